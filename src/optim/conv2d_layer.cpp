// nn::Conv2d (flowlet/layers.hpp): a weight [out, in / groups, kH, kW] and an optional bias [out],
// initialized as PyTorch does, applied with conv2d(x, w, bias, options) (flowlet/ops/conv.hpp).
#include <cmath>

#include "core/check.hpp"
#include "flowlet/layers.hpp"
#include "flowlet/ops/creation.hpp"

namespace flowlet::nn {
namespace {

void check_positive(const char* what, int64_t value) {
  if (value <= 0) detail::fail<InvalidArgument>("Conv2d: {} must be > 0; got {}", what, value);
}

}  // namespace

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel, uint64_t seed, Conv2dOptions options_in,
               std::string name, bool has_bias, DType dtype)
    : options(options_in) {
  check_positive("in_channels", in_channels);
  check_positive("out_channels", out_channels);
  check_positive("kernel height", kernel.h);
  check_positive("kernel width", kernel.w);
  check_positive("groups", options.groups);
  if (in_channels % options.groups != 0 || out_channels % options.groups != 0) {
    detail::fail<InvalidArgument>("Conv2d: in_channels and out_channels must divide by groups; got {}, {} and groups {}",
                                  in_channels, out_channels, options.groups);
  }
  const int64_t fan_in = in_channels / options.groups * kernel.h * kernel.w;
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  weight = Variable(uniform({out_channels, in_channels / options.groups, kernel.h, kernel.w}, -bound, bound, seed, dtype),
                    name + "/weight");
  // A different stream for the bias than the weight's (same seed, shifted).
  if (has_bias) bias = Variable(uniform({out_channels}, -bound, bound, seed ^ 0x9E3779B97F4A7C15ull, dtype), name + "/bias");
}

Tensor Conv2d::forward(const Tensor& x) {
  if (!x.defined()) detail::fail<InvalidArgument>("Conv2d: input is an empty Tensor handle");
  if (x.rank() != 4) detail::fail<ShapeError>("Conv2d: expects an [N, C, H, W] input (rank 4); got {}", x.shape());
  return bias.defined() ? conv2d(x, weight, bias, options) : conv2d(x, weight, options);
}

std::vector<Variable> Conv2d::parameters() const {
  if (bias.defined()) return {weight, bias};
  return {weight};
}

}  // namespace flowlet::nn
