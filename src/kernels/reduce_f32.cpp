// The f32 run sum and max (see reduce_f32.hpp). GCC vector types (kernels/reduce_lanes.hpp): AVX2
// registers where the build targets them (-march=native), two SSE halves otherwise; the arithmetic
// and its order are the same.
#include "kernels/reduce_f32.hpp"

#include <algorithm>
#include <limits>

#include "kernels/reduce_lanes.hpp"

namespace flowlet::detail {
namespace {

using lanes::F32x8;
using lanes::F64x4;
using lanes::I32x8;
using lanes::load;
using lanes::store;
using lanes::widen_add;

constexpr int64_t kTree = 64;          // elements per 8-vector f32 tree: 8 vectors of 8 lanes
constexpr int64_t kStreamRun = 4096;   // runs this long or longer are read as four streams

// The pairwise f32 sum of the 8 vectors at p: ((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7)).
// Named vectors, not an array: GCC turned eight loads into an array into a 256-byte stack copy.
inline void tree(F32x8& t, const float* p) {
  F32x8 v0, v1, v2, v3, v4, v5, v6, v7;
  load(v0, p);
  load(v1, p + 8);
  load(v2, p + 16);
  load(v3, p + 24);
  load(v4, p + 32);
  load(v5, p + 40);
  load(v6, p + 48);
  load(v7, p + 56);
  t = ((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7));
}

}  // namespace

double sum_f32_run(const float* x, int64_t n) {
  static_assert(kShortRun == kTree);
  if (n < kTree) return sum_f32_short_run(x, n);  // short rows (softmax over classes, small axes): no tree
  // Runs of kStreamRun elements or more: the first 4 * quarter elements as four streams, one per
  // quarter, read side by side: each step takes one tree from each, adds them in pairs (a tree of
  // 16 per lane) into 4 f64 accumulators (two pairs; independent add chains hide the latency).
  // Four sequential streams keep more cache lines in flight than one (the hardware prefetcher runs
  // one stream each), and the sum is memory-bound: 16M f32, same process, interleaved, one thread
  // 21.9 against 18.2 GB/s for one stream (two streams 23.6 in another run, eight 20.6), two
  // threads 35.0 against 26.0 (see reduce_f32.hpp). Named pairs, not one array, so that they stay
  // in registers. Shorter runs (rows of a hidden layer) are read as one stream, four trees per
  // step, the same pairs: there the streams' jumps cost more than they bring (1 thread, rows in
  // cache, /tmp micro-benchmark 13:41, load 3.8: 4096 x 784 rows 385-426 us against 557-627 us
  // for four streams, 4096 x 256 62-79 against 77-84; 1024 x 4096 637 against 591-609).
  F64x4 first[2] = {}, second[2] = {};
  F32x8 t, u, v, w;
  int64_t i = 0;
  if (n >= kStreamRun) {
    const int64_t quarter = n / (4 * kTree) * kTree;
    const float* x1 = x + quarter;
    const float* x2 = x + 2 * quarter;
    const float* x3 = x + 3 * quarter;
    for (int64_t j = 0; j < quarter; j += kTree) {
      tree(t, x + j);
      tree(u, x1 + j);
      tree(v, x2 + j);
      tree(w, x3 + j);
      widen_add(first, t + u);
      widen_add(second, v + w);
    }
    i = 4 * quarter;
  }
  for (; i + 4 * kTree <= n; i += 4 * kTree) {  // one stream (the whole of a short run)
    tree(t, x + i);
    tree(u, x + i + kTree);
    tree(v, x + i + 2 * kTree);
    tree(w, x + i + 3 * kTree);
    widen_add(first, t + u);
    widen_add(second, v + w);
  }
  // The rest (under 4 trees): a pair of trees, a tree, vectors, then the last n % 8 elements as
  // one masked vector (zeros in the other lanes).
  if (i + 2 * kTree <= n) {
    tree(t, x + i);
    tree(u, x + i + kTree);
    widen_add(first, t + u);
    i += 2 * kTree;
  }
  if (i + kTree <= n) {
    tree(t, x + i);
    widen_add(second, t);
    i += kTree;
  }
  // Whole vectors of the tail still go through the f64 lanes, unpaired.
  for (; i + 8 <= n; i += 8) {
    load(t, x + i);
    widen_add(second, t);
  }
  if (i < n) {
    lanes::load_first(t, x + i, n - i);
    widen_add(second, t);
  }
  // Fixed-order combination: the accumulators pairwise, then the lanes in order.
  return lanes::lane_total((first[0] + first[1]) + (second[0] + second[1]));
}

namespace {

// Columns [0, 8 * Vectors) of the column sums: per group of 8 rows the tree of tree() down the
// rows, widened and added in f64; leftover rows one at a time.
template <int Vectors>
void column_strip(const float* x, int64_t rows, int64_t stride, double* out) {
  F64x4 acc[Vectors][2] = {};
  int64_t r = 0;
  for (; r + 8 <= rows; r += 8) {
    const float* p = x + r * stride;
    for (int k = 0; k < Vectors; ++k) {
      F32x8 v0, v1, v2, v3, v4, v5, v6, v7;
      load(v0, p + 8 * k);
      load(v1, p + stride + 8 * k);
      load(v2, p + 2 * stride + 8 * k);
      load(v3, p + 3 * stride + 8 * k);
      load(v4, p + 4 * stride + 8 * k);
      load(v5, p + 5 * stride + 8 * k);
      load(v6, p + 6 * stride + 8 * k);
      load(v7, p + 7 * stride + 8 * k);
      widen_add(acc[k], ((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7)));
    }
  }
  for (; r < rows; ++r) {
    for (int k = 0; k < Vectors; ++k) {
      F32x8 v;
      load(v, x + r * stride + 8 * k);
      widen_add(acc[k], v);
    }
  }
  for (int k = 0; k < Vectors; ++k) {
    for (int lane = 0; lane < 4; ++lane) {
      out[8 * k + lane] = acc[k][0][lane];
      out[8 * k + 4 + lane] = acc[k][1][lane];
    }
  }
}

// One column, with the same arithmetic as a vector lane of column_strip.
void column_scalar(const float* x, int64_t rows, int64_t stride, double* out) {
  double acc = 0;
  int64_t r = 0;
  for (; r + 8 <= rows; r += 8) {
    const float* p = x + r * stride;
    acc += static_cast<double>(((p[0] + p[stride]) + (p[2 * stride] + p[3 * stride])) +
                               ((p[4 * stride] + p[5 * stride]) + (p[6 * stride] + p[7 * stride])));
  }
  for (; r < rows; ++r) acc += static_cast<double>(x[r * stride]);
  *out = acc;
}

// Wide matrices, row group by row group: the 8 rows of a group are read side by side, 8 columns
// at a time, each column's tree added to its f64 total in out (which stays in cache), so memory is
// read as 8 sequential streams. The arithmetic per column is column_strip's exactly.
void wide_columns(const float* x, int64_t rows, int64_t stride, int64_t cols, double* out) {
  std::fill(out, out + cols, 0.0);
  int64_t r = 0;
  for (; r + 8 <= rows; r += 8) {
    const float* p = x + r * stride;
    int64_t j = 0;
    for (; j + 8 <= cols; j += 8) {
      F32x8 v0, v1, v2, v3, v4, v5, v6, v7;
      load(v0, p + j);
      load(v1, p + stride + j);
      load(v2, p + 2 * stride + j);
      load(v3, p + 3 * stride + j);
      load(v4, p + 4 * stride + j);
      load(v5, p + 5 * stride + j);
      load(v6, p + 6 * stride + j);
      load(v7, p + 7 * stride + j);
      F64x4 acc[2];  // one vector at a time: a 64-byte memcpy of both went through the stack
      load(acc[0], out + j);
      load(acc[1], out + j + 4);
      widen_add(acc, ((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7)));
      store(out + j, acc[0]);
      store(out + j + 4, acc[1]);
    }
    for (; j < cols; ++j) {
      const float* q = p + j;
      out[j] += static_cast<double>(((q[0] + q[stride]) + (q[2 * stride] + q[3 * stride])) +
                                    ((q[4 * stride] + q[5 * stride]) + (q[6 * stride] + q[7 * stride])));
    }
  }
  for (; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) out[j] += static_cast<double>(x[r * stride + j]);
}

}  // namespace

void sum_f32_columns(const float* x, int64_t rows, int64_t stride, int64_t cols, double* out) {
  if (cols > 64) return wide_columns(x, rows, stride, cols, out);
  int64_t j = 0;
  for (; j + 32 <= cols; j += 32) column_strip<4>(x + j, rows, stride, out + j);
  for (; j + 8 <= cols; j += 8) column_strip<1>(x + j, rows, stride, out + j);
  for (; j < cols; ++j) column_scalar(x + j, rows, stride, out + j);
}

void sum_f32_rows(const float* x, int64_t rows, int64_t n, float* out) {
  if (n < kShortRun) {
    for (int64_t r = 0; r < rows; ++r) out[r] = static_cast<float>(sum_f32_short_run(x + r * n, n));
  } else {
    for (int64_t r = 0; r < rows; ++r) out[r] = static_cast<float>(sum_f32_run(x + r * n, n));
  }
}

float max_f32_run(const float* x, int64_t n) {
  constexpr float kLowest = -std::numeric_limits<float>::infinity();
  F32x8 best[4] = {F32x8{} + kLowest, F32x8{} + kLowest, F32x8{} + kLowest, F32x8{} + kLowest};
  I32x8 nan = {};  // lanes that have seen a NaN
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int k = 0; k < 4; ++k) {
      F32x8 v;
      load(v, x + i + 8 * k);
      best[k] = v > best[k] ? v : best[k];
      nan |= v != v;
    }
  }
  for (; i + 8 <= n; i += 8) {
    F32x8 v;
    load(v, x + i);
    best[0] = v > best[0] ? v : best[0];
    nan |= v != v;
  }
  F32x8 all = best[0];
  for (int k = 1; k < 4; ++k) all = best[k] > all ? best[k] : all;
  bool any_nan = false;
  float result = kLowest;
  for (int lane = 0; lane < 8; ++lane) {
    any_nan |= nan[lane] != 0;
    result = all[lane] > result ? all[lane] : result;
  }
  for (; i < n; ++i) {
    any_nan |= x[i] != x[i];
    result = x[i] > result ? x[i] : result;
  }
  return any_nan ? std::numeric_limits<float>::quiet_NaN() : result;
}

}  // namespace flowlet::detail
