// The 6 x 16 f32 micro-kernel of the packed GEMM driver (gemm_packed.hpp): one register tile of C
// from a packed sliver of A (6 rows, k-major) and one of B (16 columns, k-major), on AVX2 + FMA.
// Compiled for AVX2 by function-level target pragmas; callers check sgemm_microkernel_supported().
#pragma once

#include <cstdint>

namespace flowlet::detail {

inline constexpr int kMicroRows = 6;     // rows of C per register tile (6 x 2 accumulators)
inline constexpr int kMicroColumns = 16; // columns of C per register tile (two 8-lane vectors)

// Whether the CPU has AVX2 and FMA (checked once).
bool sgemm_microkernel_supported();

// C[rows, cols] (row stride ldc, rows <= 6, cols <= 16) = alpha * A B + beta * C, where A is the
// packed sliver a[p * 6 + i] and B the packed sliver b[p * 16 + j], p in [0, k). With beta == 0 C
// is written without being read. Every element sums its k products in p order, one fused
// multiply-add each from zero, then scales once: the bits do not depend on rows or cols.
void sgemm_microkernel_6x16(int64_t k, const float* a, const float* b, float alpha, float beta, float* c, int64_t ldc,
                            int rows, int cols);

}  // namespace flowlet::detail
