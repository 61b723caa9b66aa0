// Convolutions and pooling over NCHW images: conv2d (stride, padding incl. "same", dilation,
// groups, optional bias), max_pool2d, avg_pool2d, global_avg_pool2d. Each is an op with its
// gradient, eager and traced, on the CPU and CUDA.
#pragma once

#include <cstdint>

#include "flowlet/core/tensor.hpp"

namespace flowlet {

// Two spatial values, height then width; one number means both: Size2{3} == Size2{3, 3}.
struct Size2 {
  int64_t h = 0;
  int64_t w = 0;
  constexpr Size2() = default;
  constexpr Size2(int64_t both) : h(both), w(both) {}  // NOLINT: Size2 s = 3
  constexpr Size2(int64_t height, int64_t width) : h(height), w(width) {}
  friend constexpr bool operator==(const Size2&, const Size2&) = default;
};

// Zero padding of an image's borders. A number pads every side by it; Padding(h, w) pads top and
// bottom by h, left and right by w. Padding::same() pads so that the output is ceil(input /
// stride) along each axis, the odd extra row or column at the bottom or right (TensorFlow's
// "SAME"); Padding::valid() pads nothing.
struct Padding {
  int64_t top = 0, bottom = 0, left = 0, right = 0;
  bool same_size = false;  // resolved against the input's size when the op is called
  constexpr Padding() = default;
  constexpr Padding(int64_t all) : top(all), bottom(all), left(all), right(all) {}  // NOLINT: Padding p = 1
  constexpr Padding(int64_t height, int64_t width) : top(height), bottom(height), left(width), right(width) {}
  static constexpr Padding explicit_sides(int64_t top, int64_t bottom, int64_t left, int64_t right) {
    Padding p;
    p.top = top, p.bottom = bottom, p.left = left, p.right = right;
    return p;
  }
  static constexpr Padding same() {
    Padding p;
    p.same_size = true;
    return p;
  }
  static constexpr Padding valid() { return Padding{}; }
  friend constexpr bool operator==(const Padding&, const Padding&) = default;
};

struct Conv2dOptions {
  Size2 stride = 1;
  Padding padding = 0;
  Size2 dilation = 1;
  int64_t groups = 1;  // C and O must both divide by it; w is [O, C / groups, kH, kW]
};

// x [N, C, H, W], w [O, C / groups, kH, kW] -> [N, O, H', W'] with
// H' = (H + top + bottom - dilation.h * (kH - 1) - 1) / stride.h + 1 (likewise W'), f32 or f64
// (and f16/bf16 on CUDA). Cross-correlation, as in PyTorch and TensorFlow.
//   conv2d(x, w, {.stride = 2, .padding = Padding::same()})
Tensor conv2d(const Tensor& x, const Tensor& w, int64_t stride = 1, int64_t padding = 0);
Tensor conv2d(const Tensor& x, const Tensor& w, const Conv2dOptions& options);
// The same plus bias [O], added to every output position of its channel.
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dOptions& options = {});

struct Pool2dOptions {
  Size2 kernel = 2;
  Size2 stride = 0;  // 0: the kernel size
  Padding padding = 0;
  bool ceil_mode = false;           // output size rounded up, so a partial last window counts
  bool count_include_pad = false;   // avg_pool2d: padded zeros count in the divisor (max_pool2d ignores it)
};

// x [N, C, H, W] -> [N, C, H', W']. max_pool2d: the largest value of each window (padding never
// wins); its gradient goes to the first largest element of each window. avg_pool2d: the mean of
// each window. kernel alone means stride = kernel.
Tensor max_pool2d(const Tensor& x, int64_t kernel);
Tensor max_pool2d(const Tensor& x, const Pool2dOptions& options);
Tensor avg_pool2d(const Tensor& x, int64_t kernel);
Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& options);
// x [N, C, H, W] -> [N, C]: the mean over H and W.
Tensor global_avg_pool2d(const Tensor& x);

}  // namespace flowlet
