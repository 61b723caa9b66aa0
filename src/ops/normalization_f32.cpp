// The f32 kernels of the normalization ops (normalization.cpp calls them for f32 inputs; f64,
// f16 and bf16 keep its generic f64-accumulating loops): statistics through the blocked f32 lanes
// of kernels/norm_f32.hpp (f32 inside 256-element blocks, f64 between blocks; bounds there), and
// every elementwise pass in f32 on centered values.
//
// Batch norm works per (n, c) row of S values, rows in memory order (sequential streams, split
// evenly over threads): each row's mean and M2 around its own mean come from the row while it is
// in L1; rows are then combined per channel in f64 in n order (Chan et al.'s pairwise update), the
// same arithmetic whichever thread computed a row; a second pass in memory order writes y (or dx).
// Layer norm works per row. Elementwise passes subtract the f32 mean first (x - m is exact for x
// near m) instead of folding it into an offset, so a large mean does not cancel digits:
// y = (x - m) * scale + shift', dx = a dy + bx (x - m) + k'. Each pass writes an element only
// after reading that element's inputs, so an output that shared an input's buffer would still
// come out right.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/norm_f32.hpp"
#include "ops/normalization_internal.hpp"

namespace flowlet::detail {
namespace {

// The elementwise passes, as functions with restrict parameters: every pointer is a float*, and
// with plain pointers GCC did not vectorize the layer-norm backward loop (a scalar loop, 2x slower).

// out[i] = (x[i] - center) * scale + shift over a run: batch norm's y pass.
inline void centered_affine(const float* __restrict x, float center, float scale, float shift, float* __restrict out,
                            int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = (x[i] - center) * scale + shift;
}

// dx[i] = a dy[i] + bx (x[i] - center) + k over a run: batch norm's dx pass.
inline void bn_dx_run(const float* __restrict dy, const float* __restrict x, float a, float bx, float center, float k,
                      float* __restrict dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] = a * dy[i] + bx * (x[i] - center) + k;
}

// One row of layer norm's output: y = ((x - center) rstd + offset) gamma + beta.
inline void ln_y_row(const float* __restrict x, const float* __restrict gamma, const float* __restrict beta, float center,
                     float rstd, float offset, float* __restrict y, int64_t d) {
  for (int64_t j = 0; j < d; ++j) y[j] = ((x[j] - center) * rstd + offset) * gamma[j] + beta[j];
}

// One row of layer norm's backward: xh = (x - center) rstd - offset, dx = a dy gamma + b xh + k,
// and the row's terms of dbeta (dy) and dgamma (dy xh) added to the f32 column sums.
inline void ln_dx_row(const float* __restrict x, const float* __restrict dy, const float* __restrict gamma, float center,
                      float rstd, float offset, float a, float b, float k, float* __restrict dx, float* __restrict col_dy,
                      float* __restrict col_dy_xh, int64_t d) {
  for (int64_t j = 0; j < d; ++j) {
    const float xh = (x[j] - center) * rstd - offset;
    dx[j] = a * (dy[j] * gamma[j]) + b * xh + k;
    col_dy[j] += dy[j];
    col_dy_xh[j] += dy[j] * xh;
  }
}

}  // namespace

void bn_training_f32(const float* x, const float* gamma, const float* beta, const ChannelView& v, double eps, float* y,
                     float* mean_out, float* var_out) {
  // Pass 1, rows in memory order (one sequential stream, split evenly over threads): each row's
  // moments. Then per channel, rows combined in n order (Chan, Golub, LeVeque's update), so the
  // result is the same whoever computed which row.
  const int64_t rows = v.n * v.c;
  std::vector<RunMoments> row_moments(static_cast<size_t>(rows));
  parallel_for(rows, channel_grain(v.s), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) row_moments[static_cast<size_t>(r)] = moments_f32_run(x + r * v.s, v.s);
  });
  std::vector<float> center(static_cast<size_t>(v.c)), scale(static_cast<size_t>(v.c)), shift(static_cast<size_t>(v.c));
  const auto s = static_cast<double>(v.s);
  for (int64_t c = 0; c < v.c; ++c) {
    double count = 0, mean = 0, m2 = 0;
    for (int64_t n = 0; n < v.n; ++n) {
      const RunMoments& row = row_moments[static_cast<size_t>(n * v.c + c)];
      const double total = count + s;
      const double delta = row.mean - mean;
      mean += delta * (s / total);
      m2 += row.m2 + delta * delta * (count * s / total);
      count = total;
    }
    const double var = m2 / count;
    const double sc = static_cast<double>(gamma[c]) / std::sqrt(var + eps);
    const auto k = static_cast<size_t>(c);
    // y = (x - center) * scale + shift, shift = beta - (mean - center) * scale.
    center[k] = static_cast<float>(mean);
    scale[k] = static_cast<float>(sc);
    shift[k] = static_cast<float>(static_cast<double>(beta[c]) - (mean - static_cast<double>(center[k])) * sc);
    mean_out[c] = static_cast<float>(mean);
    var_out[c] = static_cast<float>(var);
  }
  // Pass 2, rows in memory order again (x is still in L3 when it fits there).
  parallel_for(rows, channel_grain(v.s), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const auto k = static_cast<size_t>(r % v.c);
      centered_affine(x + r * v.s, center[k], scale[k], shift[k], y + r * v.s, v.s);
    }
  });
}

void bn_backward_f32(const float* x, const float* gamma, const float* mean, const float* var, const float* dy,
                     const ChannelView& v, double eps, float* dx, float* dgamma, float* dbeta) {
  const auto count = static_cast<double>(v.count());
  // Pass 1 as in bn_training_f32: per-row sums in memory order, combined per channel in n order.
  const int64_t rows = v.n * v.c;
  std::vector<WeightedSums> row_sums(static_cast<size_t>(rows));
  parallel_for(rows, channel_grain(v.s), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      row_sums[static_cast<size_t>(r)] =
          weighted_sums_f32_run(dy + r * v.s, nullptr, x + r * v.s, static_cast<double>(mean[r % v.c]), v.s);
    }
  });
  std::vector<float> center(static_cast<size_t>(v.c)), a_c(static_cast<size_t>(v.c)), bx_c(static_cast<size_t>(v.c)),
      k_c(static_cast<size_t>(v.c));
  for (int64_t c = 0; c < v.c; ++c) {
    double sum_dy = 0, sum_dy_xc = 0;
    for (int64_t n = 0; n < v.n; ++n) {
      const WeightedSums& row = row_sums[static_cast<size_t>(n * v.c + c)];
      sum_dy += row.sum_w;
      sum_dy_xc += row.sum_w_xc;
    }
    const auto mu = static_cast<double>(mean[c]);
    const double rstd = 1.0 / std::sqrt(static_cast<double>(var[c]) + eps);
    const double dg = sum_dy_xc * rstd;
    const double a = static_cast<double>(gamma[c]) * rstd;
    // dx = a dy + bx (x - mean) - a sum_dy / M, written around the f32 center (= mean here).
    const double bx = -a * dg * rstd / count;
    const auto k = static_cast<size_t>(c);
    center[k] = static_cast<float>(mu);
    a_c[k] = static_cast<float>(a);
    bx_c[k] = static_cast<float>(bx);
    k_c[k] = static_cast<float>(-a * sum_dy / count + bx * (static_cast<double>(center[k]) - mu));
    dgamma[c] = static_cast<float>(dg);
    dbeta[c] = static_cast<float>(sum_dy);
  }
  parallel_for(rows, channel_grain(v.s), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const auto k = static_cast<size_t>(r % v.c);
      bn_dx_run(dy + r * v.s, x + r * v.s, a_c[k], bx_c[k], center[k], k_c[k], dx + r * v.s, v.s);
    }
  });
}

void ln_forward_f32(const float* x, const float* gamma, const float* beta, int64_t rows, int64_t d, double eps, float* y,
                    float* mean_out, float* rstd_out) {
  parallel_for(rows, channel_grain(d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = x + r * d;
      const RunMoments m = moments_f32_run(row, d);
      const double rstd = 1.0 / std::sqrt(m.m2 / static_cast<double>(d) + eps);
      const auto center = static_cast<float>(m.mean);
      // (x - mean) rstd = (x - center) rstd - (mean - center) rstd
      const auto rstd_c = static_cast<float>(rstd);
      const auto offset = static_cast<float>(-(m.mean - static_cast<double>(center)) * rstd);
      ln_y_row(row, gamma, beta, center, rstd_c, offset, y + r * d, d);
      mean_out[r] = static_cast<float>(m.mean);
      rstd_out[r] = static_cast<float>(rstd);
    }
  });
}

void ln_backward_f32(const float* x, const float* gamma, const float* mean, const float* rstd, const float* dy,
                     int64_t rows, int64_t d, float* dx, float* dgamma, float* dbeta) {
  // Row blocks, a count fixed by the shape (never by the thread count): each block writes dx for
  // its rows and accumulates its own dgamma and dbeta partials in the same sweep: in f32 columns
  // over at most kColumnRows rows (a sum of at most 8 terms per column, as in norm_f32.hpp), then
  // in f64. The blocks' partials are added in block order.
  constexpr int64_t kColumnRows = 8;
  LnColumnPartials partials(rows, d);
  parallel_for(partials.blocks, 1, [&](int64_t first_block, int64_t last_block) {
    std::vector<float> columns(static_cast<size_t>(2 * d));
    for (int64_t block = first_block; block < last_block; ++block) {
      double* sum_dy = partials.sum_dy(block);
      double* sum_dy_xh = partials.sum_dy_xh(block);
      float* col_dy = columns.data();
      float* col_dy_xh = col_dy + d;
      std::fill(columns.begin(), columns.end(), 0.0f);
      const int64_t first = partials.first_row(block, rows), last = partials.first_row(block + 1, rows);
      for (int64_t r = first; r < last; ++r) {
        const auto mu = static_cast<double>(mean[r]), rstd_r = static_cast<double>(rstd[r]);
        const int64_t at = r * d;
        const WeightedSums u = weighted_sums_f32_run(dy + at, gamma, x + at, mu, d);
        const double mean_u = u.sum_w / static_cast<double>(d);
        const double mean_u_xh = u.sum_w_xc * rstd_r / static_cast<double>(d);
        // dx = rstd (u - mean_u - xh mean_u_xh), xh = (x - mean) rstd = (x - center) rstd - offset.
        const auto center = static_cast<float>(mu);
        const auto rstd_c = static_cast<float>(rstd_r);
        const auto offset = static_cast<float>((mu - static_cast<double>(center)) * rstd_r);
        const auto a_c = rstd_c, b_c = static_cast<float>(-rstd_r * mean_u_xh), k_c = static_cast<float>(-rstd_r * mean_u);
        ln_dx_row(x + at, dy + at, gamma, center, rstd_c, offset, a_c, b_c, k_c, dx + at, col_dy, col_dy_xh, d);
        if ((r - first) % kColumnRows == kColumnRows - 1 || r == last - 1) {
          for (int64_t j = 0; j < d; ++j) {
            sum_dy[j] += static_cast<double>(col_dy[j]);
            sum_dy_xh[j] += static_cast<double>(col_dy_xh[j]);
          }
          std::fill(columns.begin(), columns.end(), 0.0f);
        }
      }
    }
  });
  partials.write(dgamma, dbeta);
}

}  // namespace flowlet::detail
