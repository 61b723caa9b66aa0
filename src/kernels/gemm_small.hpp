// Products too small or too narrow for a BLAS call to pay for its own setup: the 10-class layer's
// products (h @ W2 and h^T @ dy, n = 10, at every batch) take
// 0.5-3 us at batch 1-8 in oneDNN or OpenBLAS, much of it choosing a kernel, packing and blocking
// for sizes these calls never reach, and oneDNN's kernels for n = 10 run 30-45 GFLOP/s.
// small_gemm is our own register-tiled AVX2/FMA loop (f32 and f64) on the calling thread: no
// packing of A (its elements are broadcast wherever they lie), B read in place or, when
// transposed, gathered once into a stack buffer. Measured beside the BLAS calls in
// docs/notes20/gemm.md; small_gemm_pays holds the shapes where it won.
#pragma once

#include <cstdint>

namespace flowlet::detail {

// Whether small_gemm takes an m x n x k product (one matrix, f32 or f64): the CPU has AVX2 and FMA,
// n >= 2 (a column is GEMV's), k >= 2 (k = 1 is gemm_outer's), and either
//   - C is narrow (n <= 16: h @ W2 and h^T @ dy at every batch) up to kSmallGemmNarrowWork
//     multiply-adds, with k <= 512 when A is transposed (A^T's rows are strided columns then, read
//     a cache line per k), or
//   - k is short (k <= 16) with a wide C and B as stored, up to kSmallGemmShortWork. With B
//     transposed (dy @ W2^T) gathering it, even 8 x 8 blocks at a time, left flowlet's call at
//     0.85-0.93x of oneDNN's bare call (8-32 x 10 x 256): at m <= 8 small_sgemm_bt
//     (gemm_small_bt.hpp) takes them without a gather, the rest stay with oneDNN.
// Side by side on the 2-core VM (docs/notes20/gemm.md) those won against oneDNN's and OpenBLAS's
// single-threaded calls; beyond them oneDNN's blocking wins. f32 callers also ask
// thin_sgemm_beats_small (gemm_thin.hpp): at 64-1024 x 256 x 10 oneDNN's kernel was faster (round 4
// follow-up, docs/notes21/gemm.md). A transposed B must also fit
// kSmallGemmPackElements.
bool small_gemm_pays(int64_t m, int64_t n, int64_t k, bool transpose_a, bool transpose_b);

// Elements of a transposed B that small_gemm gathers on its stack (32 KiB of f64).
inline constexpr int64_t kSmallGemmPackElements = 4096;
inline constexpr double kSmallGemmNarrowWork = 1 << 22;
inline constexpr double kSmallGemmShortWork = 1 << 16;

// Whether the CPU runs the kernel (AVX2 and FMA; checked once).
bool small_gemm_supported();

// Row-major C[m, n] = alpha * op(A) op(B), or C += alpha * op(A) op(B) with accumulate, as
// cblas_?gemm(CblasRowMajor, ...) takes the operands (transposes as flags, leading dimensions in
// elements). Without accumulate C is written without being read (NaN there does not leak in).
// Each element sums its k terms in k order in up to four interleaved partial sums, one rounding
// per fused multiply-add. Correct for any shape; fast only where small_gemm_pays says so (a
// transposed B past kSmallGemmPackElements is gathered on the heap).
void small_gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                int64_t lda, const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc);
void small_gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
                int64_t lda, const double* b, int64_t ldb, bool accumulate, double* c, int64_t ldc);

}  // namespace flowlet::detail
