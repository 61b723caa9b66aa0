// Vectorized f32 exp, log and tanh over contiguous arrays, from glibc's libmvec (the SIMD variants
// of libm that compilers call under -ffast-math). Scalar expf/tanhf cost 10-46 ns per element;
// these 1-2 ns, within a few ulp of the scalar results. Null when the build or CPU lacks AVX2.
#pragma once

#include <cstdint>

namespace flowlet::detail {

using VectorMathF32 = void (*)(const float* in, float* out, int64_t n);

VectorMathF32 vector_exp_f32();
VectorMathF32 vector_log_f32();
VectorMathF32 vector_tanh_f32();

}  // namespace flowlet::detail
