// The softmax arithmetic that softmax, log_softmax, softmax_cross_entropy (src/ops/nn.cpp) and the
// fused cross-entropy gradient (src/ops/cross_entropy_grad.cpp) share, so that the fused node's
// softmax is bit for bit the one eager's softmax op writes: one line of any stride, and f32 rows
// (softmax and the cross-entropy loss, with or without the probs the traced gradient reuses) with
// the vectorized exp; and how finely the loss splits its rows over the pool.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/vector_math.hpp"

namespace flowlet::detail {

// y[i * stride] = x[i * stride] - max - log(sum(exp(x - max))) for i < extent (Log), or its exp.
// The maximum is subtracted first so every exp is at most 1 (finite for any finite x); the sum is
// taken in f64 and its log rounded once to T.
template <bool Log, class T>
void softmax_line(const T* x, T* y, int64_t extent, int64_t stride) {
  T top = -std::numeric_limits<T>::infinity();
  for (int64_t i = 0; i < extent; ++i) top = std::max(top, x[i * stride]);
  double total = 0.0;
  for (int64_t i = 0; i < extent; ++i) total += std::exp(static_cast<double>(x[i * stride] - top));
  const T log_total = static_cast<T>(std::log(total));
  for (int64_t i = 0; i < extent; ++i) {
    const T shifted = x[i * stride] - top - log_total;
    y[i * stride] = Log ? shifted : std::exp(shifted);
  }
}

// Rows [begin, end) of a contiguous f32 [rows, extent] array: y_r = x_r - max(x_r), rounded to f32
// (what softmax_line's exp argument is), ready for one vector exp over the block.
inline void subtract_row_max_f32(const float* x, float* y, int64_t extent, int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) {
    const float* xr = x + r * extent;
    float* yr = y + r * extent;
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < extent; ++i) top = std::max(top, xr[i]);
    for (int64_t i = 0; i < extent; ++i) yr[i] = xr[i] - top;
  }
}

// sum(e[0, extent)) in f64: adding f32 terms in f64 costs the sum nothing but the terms' own error.
inline double row_sum_f64(const float* e, int64_t extent) {
  double total = 0.0;
  for (int64_t i = 0; i < extent; ++i) total += static_cast<double>(e[i]);
  return total;
}

// A row of exps e becomes the softmax e / sum, the f64 sum rounded to f32 once (softmax_rows_f32
// and cross_entropy_rows_f32's probabilities: the same arithmetic, so the same bits).
inline void normalize_row_f32(float* e, int64_t extent, double total) {
  const auto sum = static_cast<float>(total);
  for (int64_t i = 0; i < extent; ++i) e[i] /= sum;
}

// Softmax of rows [begin, end) of a contiguous f32 [rows, extent] array, the exps from `exp` (the
// vectorized exp, kernels/vector_math.hpp, <= 1 ulp): each row's x - max goes into y, one exp call
// covers the whole block (rows of 10 classes give it nothing to vectorize one at a time), then
// y = e / sum(e) with the sum in f64. Two libm exps per element (softmax_line) cost ~20 ns each;
// this is one vector exp. Each row's result depends on that row only, not on the block.
inline void softmax_rows_f32(VectorMathF32 exp, const float* x, float* y, int64_t extent, int64_t begin, int64_t end) {
  subtract_row_max_f32(x, y, extent, begin, end);
  exp(y + begin * extent, y + begin * extent, (end - begin) * extent);
  for (int64_t r = begin; r < end; ++r) normalize_row_f32(y + r * extent, extent, row_sum_f64(y + r * extent, extent));
}

// The cross-entropy loss of rows [begin, end) of contiguous f32 logits [rows, extent] with labels
// already checked to lie in [0, extent): loss_r = log(sum_c exp(d_rc)) - d_r,label, d = x - max(x)
// rounded to f32, the exps from `exp` (<= 1 ulp) over blocks of rows at once (as softmax_rows_f32),
// the sum and log in f64, the result rounded once. Against the exact loss of the f32 logits:
//   |loss - exact| <= 2^-23 (the exps, each <= 1 ulp, so their f64 sum is within 2^-23 relative
//                            and its log within 2^-23 absolute; the f64 sum and log add ~2^-52)
//                   + 2^-24 sum_c p_c |d_c| (d_c rounded to f32 in the exp's argument; p = softmax)
//                   + 2^-24 |d_label| (the same rounding in the picked logit)
//                   + 2^-24 |loss| (the final rounding to f32)
// (tests/test_nn.cpp checks this bound per row against an f64 reference). libm's f64 exp per
// element (softmax_line) cost 106-132 us at 1024 x 10 (profile_step); this is one vector exp.
// Each row's loss depends on that row only, so eager and traced (and any split) agree bit for bit.
// With `probs` (a contiguous [rows, extent] output) the exps are taken in place there and each row
// is then normalized as softmax_rows_f32 does it: the softmax op's bits, for the traced loss
// gradient to reuse (softmax_cross_entropy_with_probs, src/ops/cross_entropy_grad.hpp).
inline void cross_entropy_rows_f32(VectorMathF32 exp, const float* x, const int64_t* label, float* loss,
                                   int64_t extent, int64_t begin, int64_t end, float* probs = nullptr) {
  // At most ~16 KB of shifted logits at a time (at least one row), reused for every block.
  const int64_t block_rows = std::max<int64_t>(1, 4096 / std::max<int64_t>(extent, 1));
  std::vector<float> scratch(probs != nullptr ? 0 : static_cast<size_t>(std::min(block_rows, end - begin) * extent));
  for (int64_t first = begin; first < end; first += block_rows) {
    const int64_t last = std::min(end, first + block_rows);
    float* shifted = probs != nullptr ? probs + first * extent : scratch.data();
    subtract_row_max_f32(x + first * extent, shifted, extent, 0, last - first);
    // The picked d before the exp overwrites it, parked in the row's own output.
    for (int64_t r = first; r < last; ++r) loss[r] = shifted[(r - first) * extent + label[r]];
    exp(shifted, shifted, (last - first) * extent);
    for (int64_t r = first; r < last; ++r) {
      float* e = shifted + (r - first) * extent;
      const double total = row_sum_f64(e, extent);
      loss[r] = static_cast<float>(std::log(total) - static_cast<double>(loss[r]));
      if (probs != nullptr) normalize_row_f32(e, extent, total);
    }
  }
}

// The loss of one row of any float type with libm's exp and log in f64 (f64 logits, and f32 on a
// CPU without the vector exp): log(sum exp(x - max)) - (x_label - max), rounded once.
template <class T>
T cross_entropy_line(const T* row, int64_t label, int64_t extent) {
  T top = -std::numeric_limits<T>::infinity();
  for (int64_t c = 0; c < extent; ++c) top = std::max(top, row[c]);
  double total = 0.0;
  for (int64_t c = 0; c < extent; ++c) total += std::exp(static_cast<double>(row[c] - top));
  return static_cast<T>(std::log(total) - static_cast<double>(row[label] - top));
}

// Rows split over the pool from this many logits a piece (~15 us of the f32 loss): bench_loss_op
// at 2 threads, load 2-3, 1024 x 10 43 -> 29-38 us and 512 x 10 22 -> 15-19 us split; 256 x 10
// did not gain. Rows are independent, so results do not depend on the split (tests/test_nn.cpp).
inline constexpr int64_t kCrossEntropyGrainLogits = 4096;

}  // namespace flowlet::detail
