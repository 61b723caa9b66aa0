// Matrix products.
#pragma once

#include "flowlet/core/tensor.hpp"

namespace flowlet {

// [m, k] x [k, n] -> [m, n]; [b, m, k] x [b, k, n] -> [b, m, n]; a rank-3 operand may meet a rank-2
// one, which is shared across the batch. f32 and f64 (OpenBLAS on the CPU).
Tensor matmul(const Tensor& a, const Tensor& b);

// Lets f32 matmul on CUDA devices use TF32 tensor cores: several times faster, with the inputs
// rounded to 10 mantissa bits (relative error about 1e-3 instead of 1e-6). Off by default, as f32
// results should not change silently; process-wide; the CPU ignores it.
//   set_matmul_tf32(true);  // like torch.backends.cuda.matmul.allow_tf32 = True
void set_matmul_tf32(bool allowed);
bool matmul_tf32();

}  // namespace flowlet
