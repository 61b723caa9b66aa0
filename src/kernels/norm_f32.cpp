// The f32 moment and weighted-sum runs of the normalization ops (see norm_f32.hpp). GCC vector
// types (kernels/reduce_lanes.hpp): AVX2 registers where the build targets them (-march=native),
// SSE halves otherwise; the arithmetic and its order are the same either way.
#include "kernels/norm_f32.hpp"

#include <algorithm>

#include "kernels/reduce_lanes.hpp"

namespace flowlet::detail {
namespace {

using lanes::F32x8;
using lanes::F64x4;
using lanes::load;
using lanes::widen_add;

inline double total(const F64x4* acc) { return lanes::lane_total(acc[0] + acc[1]); }

constexpr int64_t kVectors = 4;                // independent f32 accumulators per sum
constexpr int64_t kStep = 8 * kVectors;        // elements per step: one per lane
constexpr int64_t kBlock = 8 * kStep;          // elements per f32 block: 8 per lane

// Runs `step(i, k, sums)` for every vector of 8 elements at i (k: which of the kVectors
// accumulators), with Sums f32 accumulators per block of at most kBlock elements, each block's
// widened into the f64 pair acc[s]; returns the index of the first element not covered (n rounded
// down to a multiple of 8). Blocks hold whole steps of kStep elements; the last few vectors (fewer
// than kVectors) form one more block of their own, so the main loop has no partial step (with one,
// GCC kept the accumulators in memory).
template <int Sums, class Step>
int64_t blocked_lanes(int64_t n, F64x4 (&acc)[Sums][2], Step step) {
  int64_t i = 0;
  const int64_t whole_steps = n - n % kStep;
  while (i < whole_steps) {
    const int64_t block_end = std::min(whole_steps, i + kBlock);
    F32x8 sums[Sums][kVectors] = {};
    for (; i < block_end; i += kStep)
      for (int k = 0; k < kVectors; ++k) step(i + 8 * k, k, sums);
    for (int s = 0; s < Sums; ++s)
      for (int k = 0; k < kVectors; ++k) widen_add(acc[s], sums[s][k]);
  }
  if (i + 8 <= n) {
    F32x8 sums[Sums][kVectors] = {};
    int k = 0;
    for (; i + 8 <= n; i += 8, ++k) step(i, k, sums);
    for (int s = 0; s < Sums; ++s)
      for (int j = 0; j < k; ++j) widen_add(acc[s], sums[s][j]);
  }
  return i;
}

}  // namespace

RunMoments moments_f32_run(const float* x, int64_t n) {
  F64x4 sum[1][2] = {};
  int64_t i = blocked_lanes<1>(n, sum, [&](int64_t at, int k, F32x8 (&s)[1][kVectors]) {
    F32x8 v;
    load(v, x + at);
    s[0][k] += v;
  });
  double first = total(sum[0]);
  for (; i < n; ++i) first += static_cast<double>(x[i]);
  const auto center = static_cast<float>(first / static_cast<double>(n));

  // Deviations from the f32 mean, and their squares; M2 = sum(d^2) - sum(d)^2 / n.
  F64x4 dev[2][2] = {};
  const F32x8 c = F32x8{} + center;
  i = blocked_lanes<2>(n, dev, [&](int64_t at, int k, F32x8 (&s)[2][kVectors]) {
    F32x8 v;
    load(v, x + at);
    const F32x8 d = v - c;
    s[0][k] += d;
    s[1][k] += d * d;
  });
  double sum_d = total(dev[0]), sum_d2 = total(dev[1]);
  for (; i < n; ++i) {
    const double d = static_cast<double>(x[i] - center);
    sum_d += d;
    sum_d2 += d * d;
  }
  const double nd = static_cast<double>(n);
  return {static_cast<double>(center) + sum_d / nd, std::max(0.0, sum_d2 - sum_d * sum_d / nd)};
}

WeightedSums weighted_sums_f32_run(const float* dy, const float* gamma, const float* x, double center, int64_t n) {
  const auto c32 = static_cast<float>(center);
  const F32x8 c = F32x8{} + c32;
  F64x4 acc[2][2] = {};
  int64_t i = 0;
  if (gamma == nullptr) {
    i = blocked_lanes<2>(n, acc, [&](int64_t at, int k, F32x8 (&s)[2][kVectors]) {
      F32x8 w, v;
      load(w, dy + at);
      load(v, x + at);
      s[0][k] += w;
      s[1][k] += w * (v - c);
    });
  } else {
    i = blocked_lanes<2>(n, acc, [&](int64_t at, int k, F32x8 (&s)[2][kVectors]) {
      F32x8 w, g, v;
      load(w, dy + at);
      load(g, gamma + at);
      load(v, x + at);
      w *= g;
      s[0][k] += w;
      s[1][k] += w * (v - c);
    });
  }
  double sum_w = total(acc[0]), sum_w_xc = total(acc[1]);
  for (; i < n; ++i) {
    const float w = gamma == nullptr ? dy[i] : dy[i] * gamma[i];
    sum_w += static_cast<double>(w);
    sum_w_xc += static_cast<double>(w * (x[i] - c32));
  }
  // sum(w (x - center)) = sum(w (x - c32)) + (c32 - center) sum(w).
  return {sum_w, sum_w_xc + (static_cast<double>(c32) - center) * sum_w};
}

}  // namespace flowlet::detail
