// small_sgemm_bt: C = op(A) B^T for at most 8 rows and a short k, B read in place (see
// gemm_small_bt.hpp). Standard headers come before the target pragma, as in gemm_small.cpp.
#include "kernels/gemm_small_bt.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "kernels/gemm_small.hpp"

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include <immintrin.h>

#include "kernels/transpose_8x8_avx2.hpp"

namespace flowlet::detail {
namespace {

// Lanes [0, count) of v to p, count in [1, 4].
void store_first(float* p, __m128 v, int count) {
  if (count == 4) return _mm_storeu_ps(p, v);
  if (count & 2) {
    _mm_storel_pi(reinterpret_cast<__m64*>(p), v);
    p += 2;
    v = _mm_movehl_ps(v, v);
  }
  if (count & 1) _mm_store_ss(p, v);
}

// Lanes [0, count) from p (the rest zero), count in [1, 4], reading nothing past them.
__m128 load_first(const float* p, int count) {
  if (count == 4) return _mm_loadu_ps(p);
  alignas(16) static const int32_t bits[8] = {-1, -1, -1, -1, 0, 0, 0, 0};
  return _mm_maskload_ps(p, _mm_loadu_si128(reinterpret_cast<const __m128i*>(bits + 4 - count)));
}

// C's columns [j, j + columns) (columns in [1, 4]) from acc[r] = alpha-free column j + r over C's
// rows: scaled, transposed in registers (4 x 8 -> 8 x 4) and stored row by row, rows [0, m).
void store_columns(const __m256 acc[4], __m256 alpha, int64_t m, bool accumulate, float* c, int64_t ldc, int columns) {
  const __m256 a0 = _mm256_mul_ps(acc[0], alpha), a1 = _mm256_mul_ps(acc[1], alpha);
  const __m256 a2 = _mm256_mul_ps(acc[2], alpha), a3 = _mm256_mul_ps(acc[3], alpha);
  const __m256 t0 = _mm256_unpacklo_ps(a0, a1), t1 = _mm256_unpackhi_ps(a0, a1);
  const __m256 t2 = _mm256_unpacklo_ps(a2, a3), t3 = _mm256_unpackhi_ps(a2, a3);
  // u0 holds rows 0 and 4, u1 rows 1 and 5, u2 rows 2 and 6, u3 rows 3 and 7 (low and high half).
  const __m256 u[4] = {_mm256_shuffle_ps(t0, t2, 0x44), _mm256_shuffle_ps(t0, t2, 0xEE),
                       _mm256_shuffle_ps(t1, t3, 0x44), _mm256_shuffle_ps(t1, t3, 0xEE)};
  for (int64_t i = 0; i < m; ++i) {
    const __m256 pair = u[i & 3];
    __m128 row = i < 4 ? _mm256_castps256_ps128(pair) : _mm256_extractf128_ps(pair, 1);
    float* out = c + i * ldc;
    if (accumulate) row = _mm_add_ps(row, load_first(out, columns));
    store_first(out, row, columns);
  }
}

// C's columns [0, 8) from acc[r] = column r over C's rows: scaled, transposed in registers
// (transpose_8x8_avx2.hpp) and stored as rows [0, m).
void store_eight_columns(const __m256 acc[8], __m256 alpha, int64_t m, bool accumulate, float* c, int64_t ldc) {
  __m256 rows[8];
#pragma GCC unroll 8
  for (int r = 0; r < 8; ++r) rows[r] = _mm256_mul_ps(acc[r], alpha);
  avx2::transpose_8x8(rows);
  for (int64_t i = 0; i < m; ++i) {
    float* out = c + i * ldc;
    _mm256_storeu_ps(out, accumulate ? _mm256_add_ps(rows[i], _mm256_loadu_ps(out)) : rows[i]);
  }
}

template <int K>
void bt_loop(int64_t m, int64_t n, float alpha, const float* a, int64_t a_row, int64_t a_col, const float* b,
             int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  // at[p], lane i = op(A)[i, p]; lanes past m stay zero (their sums are never stored).
  alignas(32) float columns_of_a[K][8] = {};
  for (int64_t i = 0; i < m; ++i) {
    for (int p = 0; p < K; ++p) columns_of_a[p][i] = a[i * a_row + p * a_col];
  }
  __m256 at[K];
#pragma GCC unroll 12
  for (int p = 0; p < K; ++p) at[p] = _mm256_load_ps(columns_of_a[p]);
  const __m256 va = _mm256_set1_ps(alpha);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    // Eight columns at once: eight independent sums in flight, then one 8 x 8 transpose.
    __m256 acc[8];
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) acc[r] = _mm256_mul_ps(_mm256_broadcast_ss(b + (j + r) * ldb), at[0]);
#pragma GCC unroll 12
    for (int p = 1; p < K; ++p) {
#pragma GCC unroll 8
      for (int r = 0; r < 8; ++r) acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(b + (j + r) * ldb + p), at[p], acc[r]);
    }
    store_eight_columns(acc, va, m, accumulate, c + j, ldc);
  }
  for (; j < n; j += 4) {
    const int columns = n - j < 4 ? static_cast<int>(n - j) : 4;
    __m256 acc[4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      // A missing column (past n) reads column j's row again and is never stored.
      const float* row = b + (j + (r < columns ? r : 0)) * ldb;
      acc[r] = _mm256_mul_ps(_mm256_broadcast_ss(row), at[0]);
#pragma GCC unroll 12
      for (int p = 1; p < K; ++p) acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(row + p), at[p], acc[r]);
    }
    store_columns(acc, va, m, accumulate, c + j, ldc, columns);
  }
}

// bt_loop<K> for K = 1 ... kSmallBtMaxDepth, by k - 1 (A's k columns must be compile-time many to stay
// in registers).
using BtLoop = void (*)(int64_t, int64_t, float, const float*, int64_t, int64_t, const float*, int64_t, bool, float*,
                        int64_t);
template <size_t... K>
constexpr std::array<BtLoop, sizeof...(K)> bt_loops(std::index_sequence<K...>) {
  return {&bt_loop<static_cast<int>(K) + 1>...};
}
constexpr auto kLoops = bt_loops(std::make_index_sequence<kSmallBtMaxDepth>());

}  // namespace

void small_sgemm_bt(bool transpose_a, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                    const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  const int64_t a_row = transpose_a ? 1 : lda, a_col = transpose_a ? lda : 1;
  if (k < 1 || k > kSmallBtMaxDepth) return;  // outside the contract (small_sgemm_bt_pays)
  kLoops[k - 1](m, n, alpha, a, a_row, a_col, b, ldb, accumulate, c, ldc);
}

}  // namespace flowlet::detail
#pragma GCC pop_options
#else
namespace flowlet::detail {
// Never called: small_sgemm_bt_pays is false without x86-64's AVX2.
void small_sgemm_bt(bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t, bool, float*,
                    int64_t) {}
}  // namespace flowlet::detail
#endif

namespace flowlet::detail {

bool small_sgemm_bt_pays(int64_t m, int64_t n, int64_t k, bool transpose_b) {
  // Its time grows with n alone (all 8 lanes run whatever m is), oneDNN's with m n: side by side
  // (docs/notes21/gemm.md) ours took 0.37-0.93x oneDNN's time up to n = 256 at m = 2-8 and up to
  // n = 2048 at m = 8, but 1.2-1.6x at m = 2-4 with n >= 784.
  const bool wide_enough_rows = n <= 256 || (m == kSmallBtMaxRows && n <= 1024);
  return transpose_b && m >= 2 && m <= kSmallBtMaxRows && k >= 2 && k <= kSmallBtMaxDepth && n >= 16 &&
         wide_enough_rows && small_gemm_supported();
}

}  // namespace flowlet::detail
