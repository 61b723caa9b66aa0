// The AVX2 half of the packed GEMM driver's A packing (gemm_packed.cpp): six stored rows of A
// turned k-major (8 x 8 register transposes), which the scalar gather did at a tenth of the
// micro-kernel's pace. Compiled for AVX2 by a target pragma; callers check packed_sgemm_supported.
#pragma once

#include <cstdint>

namespace flowlet::detail {

// dst[p * 6 + i] = a[i * lda + p] for i < rows (rows <= 6), 0 for rows <= i < 6, p in [0, depth).
void pack_a_rows_6_avx2(const float* a, int64_t lda, int rows, int64_t depth, float* dst);

}  // namespace flowlet::detail
