// f32 run kernels for the normalization ops (src/ops/normalization.cpp): the moments of a run of
// floats (layer norm's rows, batch norm's per-(n, c) rows) and the two weighted sums their
// backward passes need.
//
// Accuracy design: f32 vector lanes inside blocks, f64 between blocks. A block is 256 elements:
// 32 lanes (four 8-float vectors) of 8 elements each, so every f32 partial is a sum of at most 8
// terms, with a relative error of at most 7 * 2^-24 of the sum of the terms' magnitudes; the 32
// partials are then widened and added in f64, and so are the blocks (the last few vectors of a run
// form a block of their own). The variance is computed around the run's own f32 mean m (a first
// pass): M2 = sum((x - m)^2) - (sum(x - m))^2 / n, mean = m + sum(x - m) / n, so the error of m
// itself drops out and a large mean costs no digits (x - m is exact when x and m are within a
// factor of 2). Stated bounds (tests/test_normalization.cpp checks them against f64 loops, data
// centered at 0 and at 1e4, with outliers): every sum here is within 10 * 2^-24 (6e-7) of the sum
// of its terms' magnitudes (a term's own roundings: at most 3), which makes the mean exact to
// 6e-7 of the mean absolute deviation and M2 to 6e-7 of itself.
// Against per-element f64 accumulation (the generic kernels: a conversion and an f64 add per
// element and sum) the f32 kernels measured 1.24-1.46x faster on one thread (batch norm
// [128, 32, 28, 28], layer norm [4096, 1024]; docs/notes19/reduce.md).
//
// The lane structure and the order of every addition are fixed by n alone (never by the thread
// count), so the same run always gives the same bits in one build. Across instruction sets they
// can differ in the last bits where the compiler fuses a multiply and an add (FMA with
// -march=native; the sums of reduce_f32.hpp have no products and match bit for bit).
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
