// Rank-1 products (k = 1): C[m, n] = alpha * a b^T, or C += alpha * a b^T. Batch-1 training makes
// two of them per step (the weight gradients x^T @ dh and h^T @ dy). Our own loop, not BLAS's sger:
// sger only accumulates, so beta 0 needed a memset of C first (C written twice), and at the small
// sizes (2,560 elements for h^T @ dy) OpenBLAS's call overhead outweighed the arithmetic
// (docs/notes19/gemm.md). Each element is one rounding of alpha * a_i * b_j (plus c_ij), as in BLAS.
#pragma once

#include <cstdint>

namespace flowlet::detail {

// C is row-major with n columns (ldc = n); a_i = a[i * a_step], b_j = b[j * b_step]. accumulate
// false writes C without reading it (NaN there does not leak in). Rows split over the pool when C
// is large enough to pay for a second thread.
void outer_product(int64_t m, int64_t n, float alpha, const float* a, int64_t a_step, const float* b, int64_t b_step,
                   bool accumulate, float* c);
void outer_product(int64_t m, int64_t n, double alpha, const double* a, int64_t a_step, const double* b,
                   int64_t b_step, bool accumulate, double* c);

}  // namespace flowlet::detail
