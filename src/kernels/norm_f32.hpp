// f32 run kernels for the normalization ops (src/ops/normalization.cpp): the moments of a run of
// floats (layer norm's rows, batch norm's per-(n, c) rows) and the two weighted sums their
// backward passes need.
//
// Accuracy design: f32 vector lanes inside blocks, f64 between blocks. A block is 256 elements:
// 32 lanes (four 8-float vectors) of 8 elements each, so every f32 partial is a sum of at most 8
// terms, with a relative error of at most 7 * 2^-24 (4.2e-7) of the sum of the terms' magnitudes;
// the 32 partials are then widened and added in f64, and so are the blocks. The variance is
// computed around the run's own f32 mean, m: M2 = sum((x - m)^2) - (sum(x - m))^2 / n, whose
// second term removes the error of m itself (to first order), so a large mean does not cost
// digits (x - m is exact when x and m are within a factor of 2). Bounds, for the tests: the sum,
// mean and the weighted sums are within 8 * 2^-24 * sum(|terms|) (+ f64 rounding); M2 within
// 10 * 2^-24 * M2 + 8 * 2^-24 * |sum(x - m)| * max|x - m| / ... (negligible when m is the f32 mean).
// Against per-element f64 accumulation (two conversions and two f64 adds per element, on lanes
// half as wide) this is about 4 times less arithmetic per element for rows that sit in cache.
//
// The lane structure and the order of every addition are fixed by n alone (never by the thread
// count or the instruction set), so the same run always gives the same bits.
#pragma once

#include <cstdint>

namespace flowlet::detail {

// The mean of x[0..n) and the sum of squared deviations from it (n >= 1).
struct RunMoments {
  double mean = 0;
  double m2 = 0;
};
RunMoments moments_f32_run(const float* x, int64_t n);

// With w = dy * gamma elementwise (gamma == nullptr: w = dy): sum(w) and sum(w * (x - center)).
// center is rounded to f32 for the lanes and the difference corrected in f64 (exact to first order).
struct WeightedSums {
  double sum_w = 0;
  double sum_w_xc = 0;
};
WeightedSums weighted_sums_f32_run(const float* dy, const float* gamma, const float* x, double center, int64_t n);

}  // namespace flowlet::detail
