// An 8 x 8 f32 transpose in AVX registers: unpacks, shuffles and 128-bit swaps, 24 instructions
// for 64 elements. Shared by small_gemm's gather of a transposed B (gemm_small.cpp) and
// small_sgemm_bt's column-to-row stores (gemm_small_bt.cpp). Include it only where AVX2 code is
// compiled (after `#pragma GCC target("avx2,fma")` and <immintrin.h>).
#pragma once

#include <immintrin.h>

namespace flowlet::detail::avx2 {

// r[i] lane j becomes r[j] lane i.
[[gnu::always_inline]] inline void transpose_8x8(__m256 r[8]) {
  __m256 t[8], u[8];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {  // rows 0-3, then 4-7
    const int o = 4 * h;
    u[o + 0] = _mm256_shuffle_ps(t[o + 0], t[o + 2], 0x44);
    u[o + 1] = _mm256_shuffle_ps(t[o + 0], t[o + 2], 0xEE);
    u[o + 2] = _mm256_shuffle_ps(t[o + 1], t[o + 3], 0x44);
    u[o + 3] = _mm256_shuffle_ps(t[o + 1], t[o + 3], 0xEE);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

}  // namespace flowlet::detail::avx2
