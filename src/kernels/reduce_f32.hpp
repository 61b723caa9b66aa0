// f32 row kernels for the reductions (src/ops/reduce.cpp): the sum and the max of a contiguous run,
// the sums of many short rows, and column sums.
//
// Sum: pairwise f32 trees of 16 elements per lane, f64 between trees, runs of 4096 elements or
// more read as four streams; runs under 64 elements (sum_f32_short_run) are widened to f64 whole.
// Why this shape: the sum is memory-bound, yet how many instructions the core spends per byte
// decides how far ahead its out-of-order window reads memory, and so the bandwidth one thread gets.
// Every element widened to f64 (the first loop), or every pair (an f32 add per pair, then f64, ~50
// instructions per 64 floats as GCC 12 compiled it), ran 20-30% slower than a plain f32 loop on
// one thread (11.7 against 14.9 GB/s, Zen 3). Here each lane adds 16 elements as a pairwise tree
// in f32: two trees of 8 (one element from each of 8 consecutive vectors),
// ((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7)), added together; only that is widened and
// accumulated in f64 (16.9 GB/s on one thread against 14.2 for trees of 8 and 11.7 for pairs).
// In runs of 4096 or more the two trees of a pair come from different quarters of the run: the
// run's first 4 * floor(n / 256) * 64 elements are read as four sequential streams side by side
// (one tree from each per step), which keeps more cache lines in flight than one stream (shorter
// runs, rows of a hidden layer, read four consecutive trees per step: there the streams cost
// more than they bring, see sum_f32_run). The last n % 8 elements are one masked vector. 16M f32 through
// the op, same process, interleaved rounds (/tmp driver, 10:43, load 6.3): one thread 21.9 GB/s
// against 18.2 for one stream (two streams: 23.6 against 21.0 in another run; eight: 20.6), two
// threads 35.0 against 26.0 (libtorch 28.1 in the same rounds). Accuracy: each element passes
// through at most 4 f32 roundings, so for inputs of one sign the relative error is at most
// 4 * 2^-24 (2.4e-7) plus the f64 accumulation's (about n * 2^-53), against up to n * 2^-24 for a
// plain f32 loop; typical data loses far less (16M x 0.1f sums exactly: a tree of equal values
// only doubles them; the adversarial runs of tests/test_reduce.cpp stay within 1e-7), and
// everything after the tree is f64. Column sums use trees of 8 rows (3 roundings).
//
// The lane structure (the streams, trees of 16 and 8 vectors, 4 f64 accumulators, the masked
// tail, fixed combination order) depends only on n, not on the instruction set or the thread count, so the
// same run of floats always gives the same bits.
#pragma once

#include <cstdint>

#include "kernels/reduce_lanes.hpp"

namespace flowlet::detail {

// Sum of x[0..n) as described above (n >= 0; 0 for an empty run).
double sum_f32_run(const float* x, int64_t n);

// sum_f32_run for n < 64 (its first branch), inline: rows of 10 classes are summed 65536 at a time,
// and a call per row cost three times the sum (1 thread, 65536 x 10: 1.66 ms through the call,
// 0.55 ms inline, /tmp micro-benchmark 13:26). Every element, the last n % 8 too (a masked load,
// zeros in the other lanes), is widened into two f64 accumulators, so there is no f32 rounding at
// all and one horizontal add per row instead of a scalar f64 chain over the tail, which bounded
// how many rows the core overlapped (the tail's dependent adds took 40% of the profile).
inline double sum_f32_short_run(const float* x, int64_t n) {
  lanes::F64x4 acc[2] = {};
  int64_t i = 0;
  lanes::F32x8 v;
  for (; i + 8 <= n; i += 8) {
    lanes::load(v, x + i);
    lanes::widen_add(acc, v);
  }
  if (i < n) {
    lanes::load_first(v, x + i, n - i);
    lanes::widen_add(acc, v);
  }
  return lanes::lane_total(acc[0] + acc[1]);
}
inline constexpr int64_t kShortRun = 64;  // below this, sum_f32_run is sum_f32_short_run

// Column sums: out[j] = sum over r in [0, rows) of x[r * stride + j], for j in [0, cols). Each
// column adds its rows in groups of 8 as the same pairwise f32 tree (then f64), so the same bounds
// hold, and a column's bits do not depend on which other columns are summed with it.
void sum_f32_columns(const float* x, int64_t rows, int64_t stride, int64_t cols, double* out);

// Max of x[0..n): NaN if any element is NaN, -inf for an empty run. Branch-free vector lanes (the
// generic lane loop compiled to compare-and-branch per element: 3 ns per element on random data).
float max_f32_run(const float* x, int64_t n);

// out[r] = sum_f32_run(x + r * n, n) rounded to f32, for r in [0, rows): short rows without a call
// per row.
void sum_f32_rows(const float* x, int64_t rows, int64_t n, float* out);

}  // namespace flowlet::detail
