// conv_block_sgemm (see conv_block_gemm.hpp): k is cut into blocks whose rows of B stay within
// about 16 KiB (L1), and for each block C is swept in tiles of up to 6 rows x 16 columns, each
// tile's accumulators held in registers for the whole k block (12 + 2 + 1 of the 16 AVX2
// registers). The m and n tails take the same kernel with fewer rows / one vector of columns.
#include "kernels/conv_block_gemm.hpp"

#include <algorithm>
#include <stdexcept>

#if defined(__FMA__)
#include <immintrin.h>
#endif

namespace flowlet::detail {
namespace {

using v8 = float __attribute__((vector_size(32)));
constexpr int64_t kLanes = 8;
constexpr int kRows = 6;
// Bytes of B one k block keeps: B's rows are reread for every tile of rows of C.
constexpr int64_t kBlockBytes = 16 << 10;

v8 load(const float* p) {
  v8 v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
void store(float* p, v8 v) { __builtin_memcpy(p, &v, sizeof v); }

// a * b + c, one rounding where the CPU has FMA.
v8 fma(v8 a, v8 b, v8 c) {
#if defined(__FMA__)
  return reinterpret_cast<v8>(_mm256_fmadd_ps(reinterpret_cast<__m256>(a), reinterpret_cast<__m256>(b),
                                              reinterpret_cast<__m256>(c)));
#else
  return a * b + c;
#endif
}

// One tile: Rows rows (A's rows at a_rows[i]) by Vectors * 8 columns of C over k steps (B's row l
// at b + b_offsets[l] when BOffsets, else b + l * ldb), accumulating into C when load_c.
template <int Rows, int Vectors, bool BOffsets>
[[gnu::always_inline]] inline void tile(bool load_c, int64_t k, const float* const* a_rows, int64_t a_col,
                                        const float* b, int64_t ldb, const int64_t* b_offsets, float* c, int64_t ldc) {
  v8 acc[Rows][Vectors];
  const float* a[Rows];
#pragma GCC unroll 8
  for (int i = 0; i < Rows; ++i) {
    a[i] = a_rows[i];
#pragma GCC unroll 2
    for (int j = 0; j < Vectors; ++j) acc[i][j] = load_c ? load(c + i * ldc + j * kLanes) : v8{};
  }
  for (int64_t l = 0; l < k; ++l) {
    const float* b_row = BOffsets ? b + b_offsets[l] : b + l * ldb;
    v8 row[Vectors];
#pragma GCC unroll 2
    for (int j = 0; j < Vectors; ++j) row[j] = load(b_row + j * kLanes);
#pragma GCC unroll 8
    for (int i = 0; i < Rows; ++i) {
      const v8 value = v8{} + a[i][l * a_col];
#pragma GCC unroll 2
      for (int j = 0; j < Vectors; ++j) acc[i][j] = fma(value, row[j], acc[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < Rows; ++i)
#pragma GCC unroll 2
    for (int j = 0; j < Vectors; ++j) store(c + i * ldc + j * kLanes, acc[i][j]);
}

template <int Vectors, bool BOffsets>
void tile_rows(int64_t rows, bool load_c, int64_t k, const float* const* a_rows, int64_t a_col, const float* b,
               int64_t ldb, const int64_t* b_offsets, float* c, int64_t ldc) {
  switch (rows) {
    case 6: return tile<6, Vectors, BOffsets>(load_c, k, a_rows, a_col, b, ldb, b_offsets, c, ldc);
    case 5: return tile<5, Vectors, BOffsets>(load_c, k, a_rows, a_col, b, ldb, b_offsets, c, ldc);
    case 4: return tile<4, Vectors, BOffsets>(load_c, k, a_rows, a_col, b, ldb, b_offsets, c, ldc);
    case 3: return tile<3, Vectors, BOffsets>(load_c, k, a_rows, a_col, b, ldb, b_offsets, c, ldc);
    case 2: return tile<2, Vectors, BOffsets>(load_c, k, a_rows, a_col, b, ldb, b_offsets, c, ldc);
    default: return tile<1, Vectors, BOffsets>(load_c, k, a_rows, a_col, b, ldb, b_offsets, c, ldc);
  }
}

template <bool BOffsets>
void sweep(bool accumulate, int64_t m, int64_t n, int64_t k, const BlockOperand& a, const BlockOperand& b, float* c,
           int64_t ldc) {
  constexpr int64_t kColumns = 2 * kLanes;
  const int64_t k_block = std::max<int64_t>(16, kBlockBytes / std::max<int64_t>(1, n * 4));
  // k = 0: one pass with an empty k block, so C is still written (zeros) or left (accumulate).
  for (int64_t l0 = 0; l0 < std::max<int64_t>(k, 1); l0 += k_block) {
    const int64_t depth = std::min(k_block, k - l0);
    const bool load_c = accumulate || l0 > 0;
    const float* b_block = BOffsets ? b.data : b.data + l0 * b.row_stride;
    const int64_t* b_offsets = BOffsets ? b.row_offsets + l0 : nullptr;
    for (int64_t i0 = 0; i0 < m; i0 += kRows) {
      const int64_t rows = std::min<int64_t>(kRows, m - i0);
      const float* a_rows[kRows];
      for (int64_t i = 0; i < rows; ++i)
        a_rows[i] = a.data + (a.row_offsets != nullptr ? a.row_offsets[i0 + i] : (i0 + i) * a.row_stride) +
                    l0 * a.col_stride;
      float* c_rows = c + i0 * ldc;
      int64_t j0 = 0;
      for (; j0 + kColumns <= n; j0 += kColumns)
        tile_rows<2, BOffsets>(rows, load_c, depth, a_rows, a.col_stride, b_block + j0, b.row_stride, b_offsets,
                               c_rows + j0, ldc);
      if (j0 < n)
        tile_rows<1, BOffsets>(rows, load_c, depth, a_rows, a.col_stride, b_block + j0, b.row_stride, b_offsets,
                               c_rows + j0, ldc);
    }
  }
}

}  // namespace

void conv_block_sgemm(bool accumulate, int64_t m, int64_t n, int64_t k, const BlockOperand& a, const BlockOperand& b,
                      float* c, int64_t ldc) {
  if (n % kLanes != 0 || m < 0 || n < 0 || k < 0 || b.col_stride != 1)
    throw std::invalid_argument(
        "conv_block_sgemm: n must be a multiple of 8, B's rows contiguous (col_stride 1) and no size negative");
  if (b.row_offsets != nullptr) {
    sweep<true>(accumulate, m, n, k, a, b, c, ldc);
  } else {
    sweep<false>(accumulate, m, n, k, a, b, c, ldc);
  }
}

}  // namespace flowlet::detail
