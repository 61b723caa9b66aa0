// Convolutions and pooling (flowlet/ops/conv.hpp): conv2d against a naive f64 loop over strides,
// paddings ("same" with stride 2, asymmetric), dilations, groups (depthwise too), bias and the relu
// activation, on shapes big enough to split over threads; gradients of every conv and pooling op
// by central finite differences in f64 (the shared cases of support/conv_grad_cases.hpp plus the
// relu activation); pooling on hand-worked cases (tie rule, ceil_mode, count_include_pad); traced
// against eager; and the error paths the op table does not reach.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/conv_winograd.hpp"  // white-box (src/ on the include path): the Winograd kernels and their transforms
#include "../src/ops/conv_attrs.hpp"  // white-box: the relu activation only the fusion pass sets
#include "flowlet/trace.hpp"
#include "support/conv_reference.hpp"
#include "support/gradient_check.hpp"
#include "support/reference.hpp"

using test::check_op_throws;
using test::check_tensor;

namespace {

conv_ref::Image image_of(const fl::Tensor& t) {
  return {test::values(t), std::vector<int64_t>(t.shape().begin(), t.shape().end())};
}

struct ConvCase {
  std::string label;
  fl::Shape x, w;
  fl::Conv2dOptions options;
  bool bias = false;
  conv_ref::ConvSpec spec;  // the same convolution with explicit pads
};

std::vector<ConvCase> conv_cases() {
  using P = fl::Padding;
  return {
      {"3x3", {2, 3, 6, 5}, {4, 3, 3, 3}, {}, false, {}},
      {"stride 2, padding 1, bias", {2, 3, 7, 8}, {5, 3, 3, 3}, {.stride = 2, .padding = 1}, true,
       {.stride_h = 2, .stride_w = 2, .pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1}},
      // same with stride 2: H 7 -> 4 (total pad (4-1)*2+3-7 = 2: 1 and 1), W 8 -> 4 (total 1: 0 and 1)
      {"same, stride 2", {1, 2, 7, 8}, {3, 2, 3, 3}, {.stride = 2, .padding = P::same()}, false,
       {.stride_h = 2, .stride_w = 2, .pad_top = 1, .pad_bottom = 1, .pad_left = 0, .pad_right = 1}},
      // same, stride 1, kernel 4x2: total pads 3 (1 and 2) and 1 (0 and 1)
      {"same, even kernel", {1, 2, 5, 6}, {2, 2, 4, 2}, {.padding = P::same()}, true,
       {.pad_top = 1, .pad_bottom = 2, .pad_left = 0, .pad_right = 1}},
      {"asymmetric padding", {2, 2, 5, 6}, {3, 2, 3, 2}, {.padding = P::explicit_sides(2, 0, 1, 3)}, false,
       {.pad_top = 2, .pad_bottom = 0, .pad_left = 1, .pad_right = 3}},
      {"dilation 2x3, stride 1x2", {1, 3, 9, 10}, {2, 3, 3, 3}, {.stride = {1, 2}, .padding = {2, 1}, .dilation = {2, 3}}, true,
       {.stride_h = 1, .stride_w = 2, .pad_top = 2, .pad_bottom = 2, .pad_left = 1, .pad_right = 1, .dilation_h = 2,
        .dilation_w = 3}},
      {"groups 2", {2, 4, 6, 6}, {6, 2, 3, 3}, {.padding = 1, .groups = 2}, true,
       {.pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1, .groups = 2}},
      {"depthwise, stride 2", {2, 5, 7, 7}, {5, 1, 3, 3}, {.stride = 2, .padding = 1, .groups = 5}, true,
       {.stride_h = 2, .stride_w = 2, .pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1, .groups = 5}},
      {"depthwise multiplier 2", {1, 3, 5, 5}, {6, 1, 3, 3}, {.groups = 3}, false, {.groups = 3}},
      {"1x1", {3, 8, 5, 4}, {6, 8, 1, 1}, {}, true, {}},
      {"1x1 stride 2", {2, 8, 5, 4}, {6, 8, 1, 1}, {.stride = 2}, false, {.stride_h = 2, .stride_w = 2}},
      {"1x1 padded", {1, 4, 3, 3}, {2, 4, 1, 1}, {.padding = 1}, false,
       {.pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1}},
      {"kernel covers the input", {2, 2, 3, 4}, {3, 2, 3, 4}, {}, true, {}},
      // Big enough that the work splits over the pool (several images per chunk, both kernels).
      {"threaded 3x3", {6, 16, 14, 14}, {24, 16, 3, 3}, {.padding = 1}, true,
       {.pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1}},
      {"threaded 1x1", {4, 64, 14, 14}, {32, 64, 1, 1}, {}, false, {}},
      {"threaded groups 4", {3, 32, 12, 12}, {32, 8, 3, 3}, {.stride = 2, .padding = 1, .groups = 4}, false,
       {.stride_h = 2, .stride_w = 2, .pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1, .groups = 4}},
  };
}

fl::Tensor run_conv(const ConvCase& c, const fl::Tensor& x, const fl::Tensor& w, const fl::Tensor& b) {
  return c.bias ? fl::conv2d(x, w, b, c.options) : fl::conv2d(x, w, c.options);
}

// conv2d with the op's relu activation, through the op as the fusion pass would call it.
fl::Tensor conv2d_relu(const fl::Tensor& x, const fl::Tensor& w, const fl::Tensor& b, const conv_ref::ConvSpec& s) {
  fl::detail::Conv2dAttrs a;
  a.stride_h = s.stride_h, a.stride_w = s.stride_w, a.dilation_h = s.dilation_h, a.dilation_w = s.dilation_w;
  a.pad_top = s.pad_top, a.pad_bottom = s.pad_bottom, a.pad_left = s.pad_left, a.pad_right = s.pad_right;
  a.groups = s.groups;
  a.activation = fl::detail::ConvActivation::relu;
  const std::vector<fl::Tensor> in = b.defined() ? std::vector<fl::Tensor>{x, w, b} : std::vector<fl::Tensor>{x, w};
  return fl::dispatch(*fl::find_op("conv2d"), in, &a);
}

}  // namespace

TEST_CASE("conv2d matches the naive loop over strides, paddings, dilations, groups and bias") {
  uint64_t seed = 10;
  for (const ConvCase& c : conv_cases()) {
    for (fl::DType dt : {fl::f64, fl::f32}) {
      INFO(c.label, " ", fl::dtype_name(dt));
      const fl::Tensor x = test::random_tensor(c.x, seed, dt), w = test::random_tensor(c.w, seed + 1, dt);
      const fl::Tensor b = test::random_tensor({c.w[0]}, seed + 2, dt);
      const std::vector<double> bias = test::values(b);
      const conv_ref::Image want = conv_ref::conv2d(image_of(x), image_of(w), c.bias ? &bias : nullptr, c.spec);
      const test::Tolerance tol = dt == fl::f64 ? test::Tolerance{1e-12, 1e-12} : test::Tolerance{1e-5, 1e-5};
      check_tensor(run_conv(c, x, w, b), want.values, fl::Shape(want.dims), dt, tol);
      // The relu activation is applied after the bias.
      conv_ref::ConvSpec relu_spec = c.spec;
      relu_spec.relu = true;
      const conv_ref::Image want_relu = conv_ref::conv2d(image_of(x), image_of(w), c.bias ? &bias : nullptr, relu_spec);
      check_tensor(conv2d_relu(x, w, c.bias ? b : fl::Tensor(), c.spec), want_relu.values, fl::Shape(want_relu.dims), dt, tol);
    }
    seed += 3;
  }
}

TEST_CASE("conv2d on a hand-worked case: a 2x2 sum filter with stride 2 and same padding") {
  // x 1x1x3x3 = 1..9; same with stride 2 gives 2x2 outputs, total pad 1 per axis, all at the end.
  const fl::Tensor x = test::make({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3}, fl::f64);
  const fl::Tensor w = test::make({1, 1, 1, 1}, {1, 1, 2, 2}, fl::f64);
  check_tensor(fl::conv2d(x, w, {.stride = 2, .padding = fl::Padding::same()}), {12, 9, 15, 9}, {1, 1, 2, 2}, fl::f64);
  // The two-integer overload: stride 1, padding 1.
  check_tensor(fl::conv2d(x, w, 1, 1), {1, 3, 5, 3, 5, 12, 16, 9, 11, 24, 28, 15, 7, 15, 17, 9}, {1, 1, 4, 4}, fl::f64);
}

TEST_CASE("conv2d, its backward ops and pooling match central finite differences in f64") {
  const auto builders = test::gradient::build_cases();
  int cases = 0;
  for (const char* name :
       {"conv2d", "conv2d_backward_input", "conv2d_backward_weight", "max_pool2d", "avg_pool2d", "avg_pool2d_backward"}) {
    for (const test::gradient::GradCase& c : builders.at(name)()) {
      INFO(name, ": ", c.label);
      test::gradient::check_case(c);
      ++cases;
    }
  }
  CHECK(cases >= 30);
}

TEST_CASE("the Winograd F(2, 3), F(2, 5) and F(4, 5) transforms compute the 1-D correlation") {
  // sum_j A^T[i][j] G[j][k] B^T[j][s] must be 1 where input s meets weight k for output i (s = i + k)
  // and 0 elsewhere, which is y_i = sum_k g_k d_{i+k} for every d and g.
  for (const auto& [r, m] : {std::pair{3, 2}, std::pair{5, 2}, std::pair{5, 4}}) {
    INFO("r = ", r, ", m = ", m);
    const fl::detail::WinogradTransform& t = fl::detail::winograd_transform(r, m);
    REQUIRE(t.r == r);
    REQUIRE(t.m == m);
    REQUIRE(t.alpha == m + r - 1);
    const int a = t.alpha;
    for (int i = 0; i < m; ++i)
      for (int k = 0; k < r; ++k)
        for (int s = 0; s < a; ++s) {
          double sum = 0;
          for (int j = 0; j < a; ++j) sum += t.at[i * a + j] * t.g[j * r + k] * t.bt[j * a + s];
          CHECK(sum == doctest::Approx(s == i + k ? 1.0 : 0.0).epsilon(1e-12));
        }
  }
  CHECK_THROWS_AS(fl::detail::winograd_transform(4), std::invalid_argument);
  CHECK_THROWS_AS(fl::detail::winograd_transform(3, 4), std::invalid_argument);
}

namespace {

// dx of a stride-1, dilation-1 convolution, as a naive f64 loop: dx[c][iy][ix] = sum over o, i, j
// of w[o][c % cg][i][j] dy[o][iy - i + pad_top][ix - j + pad_left] (within its group).
std::vector<double> naive_backward_input(const std::vector<double>& dy, const std::vector<double>& w,
                                         const fl::detail::ConvGeometry& g) {
  const int64_t cg = g.c / g.groups, og = g.o / g.groups;
  std::vector<double> dx(static_cast<size_t>(g.n * g.c * g.h * g.w), 0.0);
  for (int64_t b = 0; b < g.n; ++b)
    for (int64_t oc = 0; oc < g.o; ++oc)
      for (int64_t ci = 0; ci < cg; ++ci)
        for (int64_t oy = 0; oy < g.oh; ++oy)
          for (int64_t ox = 0; ox < g.ow; ++ox)
            for (int64_t i = 0; i < g.kh; ++i)
              for (int64_t j = 0; j < g.kw; ++j) {
                const int64_t iy = oy + i - g.pad_top, ix = ox + j - g.pad_left;
                if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) continue;
                const int64_t c = (oc / og) * cg + ci;
                dx[static_cast<size_t>(((b * g.c + c) * g.h + iy) * g.w + ix)] +=
                    w[static_cast<size_t>(((oc * cg + ci) * g.kh + i) * g.kw + j)] *
                    dy[static_cast<size_t>(((b * g.o + oc) * g.oh + oy) * g.ow + ox)];
              }
  return dx;
}

// dw of a stride-1, dilation-1 convolution, as a naive f64 loop: dw[o][ci][i][j] = sum over images
// and outputs of dy[o][oy][ox] x[group's ci][oy + i - pad_top][ox + j - pad_left].
std::vector<double> naive_backward_weight(const std::vector<double>& x, const std::vector<double>& dy,
                                          const fl::detail::ConvGeometry& g) {
  const int64_t cg = g.c / g.groups, og = g.o / g.groups;
  std::vector<double> dw(static_cast<size_t>(g.o * cg * g.kh * g.kw), 0.0);
  for (int64_t b = 0; b < g.n; ++b)
    for (int64_t oc = 0; oc < g.o; ++oc)
      for (int64_t ci = 0; ci < cg; ++ci)
        for (int64_t i = 0; i < g.kh; ++i)
          for (int64_t j = 0; j < g.kw; ++j) {
            double sum = 0;
            for (int64_t oy = 0; oy < g.oh; ++oy)
              for (int64_t ox = 0; ox < g.ow; ++ox) {
                const int64_t iy = oy + i - g.pad_top, ix = ox + j - g.pad_left;
                if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) continue;
                sum += dy[static_cast<size_t>(((b * g.o + oc) * g.oh + oy) * g.ow + ox)] *
                       x[static_cast<size_t>(((b * g.c + (oc / og) * cg + ci) * g.h + iy) * g.w + ix)];
              }
            dw[static_cast<size_t>(((oc * cg + ci) * g.kh + i) * g.kw + j)] += sum;
          }
  return dw;
}

}  // namespace

TEST_CASE("Winograd conv2d and its gradients (3x3, 5x5, stride 1) match naive f64 loops") {
  // Odd output sizes (tiles past the edge), channel counts that are no multiple of the 8-wide
  // vectors, groups, asymmetric pads and pads wider than the kernel (negative pads for the input
  // gradient), bias and relu. Winograd's f32 error grows with the transforms' coefficients, so it is
  // bounded against the result's scale (its largest magnitude): F(2, 3) within 4e-6 of it, F(2, 5)
  // (points up to +-2) within 2e-5 (measured: 4.8e-7 and 3.4e-6 on the CNN demo's shapes; the
  // im2col + GEMM path: 5.5e-7).
  struct Case {
    fl::Shape x, w;
    conv_ref::ConvSpec spec;
    bool bias;
  };
  const std::vector<Case> cases = {
      {{2, 16, 9, 7}, {16, 16, 3, 3}, {.pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1, .relu = true}, true},
      {{3, 17, 8, 11}, {20, 17, 5, 5}, {.pad_top = 2, .pad_bottom = 2, .pad_left = 2, .pad_right = 2}, true},
      {{2, 32, 6, 7}, {32, 16, 3, 3}, {.groups = 2}, false},
      {{1, 16, 5, 6}, {24, 16, 5, 5}, {.pad_top = 3, .pad_bottom = 1, .pad_left = 4, .pad_right = 0, .relu = true}, true},
      {{1, 16, 4, 4}, {16, 16, 3, 3}, {.pad_top = 3, .pad_bottom = 3, .pad_left = 3, .pad_right = 3}, false},
      // big enough for several blocks of tiles and both threads
      {{4, 32, 14, 14}, {64, 32, 5, 5}, {.pad_top = 2, .pad_bottom = 2, .pad_left = 2, .pad_right = 2}, true},
      {{4, 32, 14, 14}, {48, 32, 3, 3}, {.pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1, .relu = true}, true},
  };
  // Both engines of the forward's per-position products (oneDNN where built, the default, and
  // OpenBLAS), and 5x5 kernels with 4x4 tiles (the default where they pay) and 2x2 ones.
  for (const auto& [onednn, large_tiles] : {std::pair{"1", "1"}, std::pair{"0", "1"}, std::pair{"1", "0"}}) {
    setenv("FLOWLET_CONV_ONEDNN", onednn, 1);
    setenv("FLOWLET_CONV_WINOGRAD_4X4", large_tiles, 1);
    uint64_t seed = 300;
    for (const Case& c : cases) {
      INFO(test::shape_text(c.x), " * ", test::shape_text(c.w), " groups ", c.spec.groups, " oneDNN ", onednn, " 4x4 tiles ", large_tiles);
      const fl::Tensor x = test::random_tensor(c.x, seed), w = test::random_tensor(c.w, seed + 1);
      const fl::Tensor b = test::random_tensor({c.w[0]}, seed + 2);
      seed += 3;
      const std::vector<double> bias = test::values(b);
      const conv_ref::Image want = conv_ref::conv2d(image_of(x), image_of(w), c.bias ? &bias : nullptr, c.spec);
      fl::detail::ConvGeometry g;
      g.n = c.x[0], g.c = c.x[1], g.h = c.x[2], g.w = c.x[3];
      g.o = c.w[0], g.kh = c.w[2], g.kw = c.w[3];
      g.oh = want.dims[2], g.ow = want.dims[3];
      g.pad_top = c.spec.pad_top, g.pad_left = c.spec.pad_left, g.groups = c.spec.groups;
      REQUIRE(fl::detail::winograd_forward_applies(g));
      REQUIRE(fl::detail::winograd_backward_input_applies(g));
      // The CNN demo's shape takes 4x4 tiles unless they are switched off; 3x3 kernels keep 2x2.
      if (g.kh == 5 && g.oh == 14) CHECK(fl::detail::winograd_tile(g) == (std::string_view(large_tiles) == "1" ? 4 : 2));
      if (g.kh == 3) CHECK(fl::detail::winograd_tile(g) == 2);
      const double bound = g.kh == 3 ? 4e-6 : 2e-5;
      auto within = [&](const std::vector<double>& want_values) {
        double scale = 0;
        for (const double value : want_values) scale = std::max(scale, std::fabs(value));
        return test::Tolerance{0.0, bound * scale};
      };

      fl::Tensor y = fl::zeros(fl::Shape(want.dims));
      fl::detail::conv2d_winograd_forward(g, x.data<float>(), w.data<float>(), c.bias ? b.data<float>() : nullptr,
                                          c.spec.relu, y.data<float>());
      check_tensor(y, want.values, fl::Shape(want.dims), fl::f32, within(want.values));
      // conv2d itself takes this path for f32.
      const fl::Tensor through_op = conv2d_relu(x, w, c.bias ? b : fl::Tensor(), c.spec);
      if (c.spec.relu) check_tensor(through_op, want.values, fl::Shape(want.dims), fl::f32, within(want.values));

      const fl::Tensor dy = test::random_tensor(fl::Shape(want.dims), seed + 7);
      fl::Tensor dx = fl::full(c.x, 123.0f);  // overwritten, never accumulated into
      fl::detail::conv2d_winograd_backward_input(g, dy.data<float>(), w.data<float>(), dx.data<float>());
      const std::vector<double> want_dx = naive_backward_input(test::values(dy), test::values(w), g);
      check_tensor(dx, want_dx, c.x, fl::f32, within(want_dx));

      REQUIRE(fl::detail::winograd_backward_weight_applies(g));
      fl::Tensor dw = fl::full(c.w, 123.0f);  // overwritten, never accumulated into
      fl::detail::conv2d_winograd_backward_weight(g, x.data<float>(), dy.data<float>(), dw.data<float>());
      const std::vector<double> want_dw = naive_backward_weight(test::values(x), test::values(dy), g);
      check_tensor(dw, want_dw, c.w, fl::f32, within(want_dw));
    }
  }
  unsetenv("FLOWLET_CONV_ONEDNN");
  unsetenv("FLOWLET_CONV_WINOGRAD_4X4");
}

TEST_CASE("f32 1x1 conv2d and its gradients (oneDNN's sgemm where built, or OpenBLAS) match naive f64 loops") {
  // product_gemm: odd positions (35), groups, a batch big enough for two chunks; both engines.
  struct Case {
    fl::Shape x, w;
    int64_t groups;
  };
  for (const char* onednn : {"1", "0"}) {
    setenv("FLOWLET_CONV_ONEDNN", onednn, 1);
    uint64_t seed = 600;
    for (const Case& c : {Case{{3, 24, 5, 7}, {10, 24, 1, 1}, 1}, Case{{2, 16, 6, 6}, {12, 8, 1, 1}, 2},
                          Case{{4, 64, 14, 14}, {32, 64, 1, 1}, 1}}) {
      INFO(test::shape_text(c.x), " * ", test::shape_text(c.w), " groups ", c.groups, " oneDNN ", onednn);
      const fl::Tensor x = test::random_tensor(c.x, seed), w = test::random_tensor(c.w, seed + 1);
      const conv_ref::ConvSpec spec{.groups = c.groups};
      const conv_ref::Image want = conv_ref::conv2d(image_of(x), image_of(w), nullptr, spec);
      auto within = [&](const std::vector<double>& values) {
        double scale = 0;
        for (const double value : values) scale = std::max(scale, std::fabs(value));
        return test::Tolerance{0.0, 1e-5 * scale};
      };
      check_tensor(fl::conv2d(x, w, {.groups = c.groups}), want.values, fl::Shape(want.dims), fl::f32, within(want.values));
      fl::detail::ConvGeometry g;
      g.n = c.x[0], g.c = c.x[1], g.h = c.x[2], g.w = c.x[3], g.o = c.w[0], g.kh = 1, g.kw = 1;
      g.oh = c.x[2], g.ow = c.x[3], g.groups = c.groups;
      const fl::Tensor dy = test::random_tensor(fl::Shape(want.dims), seed + 2);
      fl::detail::Conv2dAttrs attrs;
      attrs.groups = c.groups;
      const fl::detail::Conv2dBackwardAttrs input_attrs{attrs, g.h, g.w}, weight_attrs{attrs, 1, 1};
      const std::vector<fl::Tensor> input_in{dy, w}, weight_in{x, dy};
      const std::vector<double> want_dx = naive_backward_input(test::values(dy), test::values(w), g);
      check_tensor(fl::dispatch(*fl::find_op("conv2d_backward_input"), input_in, &input_attrs), want_dx, c.x, fl::f32,
                   within(want_dx));
      const std::vector<double> want_dw = naive_backward_weight(test::values(x), test::values(dy), g);
      check_tensor(fl::dispatch(*fl::find_op("conv2d_backward_weight"), weight_in, &weight_attrs), want_dw, c.w, fl::f32,
                   within(want_dw));
      seed += 3;
    }
  }
  unsetenv("FLOWLET_CONV_ONEDNN");
}

TEST_CASE("on big shapes (row blocks, several chunks) the backward ops are conv2d's adjoints") {
  // <conv2d(x, w), dy> = <x, backward_input(dy, w)> = <w, backward_weight(x, dy)>: the gradients of
  // sum(conv2d(x, w) * dy). Each column block of these shapes holds a few output rows only.
  struct Big {
    fl::Shape x, w;
    fl::Conv2dOptions options;
  };
  for (const Big& b : {Big{{2, 64, 40, 40}, {4, 64, 5, 5}, {.padding = 2}},
                       Big{{3, 32, 30, 33}, {8, 16, 3, 3}, {.stride = 2, .padding = fl::Padding::same(), .groups = 2}},
                       Big{{2, 48, 20, 60}, {6, 48, 3, 7}, {.padding = {1, 3}, .dilation = {1, 2}}}}) {
    for (fl::DType dt : {fl::f64, fl::f32}) {
      INFO(test::shape_text(b.x), " ", fl::dtype_name(dt));
      const fl::Tensor x = test::random_tensor(b.x, 80, dt), w = test::random_tensor(b.w, 81, dt);
      const fl::Tensor y = fl::conv2d(x, w, b.options);
      const conv_ref::Image want = conv_ref::conv2d(image_of(x), image_of(w), nullptr, [&] {
        conv_ref::ConvSpec s{.stride_h = b.options.stride.h, .stride_w = b.options.stride.w, .dilation_h = b.options.dilation.h,
                             .dilation_w = b.options.dilation.w, .groups = b.options.groups};
        const bool same = b.options.padding.same_size;
        // same, stride 2, 3x3 on 30x33: outputs 15x17, total pads 14*2+3-30 = 1 (0, 1) and 16*2+3-33 = 2 (1, 1)
        s.pad_top = same ? 0 : b.options.padding.top, s.pad_bottom = same ? 1 : b.options.padding.bottom;
        s.pad_left = same ? 1 : b.options.padding.left, s.pad_right = same ? 1 : b.options.padding.right;
        return s;
      }());
      const test::Tolerance tol = dt == fl::f64 ? test::Tolerance{1e-11, 1e-11} : test::Tolerance{1e-4, 1e-4};
      check_tensor(y, want.values, fl::Shape(want.dims), dt, tol);
      const fl::Tensor dy = test::random_tensor(y.shape(), 82, dt);
      fl::GradientTape tape;
      tape.watch(x);
      tape.watch(w);
      const std::vector<fl::Tensor> g = tape.gradient(fl::sum(fl::conv2d(x, w, b.options) * dy), std::vector<fl::Tensor>{x, w});
      const double forward = test::gradient::dot(test::values(y), test::values(dy));
      const double rel = dt == fl::f64 ? 1e-11 : 1e-4;
      CHECK(test::gradient::dot(test::values(x), test::values(g[0])) == doctest::Approx(forward).epsilon(rel));
      CHECK(test::gradient::dot(test::values(w), test::values(g[1])) == doctest::Approx(forward).epsilon(rel));
    }
  }
}

TEST_CASE("conv2d's relu activation passes the gradient only where the output is positive") {
  for (bool with_bias : {false, true}) {
    INFO("bias ", with_bias);
    const conv_ref::ConvSpec spec{.stride_h = 2, .stride_w = 1, .pad_top = 1, .pad_bottom = 0, .pad_left = 1, .pad_right = 1};
    test::gradient::Inputs in{test::gradient::f64_input({2, 2, 5, 5}, 60), test::gradient::f64_input({3, 2, 3, 3}, 61)};
    if (with_bias) in.push_back(test::gradient::f64_input({3}, 62));
    test::gradient::check_case(test::gradient::all_floating("relu", in, [spec](const test::gradient::Inputs& t) {
      return conv2d_relu(t[0], t[1], t.size() == 3 ? t[2] : fl::Tensor(), spec);
    }));
  }
}

TEST_CASE("second-order: the gradient of conv2d's input gradient wrt w, through nested tapes") {
  // loss(w) = sum(dx * v) where dx = d/dx sum(conv2d(x, w) * u): linear in w, so its gradient is
  // the same for any w, and finite differences are exact up to rounding.
  const fl::Tensor x = test::gradient::f64_input({1, 2, 5, 5}, 70);
  const fl::Tensor u = test::gradient::f64_input({1, 3, 3, 3}, 71);
  const fl::Tensor v = test::gradient::f64_input({1, 2, 5, 5}, 72);
  const fl::Tensor w = test::gradient::f64_input({3, 2, 3, 3}, 73);
  auto loss = [&](const fl::Tensor& weights) {
    fl::GradientTape inner;
    inner.watch(x);
    const fl::Tensor dx = inner.gradient(fl::sum(fl::conv2d(x, weights, {.stride = 2, .padding = 1}) * u), std::vector<fl::Tensor>{x})[0];
    return fl::sum(dx * v);
  };
  fl::GradientTape outer;
  outer.watch(w);
  const fl::Tensor g = outer.gradient(loss(w), std::vector<fl::Tensor>{w})[0];
  const std::vector<double> numeric = test::gradient::central_differences(test::values(w), 1e-6, [&](const std::vector<double>& moved) {
    return test::values(loss(test::make(moved, w.shape(), fl::f64)))[0];
  });
  check_tensor(g, numeric, w.shape(), fl::f64, test::Tolerance{1e-6, 1e-6});
}

TEST_CASE("pooling on hand-worked cases") {
  const fl::Tensor x = test::make({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, {1, 1, 4, 4}, fl::f64);
  check_tensor(fl::max_pool2d(x, 2), {6, 8, 14, 16}, {1, 1, 2, 2}, fl::f64);
  check_tensor(fl::avg_pool2d(x, 2), {3.5, 5.5, 11.5, 13.5}, {1, 1, 2, 2}, fl::f64);
  // 3x3 windows, stride 1, padding 1: padding never wins a max; the average counts real elements only.
  check_tensor(fl::max_pool2d(x, {.kernel = 3, .stride = 1, .padding = 1}),
               {6, 7, 8, 8, 10, 11, 12, 12, 14, 15, 16, 16, 14, 15, 16, 16}, {1, 1, 4, 4}, fl::f64);
  check_tensor(fl::avg_pool2d(x, {.kernel = 3, .stride = 1, .padding = 1}),
               {3.5, 4, 5, 5.5, 5.5, 6, 7, 7.5, 9.5, 10, 11, 11.5, 11.5, 12, 13, 13.5}, {1, 1, 4, 4}, fl::f64);
  // Negative values with padding: the max is the largest real element, not the padded zero.
  const fl::Tensor neg = test::make({-1, -2, -3, -4}, {1, 1, 2, 2}, fl::f64);
  check_tensor(fl::max_pool2d(neg, {.kernel = 2, .stride = 1, .padding = 1}), {-1, -1, -2, -1, -1, -2, -3, -3, -4},
               {1, 1, 3, 3}, fl::f64);
  // global average pooling: the mean of each plane.
  check_tensor(fl::global_avg_pool2d(fl::concat({x, x * 2.0}, 1)), {8.5, 17}, {1, 2}, fl::f64);
}

TEST_CASE("max_pool2d sends each window's gradient to its first maximum") {
  // Ties everywhere: windows of 2x2 ones, overlapping (stride 1); each window's first element wins.
  const fl::Tensor x = fl::ones(fl::Shape{1, 1, 3, 3}, fl::f64);
  fl::GradientTape tape;
  tape.watch(x);
  const fl::Tensor y = fl::max_pool2d(x, {.kernel = 2, .stride = 1});
  const fl::Tensor g = tape.gradient(fl::sum(y * test::make({1, 10, 100, 1000}, {1, 1, 2, 2}, fl::f64)), std::vector<fl::Tensor>{x})[0];
  check_tensor(g, {1, 10, 0, 100, 1000, 0, 0, 0, 0}, {1, 1, 3, 3}, fl::f64);
  // A later strictly larger element takes the window; equal later ones do not.
  const fl::Tensor z = test::make({3, 5, 5, 1}, {1, 1, 2, 2}, fl::f64);
  fl::GradientTape tape2;
  tape2.watch(z);
  check_tensor(tape2.gradient(fl::sum(fl::max_pool2d(z, 2)), std::vector<fl::Tensor>{z})[0], {0, 1, 0, 0}, {1, 1, 2, 2}, fl::f64);
}

TEST_CASE("pooling with ceil_mode and count_include_pad") {
  std::vector<double> v(25);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i);
  const fl::Tensor x = test::make(v, {1, 1, 5, 5}, fl::f64);
  // Floor: 2x2 windows; ceil: a third, partial row and column of windows.
  CHECK(fl::max_pool2d(x, 2).shape() == fl::Shape{1, 1, 2, 2});
  check_tensor(fl::max_pool2d(x, {.kernel = 2, .ceil_mode = true}), {6, 8, 9, 16, 18, 19, 21, 23, 24}, {1, 1, 3, 3}, fl::f64);
  check_tensor(fl::avg_pool2d(x, {.kernel = 2, .ceil_mode = true}), {3, 5, 6.5, 13, 15, 16.5, 20.5, 22.5, 24}, {1, 1, 3, 3},
               fl::f64);
  // A window that would start in the bottom padding is dropped: 4 + 2*1 - 3 = 3, ceil(3/2)+1 = 3,
  // and the third window starts at row 3 (inside), so 3 stays; with padding 0 on 4: (4-3)/2 -> 2.
  const fl::Tensor ones = fl::ones(fl::Shape{1, 1, 4, 4}, fl::f64);
  // count_include_pad counts the explicit padding, never ceil_mode's extra rows (as PyTorch):
  // window (2, 2) covers rows 3..5 of which row 4 is padding and row 5 is past it: divisor 2x2.
  check_tensor(fl::avg_pool2d(ones, {.kernel = 3, .stride = 2, .padding = 1, .ceil_mode = true, .count_include_pad = true}),
               {4.0 / 9, 6.0 / 9, 2.0 / 6, 6.0 / 9, 1, 3.0 / 6, 2.0 / 6, 3.0 / 6, 1.0 / 4}, {1, 1, 3, 3}, fl::f64);
  check_tensor(fl::avg_pool2d(ones, {.kernel = 3, .stride = 2, .padding = 1, .ceil_mode = true}),
               {1, 1, 1, 1, 1, 1, 1, 1, 1}, {1, 1, 3, 3}, fl::f64);
  // The last ceil window must start inside the input: 5 with kernel 2, stride 3, ceil -> 2 windows.
  CHECK(fl::max_pool2d(fl::zeros(fl::Shape{1, 1, 5, 5}), {.kernel = 2, .stride = 3, .ceil_mode = true}).shape() == fl::Shape{1, 1, 2, 2});
  CHECK(fl::max_pool2d(fl::zeros(fl::Shape{1, 1, 4, 4}), {.kernel = 2, .stride = 3, .padding = 1, .ceil_mode = true}).shape() ==
        fl::Shape{1, 1, 2, 2});
}

TEST_CASE("Winograd and 2x2 pooling kernels on an empty batch: empty outputs, a zero weight gradient") {
  fl::detail::ConvGeometry g;
  g.n = 0, g.c = 16, g.h = 6, g.w = 6, g.o = 16, g.kh = 3, g.kw = 3, g.oh = 6, g.ow = 6, g.pad_top = 1, g.pad_left = 1;
  REQUIRE(fl::detail::winograd_backward_weight_applies(g));
  const fl::Tensor x = fl::zeros(fl::Shape{0, 16, 6, 6}), w = test::random_tensor({16, 16, 3, 3}, 600);
  fl::Tensor dw = fl::full(fl::Shape{16, 16, 3, 3}, 5.0f);
  fl::detail::conv2d_winograd_backward_weight(g, x.data<float>(), x.data<float>(), dw.data<float>());
  check_tensor(dw, std::vector<double>(static_cast<size_t>(dw.numel()), 0.0), dw.shape(), fl::f32);
  // Through the ops (f32 takes the Winograd kernels; the pools the 2x2 ones).
  fl::GradientTape tape;
  tape.watch(x);
  tape.watch(w);
  const fl::Tensor y = fl::max_pool2d(fl::conv2d(x, w, {.padding = 1}), 2);
  CHECK(y.shape() == fl::Shape{0, 16, 3, 3});
  const std::vector<fl::Tensor> grads = tape.gradient(fl::sum(y), std::vector<fl::Tensor>{x, w});
  CHECK(grads[0].shape() == x.shape());
  check_tensor(grads[1], std::vector<double>(static_cast<size_t>(w.numel()), 0.0), w.shape(), fl::f32);
}

TEST_CASE("2x2 max pooling (its own kernels) and its gradient match a naive loop: ties, NaNs, odd sizes") {
  // Values from a few integers, so windows tie often; a NaN in some windows (it wins, the first
  // one among several); 7x23 planes leave a row and a column outside every window (gradient 0),
  // and their 11 windows a row take the 8-wide f32 loop and its scalar tail.
  for (fl::DType dt : {fl::f64, fl::f32}) {
    INFO(fl::dtype_name(dt));
    const int64_t n = 3, c = 5, h = 7, w = 23, oh = 3, ow = 11;
    std::vector<double> xs = test::values(test::random_tensor({n, c, h, w}, 500, fl::f64));
    for (size_t i = 0; i < xs.size(); ++i) xs[i] = std::round(xs[i] * 1.5);
    // (plane, row, column): NaNs second in window (0, 1), last in (0, 0) and (0, 2), second in the
    // tail window (1, 9); third in (2, 4); first and last in (0, 0); in the column outside every window.
    for (const auto [plane, row, col] : std::vector<std::array<int64_t, 3>>{
             {0, 0, 3}, {0, 1, 1}, {0, 1, 5}, {0, 2, 19}, {1, 4, 9}, {2, 0, 0}, {2, 1, 1}, {3, 0, 22}})
      xs[static_cast<size_t>((plane * h + row) * w + col)] = std::nan("");
    const fl::Tensor x = test::make(xs, {n, c, h, w}, dt);
    const fl::Tensor dy = test::random_tensor({n, c, oh, ow}, 501, dt);
    const std::vector<double> gy = test::values(dy);
    std::vector<double> want_y(static_cast<size_t>(n * c * oh * ow)), want_dx(xs.size(), 0.0);
    for (int64_t p = 0; p < n * c; ++p)
      for (int64_t oy = 0; oy < oh; ++oy)
        for (int64_t ox = 0; ox < ow; ++ox) {
          size_t best = static_cast<size_t>((p * h + 2 * oy) * w + 2 * ox);
          for (int64_t i = 0; i < 2; ++i)
            for (int64_t j = 0; j < 2; ++j) {
              const size_t at = static_cast<size_t>((p * h + 2 * oy + i) * w + 2 * ox + j);
              if (xs[at] > xs[best] || (std::isnan(xs[at]) && !std::isnan(xs[best]))) best = at;
            }
          const size_t out = static_cast<size_t>((p * oh + oy) * ow + ox);
          want_y[out] = xs[best];
          want_dx[best] = gy[out];
        }
    fl::GradientTape tape;
    tape.watch(x);
    const fl::Tensor y = fl::max_pool2d(x, 2);
    check_tensor(y, want_y, {n, c, oh, ow}, dt);
    check_tensor(tape.gradient(fl::sum(y * dy), std::vector<fl::Tensor>{x})[0], want_dx, {n, c, h, w}, dt);
  }
}

TEST_CASE("pooling matches the naive loop on random inputs, f32 and f64, threaded") {
  const std::vector<fl::Pool2dOptions> options = {
      {.kernel = 2},
      {.kernel = 3, .stride = 2, .padding = 1},
      {.kernel = 3, .stride = 2, .ceil_mode = true},
      {.kernel = {3, 2}, .stride = {1, 2}, .padding = {1, 0}, .count_include_pad = true},
      {.kernel = 3, .stride = 2, .padding = 1, .ceil_mode = true, .count_include_pad = true},
  };
  uint64_t seed = 90;
  for (const fl::Pool2dOptions& o : options) {
    for (fl::DType dt : {fl::f64, fl::f32}) {
      const fl::Tensor x = test::random_tensor({8, 16, 15, 13}, seed++, dt);
      conv_ref::PoolSpec s{o.kernel.h, o.kernel.w, o.stride.h == 0 ? o.kernel.h : o.stride.h,
                           o.stride.w == 0 ? o.kernel.w : o.stride.w, o.padding.top, o.padding.bottom, o.padding.left,
                           o.padding.right, o.ceil_mode, o.count_include_pad};
      for (bool max : {true, false}) {
        INFO("kernel ", o.kernel.h, "x", o.kernel.w, " max ", max, " ", fl::dtype_name(dt));
        const conv_ref::Image want = conv_ref::pool2d(image_of(x), s, max);
        check_tensor(max ? fl::max_pool2d(x, o) : fl::avg_pool2d(x, o), want.values, fl::Shape(want.dims), dt,
                     test::Tolerance{1e-6, 1e-6});
      }
    }
  }
}

TEST_CASE("traced conv and pooling, with their gradients, equal the eager calls") {
  const fl::Tensor x = test::random_tensor({4, 3, 12, 12}, 30);
  const fl::Tensor w = test::random_tensor({8, 3, 3, 3}, 31);
  const fl::Tensor b = test::random_tensor({8}, 32);
  auto step = [](fl::Tensor x, fl::Tensor w, fl::Tensor b) {
    fl::GradientTape tape;
    tape.watch(x);
    tape.watch(w);
    tape.watch(b);
    const fl::Tensor h = fl::relu(fl::conv2d(x, w, b, {.stride = 1, .padding = fl::Padding::same()}));
    const fl::Tensor p = fl::avg_pool2d(fl::max_pool2d(h, {.kernel = 3, .stride = 2, .ceil_mode = true}), 2);
    const fl::Tensor loss = fl::sum(fl::global_avg_pool2d(p) * fl::global_avg_pool2d(p));
    const std::vector<fl::Tensor> g = tape.gradient(loss, std::vector<fl::Tensor>{x, w, b});
    return std::tuple<fl::Tensor, fl::Tensor, fl::Tensor, fl::Tensor>{loss, g[0], g[1], g[2]};
  };
  auto traced = fl::trace(step);
  const auto [l1, gx1, gw1, gb1] = step(x, w, b);
  const auto [l2, gx2, gw2, gb2] = traced(x, w, b);
  check_tensor(l2, test::values(l1), l1.shape(), fl::f32, test::Tolerance{1e-6, 1e-7});
  check_tensor(gx2, test::values(gx1), gx1.shape(), fl::f32, test::Tolerance{1e-6, 1e-7});
  check_tensor(gw2, test::values(gw1), gw1.shape(), fl::f32, test::Tolerance{1e-6, 1e-7});
  check_tensor(gb2, test::values(gb1), gb1.shape(), fl::f32, test::Tolerance{1e-6, 1e-7});
}

TEST_CASE("conv and pooling errors name the op and what is wrong") {
  const fl::Tensor x = fl::zeros(fl::Shape{1, 2, 5, 5});
  const fl::Tensor w = fl::zeros(fl::Shape{3, 2, 3, 3});
  check_op_throws<fl::InvalidArgument>("conv2d", [&] { (void)fl::conv2d(fl::Tensor(), w); });
  check_op_throws<fl::InvalidArgument>("conv2d", [&] { (void)fl::conv2d(x, fl::Tensor(), {.padding = fl::Padding::same()}); });
  check_op_throws<fl::ShapeError>("conv2d", [&] { (void)fl::conv2d(fl::zeros(fl::Shape{2, 5, 5}), w, {.padding = fl::Padding::same()}); },
                                  {"[2, 5, 5]"});
  check_op_throws<fl::InvalidArgument>("conv2d", [&] { (void)fl::conv2d(x, w, {.stride = {2, -1}, .padding = fl::Padding::same()}); },
                                       {"stride", "[2, -1]"});
  check_op_throws<fl::ShapeError>("conv2d", [&] { (void)fl::conv2d(x, w, fl::zeros(fl::Shape{3, 1})); }, {"bias", "[3, 1]"});
  check_op_throws<fl::DTypeError>("conv2d", [&] { (void)fl::conv2d(x, w, fl::zeros(fl::Shape{3}, fl::f64)); }, {"f32", "f64"});
  check_op_throws<fl::DTypeError>("conv2d", [&] { (void)fl::conv2d(fl::zeros(fl::Shape{1, 2, 5, 5}, fl::bf16), fl::zeros(fl::Shape{3, 2, 3, 3}, fl::bf16)); },
                                  {"bf16", "f32, f64"});
  check_op_throws<fl::ShapeError>("max_pool2d", [&] { (void)fl::max_pool2d(fl::zeros(fl::Shape{5, 5}), 2); }, {"[5, 5]"});
  check_op_throws<fl::ShapeError>("avg_pool2d", [&] { (void)fl::avg_pool2d(fl::zeros(fl::Shape{1, 1, 1, 5}), 2); },
                                  {"larger", "[1, 1, 1, 5]"});
  check_op_throws<fl::InvalidArgument>("avg_pool2d",
                                       [&] { (void)fl::avg_pool2d(x, {.kernel = 2, .padding = fl::Padding::explicit_sides(0, 3, 0, 0)}); },
                                       {"wholly in the padding"});
  check_op_throws<fl::DTypeError>("max_pool2d", [&] { (void)fl::max_pool2d(fl::zeros(fl::Shape{1, 1, 4, 4}, fl::i64), 2); }, {"i64"});
  check_op_throws<fl::ShapeError>("global_avg_pool2d", [&] { (void)fl::global_avg_pool2d(fl::zeros(fl::Shape{2, 3})); }, {"[2, 3]"});
  check_op_throws<fl::DTypeError>("global_avg_pool2d", [&] { (void)fl::global_avg_pool2d(fl::zeros(fl::Shape{1, 1, 2, 2}, fl::i32)); },
                                  {"i32"});
  // The backward ops check what they are given too (a rule could pass them anything).
  fl::detail::Conv2dBackwardAttrs bad{{}, 4, 4};  // input 4x4 with a 3x3 kernel gives 2x2, not 3x3
  const std::vector<fl::Tensor> in{fl::zeros(fl::Shape{1, 3, 3, 3}), w};
  check_op_throws<fl::ShapeError>("conv2d_backward_input", [&] { (void)fl::dispatch(*fl::find_op("conv2d_backward_input"), in, &bad); },
                                  {"[1, 3, 3, 3]"});
}
