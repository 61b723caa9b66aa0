// The small f32 products inside the Winograd convolutions (src/kernels/conv_winograd.cpp): per
// transform position, [tiles, cg] @ [cg, og] for the forward pass and the input gradient, a few
// hundred by a few dozen, cache-resident. OpenBLAS spent part of each such call packing both
// operands and zeroing C before a beta = 0 product (sgemm_beta: 6% of the CNN step's samples last
// round); this register-blocked kernel (6 rows x 16 columns of accumulators, GCC vector types, FMA
// under -march=native) reads the operands where they lie: A through two strides or a table of row
// offsets (one element broadcast at a time), B by contiguous rows of 8-column vectors found by a
// stride or a table of row offsets. Runs on the calling thread only.
#pragma once

#include <cstdint>

namespace flowlet::detail {

// An operand of conv_block_sgemm: element (i, l) at data[i * row_stride + l * col_stride], or at
// data[row_offsets[i] + l * col_stride] when row_offsets is set (one offset per row).
struct BlockOperand {
  const float* data = nullptr;
  int64_t row_stride = 0, col_stride = 1;
  const int64_t* row_offsets = nullptr;
};

// C [m, n] = A [m, k] @ B [k, n], or C += A @ B when accumulate; C(i, j) = c[i * ldc + j]. B's
// rows must be contiguous (col_stride 1) and n a multiple of 8 (the callers pad to 8); m, k any
// size >= 0 (k = 0 writes zeros unless accumulate). Anything else is a caller bug
// (std::invalid_argument).
void conv_block_sgemm(bool accumulate, int64_t m, int64_t n, int64_t k, const BlockOperand& a, const BlockOperand& b,
                      float* c, int64_t ldc);

// The same with both operands strided: A(i, l) = a[i * a_row + l * a_col], B(l, j) = b[l * ldb + j].
inline void conv_block_sgemm(bool accumulate, int64_t m, int64_t n, int64_t k, const float* a, int64_t a_row,
                             int64_t a_col, const float* b, int64_t ldb, float* c, int64_t ldc) {
  conv_block_sgemm(accumulate, m, n, k, BlockOperand{a, a_row, a_col, nullptr}, BlockOperand{b, ldb, 1, nullptr}, c,
                   ldc);
}

}  // namespace flowlet::detail
