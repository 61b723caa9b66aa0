// Picks the vector math table once: AVX-512 where the CPU has it, else AVX2 + FMA, else none (the
// callers fall back to the scalar libm functors). The kernels themselves live in
// vector_math_impl.hpp, compiled per instruction set by vector_math_avx2.cpp / _avx512.cpp.
#include "kernels/vector_math.hpp"

namespace flowlet::detail {

const VectorMathTable* vector_math_best() {
  static const VectorMathTable* const best = [] {
    const VectorMathTable* wide = vector_math_avx512();
    return wide != nullptr ? wide : vector_math_avx2();
  }();
  return best;
}

namespace {
template <VectorMathF32 VectorMathTable::*Entry>
VectorMathF32 pick() {
  const VectorMathTable* table = vector_math_best();
  return table != nullptr ? table->*Entry : nullptr;
}
}  // namespace

VectorMathF32 vector_exp_f32() { return pick<&VectorMathTable::exp>(); }
VectorMathF32 vector_log_f32() { return pick<&VectorMathTable::log>(); }
VectorMathF32 vector_tanh_f32() { return pick<&VectorMathTable::tanh>(); }
VectorMathF32 vector_sigmoid_f32() { return pick<&VectorMathTable::sigmoid>(); }
VectorMathF32 vector_erf_f32() { return pick<&VectorMathTable::erf>(); }

}  // namespace flowlet::detail
