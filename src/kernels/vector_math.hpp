// Vectorized f32 exp, log, tanh, sigmoid and erf over contiguous arrays: our own polynomial
// kernels (kernels/vector_math_impl.hpp, with their stated error bounds), compiled for AVX2 + FMA
// and for AVX-512 and chosen at run time from what the CPU has (16 lanes with AVX-512F, 8 with
// AVX2 + FMA). Null on CPUs (or builds) with neither: callers then use the scalar libm functors.
#pragma once

#include <cstdint>

namespace flowlet::detail {

using VectorMathF32 = void (*)(const float* in, float* out, int64_t n);

VectorMathF32 vector_exp_f32();
VectorMathF32 vector_log_f32();
VectorMathF32 vector_tanh_f32();
VectorMathF32 vector_sigmoid_f32();
VectorMathF32 vector_erf_f32();

// One instruction set's kernels. The entries above come from the best table the CPU runs; tests
// call each table the CPU supports directly.
struct VectorMathTable {
  const char* isa;  // "avx512", "avx2"
  VectorMathF32 exp, log, tanh, sigmoid, erf;
};
// Null where the build has no such code (not x86-64) or the CPU lacks the instructions.
const VectorMathTable* vector_math_avx512();
const VectorMathTable* vector_math_avx2();
// The table vector_*_f32 use (the widest available), or null.
const VectorMathTable* vector_math_best();

}  // namespace flowlet::detail
