// The internal ops behind flowlet/ops/conv.hpp, flowlet/ops/normalization.hpp and dropout
// (flowlet/random.hpp): their attribute structs, and each op's inputs and outputs. The CPU kernels
// live in src/ops/{conv,pool,normalization,dropout}.cpp, the CUDA ones in src/cuda/; both read
// this file, so it is the contract between them. Every op here takes contiguous NCHW inputs as
// dispatch gives them (kernels call .contiguous() on what may be a view).
//
//   op                       inputs                                   outputs                    attrs
//   conv2d                   x [N,C,H,W], w [O,C/g,kH,kW], (bias [O]) y [N,O,H',W']              Conv2dAttrs
//   conv2d_backward_input    dy [N,O,H',W'], w                         dx [N,C,H,W]               Conv2dBackwardAttrs (input size)
//   conv2d_backward_weight   x, dy                                     dw [O,C/g,kH,kW]           Conv2dBackwardAttrs (kernel size)
//   max_pool2d               x                                         y                          Pool2dAttrs
//   max_pool2d_backward      x, dy                                     dx (to each window's first maximum)  Pool2dAttrs
//   avg_pool2d               x                                         y                          Pool2dAttrs
//   avg_pool2d_backward      dy                                        dx                         Pool2dBackwardAttrs
//   batch_norm_training      x [N,C,...], gamma [C], beta [C]          y, mean [C], var [C] (biased)   NormAttrs
//   batch_norm_backward      x, gamma, mean, var, dy                   dx, dgamma, dbeta          NormAttrs
//   batch_norm_inference     x, gamma, beta, mean, var                 y                          NormAttrs
//   layer_norm               x, gamma, beta                            y, mean [outer], rstd [outer]   NormAttrs (normalized_dims)
//   layer_norm_backward      x, gamma, mean, rstd, dy                  dx, dgamma, dbeta          NormAttrs
//   dropout                  x, state i64 [2] (seed, offset)           y                          DropoutAttrs
//
// conv2d's activation (none or relu) is applied after the bias: the conv fusion pass
// (src/trace/passes/conv_fusion.cpp) sets it when a relu is the only user of a conv2d.
//
// dropout keeps element i when philox_uniform(seed, offset + i) >= rate (the mapping in
// src/kernels/dropout_mask.hpp, shared by the CPU and CUDA kernels, so both draw the same mask).
// Its gradient is the same op applied to dy with the same state: the same mask, the same scale.
#pragma once

#include <cstdint>
#include <string>

#include <fmt/format.h>

namespace flowlet::detail {

enum class ConvActivation : int { none, relu };

struct Conv2dAttrs {
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;  // "same" is resolved before the op
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t groups = 1;
  ConvActivation activation = ConvActivation::none;
  std::string describe() const {
    return fmt::format("stride=[{}, {}], pad=[{}, {}, {}, {}], dilation=[{}, {}], groups={}, activation={}", stride_h,
                       stride_w, pad_top, pad_bottom, pad_left, pad_right, dilation_h, dilation_w, groups,
                       activation == ConvActivation::relu ? "relu" : "none");
  }
};

// The forward attributes plus the size the backward op cannot infer: the input's H and W
// (backward_input; a strided convolution maps several input sizes to one output size) or the
// kernel's kH and kW (backward_weight).
struct Conv2dBackwardAttrs {
  Conv2dAttrs conv;
  int64_t size_h = 0, size_w = 0;
  std::string describe() const { return fmt::format("{}, size=[{}, {}]", conv.describe(), size_h, size_w); }
};

struct Pool2dAttrs {
  int64_t kernel_h = 2, kernel_w = 2;
  int64_t stride_h = 2, stride_w = 2;
  int64_t pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;  // ceil_mode is folded into bottom/right
  bool count_include_pad = false;
  // The rows (columns) ceil_mode added to pad_bottom (pad_right). count_include_pad counts the
  // explicit padding only, as PyTorch does: a partial last window's divisor stops at the input's
  // explicitly padded edge, pad_bottom - ceil_h (pad_right - ceil_w).
  int64_t ceil_h = 0, ceil_w = 0;
  std::string describe() const {
    return fmt::format("kernel=[{}, {}], stride=[{}, {}], pad=[{}, {}, {}, {}], count_include_pad={}, ceil=[{}, {}]",
                       kernel_h, kernel_w, stride_h, stride_w, pad_top, pad_bottom, pad_left, pad_right,
                       count_include_pad, ceil_h, ceil_w);
  }
};

struct Pool2dBackwardAttrs {
  Pool2dAttrs pool;
  int64_t input_h = 0, input_w = 0;
  std::string describe() const { return fmt::format("{}, input=[{}, {}]", pool.describe(), input_h, input_w); }
};

struct NormAttrs {
  double eps = 1e-5;
  int64_t normalized_dims = 1;  // layer_norm only: how many trailing axes
  std::string describe() const { return fmt::format("eps={}, normalized_dims={}", eps, normalized_dims); }
};

struct DropoutAttrs {
  double rate = 0.5;
  std::string describe() const { return fmt::format("rate={}", rate); }
};

}  // namespace flowlet::detail
