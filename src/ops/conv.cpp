// conv2d and its two backward ops (src/ops/conv_attrs.hpp): the shape rules, the CPU kernels
// (im2col + OpenBLAS, src/kernels/conv_gemm.hpp) and the gradient rules, and the public
// functions of flowlet/ops/conv.hpp that resolve Padding::same() into explicit pads.
//
// Gradients, all written with these ops so they trace, run on CUDA and nest:
//   y = conv2d(x, w) + b (then relu): g = dy (times y > 0 under relu);
//     dx = conv2d_backward_input(g, w), dw = conv2d_backward_weight(x, g), db = sum(g, {0, 2, 3}).
//   dx = conv2d_backward_input(dy, w) is bilinear: d(dy) = conv2d(G, w), d(w) = backward_weight(G, dy).
//   dw = conv2d_backward_weight(x, dy) is bilinear: d(x) = backward_input(dy, G), d(dy) = conv2d(x, G).
// The CPU computes in f32 and f64; f16/bf16 inputs on the CPU get a DTypeError (CUDA runs them).
#include "flowlet/ops/conv.hpp"

#include <limits>

#include "flowlet/dispatch.hpp"
#include "flowlet/ops/elementwise.hpp"
#include "flowlet/ops/reduce.hpp"
#include "kernels/conv_gemm.hpp"
#include "kernels/dtypes.hpp"
#include "ops/conv_attrs.hpp"
#include "ops/grad_helpers.hpp"
#include "ops/registry.hpp"

namespace flowlet {
namespace detail {
namespace {

// The output length of one spatial axis, or a ShapeError when the dilated kernel is larger than
// the padded input.
int64_t conv_out_size(std::string_view op, int64_t in, int64_t pad_lo, int64_t pad_hi, int64_t kernel, int64_t dilation,
                      int64_t stride, const Shape& x, const Shape& w) {
  const int64_t span = dilation * (kernel - 1) + 1;
  if (in + pad_lo + pad_hi < span) {
    fail<ShapeError>("{}: the kernel (extent {} with dilation {}) is larger than the padded input ({} + {} + {}); got x {} and w {}",
                     op, span, dilation, in, pad_lo, pad_hi, x, w);
  }
  return (in + pad_lo + pad_hi - span) / stride + 1;
}

void check_conv_attrs(std::string_view op, const Conv2dAttrs& a) {
  if (a.stride_h <= 0 || a.stride_w <= 0) fail<InvalidArgument>("{}: stride must be positive; got [{}, {}]", op, a.stride_h, a.stride_w);
  if (a.dilation_h <= 0 || a.dilation_w <= 0)
    fail<InvalidArgument>("{}: dilation must be positive; got [{}, {}]", op, a.dilation_h, a.dilation_w);
  if (a.pad_top < 0 || a.pad_bottom < 0 || a.pad_left < 0 || a.pad_right < 0)
    fail<InvalidArgument>("{}: padding must be >= 0; got [{}, {}, {}, {}] (top, bottom, left, right)", op, a.pad_top,
                          a.pad_bottom, a.pad_left, a.pad_right);
  if (a.groups <= 0) fail<InvalidArgument>("{}: groups must be positive; got {}", op, a.groups);
}

// f32/f64 anywhere, f16/bf16 only off the CPU; every tensor of the call in one dtype.
void check_conv_dtypes(std::string_view op, std::span<const Tensor> ts) {
  const DType dt = ts[0].dtype();
  for (const Tensor& t : ts)
    if (t.dtype() != dt) fail<DTypeError>("{}: inputs must share one dtype; got {} and {}", op, dt, t.dtype());
  if (ts[0].device().kind() == DeviceKind::cpu && (bit(dt) & kHalves)) {
    fail<DTypeError>("{}: unsupported dtype on the CPU; got {}, supported: f32, f64 (cast f16/bf16 up on the CPU; CUDA "
                     "runs them)", op, dt);
  }
  check_dtype(op, dt, kFloating);
}

// Checks x [N, C, H, W] against w [O, C / groups, kH, kW] and returns [N, O, H', W'].
Shape conv_output_shape(std::string_view op, const Shape& x, const Shape& w, const Conv2dAttrs& a) {
  if (x.size() != 4 || w.size() != 4) {
    fail<ShapeError>("{}: expects x [N, C, H, W] and w [O, C / groups, kH, kW]; got x {} and w {}", op, x, w);
  }
  check_conv_attrs(op, a);
  if (x[1] % a.groups != 0 || w[0] % a.groups != 0 || w[1] * a.groups != x[1]) {
    fail<ShapeError>("{}: with groups = {}, C ({}) and O ({}) must divide by groups and w's second dimension must be "
                     "C / groups; got x {} and w {}", op, a.groups, x[1], w[0], x, w);
  }
  if (w[2] == 0 || w[3] == 0) fail<ShapeError>("{}: the kernel must not be empty; got x {} and w {}", op, x, w);
  const int64_t oh = conv_out_size(op, x[2], a.pad_top, a.pad_bottom, w[2], a.dilation_h, a.stride_h, x, w);
  const int64_t ow = conv_out_size(op, x[3], a.pad_left, a.pad_right, w[3], a.dilation_w, a.stride_w, x, w);
  return Shape{x[0], w[0], oh, ow};
}

void conv2d_infer(const OpCall& call, OutputSpec& spec) {
  const Tensor& x = call.inputs[0];
  const Tensor& w = call.inputs[1];
  check_conv_dtypes("conv2d", call.inputs);
  const Shape y = conv_output_shape("conv2d", x.shape(), w.shape(), call.attrs<Conv2dAttrs>());
  if (call.inputs.size() == 3 && call.inputs[2].shape() != Shape{w.shape()[0]}) {
    fail<ShapeError>("conv2d: bias must be [O] = [{}]; got bias {} with w {}", w.shape()[0], call.inputs[2].shape(),
                     w.shape());
  }
  spec.outputs[0] = {y, x.dtype()};
}

// dy [N, O, H', W'] and w give dx [N, C, size_h, size_w]; dy must be what conv2d makes of that.
void backward_input_infer(const OpCall& call, OutputSpec& spec) {
  const auto& a = call.attrs<Conv2dBackwardAttrs>();
  const Tensor& dy = call.inputs[0];
  const Tensor& w = call.inputs[1];
  check_conv_dtypes("conv2d_backward_input", call.inputs);
  if (dy.rank() != 4 || w.rank() != 4) {
    fail<ShapeError>("conv2d_backward_input: expects dy [N, O, H', W'] and w [O, C / groups, kH, kW]; got dy {} and w {}",
                     dy.shape(), w.shape());
  }
  const Shape x{dy.shape()[0], w.shape()[1] * a.conv.groups, a.size_h, a.size_w};
  check_shape("conv2d_backward_input", x);
  const Shape y = conv_output_shape("conv2d_backward_input", x, w.shape(), a.conv);
  if (y != dy.shape()) {
    fail<ShapeError>("conv2d_backward_input: dy must be the convolution's output {} for input {}; got dy {} and w {}", y,
                     x, dy.shape(), w.shape());
  }
  spec.outputs[0] = {x, dy.dtype()};
}

// x and dy [N, O, H', W'] give dw [O, C / groups, size_h, size_w].
void backward_weight_infer(const OpCall& call, OutputSpec& spec) {
  const auto& a = call.attrs<Conv2dBackwardAttrs>();
  const Tensor& x = call.inputs[0];
  const Tensor& dy = call.inputs[1];
  check_conv_dtypes("conv2d_backward_weight", call.inputs);
  if (x.rank() != 4 || dy.rank() != 4) {
    fail<ShapeError>("conv2d_backward_weight: expects x [N, C, H, W] and dy [N, O, H', W']; got x {} and dy {}", x.shape(),
                     dy.shape());
  }
  if (a.conv.groups <= 0) fail<InvalidArgument>("conv2d_backward_weight: groups must be positive; got {}", a.conv.groups);
  const Shape w{dy.shape()[1], x.shape()[1] / a.conv.groups, a.size_h, a.size_w};
  check_shape("conv2d_backward_weight", w);
  const Shape y = conv_output_shape("conv2d_backward_weight", x.shape(), w, a.conv);
  if (y != dy.shape()) {
    fail<ShapeError>("conv2d_backward_weight: dy must be the convolution's output {}; got x {} and dy {}", y, x.shape(),
                     dy.shape());
  }
  spec.outputs[0] = {w, x.dtype()};
}

ConvGeometry geometry(const Shape& x, const Shape& w, const Shape& y, const Conv2dAttrs& a) {
  ConvGeometry g;
  g.n = x[0], g.c = x[1], g.h = x[2], g.w = x[3];
  g.o = w[0], g.kh = w[2], g.kw = w[3];
  g.oh = y[2], g.ow = y[3];
  g.stride_h = a.stride_h, g.stride_w = a.stride_w;
  g.pad_top = a.pad_top, g.pad_left = a.pad_left;
  g.dilation_h = a.dilation_h, g.dilation_w = a.dilation_w;
  g.groups = a.groups;
  // OpenBLAS takes int sizes: one image-group's GEMM (weights [O/g, C/g*kH*kW] by columns
  // [C/g*kH*kW, H'*W']) must fit, or the sizes would wrap into a wrong answer.
  constexpr int64_t kBlasLimit = std::numeric_limits<int>::max();
  if (g.c / g.groups * g.kh * g.kw > kBlasLimit || g.oh * g.ow > kBlasLimit || g.h * g.w > kBlasLimit) {
    fail<ShapeError>("conv2d: one image's matrices exceed the {} rows or columns a BLAS call takes; got x {} and w {} "
                     "with {} groups", kBlasLimit, x, w, g.groups);
  }
  return g;
}

template <class T>
const T* data_of(const Tensor& t) {
  return static_cast<const T*>(t.raw_data());
}

void conv2d_kernel(const OpCall& call, std::span<Tensor> out) {
  const auto& a = call.attrs<Conv2dAttrs>();
  const Tensor x = call.inputs[0].contiguous();
  const Tensor w = call.inputs[1].contiguous();
  const Tensor bias = call.inputs.size() == 3 ? call.inputs[2].contiguous() : Tensor();
  const ConvGeometry g = geometry(x.shape(), w.shape(), out[0].shape(), a);
  visit_dtype<kFloatCompute>(x.dtype(), [&]<class T>(TypeTag<T>) {
    conv2d_forward_cpu<T>(g, data_of<T>(x), data_of<T>(w), bias.defined() ? data_of<T>(bias) : nullptr,
                          a.activation == ConvActivation::relu, static_cast<T*>(out[0].raw_data()));
  }, "conv2d");
}

void backward_input_kernel(const OpCall& call, std::span<Tensor> out) {
  const auto& a = call.attrs<Conv2dBackwardAttrs>();
  const Tensor dy = call.inputs[0].contiguous();
  const Tensor w = call.inputs[1].contiguous();
  const ConvGeometry g = geometry(out[0].shape(), w.shape(), dy.shape(), a.conv);
  visit_dtype<kFloatCompute>(dy.dtype(), [&]<class T>(TypeTag<T>) {
    conv2d_backward_input_cpu<T>(g, data_of<T>(dy), data_of<T>(w), static_cast<T*>(out[0].raw_data()));
  }, "conv2d_backward_input");
}

void backward_weight_kernel(const OpCall& call, std::span<Tensor> out) {
  const auto& a = call.attrs<Conv2dBackwardAttrs>();
  const Tensor x = call.inputs[0].contiguous();
  const Tensor dy = call.inputs[1].contiguous();
  const ConvGeometry g = geometry(x.shape(), out[0].shape(), dy.shape(), a.conv);
  visit_dtype<kFloatCompute>(x.dtype(), [&]<class T>(TypeTag<T>) {
    conv2d_backward_weight_cpu<T>(g, data_of<T>(x), data_of<T>(dy), static_cast<T*>(out[0].raw_data()));
  }, "conv2d_backward_weight");
}

Tensor backward_input(const Tensor& dy, const Tensor& w, const Conv2dAttrs& conv, int64_t h, int64_t wd);
Tensor backward_weight(const Tensor& x, const Tensor& dy, const Conv2dAttrs& conv, int64_t kh, int64_t kw);
Tensor plain_conv(const Tensor& x, const Tensor& w, Conv2dAttrs conv);

void conv2d_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> dx) {
  Conv2dAttrs a = c.attrs<Conv2dAttrs>();
  Tensor dy = g[0];
  if (a.activation == ConvActivation::relu) dy = where(c.outputs[0] > 0.0, dy, zero_like_scalar(dy));
  a.activation = ConvActivation::none;
  const Tensor& x = c.inputs[0];
  const Tensor& w = c.inputs[1];
  if (c.wants(0)) dx[0] = backward_input(dy, w, a, x.shape()[2], x.shape()[3]);
  if (c.wants(1)) dx[1] = backward_weight(x, dy, a, w.shape()[2], w.shape()[3]);
  if (c.inputs.size() == 3 && c.wants(2)) dx[2] = sum(dy, {0, 2, 3});
}

void backward_input_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> dx) {
  const auto& a = c.attrs<Conv2dBackwardAttrs>();
  const Tensor& dy = c.inputs[0];
  const Tensor& w = c.inputs[1];
  if (c.wants(0)) dx[0] = plain_conv(g[0], w, a.conv);
  if (c.wants(1)) dx[1] = backward_weight(g[0], dy, a.conv, w.shape()[2], w.shape()[3]);
}

void backward_weight_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> dx) {
  const auto& a = c.attrs<Conv2dBackwardAttrs>();
  const Tensor& x = c.inputs[0];
  const Tensor& dy = c.inputs[1];
  if (c.wants(0)) dx[0] = backward_input(dy, g[0], a.conv, x.shape()[2], x.shape()[3]);
  if (c.wants(1)) dx[1] = plain_conv(x, g[0], a.conv);
}

}  // namespace

Op conv2d_op{"conv2d", 2, 3, kNoFlags, &conv2d_infer, {&conv2d_kernel, nullptr}, &conv2d_grad,
             &copy_attributes<Conv2dAttrs>, &describe_attributes<Conv2dAttrs>};
Op conv2d_backward_input_op{"conv2d_backward_input", 2, 2, kNoFlags, &backward_input_infer,
                            {&backward_input_kernel, nullptr}, &backward_input_grad,
                            &copy_attributes<Conv2dBackwardAttrs>, &describe_attributes<Conv2dBackwardAttrs>};
Op conv2d_backward_weight_op{"conv2d_backward_weight", 2, 2, kNoFlags, &backward_weight_infer,
                             {&backward_weight_kernel, nullptr}, &backward_weight_grad,
                             &copy_attributes<Conv2dBackwardAttrs>, &describe_attributes<Conv2dBackwardAttrs>};

namespace {

Tensor backward_input(const Tensor& dy, const Tensor& w, const Conv2dAttrs& conv, int64_t h, int64_t wd) {
  return dispatch(conv2d_backward_input_op, {dy, w}, Conv2dBackwardAttrs{conv, h, wd});
}
Tensor backward_weight(const Tensor& x, const Tensor& dy, const Conv2dAttrs& conv, int64_t kh, int64_t kw) {
  return dispatch(conv2d_backward_weight_op, {x, dy}, Conv2dBackwardAttrs{conv, kh, kw});
}
Tensor plain_conv(const Tensor& x, const Tensor& w, Conv2dAttrs conv) {
  conv.activation = ConvActivation::none;
  return dispatch(conv2d_op, {x, w}, conv);
}

// The pads of one axis that make its output ceil(in / stride), the odd one at the end.
std::pair<int64_t, int64_t> same_pads(int64_t in, int64_t kernel, int64_t stride, int64_t dilation) {
  const int64_t out = (in + stride - 1) / stride;
  const int64_t total = std::max<int64_t>((out - 1) * stride + dilation * (kernel - 1) + 1 - in, 0);
  return {total / 2, total - total / 2};
}

// The op's attributes for the public options: checks what the op cannot check once "same" is
// resolved (the ranks it needs to resolve it).
Conv2dAttrs conv_attrs(const Tensor& x, const Tensor& w, const Conv2dOptions& o) {
  Conv2dAttrs a;
  a.stride_h = o.stride.h, a.stride_w = o.stride.w;
  a.dilation_h = o.dilation.h, a.dilation_w = o.dilation.w;
  a.groups = o.groups;
  a.pad_top = o.padding.top, a.pad_bottom = o.padding.bottom, a.pad_left = o.padding.left, a.pad_right = o.padding.right;
  if (o.padding.same_size && x.defined() && w.defined()) {
    if (x.rank() != 4 || w.rank() != 4) {
      fail<ShapeError>("conv2d: expects x [N, C, H, W] and w [O, C / groups, kH, kW]; got x {} and w {}", x.shape(),
                       w.shape());
    }
    check_conv_attrs("conv2d", a);
    std::tie(a.pad_top, a.pad_bottom) = same_pads(x.shape()[2], w.shape()[2], a.stride_h, a.dilation_h);
    std::tie(a.pad_left, a.pad_right) = same_pads(x.shape()[3], w.shape()[3], a.stride_w, a.dilation_w);
  }
  return a;
}

}  // namespace

void add_conv_ops(std::vector<Op*>& ops) {
  ops.insert(ops.end(), {&conv2d_op, &conv2d_backward_input_op, &conv2d_backward_weight_op});
}

}  // namespace detail

Tensor conv2d(const Tensor& x, const Tensor& w, int64_t stride, int64_t padding) {
  return conv2d(x, w, Conv2dOptions{.stride = stride, .padding = padding});
}
Tensor conv2d(const Tensor& x, const Tensor& w, const Conv2dOptions& options) {
  return dispatch(detail::conv2d_op, {x, w}, detail::conv_attrs(x, w, options));
}
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dOptions& options) {
  return dispatch(detail::conv2d_op, {x, w, bias}, detail::conv_attrs(x, w, options));
}

}  // namespace flowlet
