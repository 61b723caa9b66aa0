// Gradient cases of conv2d, its backward ops and pooling for the shared finite-difference table
// (tests/support/gradient_check.hpp includes this file after GradCase and its helpers and calls
// add_conv_cases from build_cases; include it nowhere else). f64 inputs over strides, paddings
// (same, asymmetric), dilations and groups. The backward ops are reached the way training reaches
// them: as the gradient of their forward op on an inner tape, which the outer tape differentiates.
#pragma once

#include "flowlet/ops/conv.hpp"

namespace test::gradient {

// The options each conv case runs with, and the shapes of x and w.
struct ConvGradShape {
  std::string label;
  fl::Shape x, w;
  fl::Conv2dOptions options;
  bool bias = false;
};

inline std::vector<ConvGradShape> conv_grad_shapes() {
  return {
      {"3x3, stride 1", {2, 2, 5, 4}, {3, 2, 3, 3}, {}},
      {"stride 2, padding 1, bias", {1, 3, 6, 5}, {2, 3, 3, 3}, {.stride = 2, .padding = 1}, true},
      {"same, stride 2", {1, 2, 7, 6}, {2, 2, 3, 2}, {.stride = 2, .padding = fl::Padding::same()}},
      {"asymmetric padding, dilation 2", {1, 2, 6, 7}, {2, 2, 2, 3},
       {.stride = {1, 2}, .padding = fl::Padding::explicit_sides(1, 0, 2, 1), .dilation = 2}},
      {"groups 2, bias", {2, 4, 4, 4}, {4, 2, 3, 3}, {.padding = 1, .groups = 2}, true},
      {"depthwise, bias", {1, 3, 5, 5}, {3, 1, 3, 3}, {.stride = 2, .padding = 1, .groups = 3}, true},
      {"1x1", {2, 3, 3, 3}, {4, 3, 1, 1}, {}},
  };
}

inline fl::Shape conv_output_shape(const ConvGradShape& s) {
  return fl::conv2d(fl::zeros(s.x, fl::f64), fl::zeros(s.w, fl::f64), s.options).shape();
}

struct PoolGradShape {
  std::string label;
  fl::Shape x;
  fl::Pool2dOptions options;
};

inline std::vector<PoolGradShape> pool_grad_shapes() {
  return {
      {"2x2", {2, 2, 4, 6}, {.kernel = 2}},
      {"3x3 stride 2 padding 1", {1, 2, 5, 5}, {.kernel = 3, .stride = 2, .padding = 1}},
      {"overlapping, ceil_mode", {1, 1, 6, 7}, {.kernel = 3, .stride = 2, .ceil_mode = true}},
      {"same, asymmetric kernel", {1, 2, 5, 6}, {.kernel = {2, 3}, .stride = {2, 1}, .padding = fl::Padding::same()}},
      {"count_include_pad, ceil_mode", {1, 1, 6, 6},
       {.kernel = 3, .stride = 2, .padding = 1, .ceil_mode = true, .count_include_pad = true}},
  };
}

inline void add_conv_cases(std::map<std::string, std::function<std::vector<GradCase>()>>& b) {
  b["conv2d"] = [] {
    std::vector<GradCase> cases;
    uint64_t seed = 1500;
    for (const ConvGradShape& s : conv_grad_shapes()) {
      Inputs in{f64_input(s.x, seed), f64_input(s.w, seed + 1)};
      if (s.bias) in.push_back(f64_input({s.w[0]}, seed + 2));
      seed += 3;
      cases.push_back(all_floating(s.label, in, [o = s.options](const Inputs& t) {
        return t.size() == 3 ? fl::conv2d(t[0], t[1], t[2], o) : fl::conv2d(t[0], t[1], o);
      }));
    }
    return cases;
  };
  // dx = conv2d_backward_input(dy, w), as the inner gradient of conv2d at a fixed x.
  b["conv2d_backward_input"] = [] {
    std::vector<GradCase> cases;
    uint64_t seed = 1600;
    for (const ConvGradShape& s : conv_grad_shapes()) {
      const fl::Tensor x = f64_input(s.x, seed);
      cases.push_back(all_floating(s.label, {f64_input(conv_output_shape(s), seed + 1), f64_input(s.w, seed + 2)},
                                   [x0 = x, o = s.options](const Inputs& t) {
                                     const fl::Tensor x = fl::cast(x0, t[0].dtype());  // f32 runs of the table
                                     fl::GradientTape inner;
                                     inner.watch(x);
                                     const fl::Tensor y = fl::conv2d(x, t[1], o);
                                     return inner.gradient(fl::sum(y * t[0]), std::vector<fl::Tensor>{x})[0];
                                   }));
      seed += 3;
    }
    return cases;
  };
  // dw = conv2d_backward_weight(x, dy), as the inner gradient of conv2d at a fixed w.
  b["conv2d_backward_weight"] = [] {
    std::vector<GradCase> cases;
    uint64_t seed = 1700;
    for (const ConvGradShape& s : conv_grad_shapes()) {
      const fl::Tensor w = f64_input(s.w, seed);
      cases.push_back(all_floating(s.label, {f64_input(s.x, seed + 1), f64_input(conv_output_shape(s), seed + 2)},
                                   [w0 = w, o = s.options](const Inputs& t) {
                                     const fl::Tensor w = fl::cast(w0, t[0].dtype());
                                     fl::GradientTape inner;
                                     inner.watch(w);
                                     const fl::Tensor y = fl::conv2d(t[0], w, o);
                                     return inner.gradient(fl::sum(y * t[1]), std::vector<fl::Tensor>{w})[0];
                                   }));
      seed += 3;
    }
    return cases;
  };
  // Distinct values: every window has one clear maximum, away from the finite-difference step.
  b["max_pool2d"] = [] {
    std::vector<GradCase> cases;
    uint64_t seed = 1800;
    for (const PoolGradShape& s : pool_grad_shapes())
      cases.push_back(all_floating(s.label, {distinct_input(s.x, seed++)},
                                   [o = s.options](const Inputs& t) { return fl::max_pool2d(t[0], o); }));
    return cases;
  };
  b["avg_pool2d"] = [] {
    std::vector<GradCase> cases;
    uint64_t seed = 1900;
    for (const PoolGradShape& s : pool_grad_shapes())
      cases.push_back(all_floating(s.label, {f64_input(s.x, seed++)},
                                   [o = s.options](const Inputs& t) { return fl::avg_pool2d(t[0], o); }));
    return cases;
  };
  // dx = avg_pool2d_backward(dy), as the inner gradient of avg_pool2d.
  b["avg_pool2d_backward"] = [] {
    std::vector<GradCase> cases;
    uint64_t seed = 2000;
    for (const PoolGradShape& s : pool_grad_shapes()) {
      const fl::Tensor x = f64_input(s.x, seed++);
      const fl::Shape y = fl::avg_pool2d(x, s.options).shape();
      cases.push_back(all_floating(s.label, {f64_input(y, seed++)}, [x0 = x, o = s.options](const Inputs& t) {
        const fl::Tensor x = fl::cast(x0, t[0].dtype());
        fl::GradientTape inner;
        inner.watch(x);
        return inner.gradient(fl::sum(fl::avg_pool2d(x, o) * t[0]), std::vector<fl::Tensor>{x})[0];
      }));
    }
    return cases;
  };
}

}  // namespace test::gradient
