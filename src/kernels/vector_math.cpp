// libmvec's 8-wide AVX2 entry points (names follow the x86 vector function ABI: 'd' = AVX2,
// 'N8' = 8 lanes, 'v' = one vector argument). The tail of an array goes through one padded vector.
#include "kernels/vector_math.hpp"

#include <cstring>

#if defined(__AVX2__)
#include <immintrin.h>

extern "C" {
__m256 _ZGVdN8v_expf(__m256);
__m256 _ZGVdN8v_logf(__m256);
__m256 _ZGVdN8v_tanhf(__m256);
#if defined(__AVX512F__)
__m512 _ZGVeN16v_expf(__m512);  // 'e' = AVX-512: 16 lanes, about twice the AVX2 throughput
__m512 _ZGVeN16v_logf(__m512);
__m512 _ZGVeN16v_tanhf(__m512);
#endif
}
#endif

namespace flowlet::detail {
namespace {

#if defined(__AVX2__)
template <__m256 (*F)(__m256)>
void apply(const float* in, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, F(_mm256_loadu_ps(in + i)));
  if (i < n) {
    alignas(32) float lanes[8] = {1, 1, 1, 1, 1, 1, 1, 1};  // padding lanes stay in every domain
    const auto rest = static_cast<size_t>(n - i);
    std::memcpy(lanes, in + i, rest * sizeof(float));
    _mm256_store_ps(lanes, F(_mm256_load_ps(lanes)));
    std::memcpy(out + i, lanes, rest * sizeof(float));
  }
}

#if defined(__AVX512F__)
template <__m512 (*F)(__m512)>
void apply16(const float* in, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, F(_mm512_loadu_ps(in + i)));
  if (i < n) {
    const auto rest = static_cast<__mmask16>((1u << (n - i)) - 1u);
    // Masked-off lanes read as 1, inside every function's domain.
    const __m512 x = _mm512_mask_loadu_ps(_mm512_set1_ps(1.0f), rest, in + i);
    _mm512_mask_storeu_ps(out + i, rest, F(x));
  }
}

bool cpu_has_avx512() {
  static const bool has = __builtin_cpu_supports("avx512f") != 0;
  return has;
}
#define FLOWLET_PICK(name) (cpu_has_avx512() ? &apply16<_ZGVeN16v_##name> : cpu_has_avx2() ? &apply<_ZGVdN8v_##name> : nullptr)
#else
#define FLOWLET_PICK(name) (cpu_has_avx2() ? &apply<_ZGVdN8v_##name> : nullptr)
#endif

bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2") != 0;
  return has;
}
#endif

}  // namespace

#if defined(__AVX2__)
VectorMathF32 vector_exp_f32() { return FLOWLET_PICK(expf); }
VectorMathF32 vector_log_f32() { return FLOWLET_PICK(logf); }
VectorMathF32 vector_tanh_f32() { return FLOWLET_PICK(tanhf); }
#else
VectorMathF32 vector_exp_f32() { return nullptr; }
VectorMathF32 vector_log_f32() { return nullptr; }
VectorMathF32 vector_tanh_f32() { return nullptr; }
#endif

}  // namespace flowlet::detail
