// GEMM on CUDA devices through cuBLAS, for matmul and for library code that needs other dtypes or
// precisions than the op offers (the GPU benchmarks time bf16 with it).
#pragma once

#include "flowlet/core/tensor.hpp"

namespace flowlet::detail::cuda {

// c = alpha * (a @ b) + beta * c for operands on one CUDA device, shaped as matmul checks them
// (rank 2, or 3 with a batch; a rank-2 operand is shared across the batch); c contiguous; beta 0
// (c is overwritten) or 1 (accumulate: a variable updated by its gradient, assign_matmul). f32
// (TF32 tensor cores when `tf32`), f64, and f16/bf16 with f32 accumulation. Transposed views go to
// cuBLAS as flags; other strided operands are packed first.
void gemm(const Tensor& a, const Tensor& b, Tensor& c, bool tf32, double alpha = 1.0, double beta = 0.0);

}  // namespace flowlet::detail::cuda
