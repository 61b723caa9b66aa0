// packed_sgemm: our own f32 GEMM driver in the GotoBLAS/BLIS structure, for products split over
// the pool. B (the operand every row block shares) is packed ONCE per call into 16-column slivers,
// the packing split between the pool's threads; then the threads claim tiles of C (a block of rows
// x a block of columns) from the pool's chunk counter, pack their tile's A block (6-row slivers,
// kept in L2) and run the 6 x 16 AVX2/FMA micro-kernel (gemm_microkernel_avx2.hpp) over it. With
// few rows (m <= kPackedMcMax) it is the other way round: A is packed once and shared, and the
// tiles are column blocks that pack their own B. A late worker costs one small tile, and no piece
// packs the shared operand again (the split of single-threaded BLAS calls in linalg.cpp packs it
// once per piece). Transposes are the packing's business, so A^T and B^T cost nothing extra.
#pragma once

#include <cstdint>

namespace flowlet::detail {

// The depth of one packed block: a 6 x 16 tile's slivers (kc x 6 and kc x 16 floats, 6 and 16 KiB
// at 256) stay in L1. k is cut into equal blocks of at most this, so the sum order over k, and with
// it the result's bits, depends on k alone, never on the thread count or the tiles.
inline constexpr int64_t kPackedKc = 256;
// The most rows of one tile (its packed A block, 144 x 256 floats = 144 KiB, stays in L2) and the
// most columns (its B panel of 256 x 512 floats = 512 KiB is read from L2/L3).
inline constexpr int64_t kPackedMcMax = 144;
inline constexpr int64_t kPackedNcMax = 512;

// Whether the CPU runs the driver's micro-kernel (AVX2 and FMA).
bool packed_sgemm_supported();

// Whether gemm_into (ops/linalg.cpp) gives one f32 product split over `threads` (>= 2) pool
// threads to packed_sgemm instead of guided pieces of single-threaded BLAS calls: where the two
// measured faster side by side (docs/notes22/gemm.md): at least 256 rows, 64 columns, and a depth of
// 32-512. That takes x^T @ dh at batch 64-256 (784 x B x 256, A transposed; 0.78-0.91x the split's
// time per round) and square 512 (0.75-0.98x); x @ W1 (k = 784: 0.92-1.09x), x^T @ dh at batch
// 1024 (k = 1024: 1.05-1.09x) and 1024^3 (1.01x) stay with the split.
bool packed_sgemm_pays(int64_t m, int64_t n, int64_t k, bool transpose_a, bool transpose_b, int64_t threads);

// Row-major C[m, n] = alpha * op(A) op(B) + beta * C, with the operands as cblas_sgemm
// (CblasRowMajor) takes them: op(A) = A[m, k] (lda) or A^T with A stored [k, m]; likewise B.
// beta == 0 writes C without reading it. Splits over up to `threads` pool threads (1: the calling
// thread alone); the result is bit for bit the same at every thread count and on every call.
// Needs packed_sgemm_supported(); m, n, k >= 1.
void packed_sgemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                  int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc, int threads);

}  // namespace flowlet::detail
