// The f32 kernels of the normalization ops (normalization.cpp calls them for f32 inputs; f64,
// f16 and bf16 keep its generic f64-accumulating loops): statistics through the blocked f32 lanes
// of kernels/norm_f32.hpp (f32 inside 256-element blocks, f64 between blocks; bounds there), and
// every elementwise pass in f32 on centered values.
//
// Batch norm works per channel, in parallel over channels, and per (n, c) row of S values: each
// row's mean and M2 around its own mean come from the row while it is in L1, and rows are combined
// in f64 in order (Chan et al.'s pairwise update), so a channel is read once for its statistics
// and once more to write y. Layer norm works per row. Elementwise passes subtract the f32 mean
// first (x - m is exact for x near m) instead of folding it into an offset, so a large mean does
// not cancel digits: y = (x - m) * scale + shift', dx = a dy + bx (x - m) + k'.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/norm_f32.hpp"
#include "ops/normalization_internal.hpp"

namespace flowlet::detail {
namespace {

// out[i] = (x[i] - center) * scale + shift over a run: the y and dx passes.
inline void centered_affine(const float* x, float center, float scale, float shift, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = (x[i] - center) * scale + shift;
}

}  // namespace

void bn_training_f32(const float* x, const float* gamma, const float* beta, const ChannelView& v, double eps, float* y,
                     float* mean_out, float* var_out) {
  parallel_for(v.c, channel_grain(v.count()), [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      // Rows combined in order: count, mean and M2 of the rows so far (Chan, Golub, LeVeque).
      double count = 0, mean = 0, m2 = 0;
      const auto s = static_cast<double>(v.s);
      for (int64_t n = 0; n < v.n; ++n) {
        const RunMoments row = moments_f32_run(x + (n * v.c + c) * v.s, v.s);
        const double total = count + s;
        const double delta = row.mean - mean;
        mean += delta * (s / total);
        m2 += row.m2 + delta * delta * (count * s / total);
        count = total;
      }
      const double var = m2 / count;
      const double scale = static_cast<double>(gamma[c]) / std::sqrt(var + eps);
      const auto center = static_cast<float>(mean);
      // y = (x - center) * scale + shift, shift = beta - (mean - center) * scale.
      const auto shift = static_cast<float>(static_cast<double>(beta[c]) - (mean - static_cast<double>(center)) * scale);
      for (int64_t n = 0; n < v.n; ++n) {
        const int64_t at = (n * v.c + c) * v.s;
        centered_affine(x + at, center, static_cast<float>(scale), shift, y + at, v.s);
      }
      mean_out[c] = static_cast<float>(mean);
      var_out[c] = static_cast<float>(var);
    }
  });
}

void bn_backward_f32(const float* x, const float* gamma, const float* mean, const float* var, const float* dy,
                     const ChannelView& v, double eps, float* dx, float* dgamma, float* dbeta) {
  const auto count = static_cast<double>(v.count());
  parallel_for(v.c, channel_grain(v.count()), [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const auto mu = static_cast<double>(mean[c]);
      const double rstd = 1.0 / std::sqrt(static_cast<double>(var[c]) + eps);
      double sum_dy = 0, sum_dy_xc = 0;
      for (int64_t n = 0; n < v.n; ++n) {
        const int64_t at = (n * v.c + c) * v.s;
        const WeightedSums row = weighted_sums_f32_run(dy + at, nullptr, x + at, mu, v.s);
        sum_dy += row.sum_w;
        sum_dy_xc += row.sum_w_xc;
      }
      const double dg = sum_dy_xc * rstd;
      const double a = static_cast<double>(gamma[c]) * rstd;
      // dx = a dy + bx (x - mean) - a sum_dy / M, written around the f32 center.
      const double bx = -a * dg * rstd / count;
      const auto center = static_cast<float>(mu);
      const double k = -a * sum_dy / count + bx * (static_cast<double>(center) - mu);
      const auto a_c = static_cast<float>(a), bx_c = static_cast<float>(bx), k_c = static_cast<float>(k);
      for (int64_t n = 0; n < v.n; ++n) {
        const int64_t at = (n * v.c + c) * v.s;
        const float* dy_row = dy + at;
        const float* x_row = x + at;
        float* dx_row = dx + at;
        for (int64_t s = 0; s < v.s; ++s) dx_row[s] = a_c * dy_row[s] + bx_c * (x_row[s] - center) + k_c;
      }
      dgamma[c] = static_cast<float>(dg);
      dbeta[c] = static_cast<float>(sum_dy);
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
      float* out = y + r * d;
      for (int64_t j = 0; j < d; ++j) out[j] = ((row[j] - center) * rstd_c + offset) * gamma[j] + beta[j];
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
  const int64_t blocks = std::clamp<int64_t>(std::min<int64_t>(64, (int64_t{1} << 22) / (2 * d)), 1, std::max<int64_t>(rows, 1));
  std::vector<double> partial(static_cast<size_t>(blocks * 2 * d), 0.0);
  parallel_for(blocks, 1, [&](int64_t first_block, int64_t last_block) {
    std::vector<float> columns(static_cast<size_t>(2 * d));
    for (int64_t block = first_block; block < last_block; ++block) {
      double* sum_dy = partial.data() + block * 2 * d;
      double* sum_dy_xh = sum_dy + d;
      float* col_dy = columns.data();
      float* col_dy_xh = col_dy + d;
      std::fill(columns.begin(), columns.end(), 0.0f);
      const int64_t first = rows * block / blocks, last = rows * (block + 1) / blocks;
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
        const float* dy_row = dy + at;
        const float* x_row = x + at;
        float* dx_row = dx + at;
        for (int64_t j = 0; j < d; ++j) {
          const float xh = (x_row[j] - center) * rstd_c - offset;
          dx_row[j] = a_c * (dy_row[j] * gamma[j]) + b_c * xh + k_c;
          col_dy[j] += dy_row[j];
          col_dy_xh[j] += dy_row[j] * xh;
        }
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
  for (int64_t j = 0; j < d; ++j) {
    double total_dy = 0, total_dy_xh = 0;
    for (int64_t b = 0; b < blocks; ++b) {
      total_dy += partial[static_cast<size_t>(b * 2 * d + j)];
      total_dy_xh += partial[static_cast<size_t>(b * 2 * d + d + j)];
    }
    dgamma[j] = static_cast<float>(total_dy_xh);
    dbeta[j] = static_cast<float>(total_dy);
  }
}

}  // namespace flowlet::detail
