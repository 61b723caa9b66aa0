// small_gemm: the register-tiled AVX2/FMA loop for tiny products (see gemm_small.hpp).
// Standard headers come before the target pragma so that none of their inline functions is
// compiled for AVX2 here (the linker could keep that copy for callers on any CPU).
#include "kernels/gemm_small.hpp"

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include <immintrin.h>

#include "kernels/transpose_8x8_avx2.hpp"

namespace flowlet::detail {
namespace {

// One vector register and the operations a tile needs, for f32 (8 lanes) and f64 (4 lanes).
template <class T>
struct Lanes;

template <>
struct Lanes<float> {
  using V = __m256;
  static constexpr int kWidth = 8;
  static V zero() { return _mm256_setzero_ps(); }
  static V splat(float x) { return _mm256_set1_ps(x); }
  static V broadcast(const float* p) { return _mm256_broadcast_ss(p); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V load_first(const float* p, __m256i mask) { return _mm256_maskload_ps(p, mask); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  // Lanes [0, count) to p, count in [0, 8): 4-, 2- and 1-lane stores (a masked store is slow on
  // AMD cores, and a loop of scalar copies compiles to a memcpy call).
  static void store_first(float* p, V v, int count) {
    __m128 part = _mm256_castps256_ps128(v);
    if (count & 4) {
      _mm_storeu_ps(p, part);
      p += 4;
      part = _mm256_extractf128_ps(v, 1);
    }
    if (count & 2) {
      _mm_storel_pi(reinterpret_cast<__m64*>(p), part);
      p += 2;
      part = _mm_movehl_ps(part, part);
    }
    if (count & 1) _mm_store_ss(p, part);
  }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  // Lanes [0, count) set, count in [0, 8].
  static __m256i mask(int count) {
    alignas(32) static const int32_t bits[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bits + 8 - count));
  }
};

template <>
struct Lanes<double> {
  using V = __m256d;
  static constexpr int kWidth = 4;
  static V zero() { return _mm256_setzero_pd(); }
  static V splat(double x) { return _mm256_set1_pd(x); }
  static V broadcast(const double* p) { return _mm256_broadcast_sd(p); }
  static V load(const double* p) { return _mm256_loadu_pd(p); }
  static V load_first(const double* p, __m256i mask) { return _mm256_maskload_pd(p, mask); }
  static void store(double* p, V v) { _mm256_storeu_pd(p, v); }
  // Lanes [0, count) to p, count in [0, 4).
  static void store_first(double* p, V v, int count) {
    __m128d part = _mm256_castpd256_pd128(v);
    if (count & 2) {
      _mm_storeu_pd(p, part);
      p += 2;
      part = _mm256_extractf128_pd(v, 1);
    }
    if (count & 1) _mm_store_sd(p, part);
  }
  static V fma(V a, V b, V c) { return _mm256_fmadd_pd(a, b, c); }
  static V add(V a, V b) { return _mm256_add_pd(a, b); }
  static V mul(V a, V b) { return _mm256_mul_pd(a, b); }
  // Lanes [0, count) set, count in [0, 4].
  static __m256i mask(int count) {
    alignas(32) static const int64_t bits[8] = {-1, -1, -1, -1, 0, 0, 0, 0};
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bits + 4 - count));
  }
};

// Partial sums interleaved along k, so that at least 8 independent FMA chains are in flight (two
// FMA pipes, 4-5 cycles of latency) even in a tile of one row: a 1 x 10 row of a batch-1 product
// would otherwise wait on one chain per vector.
template <int R, int V>
constexpr int kPartialSums = R * V >= 8 ? 1 : R * V >= 4 ? 2 : 4;

// acc += op(A)(rows, p) * op(B)(p, columns) for one k term p: V loads of B, R broadcasts of A.
// A function, not a lambda, so that it is compiled under this file's target pragma.
template <class T, int R, int V, bool Tail>
__attribute__((always_inline)) inline void add_term(typename Lanes<T>::V (&acc)[R][V], int64_t p, const T* a,
                                                    int64_t a_row, int64_t a_col, const T* b, int64_t ldb,
                                                    __m256i last_mask) {
  using L = Lanes<T>;
  constexpr int W = L::kWidth;
  const T* bp = b + p * ldb;
  typename L::V bv[V];
  #pragma GCC unroll 8
  for (int v = 0; v < V; ++v) bv[v] = Tail && v == V - 1 ? L::load_first(bp + v * W, last_mask) : L::load(bp + v * W);
  const T* ap = a + p * a_col;
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const typename L::V av = L::broadcast(ap + r * a_row);
    #pragma GCC unroll 8
    for (int v = 0; v < V; ++v) acc[r][v] = L::fma(av, bv[v], acc[r][v]);
  }
}

// The tile of C with R rows and V vectors of columns, summed over all k. `a` points at op(A)(i0, 0)
// (a_row elements to the next row, a_col to the next k), `b` at op(B)(0, j0) (ldb to the next k,
// columns contiguous), `c` at C(i0, j0). With Tail the last vector holds only the lanes set in
// `last_mask` (`last` columns): B and C are read with masked loads, C written lane group by group.
template <class T, int R, int V, bool Tail>
void tile(int64_t k, const T* a, int64_t a_row, int64_t a_col, const T* b, int64_t ldb, int last, __m256i last_mask,
          T alpha, bool accumulate, T* c, int64_t ldc) {
  using L = Lanes<T>;
  using Vec = typename L::V;
  constexpr int S = kPartialSums<R, V>;
  constexpr int W = L::kWidth;
  Vec acc[S][R][V];
  #pragma GCC unroll 8
  for (int s = 0; s < S; ++s) {
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      #pragma GCC unroll 8
      for (int v = 0; v < V; ++v) acc[s][r][v] = L::zero();
    }
  }
  int64_t p = 0;
  for (; p + S <= k; p += S) {
    #pragma GCC unroll 8
    for (int s = 0; s < S; ++s) add_term<T, R, V, Tail>(acc[s], p + s, a, a_row, a_col, b, ldb, last_mask);
  }
  for (; p < k; ++p) add_term<T, R, V, Tail>(acc[0], p, a, a_row, a_col, b, ldb, last_mask);
  const Vec va = L::splat(alpha);
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    T* row = c + r * ldc;
    #pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      Vec sum = acc[0][r][v];
      #pragma GCC unroll 8
      for (int s = 1; s < S; ++s) sum = L::add(sum, acc[s][r][v]);
      T* to = row + v * W;
      if (Tail && v == V - 1) {
        L::store_first(to, accumulate ? L::fma(va, sum, L::load_first(to, last_mask)) : L::mul(va, sum), last);
      } else {
        L::store(to, accumulate ? L::fma(va, sum, L::load(to)) : L::mul(va, sum));
      }
    }
  }
}

// One block of up to V vectors of columns, every row of C: tiles of 6 rows (12 accumulators with
// V = 2, two of B's vectors and one broadcast of A: 15 of the 16 registers), then the rest.
template <class T, int V, bool Tail>
void column_block(int64_t m, int64_t k, const T* a, int64_t a_row, int64_t a_col, const T* b, int64_t ldb, int last,
                  T alpha, bool accumulate, T* c, int64_t ldc) {
  const __m256i mask = Lanes<T>::mask(last);
  int64_t i = 0;
  for (; i + 6 <= m; i += 6) tile<T, 6, V, Tail>(k, a + i * a_row, a_row, a_col, b, ldb, last, mask, alpha, accumulate, c + i * ldc, ldc);
  const T* ai = a + i * a_row;
  T* ci = c + i * ldc;
  switch (m - i) {
    case 5: tile<T, 5, V, Tail>(k, ai, a_row, a_col, b, ldb, last, mask, alpha, accumulate, ci, ldc); break;
    case 4: tile<T, 4, V, Tail>(k, ai, a_row, a_col, b, ldb, last, mask, alpha, accumulate, ci, ldc); break;
    case 3: tile<T, 3, V, Tail>(k, ai, a_row, a_col, b, ldb, last, mask, alpha, accumulate, ci, ldc); break;
    case 2: tile<T, 2, V, Tail>(k, ai, a_row, a_col, b, ldb, last, mask, alpha, accumulate, ci, ldc); break;
    case 1: tile<T, 1, V, Tail>(k, ai, a_row, a_col, b, ldb, last, mask, alpha, accumulate, ci, ldc); break;
    default: break;
  }
}

// Rows [0, 8) x columns [0, 8) of `from` (row step ld_from) written transposed into `to` (row step
// ld_to), through registers (transpose_8x8_avx2.hpp).
void transpose_8x8(const float* from, int64_t ld_from, float* to, int64_t ld_to) {
  __m256 r[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(from + i * ld_from);
  avx2::transpose_8x8(r);
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) _mm256_storeu_ps(to + i * ld_to, r[i]);
}

// packed[p * n + j] = b[j * ldb + p]: a transposed B as k rows of n. f32 moves 8 x 8 blocks through
// registers (24 shuffles per 64 elements instead of 64 scalar loads and stores); the edges, and f64, go element by
// element, stores in order (stores striding by n made a flowlet 8x10x256 call 2.2x slower).
template <class T>
void gather_transposed(const T* b, int64_t ldb, int64_t k, int64_t n, T* packed) {
  int64_t j0 = 0;
  if constexpr (std::is_same_v<T, float>) {
    const int64_t p_blocks = k / 8 * 8;
    for (; j0 + 8 <= n; j0 += 8) {
      for (int64_t p = 0; p < p_blocks; p += 8) transpose_8x8(b + j0 * ldb + p, ldb, packed + p * n + j0, n);
      for (int64_t p = p_blocks; p < k; ++p) {
        for (int64_t j = j0; j < j0 + 8; ++j) packed[p * n + j] = b[j * ldb + p];
      }
    }
  }
  for (int64_t p = 0; p < k; ++p) {
    for (int64_t j = j0; j < n; ++j) packed[p * n + j] = b[j * ldb + p];
  }
}

template <class T>
void small(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
           const T* b, int64_t ldb, bool accumulate, T* c, int64_t ldc) {
  constexpr int W = Lanes<T>::kWidth;
  // A transposed B (a weight used as W^T) is gathered once into k rows of n, so that every tile
  // reads B's columns contiguously.
  alignas(32) T on_stack[kSmallGemmPackElements];
  std::vector<T> on_heap;  // only for a caller past small_gemm_pays's limit
  if (transpose_b) {
    T* packed = on_stack;
    if (n * k > kSmallGemmPackElements) {
      on_heap.resize(static_cast<size_t>(n * k));
      packed = on_heap.data();
    }
    gather_transposed(b, ldb, k, n, packed);
    b = packed;
    ldb = n;
  }
  const int64_t a_row = transpose_a ? 1 : lda, a_col = transpose_a ? lda : 1;
  for (int64_t j = 0; j < n; j += 2 * W) {
    const int64_t columns = std::min<int64_t>(2 * W, n - j);
    const int last = static_cast<int>(columns > W ? columns - W : columns);  // columns in the last vector
    const bool tail = last < W;
    if (columns > W) {
      if (tail) column_block<T, 2, true>(m, k, a, a_row, a_col, b + j, ldb, last, alpha, accumulate, c + j, ldc);
      else column_block<T, 2, false>(m, k, a, a_row, a_col, b + j, ldb, last, alpha, accumulate, c + j, ldc);
    } else {
      if (tail) column_block<T, 1, true>(m, k, a, a_row, a_col, b + j, ldb, last, alpha, accumulate, c + j, ldc);
      else column_block<T, 1, false>(m, k, a, a_row, a_col, b + j, ldb, last, alpha, accumulate, c + j, ldc);
    }
  }
}

}  // namespace

bool small_gemm_supported() {
  static const bool supported = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return supported;
}

void small_gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                int64_t lda, const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  small(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
}

void small_gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
                int64_t lda, const double* b, int64_t ldb, bool accumulate, double* c, int64_t ldc) {
  small(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
}

}  // namespace flowlet::detail
#pragma GCC pop_options
#else
namespace flowlet::detail {
bool small_gemm_supported() { return false; }
// Never called: small_gemm_pays is false without x86-64's AVX2.
void small_gemm(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t, bool,
                float*, int64_t) {}
void small_gemm(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t, const double*, int64_t, bool,
                double*, int64_t) {}
}  // namespace flowlet::detail
#endif

namespace flowlet::detail {

bool small_gemm_pays(int64_t m, int64_t n, int64_t k, bool transpose_a, bool transpose_b) {
  if (m < 1 || n < 2 || k < 2 || !small_gemm_supported()) return false;
  if (transpose_b && n * k > kSmallGemmPackElements) return false;
  const double work = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  if (n <= 16) return work <= kSmallGemmNarrowWork && (!transpose_a || k <= 512);
  return k <= 16 && !transpose_b && work <= kSmallGemmShortWork;
}

}  // namespace flowlet::detail
