// The vector math kernels (vector_math_impl.hpp) compiled for AVX2 + FMA: 8 f32 lanes.
// Standard headers come before the target pragma so that none of their inline functions is
// compiled for AVX2 here (the linker could keep that copy for callers on any CPU).
#include <cstdint>

#include "kernels/vector_math.hpp"

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include <immintrin.h>

#include "kernels/vector_math_impl.hpp"

namespace flowlet::detail {
namespace {

using F = __m256;
using I = int32_t __attribute__((vector_size(32)));

// Each kernel as a functor type (not a lambda), so that its call operator is compiled under this
// file's target pragma like everything else here.
#define FLOWLET_VECTOR_KERNEL(name)                                                    \
  struct name##_kernel {                                                               \
    F operator()(F x) const { return name##_f32<F, I>(x); }                           \
  };                                                                                  \
  void name##_avx2(const float* in, float* out, int64_t n) { apply_vector<F>(in, out, n, name##_kernel{}); }
FLOWLET_VECTOR_KERNEL(exp)
FLOWLET_VECTOR_KERNEL(log)
FLOWLET_VECTOR_KERNEL(tanh)
FLOWLET_VECTOR_KERNEL(sigmoid)
FLOWLET_VECTOR_KERNEL(erf)
#undef FLOWLET_VECTOR_KERNEL

constexpr VectorMathTable kAvx2{"avx2", &exp_avx2, &log_avx2, &tanh_avx2, &sigmoid_avx2, &erf_avx2};

}  // namespace
}  // namespace flowlet::detail
#pragma GCC pop_options

namespace flowlet::detail {
const VectorMathTable* vector_math_avx2() {
  static const bool supported = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return supported ? &kAvx2 : nullptr;
}
}  // namespace flowlet::detail
#else
namespace flowlet::detail {
const VectorMathTable* vector_math_avx2() { return nullptr; }
}  // namespace flowlet::detail
#endif
