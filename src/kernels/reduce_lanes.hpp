// The vector lanes the f32 reduction kernels share (reduce_f32.cpp, reduce_f32.hpp, norm_f32.cpp):
// 8-float and 4-double GCC vector types, an unaligned load, a masked load of a row's last few
// floats, and the widening of 8 f32 lanes into two f64 accumulators.
//
// Why the widening is written with AVX intrinsics where the build has AVX: GCC 12 lowers
// __builtin_convertvector(float x4 -> double x4) into two 128-bit conversions of two lanes each
// plus shuffles and inserts (11 instructions per 8 floats instead of 3). What made last round's
// sum slow was widening every pair that way (11.7 GB/s on one thread, /tmp micro-benchmark, Zen 3;
// the same pairs with intrinsics: 11.8); the trees of reduce_f32.cpp widen 8 or 16 times less
// often (14.0 and 16.9 GB/s). The intrinsics keep the instruction count down wherever lanes are
// widened.
// Without AVX the generic form stays; the arithmetic, and so every bit, is the same.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX__)
#include <immintrin.h>
#endif

namespace flowlet::detail::lanes {

using F32x8 = float __attribute__((vector_size(32)));
using F64x4 = double __attribute__((vector_size(32)));
using I32x8 = int32_t __attribute__((vector_size(32)));

// Vectors pass by reference, never by value: in a build without AVX (-Dnative=false) a 32-byte
// vector argument or return value would have a different calling convention (GCC -Wpsabi).
inline void load(F32x8& v, const float* p) {
  std::memcpy(&v, p, sizeof v);  // unaligned load
}

inline void load(F64x4& v, const double* p) { std::memcpy(&v, p, sizeof v); }

// The first `count` floats at p (0 <= count < 8), zeros in the other lanes; nothing past them is
// read (a masked load under AVX: masked-out lanes touch no memory, so a row's tail at the end of
// an allocation is safe).
inline void load_first(F32x8& v, const float* p, int64_t count) {
#if defined(__AVX__)
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)), lane);
  v = (F32x8)_mm256_maskload_ps(p, mask);
#else
  v = F32x8{};
  for (int64_t k = 0; k < count; ++k) v[k] = p[k];
#endif
}
inline void store(double* p, const F64x4& v) { std::memcpy(p, &v, sizeof v); }

// acc[0] += lanes 0..3 of v, acc[1] += lanes 4..7, widened to f64.
inline void widen_add(F64x4* acc, const F32x8& v) {
#if defined(__AVX__)
  const __m256 p = (__m256)v;  // GCC vector casts: the same 32 bytes, reinterpreted
  acc[0] += (F64x4)_mm256_cvtps_pd(_mm256_castps256_ps128(p));
  acc[1] += (F64x4)_mm256_cvtps_pd(_mm256_extractf128_ps(p, 1));
#else
  acc[0] += __builtin_convertvector(__builtin_shufflevector(v, v, 0, 1, 2, 3), F64x4);
  acc[1] += __builtin_convertvector(__builtin_shufflevector(v, v, 4, 5, 6, 7), F64x4);
#endif
}

// The four lanes of a, added in a fixed order.
inline double lane_total(const F64x4& a) { return (a[0] + a[1]) + (a[2] + a[3]); }

}  // namespace flowlet::detail::lanes
