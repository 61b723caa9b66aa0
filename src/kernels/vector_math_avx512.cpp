// The vector math kernels (vector_math_impl.hpp) compiled for AVX-512F: 16 f32 lanes.
// Standard headers come before the target pragma so that none of their inline functions is
// compiled for AVX-512 here (the linker could keep that copy for callers on any CPU).
#include <cstdint>

#include "kernels/vector_math.hpp"

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
// GCC 12's AVX-512 intrinsics trip -Wuninitialized inside the header itself (GCC PR 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "kernels/vector_math_impl.hpp"

namespace flowlet::detail {
namespace {

using F = __m512;
using I = int32_t __attribute__((vector_size(64)));

// Each kernel as a functor type (not a lambda), so that its call operator is compiled under this
// file's target pragma like everything else here.
#define FLOWLET_VECTOR_KERNEL(name)                                                    \
  struct name##_kernel {                                                               \
    F operator()(F x) const { return name##_f32<F, I>(x); }                           \
  };                                                                                  \
  void name##_avx512(const float* in, float* out, int64_t n) { apply_vector<F>(in, out, n, name##_kernel{}); }
FLOWLET_VECTOR_KERNEL(exp)
FLOWLET_VECTOR_KERNEL(log)
FLOWLET_VECTOR_KERNEL(tanh)
FLOWLET_VECTOR_KERNEL(sigmoid)
FLOWLET_VECTOR_KERNEL(erf)
#undef FLOWLET_VECTOR_KERNEL

constexpr VectorMathTable kAvx512{"avx512", &exp_avx512, &log_avx512, &tanh_avx512, &sigmoid_avx512, &erf_avx512};

}  // namespace
}  // namespace flowlet::detail
#pragma GCC pop_options

namespace flowlet::detail {
const VectorMathTable* vector_math_avx512() {
  static const bool supported = __builtin_cpu_supports("avx512f");
  return supported ? &kAvx512 : nullptr;
}
}  // namespace flowlet::detail
#else
namespace flowlet::detail {
const VectorMathTable* vector_math_avx512() { return nullptr; }
}  // namespace flowlet::detail
#endif
