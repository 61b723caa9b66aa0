// The GEMM behind matmul, for library code that accumulates into an existing tensor (a variable
// updated by its gradient without materializing the gradient).
#pragma once

#include "flowlet/core/tensor.hpp"

namespace flowlet::detail {

// c = alpha * (a @ b) + beta * c, with beta 0 or 1. Shapes as matmul checks them (rank 2, or 3 with a
// batch); c contiguous. Transposed views of a and b go to BLAS as flags; big products split over
// the pool.
void gemm_into(const Tensor& a, const Tensor& b, Tensor& c, double alpha, double beta);

}  // namespace flowlet::detail
