// pack_a_rows_6_avx2: six rows of A to a k-major sliver through 8 x 8 register transposes (see the
// header). Standard headers come before the target pragma (as in gemm_small.cpp).
#include "kernels/gemm_pack_avx2.hpp"

#include <cstdint>

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include <immintrin.h>

#include "kernels/transpose_8x8_avx2.hpp"

namespace flowlet::detail {

void pack_a_rows_6_avx2(const float* a, int64_t lda, int rows, int64_t depth, float* dst) {
  int64_t p = 0;
  for (; p + 8 <= depth; p += 8, dst += 8 * 6) {
    __m256 r[8];
    for (int i = 0; i < 8; ++i) r[i] = i < rows ? _mm256_loadu_ps(a + i * lda + p) : _mm256_setzero_ps();
    avx2::transpose_8x8(r);  // r[q] = column p + q: rows 0-5 in lanes 0-5, two spare lanes
    // Eight lanes per column, each store's spare two overwritten by the next column's; the last
    // column stores exactly six (4 + 2) so nothing past this group is touched.
    for (int q = 0; q < 7; ++q) _mm256_storeu_ps(dst + q * 6, r[q]);
    _mm_storeu_ps(dst + 7 * 6, _mm256_castps256_ps128(r[7]));
    _mm_storel_pi(reinterpret_cast<__m64*>(dst + 7 * 6 + 4), _mm256_extractf128_ps(r[7], 1));
  }
  for (; p < depth; ++p, dst += 6) {
    for (int i = 0; i < 6; ++i) dst[i] = i < rows ? a[i * lda + p] : 0.0f;
  }
}

}  // namespace flowlet::detail

#pragma GCC pop_options

#else

namespace flowlet::detail {
void pack_a_rows_6_avx2(const float*, int64_t, int, int64_t, float*) {}
}  // namespace flowlet::detail

#endif
