// sgemm_microkernel_6x16: the AVX2/FMA register tile of the packed GEMM driver (see the header).
// Standard headers come before the target pragma so that none of their inline functions is
// compiled for AVX2 here (the linker could keep that copy for callers on any CPU).
#include "kernels/gemm_microkernel_avx2.hpp"

#include <cstdint>

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include <immintrin.h>

namespace flowlet::detail {
namespace {

// One k step: two B vectors, six broadcasts of A, twelve FMAs into the accumulators (named
// registers: an accumulator array was kept on the stack by GCC 12).
#define FLOWLET_MICRO_ROW(P, I, LO, HI)                      \
  {                                                          \
    const __m256 x = _mm256_broadcast_ss(a + (P) * 6 + (I)); \
    LO = _mm256_fmadd_ps(x, b0, LO);                         \
    HI = _mm256_fmadd_ps(x, b1, HI);                         \
  }
#define FLOWLET_MICRO_STEP(P)                               \
  {                                                         \
    const __m256 b0 = _mm256_load_ps(b + (P) * 16);         \
    const __m256 b1 = _mm256_load_ps(b + (P) * 16 + 8);     \
    FLOWLET_MICRO_ROW(P, 0, c00, c01)                       \
    FLOWLET_MICRO_ROW(P, 1, c10, c11)                       \
    FLOWLET_MICRO_ROW(P, 2, c20, c21)                       \
    FLOWLET_MICRO_ROW(P, 3, c30, c31)                       \
    FLOWLET_MICRO_ROW(P, 4, c40, c41)                       \
    FLOWLET_MICRO_ROW(P, 5, c50, c51)                       \
  }

// One row of the tile to C: alpha * sum (+ beta * C when beta != 0).
inline void store_row(float* c, __m256 lo, __m256 hi, __m256 alpha, float beta) {
  lo = _mm256_mul_ps(lo, alpha);
  hi = _mm256_mul_ps(hi, alpha);
  if (beta != 0.0f) {
    const __m256 vb = _mm256_set1_ps(beta);
    lo = _mm256_fmadd_ps(vb, _mm256_loadu_ps(c), lo);
    hi = _mm256_fmadd_ps(vb, _mm256_loadu_ps(c + 8), hi);
  }
  _mm256_storeu_ps(c, lo);
  _mm256_storeu_ps(c + 8, hi);
}

}  // namespace

void sgemm_microkernel_6x16(int64_t k, const float* a, const float* b, float alpha, float beta, float* c, int64_t ldc,
                            int rows, int cols) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
  __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  // The C tile's rows are read (beta) and written after the loop: fetch them meanwhile.
  for (int i = 0; i < rows; ++i) {
    _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc + 15), _MM_HINT_T0);
  }
  int64_t p = 0;
  for (; p + 4 <= k; p += 4) {
    _mm_prefetch(reinterpret_cast<const char*>(a + 6 * 16), _MM_HINT_T0);
    FLOWLET_MICRO_STEP(0)
    FLOWLET_MICRO_STEP(1)
    FLOWLET_MICRO_STEP(2)
    FLOWLET_MICRO_STEP(3)
    a += 4 * 6;
    b += 4 * 16;
  }
  for (; p < k; ++p) {
    FLOWLET_MICRO_STEP(0)
    a += 6;
    b += 16;
  }
  const __m256 va = _mm256_set1_ps(alpha);
  if (rows == kMicroRows && cols == kMicroColumns) {
    store_row(c, c00, c01, va, beta);
    store_row(c + ldc, c10, c11, va, beta);
    store_row(c + 2 * ldc, c20, c21, va, beta);
    store_row(c + 3 * ldc, c30, c31, va, beta);
    store_row(c + 4 * ldc, c40, c41, va, beta);
    store_row(c + 5 * ldc, c50, c51, va, beta);
    return;
  }
  // An edge tile: the whole tile through a buffer, then only rows x cols of it to C (C outside
  // them is neither read nor written).
  alignas(32) float tile[kMicroRows * kMicroColumns];
  const __m256 sums[kMicroRows][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
  for (int i = 0; i < kMicroRows; ++i) {
    _mm256_store_ps(tile + i * 16, _mm256_mul_ps(sums[i][0], va));
    _mm256_store_ps(tile + i * 16 + 8, _mm256_mul_ps(sums[i][1], va));
  }
  for (int i = 0; i < rows; ++i) {
    float* row = c + i * ldc;
    const float* t = tile + i * 16;
    if (beta == 0.0f) {
      for (int j = 0; j < cols; ++j) row[j] = t[j];
    } else {
      // The same rounding as the full tile's fused multiply-add.
      for (int j = 0; j < cols; ++j) row[j] = __builtin_fmaf(beta, row[j], t[j]);
    }
  }
}

#undef FLOWLET_MICRO_STEP
#undef FLOWLET_MICRO_ROW

bool sgemm_microkernel_supported() {
  static const bool supported = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return supported;
}

}  // namespace flowlet::detail

#pragma GCC pop_options

#else  // not x86-64: the driver is never used (callers check sgemm_microkernel_supported)

namespace flowlet::detail {
bool sgemm_microkernel_supported() { return false; }
void sgemm_microkernel_6x16(int64_t, const float*, const float*, float, float, float*, int64_t, int, int) {}
}  // namespace flowlet::detail

#endif
