// The B = 8 backward product dy @ W2^T (m <= 8 rows, a short k such as 10 classes, B stored [n, k]
// and used transposed) as our own AVX2/FMA loop without gathering B^T: small_gemm's gather of a
// 256 x 10 B^T took 450-600 of its 1150 ns (docs/notes21/gemm.md), level with oneDNN's whole call.
// Here A's k columns sit in registers as vectors over its (at most 8) rows, each row of the stored
// B is read in place and broadcast, so four of C's columns come out as four vectors over C's rows,
// transposed in registers before they are stored. f32 only (f64 keeps OpenBLAS).
#pragma once

#include <cstdint>

namespace flowlet::detail {

// The most rows and the longest k small_sgemm_bt takes (A's k columns live in registers).
inline constexpr int64_t kSmallBtMaxRows = 8;
inline constexpr int64_t kSmallBtMaxDepth = 12;

// Whether small_sgemm_bt takes an f32 m x n x k product with B transposed: AVX2 and FMA, m in
// [2, kSmallBtMaxRows] (a single row is GEMV's), k in [2, kSmallBtMaxDepth], n in [16, 256], or up
// to 1024 with all 8 rows (where it beat oneDNN's sgemm; fewer rows leave lanes idle).
bool small_sgemm_bt_pays(int64_t m, int64_t n, int64_t k, bool transpose_b);

// Row-major C[m, n] = alpha * op(A) B^T (or C += with accumulate), B stored [n, k] with row step
// ldb, op(A) as cblas takes it (transpose_a: A stored [k, m]). Without accumulate C is written
// without being read. Each element sums its k terms in k order, one rounding per fused
// multiply-add. Requires m <= kSmallBtMaxRows and k <= kSmallBtMaxDepth and a CPU with AVX2 and FMA.
void small_sgemm_bt(bool transpose_a, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                    const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc);

}  // namespace flowlet::detail
