// Matrix products.
#pragma once

#include "flowlet/core/tensor.hpp"

namespace flowlet {

// [m, k] x [k, n] -> [m, n]; [b, m, k] x [b, k, n] -> [b, m, n]; a rank-3 operand may meet a rank-2
// one, which is shared across the batch. f32 and f64 (OpenBLAS on the CPU).
Tensor matmul(const Tensor& a, const Tensor& b);

}  // namespace flowlet
