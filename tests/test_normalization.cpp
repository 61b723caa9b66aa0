// Batch normalization, layer normalization and dropout: hand-worked cases and f64 reference loops
// for the forward values (f32 statistics of data with a large mean too), second-order gradients
// through nested tapes against finite differences (first-order ones: test_autodiff's table),
// traced against eager, batch_norm()'s running statistics against a hand-computed moving average
// (eagerly and inside a traced step), and dropout: its exact mask against an independent Philox,
// the share of zeros, the scale, the gradient's mask, manual_seed reproducibility eagerly and
// traced, a new mask per traced call, per-device states, threads, and errors.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "support/reference.hpp"
#include "support/thread_count_child.hpp"

namespace {

// ---------------------------------------------------------------------------------------------
// References

struct BatchStats {
  std::vector<double> y, mean, var;  // var biased
};

// x [N, C, ...] per channel over every other axis, in f64 from the stored values.
BatchStats batch_norm_reference(const fl::Tensor& xt, const std::vector<double>& gamma, const std::vector<double>& beta,
                                double eps) {
  const std::vector<double> x = test::values(xt);
  const int64_t n = xt.shape()[0], c = xt.shape()[1], s = xt.numel() / std::max<int64_t>(n * c, 1);
  BatchStats out{std::vector<double>(x.size()), std::vector<double>(static_cast<size_t>(c)),
                 std::vector<double>(static_cast<size_t>(c))};
  for (int64_t ch = 0; ch < c; ++ch) {
    std::vector<double> vals;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < s; ++j) vals.push_back(x[static_cast<size_t>((i * c + ch) * s + j)]);
    double m = 0;
    for (double v : vals) m += v;
    m /= static_cast<double>(vals.size());
    double var = 0;
    for (double v : vals) var += (v - m) * (v - m);
    var /= static_cast<double>(vals.size());
    const auto k = static_cast<size_t>(ch);
    out.mean[k] = m;
    out.var[k] = var;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < s; ++j) {
        const auto at = static_cast<size_t>((i * c + ch) * s + j);
        out.y[at] = (x[at] - m) / std::sqrt(var + eps) * gamma[k] + beta[k];
      }
  }
  return out;
}

// Philox-4x32-10 written from Salmon et al. (SC'11), independent of src/kernels/philox.hpp, and
// checked below against the Random123 known-answer vectors.
std::array<uint32_t, 4> philox_reference(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k[0] += 0x9E3779B9u;
      k[1] += 0xBB67AE85u;
    }
    const uint64_t p0 = uint64_t{0xD2511F53u} * c[0], p1 = uint64_t{0xCD9E8D57u} * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1), static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1],
         static_cast<uint32_t>(p0)};
  }
  return c;
}

// The documented mask (src/kernels/dropout_mask.hpp): stream index k = offset + i uses word k % 4 of
// block k / 4 (counter (k / 4) as two 32-bit words, key = seed); kept when word / 2^32 >= rate.
std::vector<bool> dropout_mask_reference(uint64_t seed, uint64_t offset, int64_t n, double rate) {
  std::vector<bool> keep;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t k = offset + static_cast<uint64_t>(i), block = k / 4;
    const auto words = philox_reference({static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 0, 0},
                                        {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
    keep.push_back(static_cast<double>(words[k % 4]) / 4294967296.0 >= rate);
  }
  return keep;
}

std::vector<int64_t> state_of(const fl::Generator& g, fl::Device device = fl::Device("cpu")) {
  return g.state(device).value().to_vector<int64_t>();
}

// Central differences of a scalar function of x's values, in f64.
std::vector<double> numeric_gradient(const fl::Tensor& x, const std::function<double(const fl::Tensor&)>& f, double h = 1e-6) {
  std::vector<double> base = test::values(x), out(base.size());
  for (size_t i = 0; i < base.size(); ++i) {
    std::vector<double> moved = base;
    moved[i] = base[i] + h;
    const double plus = f(test::make(moved, x.shape(), fl::f64));
    moved[i] = base[i] - h;
    const double minus = f(test::make(moved, x.shape(), fl::f64));
    out[i] = (plus - minus) / (2 * h);
  }
  return out;
}

double scalar_value(const fl::Tensor& t) { return test::values(t).at(0); }

// The attributes of the normalization ops (src/ops/conv_attrs.hpp NormAttrs: eps, normalized_dims),
// for calling the forward and backward ops directly.
struct NormAttrs {
  double eps = 1e-5;
  int64_t normalized_dims = 1;
};
const NormAttrs kNormAttrs;

}  // namespace

// ---------------------------------------------------------------------------------------------
// Forward values

TEST_CASE("batch_norm_training: a hand-worked case") {
  // One channel, values 1..4: mean 2.5, biased var 1.25; y = 2 (x - 2.5) / sqrt(1.25) + 1 with eps 0.
  const fl::Tensor x = test::make({1, 2, 3, 4}, fl::Shape{4, 1}, fl::f64);
  const fl::BatchNormOutput o = fl::batch_norm_training(x, test::make({2}, fl::f64), test::make({1}, fl::f64), 0.0);
  const double r = 1 / std::sqrt(1.25);
  test::check_tensor(o.y, {1 - 3 * r, 1 - r, 1 + r, 1 + 3 * r}, fl::Shape{4, 1}, fl::f64);
  test::check_tensor(o.mean, {2.5}, fl::Shape{1}, fl::f64);
  test::check_tensor(o.var, {1.25}, fl::Shape{1}, fl::f64);
}

TEST_CASE("batch_norm_training and batch_norm_inference match an f64 reference loop") {
  for (const fl::Shape& s : {fl::Shape{5, 3}, fl::Shape{4, 3, 5, 6}, fl::Shape{2, 7, 9}, fl::Shape{3, 16, 8, 8}}) {
    for (fl::DType dt : {fl::f32, fl::f64}) {
      CAPTURE(test::shape_text(s));
      CAPTURE(dt);
      const fl::Tensor x = test::random_tensor(s, 11, dt);
      const fl::Shape c{s[1]};
      const fl::Tensor gamma = test::random_tensor(c, 12, dt), beta = test::random_tensor(c, 13, dt);
      const BatchStats want = batch_norm_reference(x, test::values(gamma), test::values(beta), 1e-5);
      const fl::BatchNormOutput got = fl::batch_norm_training(x, gamma, beta);
      const test::Tolerance tol = dt == fl::f64 ? test::Tolerance{1e-12, 1e-12} : test::Tolerance{1e-5, 1e-5};
      test::check_tensor(got.y, want.y, s, dt, tol);
      test::check_tensor(got.mean, want.mean, c, dt, tol);
      test::check_tensor(got.var, want.var, c, dt, tol);
      // Inference with the batch's own statistics gives the training output.
      test::check_tensor(fl::batch_norm_inference(x, gamma, beta, got.mean, got.var), want.y, s, dt, tol);
    }
  }
}

TEST_CASE("batch_norm_training: f32 statistics of data with a large mean keep the variance") {
  // Values 1e4 + N(0, 1): a one-pass E[x^2] - E[x]^2 in f32 would lose every digit of the variance.
  std::vector<double> v = test::random_values(8 * 2 * 16, 21, fl::f64);
  for (double& e : v) e = static_cast<double>(static_cast<float>(1e4 + e));
  const fl::Tensor x = test::make(v, fl::Shape{8, 2, 16}, fl::f32);
  const BatchStats want = batch_norm_reference(x, {1, 1}, {0, 0}, 1e-5);
  const fl::BatchNormOutput got = fl::batch_norm_training(x, fl::ones({2}), fl::zeros({2}));
  test::check_tensor(got.var, want.var, fl::Shape{2}, fl::f32, test::Tolerance{1e-5, 0});
  test::check_tensor(got.y, want.y, x.shape(), fl::f32, test::Tolerance{1e-3, 1e-3});

  // The one-pass statistics shift by a channel's first value: an outlier there (1e6 among N(0, 1)
  // values) must not cost accuracy either.
  std::vector<double> w = test::random_values(64 * 2, 22, fl::f64);
  for (double& e : w) e = static_cast<double>(static_cast<float>(e));
  w[0] = 1e6;  // channel 0's first value
  const fl::Tensor xo = test::make(w, fl::Shape{64, 2}, fl::f32);
  const BatchStats want_o = batch_norm_reference(xo, {1, 1}, {0, 0}, 1e-5);
  const fl::BatchNormOutput got_o = fl::batch_norm_training(xo, fl::ones({2}), fl::zeros({2}));
  test::check_tensor(got_o.var, want_o.var, fl::Shape{2}, fl::f32, test::Tolerance{1e-6, 0});
  test::check_tensor(got_o.mean, want_o.mean, fl::Shape{2}, fl::f32, test::Tolerance{1e-6, 1e-6});
}

TEST_CASE("layer_norm: a hand-worked case and an f64 reference loop") {
  // Rows {1, 2, 3} (mean 2, var 2/3) and {0, 0, 6} (mean 2, var 8), eps 0, gamma 1, beta 0.
  const fl::Tensor x = test::make({1, 2, 3, 0, 0, 6}, fl::Shape{2, 3}, fl::f64);
  const fl::Tensor y = fl::layer_norm(x, fl::ones({3}, fl::f64), fl::zeros({3}, fl::f64), 1, 0.0);
  const double a = 1 / std::sqrt(2.0 / 3.0), b = 1 / std::sqrt(8.0);
  test::check_tensor(y, {-a, 0, a, -2 * b, -2 * b, 4 * b}, fl::Shape{2, 3}, fl::f64);

  // [2, 3, 4] over the last two axes: 2 rows of 12, with gamma and beta [3, 4].
  const fl::Tensor x3 = test::random_tensor({2, 3, 4}, 31, fl::f64);
  const fl::Tensor g = test::random_tensor({3, 4}, 32, fl::f64), bt = test::random_tensor({3, 4}, 33, fl::f64);
  const std::vector<double> xv = test::values(x3), gv = test::values(g), bv = test::values(bt);
  std::vector<double> want(24);
  for (int r = 0; r < 2; ++r) {
    double m = 0, var = 0;
    for (int j = 0; j < 12; ++j) m += xv[r * 12 + j] / 12;
    for (int j = 0; j < 12; ++j) var += (xv[r * 12 + j] - m) * (xv[r * 12 + j] - m) / 12;
    for (int j = 0; j < 12; ++j) want[r * 12 + j] = (xv[r * 12 + j] - m) / std::sqrt(var + 1e-5) * gv[j] + bv[j];
  }
  test::check_tensor(fl::layer_norm(x3, g, bt, 2), want, fl::Shape{2, 3, 4}, fl::f64);
}

// ---------------------------------------------------------------------------------------------
// The f32 kernels (src/ops/normalization_f32.cpp, kernels/norm_f32.hpp): f32 lanes inside blocks,
// f64 between them. Their stated bounds: sums within 10 * 2^-24 (6e-7) of the magnitudes of their
// centered terms, so the mean within about 6e-7 * the mean deviation, the variance within about
// 6e-7 of itself, whatever the mean; every elementwise pass a few f32 roundings. Checked against
// f64 loops over the same f32 values, for data centered at 0, at 1e4 (where a single f32 pass of
// E[x^2] - E[x]^2 keeps no digit) and with outliers, over row lengths with vector tails.

namespace {

// f32 data: N(0, 1) * spread + mean, with `outliers` (value 300 * spread + mean) at fixed places.
fl::Tensor f32_data(const fl::Shape& shape, uint64_t seed, double mean, double spread, bool outliers) {
  std::vector<double> v = test::random_values(shape.numel(), seed, fl::f64);
  for (size_t i = 0; i < v.size(); ++i) {
    const bool outlier = outliers && (i % 97 == 0 || i % 1000 == 999);
    v[i] = static_cast<double>(static_cast<float>(mean + spread * (outlier ? 300.0 : v[i])));
  }
  return test::make(v, shape, fl::f32);
}

struct Moments {
  double mean = 0, var = 0, mean_abs_dev = 0;
};
Moments moments_of(const std::vector<double>& vals) {
  Moments m;
  for (double v : vals) m.mean += v;
  m.mean /= static_cast<double>(vals.size());
  for (double v : vals) {
    m.var += (v - m.mean) * (v - m.mean);
    m.mean_abs_dev += std::abs(v - m.mean);
  }
  m.var /= static_cast<double>(vals.size());
  m.mean_abs_dev /= static_cast<double>(vals.size());
  return m;
}

// |got - want| <= bound for every element, reporting the worst ratio.
void check_within(const std::vector<double>& got, const std::vector<double>& want, const std::vector<double>& bound,
                  const char* what) {
  REQUIRE(got.size() == want.size());
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double ratio = std::abs(got[i] - want[i]) / bound[i];
    if (!(ratio <= worst)) {
      worst = ratio;
      at = i;
    }
  }
  INFO(what << ": worst error / bound " << worst << " at " << at << " (got " << got[at] << ", want " << want[at] << ")");
  CHECK(worst <= 1.0);
}

constexpr double kF32 = 0x1p-24;  // unit roundoff of f32

}  // namespace

TEST_CASE("f32 batch norm forward and backward stay within the stated bounds of f64 loops") {
  for (const fl::Shape& shape : {fl::Shape{3, 4, 7, 9}, fl::Shape{2, 3, 33}, fl::Shape{4, 2, 16, 16}, fl::Shape{5, 2, 1000},
                                 fl::Shape{2, 3, 40}}) {
    for (const double mean : {0.0, 1e4}) {
      for (const bool outliers : {false, true}) {
        CAPTURE(test::shape_text(shape));
        CAPTURE(mean);
        CAPTURE(outliers);
        const int64_t n = shape[0], c = shape[1], s = shape.numel() / (n * c);
        const fl::Tensor x = f32_data(shape, 200, mean, 1.0, outliers), dy = f32_data(shape, 201, 0.0, 1.0, false);
        const fl::Tensor gamma = f32_data({c}, 202, 1.0, 0.5, false), beta = f32_data({c}, 203, 0.0, 1.0, false);
        const std::vector<double> xv = test::values(x), dv = test::values(dy), gv = test::values(gamma),
                                  bv = test::values(beta);
        const fl::BatchNormOutput got = fl::batch_norm_training(x, gamma, beta);
        const std::vector<double> gy = test::values(got.y), gm = test::values(got.mean), gvar = test::values(got.var);
        // The backward op at the statistics the forward returned.
        const std::vector<fl::Tensor> back = fl::dispatch_all(*fl::find_op("batch_norm_backward"),
                                                              std::vector<fl::Tensor>{x, gamma, got.mean, got.var, dy}, &kNormAttrs);
        const std::vector<double> gdx = test::values(back[0]), gdg = test::values(back[1]), gdb = test::values(back[2]);
        std::vector<double> want_y(xv.size()), bound_y(xv.size()), want_dx(xv.size()), bound_dx(xv.size());
        std::vector<double> want_m, bound_m, want_v, bound_v, want_dg, bound_dg, want_db, bound_db;
        for (int64_t ch = 0; ch < c; ++ch) {
          std::vector<double> vals;
          for (int64_t i = 0; i < n; ++i)
            for (int64_t j = 0; j < s; ++j) vals.push_back(xv[static_cast<size_t>((i * c + ch) * s + j)]);
          const Moments m = moments_of(vals);
          const auto k = static_cast<size_t>(ch);
          want_m.push_back(m.mean);
          bound_m.push_back(10 * kF32 * m.mean_abs_dev + kF32 * std::abs(m.mean));  // + the f32 output's rounding
          want_v.push_back(m.var);
          bound_v.push_back(12 * kF32 * m.var);
          const double rstd = 1 / std::sqrt(m.var + 1e-5), scale = gv[k] * rstd;
          // Backward at the returned statistics: xh = (x - mean) rstd.
          const double mu = gm[k], r = 1 / std::sqrt(gvar[k] + 1e-5);
          double sum_dy = 0, sum_dy_xh = 0, abs_dy = 0, abs_dy_xh = 0;
          for (int64_t i = 0; i < n; ++i)
            for (int64_t j = 0; j < s; ++j) {
              const auto at = static_cast<size_t>((i * c + ch) * s + j);
              sum_dy += dv[at];
              sum_dy_xh += dv[at] * (xv[at] - mu) * r;
              abs_dy += std::abs(dv[at]);
              abs_dy_xh += std::abs(dv[at] * (xv[at] - mu) * r);
            }
          want_db.push_back(sum_dy);
          bound_db.push_back(10 * kF32 * abs_dy + kF32 * std::abs(sum_dy));
          want_dg.push_back(sum_dy_xh);
          bound_dg.push_back(12 * kF32 * abs_dy_xh + kF32 * std::abs(sum_dy_xh));
          const double count = static_cast<double>(n * s), a = gv[k] * r;
          for (int64_t i = 0; i < n; ++i)
            for (int64_t j = 0; j < s; ++j) {
              const auto at = static_cast<size_t>((i * c + ch) * s + j);
              want_y[at] = (xv[at] - m.mean) * scale + bv[k];
              // A few roundings of each term, and the mean's error through the scale.
              bound_y[at] = 8 * kF32 * (std::abs((xv[at] - m.mean) * scale) + std::abs(bv[k])) + scale * bound_m[k] + 1e-30;
              const double xh = (xv[at] - mu) * r;
              const double t1 = a * dv[at], t2 = a * xh * sum_dy_xh / count, t3 = a * sum_dy / count;
              want_dx[at] = t1 - t2 - t3;
              bound_dx[at] = 8 * kF32 * (std::abs(t1) + std::abs(t2) + std::abs(t3)) +
                             std::abs(a) * (bound_dg[k] * std::abs(xh) + bound_db[k]) / count + 1e-30;
            }
        }
        check_within(gm, want_m, bound_m, "mean");
        check_within(gvar, want_v, bound_v, "var");
        check_within(gy, want_y, bound_y, "y");
        // Inference with the batch's own statistics (as f32 values): the same y within its bound
        // plus what rounding the statistics to f32 moves it.
        const std::vector<double> gi = test::values(fl::batch_norm_inference(x, gamma, beta, got.mean, got.var));
        std::vector<double> bound_i(bound_y);
        for (size_t at = 0; at < bound_i.size(); ++at) {
          const auto k = static_cast<size_t>((static_cast<int64_t>(at) / s) % c);
          const double scale = gv[k] / std::sqrt(want_v[k] + 1e-5);
          bound_i[at] += scale * (std::abs(gm[k] - want_m[k]) + std::abs(xv[at] - want_m[k]) * std::abs(gvar[k] - want_v[k]) /
                                                                     (want_v[k] + 1e-5));
        }
        check_within(gi, want_y, bound_i, "inference y");
        check_within(gdb, want_db, bound_db, "dbeta");
        check_within(gdg, want_dg, bound_dg, "dgamma");
        check_within(gdx, want_dx, bound_dx, "dx");
      }
    }
  }
}

TEST_CASE("f32 layer norm forward and backward stay within the stated bounds of f64 loops") {
  for (const fl::Shape& shape : {fl::Shape{3, 1}, fl::Shape{5, 7}, fl::Shape{9, 33}, fl::Shape{4, 300}, fl::Shape{17, 1024},
                                 fl::Shape{2, 3, 700}}) {
    for (const double mean : {0.0, 1e4}) {
      for (const bool outliers : {false, true}) {
        CAPTURE(test::shape_text(shape));
        CAPTURE(mean);
        CAPTURE(outliers);
        const int64_t d = shape[shape.size() - 1], rows = shape.numel() / d;
        const fl::Tensor x = f32_data(shape, 300, mean, 1.0, outliers), dy = f32_data(shape, 301, 0.0, 1.0, false);
        const fl::Tensor gamma = f32_data({d}, 302, 1.0, 0.5, false), beta = f32_data({d}, 303, 0.0, 1.0, false);
        const std::vector<double> xv = test::values(x), dv = test::values(dy), gv = test::values(gamma),
                                  bv = test::values(beta);
        const std::vector<fl::Tensor> fwd = fl::dispatch_all(*fl::find_op("layer_norm"), std::vector<fl::Tensor>{x, gamma, beta},
                                                             &kNormAttrs);
        const std::vector<double> gy = test::values(fwd[0]), gm = test::values(fwd[1]), grs = test::values(fwd[2]);
        const std::vector<fl::Tensor> back = fl::dispatch_all(*fl::find_op("layer_norm_backward"),
                                                              std::vector<fl::Tensor>{x, gamma, fwd[1], fwd[2], dy}, &kNormAttrs);
        const std::vector<double> gdx = test::values(back[0]), gdg = test::values(back[1]), gdb = test::values(back[2]);
        std::vector<double> want_y(xv.size()), bound_y(xv.size()), want_dx(xv.size()), bound_dx(xv.size());
        std::vector<double> want_m, bound_m, want_r, bound_r;
        std::vector<double> want_dg(static_cast<size_t>(d)), bound_dg(static_cast<size_t>(d)), want_db(static_cast<size_t>(d)),
            bound_db(static_cast<size_t>(d));
        for (int64_t r = 0; r < rows; ++r) {
          const std::vector<double> vals(xv.begin() + r * d, xv.begin() + (r + 1) * d);
          const Moments m = moments_of(vals);
          const double rstd = 1 / std::sqrt(m.var + 1e-5);
          want_m.push_back(m.mean);
          bound_m.push_back(10 * kF32 * m.mean_abs_dev + kF32 * std::abs(m.mean));
          want_r.push_back(rstd);
          bound_r.push_back(8 * kF32 * rstd);  // half the variance's bound, and the output's rounding
          // Backward at the returned statistics.
          const double mu = gm[static_cast<size_t>(r)], rs = grs[static_cast<size_t>(r)];
          double sum_u = 0, sum_u_xh = 0, abs_u = 0, abs_u_xh = 0;
          for (int64_t j = 0; j < d; ++j) {
            const auto at = static_cast<size_t>(r * d + j);
            const double u = dv[at] * gv[static_cast<size_t>(j)], xh = (xv[at] - mu) * rs;
            sum_u += u;
            sum_u_xh += u * xh;
            abs_u += std::abs(u);
            abs_u_xh += std::abs(u * xh);
            want_db[static_cast<size_t>(j)] += dv[at];
            bound_db[static_cast<size_t>(j)] += 10 * kF32 * std::abs(dv[at]);
            want_dg[static_cast<size_t>(j)] += dv[at] * xh;
            bound_dg[static_cast<size_t>(j)] += 14 * kF32 * std::abs(dv[at] * xh);
          }
          for (int64_t j = 0; j < d; ++j) {
            const auto at = static_cast<size_t>(r * d + j);
            const double xc = (xv[at] - m.mean) * rstd;
            want_y[at] = xc * gv[static_cast<size_t>(j)] + bv[static_cast<size_t>(j)];
            bound_y[at] = 8 * kF32 * (std::abs(xc * gv[static_cast<size_t>(j)]) + std::abs(bv[static_cast<size_t>(j)])) +
                          std::abs(gv[static_cast<size_t>(j)]) * (rstd * bound_m.back() + std::abs(xc) * 8 * kF32) + 1e-30;
            const double u = dv[at] * gv[static_cast<size_t>(j)], xh = (xv[at] - mu) * rs;
            const double t1 = rs * u, t2 = rs * sum_u / static_cast<double>(d), t3 = rs * xh * sum_u_xh / static_cast<double>(d);
            want_dx[at] = t1 - t2 - t3;
            bound_dx[at] = 8 * kF32 * (std::abs(t1) + std::abs(t2) + std::abs(t3)) +
                           rs * (12 * kF32 * abs_u + std::abs(xh) * 14 * kF32 * abs_u_xh) / static_cast<double>(d) + 1e-30;
          }
        }
        for (int64_t j = 0; j < d; ++j) {
          bound_db[static_cast<size_t>(j)] += kF32 * std::abs(want_db[static_cast<size_t>(j)]) + 1e-30;
          bound_dg[static_cast<size_t>(j)] += kF32 * std::abs(want_dg[static_cast<size_t>(j)]) + 1e-30;
        }
        check_within(gm, want_m, bound_m, "mean");
        check_within(grs, want_r, bound_r, "rstd");
        check_within(gy, want_y, bound_y, "y");
        check_within(gdb, want_db, bound_db, "dbeta");
        check_within(gdg, want_dg, bound_dg, "dgamma");
        check_within(gdx, want_dx, bound_dx, "dx");
      }
    }
  }
}

namespace {
// Bits of the f32 normalization kernels' outputs (batch norm and layer norm, forward and backward).
std::string normalization_bits() {
  std::string bits;
  auto add = [&](const fl::Tensor& t) {
    for (float v : t.to_vector<float>()) bits += fmt::format("{:08x} ", std::bit_cast<uint32_t>(v));
  };
  // Big enough that every pass splits over threads (more rows than one chunk takes).
  const fl::Tensor x = f32_data({128, 6, 9, 11}, 400, 3.0, 2.0, true), dy = f32_data({128, 6, 9, 11}, 401, 0.0, 1.0, false);
  const fl::Tensor g = f32_data({6}, 402, 1.0, 0.5, false), b = f32_data({6}, 403, 0.0, 1.0, false);
  const fl::BatchNormOutput o = fl::batch_norm_training(x, g, b);
  add(o.y);
  add(o.mean);
  add(o.var);
  for (const fl::Tensor& t : fl::dispatch_all(*fl::find_op("batch_norm_backward"),
                                              std::vector<fl::Tensor>{x, g, o.mean, o.var, dy}, &kNormAttrs)) {
    add(t);
  }
  const fl::Tensor lx = fl::reshape(x, fl::Shape{768, 99}), ldy = fl::reshape(dy, fl::Shape{768, 99});
  const fl::Tensor lg = f32_data({99}, 404, 1.0, 0.5, false), lb = f32_data({99}, 405, 0.0, 1.0, false);
  const std::vector<fl::Tensor> f = fl::dispatch_all(*fl::find_op("layer_norm"), std::vector<fl::Tensor>{lx, lg, lb}, &kNormAttrs);
  for (const fl::Tensor& t : f) add(t);
  for (const fl::Tensor& t : fl::dispatch_all(*fl::find_op("layer_norm_backward"),
                                              std::vector<fl::Tensor>{lx, lg, f[1], f[2], ldy}, &kNormAttrs)) {
    add(t);
  }
  return bits;
}
}  // namespace

TEST_CASE("f32 normalization results are bit-identical whatever the thread count") {
  // As test_reduce's: each thread count in its own child process (the pool reads
  // FLOWLET_NUM_THREADS once per process).
  flowlet_test::check_bits_across_thread_counts("FLOWLET_TEST_NORM_BITS", "f32 normalization results are bit-identical*",
                                                normalization_bits, {1, 2, 3, 5});
}

// ---------------------------------------------------------------------------------------------
// Gradients

TEST_CASE("second-order gradients through batch_norm_training and layer_norm match finite differences") {
  // h(x, gamma) = sum(v * d/dx sum(w * y^2)): its gradient needs the rules of the backward ops and
  // the statistics outputs' terms.
  struct Case {
    const char* name;
    fl::Shape x, gamma;
    std::function<fl::Tensor(const fl::Tensor&, const fl::Tensor&)> fn;
  };
  const std::vector<Case> cases = {
      {"batch_norm [3, 2, 2]", {3, 2, 2}, {2},
       [](const fl::Tensor& x, const fl::Tensor& g) { return fl::batch_norm_training(x, g, fl::zeros_like(g), 1e-3).y; }},
      {"batch_norm [4, 3]", {4, 3}, {3},
       [](const fl::Tensor& x, const fl::Tensor& g) { return fl::batch_norm_training(x, g, fl::zeros_like(g), 1e-3).y; }},
      {"layer_norm [3, 4]", {3, 4}, {4},
       [](const fl::Tensor& x, const fl::Tensor& g) { return fl::layer_norm(x, g, fl::zeros_like(g), 1, 1e-3); }},
      {"layer_norm [2, 2, 3] over 2", {2, 2, 3}, {2, 3},
       [](const fl::Tensor& x, const fl::Tensor& g) { return fl::layer_norm(x, g, fl::zeros_like(g), 2, 1e-3); }},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const fl::Tensor x = test::random_tensor(c.x, 41, fl::f64), gamma = test::random_tensor(c.gamma, 42, fl::f64);
    const fl::Tensor w = test::random_tensor(c.x, 43, fl::f64), v = test::random_tensor(c.x, 44, fl::f64);
    auto h = [&](const fl::Tensor& xi, const fl::Tensor& gi) {
      fl::GradientTape inner;
      inner.watch(xi);
      inner.watch(gi);
      const fl::Tensor loss = fl::sum(w * fl::square(c.fn(xi, gi)));
      return fl::sum(v * inner.gradient(loss, {xi})[0]);
    };
    fl::GradientTape outer;
    outer.watch(x);
    outer.watch(gamma);
    const fl::Tensor hx = h(x, gamma);
    const std::vector<fl::Tensor> second = outer.gradient(hx, {x, gamma});
    test::check_tensor(second[0], numeric_gradient(x, [&](const fl::Tensor& xm) { return scalar_value(h(xm, gamma)); }),
                       c.x, fl::f64, test::Tolerance{1e-5, 1e-6});
    test::check_tensor(second[1],
                       numeric_gradient(gamma, [&](const fl::Tensor& gm) { return scalar_value(h(x, gm)); }),
                       c.gamma, fl::f64, test::Tolerance{1e-5, 1e-6});
  }
}

TEST_CASE("normalization gradients: traced equal eager") {
  const fl::Tensor x = test::random_tensor({4, 3, 2, 2}, 51, fl::f32);
  const fl::Tensor gamma = test::random_tensor({3}, 52, fl::f32), beta = test::random_tensor({3}, 53, fl::f32);
  const fl::Tensor w = test::random_tensor({4, 3, 2, 2}, 54, fl::f32);
  auto grads = [&](fl::Tensor xi, fl::Tensor gi, fl::Tensor bi) {
    fl::GradientTape tape;
    for (const fl::Tensor& t : {xi, gi, bi}) tape.watch(t);
    const fl::BatchNormOutput o = fl::batch_norm_training(xi, gi, bi);
    const fl::Tensor ln = fl::layer_norm(o.y, fl::ones({2, 2}), fl::zeros({2, 2}), 2);
    const fl::Tensor inf = fl::batch_norm_inference(xi, gi, bi, o.mean, o.var + 1.0f);
    const fl::Tensor loss = fl::sum(ln * w) + fl::sum(fl::square(inf)) + fl::sum(o.var);
    return tape.gradient(loss, {xi, gi, bi});
  };
  const std::vector<fl::Tensor> eager = grads(x, gamma, beta);
  auto traced = fl::trace([&](fl::Tensor xi, fl::Tensor gi, fl::Tensor bi) {
    const std::vector<fl::Tensor> g = grads(xi, gi, bi);
    return std::tuple<fl::Tensor, fl::Tensor, fl::Tensor>{g[0], g[1], g[2]};
  });
  const auto [gx, gg, gb] = traced(x, gamma, beta);
  CHECK(test::values(gx) == test::values(eager[0]));
  CHECK(test::values(gg) == test::values(eager[1]));
  CHECK(test::values(gb) == test::values(eager[2]));
}

TEST_CASE("batch_norm_training gradients traced: the statistics terms are kept exactly when the statistics are used") {
  // Traced, the rule cannot read a statistics gradient's values: it drops the terms only for the
  // tape's own zeros (nothing used that output). Each loss below uses y only, the mean only, the
  // variance only, or all three; traced and eager gradients must agree, and the mean-only and
  // var-only ones must match their closed forms (dx = g_mean / M; dx = 2 (x - mean) / M).
  const fl::Tensor x = test::random_tensor({4, 3, 2, 5}, 140, fl::f32);
  const fl::Tensor gamma = test::random_tensor({3}, 141, fl::f32), beta = test::random_tensor({3}, 142, fl::f32);
  const fl::Tensor u = test::random_tensor({4, 3, 2, 5}, 143, fl::f32);
  for (int use = 0; use < 4; ++use) {
    CAPTURE(use);
    auto grads = [&](fl::Tensor xi) {
      fl::GradientTape tape;
      tape.watch(xi);
      const fl::BatchNormOutput o = fl::batch_norm_training(xi, gamma, beta);
      fl::Tensor loss = use == 1 ? fl::sum(o.mean) : use == 2 ? fl::sum(o.var) : fl::sum(o.y * u);
      if (use == 3) loss = loss + fl::sum(o.mean) + fl::sum(o.var);
      return tape.gradient(loss, {xi})[0];
    };
    const fl::Tensor eager = grads(x);
    auto traced = fl::trace([&](fl::Tensor xi) { return grads(xi); });
    CHECK(test::values(traced(x)) == test::values(eager));
    if (use == 1 || use == 2) {
      const std::vector<double> xv = test::values(x);
      std::vector<double> mean(3, 0.0), want(xv.size());
      for (size_t i = 0; i < xv.size(); ++i) mean[(i / 10) % 3] += xv[i] / 40;
      for (size_t i = 0; i < xv.size(); ++i) want[i] = use == 1 ? 1.0 / 40 : 2 * (xv[i] - mean[(i / 10) % 3]) / 40;
      test::check_tensor(eager, want, x.shape(), fl::f32, test::Tolerance{1e-5, 1e-7});
    }
  }
}

// ---------------------------------------------------------------------------------------------
// batch_norm() with running statistics

TEST_CASE("batch_norm: running statistics after k training steps are the moving average; inference uses them") {
  const double momentum = 0.2, eps = 1e-5;
  fl::Variable running_mean(fl::zeros({3}), "rm"), running_var(fl::ones({3}), "rv");
  const fl::Tensor gamma = test::random_tensor({3}, 61), beta = test::random_tensor({3}, 62);
  std::vector<double> rm = {0, 0, 0}, rv = {1, 1, 1};
  for (int step = 0; step < 3; ++step) {
    const fl::Tensor x = test::random_tensor({4, 3, 2, 2}, 70 + static_cast<uint64_t>(step), fl::f32);
    const BatchStats batch = batch_norm_reference(x, test::values(gamma), test::values(beta), eps);
    const fl::Tensor y = fl::batch_norm(x, gamma, beta, running_mean, running_var, fl::Mode::training, momentum, eps);
    test::check_tensor(y, batch.y, x.shape(), fl::f32, test::Tolerance{1e-5, 1e-5});
    for (size_t c = 0; c < 3; ++c) {
      rm[c] = (1 - momentum) * rm[c] + momentum * batch.mean[c];
      rv[c] = (1 - momentum) * rv[c] + momentum * batch.var[c] * 16.0 / 15.0;  // unbiased: 16 values per channel
    }
  }
  test::check_tensor(running_mean.value(), rm, fl::Shape{3}, fl::f32, test::Tolerance{1e-5, 1e-6});
  test::check_tensor(running_var.value(), rv, fl::Shape{3}, fl::f32, test::Tolerance{1e-5, 1e-6});

  // Inference normalizes with the running statistics and leaves them alone.
  const fl::Tensor x = test::random_tensor({2, 3, 2, 2}, 80, fl::f32);
  const fl::Tensor y = fl::batch_norm(x, gamma, beta, running_mean, running_var, fl::Mode::inference, momentum, eps);
  const std::vector<double> xv = test::values(x), g = test::values(gamma), b = test::values(beta);
  std::vector<double> want(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) {
    const size_t c = (i / 4) % 3;
    want[i] = (xv[i] - rm[c]) / std::sqrt(rv[c] + eps) * g[c] + b[c];
  }
  test::check_tensor(y, want, x.shape(), fl::f32, test::Tolerance{1e-5, 1e-5});
  test::check_tensor(running_mean.value(), rm, fl::Shape{3}, fl::f32, test::Tolerance{1e-5, 1e-6});
  test::check_tensor(running_var.value(), rv, fl::Shape{3}, fl::f32, test::Tolerance{1e-5, 1e-6});
}

TEST_CASE("batch_norm: a traced training step updates the running statistics on every call, as eagerly") {
  const fl::Tensor gamma = test::random_tensor({2}, 91), beta = test::random_tensor({2}, 92);
  fl::Variable em(fl::zeros({2}), "em"), ev(fl::ones({2}), "ev"), tm(fl::zeros({2}), "tm"), tv(fl::ones({2}), "tv");
  auto step = fl::trace([&](fl::Tensor x) {
    return fl::batch_norm(x, gamma, beta, tm, tv, fl::Mode::training, 0.3);
  });
  for (int i = 0; i < 3; ++i) {
    const fl::Tensor x = test::random_tensor({3, 2, 4}, 100 + static_cast<uint64_t>(i));
    const fl::Tensor eager = fl::batch_norm(x, gamma, beta, em, ev, fl::Mode::training, 0.3);
    const fl::Tensor traced = step(x);
    CHECK(test::values(traced) == test::values(eager));
    CHECK(test::values(tm.value()) == test::values(em.value()));
    CHECK(test::values(tv.value()) == test::values(ev.value()));
  }
  CHECK(test::values(tm.value()) != std::vector<double>{0, 0});  // they moved
  // A traced inference function reads the statistics each call and changes nothing.
  auto infer = fl::trace([&](fl::Tensor x) { return fl::batch_norm(x, gamma, beta, tm, tv, fl::Mode::inference); });
  const fl::Tensor x = test::random_tensor({3, 2, 4}, 110);
  const std::vector<double> before = test::values(tm.value());
  CHECK(test::values(infer(x)) == test::values(fl::batch_norm(x, gamma, beta, em, ev, fl::Mode::inference)));
  CHECK(test::values(tm.value()) == before);
}

TEST_CASE("batch_norm: bad arguments are named") {
  fl::Variable rm(fl::zeros({3}), "rm"), rv(fl::ones({3}), "rv"), wrong(fl::ones({4}), "wrong"), empty;
  const fl::Tensor x = fl::zeros({4, 3}), g = fl::ones({3}), b = fl::zeros({3});
  test::check_throws<fl::InvalidArgument>([&] { (void)fl::batch_norm(x, g, b, rm, rv, fl::Mode::training, 1.5); },
                                          {"batch_norm", "momentum", "1.5"});
  test::check_throws<fl::ShapeError>([&] { (void)fl::batch_norm(x, g, b, rm, wrong, fl::Mode::training); },
                                     {"batch_norm", "'wrong'", "[4]"});
  test::check_throws<fl::InvalidArgument>([&] { (void)fl::batch_norm(x, g, b, empty, rv, fl::Mode::inference); },
                                          {"batch_norm", "empty Variable"});
  test::check_throws<fl::InvalidArgument>(
      [&] { (void)fl::batch_norm(fl::zeros({1, 3}), g, b, rm, rv, fl::Mode::training); }, {"batch_norm", "more than one value", "[1, 3]"});
  test::check_throws<fl::ShapeError>([&] { (void)fl::batch_norm(fl::zeros({3}), g, b, rm, rv, fl::Mode::training); },
                                     {"batch_norm", "rank >= 2"});
  CHECK(test::values(rm.value()) == std::vector<double>{0, 0, 0});  // nothing changed
}

// ---------------------------------------------------------------------------------------------
// Dropout

TEST_CASE("the test's Philox reproduces the Random123 known-answer vectors") {
  CHECK(philox_reference({0, 0, 0, 0}, {0, 0}) == std::array<uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
  CHECK(philox_reference({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}) ==
        std::array<uint32_t, 4>{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
  CHECK(philox_reference({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}) ==
        std::array<uint32_t, 4>{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u});
}

TEST_CASE("dropout draws the documented Philox mask, scales kept values, and advances the offset") {
  for (double rate : {0.5, 0.3}) {
    for (uint64_t offset : {uint64_t{0}, uint64_t{7}, (uint64_t{1} << 34) + 1}) {
      CAPTURE(rate);
      CAPTURE(offset);
      fl::Generator gen(12345);
      gen.state().assign(fl::tensor({int64_t{12345}, static_cast<int64_t>(offset)}));
      const fl::Tensor x = test::random_tensor({5, 13}, 3, fl::f64, test::Domain::nonzero);
      const fl::Tensor y = fl::dropout(x, rate, gen);
      const std::vector<bool> keep = dropout_mask_reference(12345, offset, 65, rate);
      const std::vector<double> xv = test::values(x);
      std::vector<double> want;
      for (size_t i = 0; i < xv.size(); ++i) want.push_back(keep[i] ? xv[i] / (1 - rate) : 0.0);
      test::check_tensor(y, want, x.shape(), fl::f64);
      CHECK(state_of(gen) == std::vector<int64_t>{12345, static_cast<int64_t>(offset + 65)});
    }
  }
}

TEST_CASE("dropout: the share of zeros is near the rate, in every floating dtype") {
  for (fl::DType dt : {fl::f32, fl::f64, fl::f16, fl::bf16}) {
    for (double rate : {0.1, 0.5, 0.8}) {
      CAPTURE(dt);
      CAPTURE(rate);
      fl::Generator gen(3);
      const int64_t n = 100000;
      const std::vector<double> y = test::values(fl::dropout(fl::ones({n}, dt), rate, gen));
      const auto zeros = static_cast<double>(std::count(y.begin(), y.end(), 0.0));
      const double sd = std::sqrt(rate * (1 - rate) / static_cast<double>(n));
      CHECK(std::abs(zeros / static_cast<double>(n) - rate) < 5 * sd);
      const double scale = test::round_to(1 / (1 - rate), dt);
      for (double v : y) {
        if (v != 0.0 && std::abs(v - scale) > 1e-2 * scale) {
          FAIL_CHECK("kept value " << v << " is not 1 / (1 - rate)");
          break;
        }
      }
    }
  }
}

TEST_CASE("dropout: the gradient uses the forward mask and scale") {
  fl::Generator gen(17);
  const fl::Tensor x = test::random_tensor({6, 7}, 5, fl::f64, test::Domain::nonzero);
  const fl::Tensor w = test::random_tensor({6, 7}, 6, fl::f64);
  fl::GradientTape tape;
  tape.watch(x);
  const fl::Tensor y = fl::dropout(x, 0.4, gen);
  const fl::Tensor g = tape.gradient(fl::sum(y * w), {x})[0];
  const std::vector<double> yv = test::values(y), wv = test::values(w);
  std::vector<double> want;
  for (size_t i = 0; i < yv.size(); ++i) want.push_back(yv[i] == 0.0 ? 0.0 : wv[i] / 0.6);
  test::check_tensor(g, want, x.shape(), fl::f64);
  CHECK(std::count(yv.begin(), yv.end(), 0.0) > 0);
  CHECK(state_of(gen)[1] == 42);  // the gradient drew nothing
}

TEST_CASE("dropout: manual_seed gives the same masks eagerly and traced, and a traced step draws a new mask per call") {
  const fl::Tensor x = fl::ones({64});
  fl::manual_seed(7);
  const std::vector<double> e1 = test::values(fl::dropout(x, 0.5)), e2 = test::values(fl::dropout(x, 0.5));
  CHECK(e1 != e2);
  fl::manual_seed(7);
  CHECK(test::values(fl::dropout(x, 0.5)) == e1);  // reproducible eagerly
  CHECK(test::values(fl::dropout(x, 0.5)) == e2);

  fl::manual_seed(7);
  auto step = fl::trace([](fl::Tensor t) { return fl::dropout(t, 0.5); });
  const std::vector<double> t1 = test::values(step(x)), t2 = test::values(step(x)), t3 = test::values(step(x));
  CHECK(t1 == e1);  // the traced step draws the eager stream
  CHECK(t2 == e2);
  CHECK(t3 != t2);
  CHECK(state_of(fl::default_generator())[1] == 3 * 64);
  fl::manual_seed(7);
  CHECK(test::values(step(x)) == e1);  // reseeding restarts the traced stream too
  CHECK(fl::default_generator().seed() == 7);
}

TEST_CASE("dropout: generators are independent; one state per device, reseeded together") {
  fl::set_logical_cpu_devices(2);
  const fl::Tensor x = fl::ones({32});
  fl::Generator a(5), b(5), c(6);
  const std::vector<double> ya = test::values(fl::dropout(x, 0.5, a));
  CHECK(test::values(fl::dropout(x, 0.5, b)) == ya);
  CHECK(test::values(fl::dropout(x, 0.5, c)) != ya);
  // cpu:1 has its own state, starting at offset 0: the same first mask.
  const fl::Tensor y1 = fl::dropout(x.to(fl::Device("cpu:1")), 0.5, a);
  CHECK(y1.device() == fl::Device("cpu:1"));
  CHECK(test::values(y1) == ya);
  CHECK(a.state(fl::Device("cpu:1")).device() == fl::Device("cpu:1"));
  a.manual_seed(9);
  CHECK(state_of(a) == std::vector<int64_t>{9, 0});
  CHECK(state_of(a, fl::Device("cpu:1")) == std::vector<int64_t>{9, 0});
  CHECK(a.seed() == 9);
}

TEST_CASE("dropout: rate 0 returns x; bad rates and inputs are named") {
  const fl::Tensor x = test::random_tensor({3, 4}, 9);
  fl::Generator gen(1);
  const fl::Tensor same = fl::dropout(x, 0.0, gen);
  CHECK(same.impl_ptr() == x.impl_ptr());
  CHECK(state_of(gen)[1] == 0);
  test::check_op_throws<fl::InvalidArgument>("dropout", [&] { (void)fl::dropout(x, 1.0); }, {"[0, 1)", "1"});
  test::check_op_throws<fl::InvalidArgument>("dropout", [&] { (void)fl::dropout(x, -0.5); }, {"-0.5"});
  test::check_op_throws<fl::InvalidArgument>("dropout", [&] { (void)fl::dropout(x, std::nan("")); }, {"nan"});
  test::check_op_throws<fl::DTypeError>("dropout", [&] { (void)fl::dropout(fl::zeros({2}, fl::i64), 0.5); }, {"i64"});
  test::check_op_throws<fl::InvalidArgument>("dropout", [&] { (void)fl::dropout(fl::Tensor(), 0.5); }, {"empty Tensor handle"});
  CHECK(state_of(gen)[1] == 0);  // failed calls drew nothing
}

TEST_CASE("dropout: threads drawing from one generator never draw the same stream indices") {
  fl::Generator gen(11);
  const int per_thread = 100;
  const fl::Tensor x = fl::ones({40});
  std::vector<std::vector<double>> masks[2];
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < per_thread; ++i) masks[t].push_back(test::values(fl::dropout(x, 0.5, gen)));
    });
  }
  for (std::thread& t : threads) t.join();
  CHECK(state_of(gen)[1] == 2 * per_thread * 40);
  // Each draw took its own 40 indices: the masks are the 200 consecutive ones, each once.
  std::multiset<std::vector<double>> got(masks[0].begin(), masks[0].end());
  got.insert(masks[1].begin(), masks[1].end());
  fl::Generator replay(11);
  std::multiset<std::vector<double>> want;
  for (int i = 0; i < 2 * per_thread; ++i) want.insert(test::values(fl::dropout(x, 0.5, replay)));
  CHECK(got == want);
}

TEST_CASE("layer_norm: gamma and beta gradients over many rows (row blocks) match an f64 loop") {
  for (const fl::Shape& s : {fl::Shape{37, 5}, fl::Shape{3, 4, 6}, fl::Shape{9, 1}}) {
    CAPTURE(test::shape_text(s));
    const int64_t d = s[s.size() - 1], rows = fl::Shape(s).numel() / d;
    const fl::Tensor x = test::random_tensor(s, 120, fl::f64), dy = test::random_tensor(s, 121, fl::f64);
    const fl::Tensor gamma = test::random_tensor({d}, 122, fl::f64), beta = test::random_tensor({d}, 123, fl::f64);
    fl::GradientTape tape;
    tape.watch(gamma);
    tape.watch(beta);
    const std::vector<fl::Tensor> g = tape.gradient(fl::sum(fl::layer_norm(x, gamma, beta) * dy), {gamma, beta});
    const std::vector<double> xv = test::values(x), dv = test::values(dy);
    std::vector<double> dgamma(static_cast<size_t>(d)), dbeta(static_cast<size_t>(d));
    for (int64_t r = 0; r < rows; ++r) {
      double m = 0, var = 0;
      for (int64_t j = 0; j < d; ++j) m += xv[static_cast<size_t>(r * d + j)] / static_cast<double>(d);
      for (int64_t j = 0; j < d; ++j) var += std::pow(xv[static_cast<size_t>(r * d + j)] - m, 2) / static_cast<double>(d);
      for (int64_t j = 0; j < d; ++j) {
        const auto i = static_cast<size_t>(r * d + j);
        dgamma[static_cast<size_t>(j)] += dv[i] * (xv[i] - m) / std::sqrt(var + 1e-5);
        dbeta[static_cast<size_t>(j)] += dv[i];
      }
    }
    test::check_tensor(g[0], dgamma, fl::Shape{d}, fl::f64, test::Tolerance{1e-10, 1e-10});
    test::check_tensor(g[1], dbeta, fl::Shape{d}, fl::f64, test::Tolerance{1e-10, 1e-10});
  }
}

TEST_CASE("dropout: a tensor split across threads draws the documented mask at every chunk boundary") {
  // 100003 elements: several parallel chunks whose edges fall inside Philox blocks and lane groups.
  const int64_t n = 100003;
  fl::Generator gen(99);
  gen.state().assign(fl::tensor({int64_t{99}, int64_t{5}}));
  const std::vector<double> y = test::values(fl::dropout(fl::ones({n}, fl::f64), 0.5, gen));
  const std::vector<bool> keep = dropout_mask_reference(99, 5, n, 0.5);
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) wrong += (y[static_cast<size_t>(i)] == 2.0) != keep[static_cast<size_t>(i)];
  CHECK(wrong == 0);
  CHECK(state_of(gen) == std::vector<int64_t>{99, 5 + n});
}

TEST_CASE("batch_norm_training: a statistics gradient that is zero now but depends on a variable keeps its derivative") {
  // loss = sum(y * u) + sum(mean * (w - w0)) at w = w0: the mean's incoming gradient w - w0 is
  // zero, yet d/dw of sum(v * dloss/dx) is sum over the channel of v / M, not 0.
  const fl::Tensor x = test::random_tensor({4, 2}, 130, fl::f64), u = test::random_tensor({4, 2}, 131, fl::f64);
  const fl::Tensor v = test::random_tensor({4, 2}, 132, fl::f64), w0 = test::random_tensor({2}, 133, fl::f64);
  const fl::Tensor gamma = fl::ones({2}, fl::f64), beta = fl::zeros({2}, fl::f64);
  auto h = [&](const fl::Tensor& w) {
    fl::GradientTape inner;
    inner.watch(x);
    const fl::BatchNormOutput o = fl::batch_norm_training(x, gamma, beta);
    const fl::Tensor loss = fl::sum(o.y * u) + fl::sum(o.mean * (w - w0));
    return fl::sum(v * inner.gradient(loss, {x})[0]);
  };
  const fl::Tensor w = fl::cast(w0, fl::f64) + 0.0;  // equal values, its own tensor
  fl::GradientTape outer;
  outer.watch(w);
  const fl::Tensor g = outer.gradient(h(w), {w})[0];
  const std::vector<double> vv = test::values(v);
  const std::vector<double> want = {(vv[0] + vv[2] + vv[4] + vv[6]) / 4, (vv[1] + vv[3] + vv[5] + vv[7]) / 4};
  test::check_tensor(g, want, fl::Shape{2}, fl::f64, test::Tolerance{1e-12, 1e-12});
  test::check_tensor(g, numeric_gradient(w, [&](const fl::Tensor& wm) { return scalar_value(h(wm)); }), fl::Shape{2},
                     fl::f64, test::Tolerance{1e-6, 1e-8});
}
