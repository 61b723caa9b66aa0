// f32 products with a thin dimension (a 10-class layer's n = 10, its gradient's k = 10, a batch of
// 8's m = 8) through oneDNN's sgemm (Debian's libdnnl-dev), on the calling thread. Measured side by
// side on the 2-core VM (one thread each, docs/notes18/gemm.md) oneDNN took 0.5-0.95x OpenBLAS's
// time at these shapes, where OpenBLAS's packing and blocking are sized for big products; at square
// and 784-wide shapes the two are level, so everything else stays with OpenBLAS. Without oneDNN at
// build time (FLOWLET_HAVE_DNNL undefined) thin_sgemm declines and OpenBLAS does all. The smallest
// and the narrow (n <= 16) products go to our own kernel before either (kernels/gemm_small.hpp),
// but for the larger narrow f32 ones, where oneDNN's kernel is faster (thin_sgemm_beats_small).
#pragma once

#include <cstdint>

namespace flowlet::detail {

// Whether an M x N x K f32 product (one single-threaded piece) goes to oneDNN: M, N or K at most
// 16, neither M nor N 1 (GEMV's), K at least 2 (a rank-1 update was slower in oneDNN). False when
// the build has no oneDNN.
bool thin_sgemm_pays(int64_t m, int64_t n, int64_t k);

// Whether a narrow f32 piece that small_gemm would take (n <= 16, A and B as stored) runs faster in
// oneDNN: from kThinOverSmallWork multiply-adds (64 x 256 x 8 and up), where oneDNN's kernel ran
// 1.05-1.35x faster than small_gemm's on one thread (h @ W2 at 64-1024 x 256 x 10, 15:10, and the
// lead's quiet runs at 14:56 and 14:59); below it (batch 1-8) small_gemm won. False without oneDNN.
inline constexpr double kThinOverSmallWork = 1 << 17;
bool thin_sgemm_beats_small(int64_t m, int64_t n, int64_t k, bool transpose_a, bool transpose_b);

// Row-major C = alpha * op(A) op(B) + beta * C as cblas_sgemm(CblasRowMajor, ...) takes it
// (transposes as flags, leading dimensions in elements), on the calling thread only: oneDNN's
// OpenMP thread count is set to 1 for the call and restored after, so it never starts threads of
// its own. Returns false (C untouched) when oneDNN is absent or refused the call.
bool thin_sgemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace flowlet::detail
