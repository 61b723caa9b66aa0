// max_pool2d, avg_pool2d and their backward ops on CUDA: host side (layouts, launches) of the
// pooling kernels in kernels/conv.cu. The kernels follow the CPU's window rules (src/ops/pool.cpp):
// the padding never wins a maximum, the gradient of a window goes to its first maximum, and the
// average's divisor counts the padding only with count_include_pad.
#include "core/device_scope_state.hpp"
#include "cuda/kernels/conv_launch.hpp"
#include "cuda/register.hpp"
#include "cuda/runtime.hpp"
#include "ops/conv_attrs.hpp"

namespace flowlet::detail::cuda {
namespace {

// The geometry of a pooling from x's [N, C, H, W] and y's [.., H', W'].
PoolGeometry geometry(const Pool2dAttrs& a, const Shape& x, const Shape& y) {
  PoolGeometry g;
  g.planes = x[0] * x[1];
  g.in_h = x[2], g.in_w = x[3], g.out_h = y[2], g.out_w = y[3];
  g.kernel_h = a.kernel_h, g.kernel_w = a.kernel_w, g.stride_h = a.stride_h, g.stride_w = a.stride_w;
  g.pad_top = a.pad_top, g.pad_bottom = a.pad_bottom, g.pad_left = a.pad_left, g.pad_right = a.pad_right;
  g.ceil_h = a.ceil_h, g.ceil_w = a.ceil_w;
  g.count_include_pad = a.count_include_pad;
  return g;
}

void max_pool_kernel(const OpCall& call, std::span<Tensor> out) {
  NoDeviceScope here;
  const Tensor x = call.inputs[0].contiguous();
  launch_max_pool(x.raw_data(), out[0].raw_data(), element_type(x.dtype()),
                  geometry(call.attrs<Pool2dAttrs>(), x.shape(), out[0].shape()), launch_on(out[0].device()));
}

void max_pool_backward_kernel(const OpCall& call, std::span<Tensor> out) {
  NoDeviceScope here;
  const Tensor x = call.inputs[0].contiguous();
  const Tensor dy = call.inputs[1].contiguous();
  launch_max_pool_backward(x.raw_data(), dy.raw_data(), out[0].raw_data(), element_type(x.dtype()),
                           geometry(call.attrs<Pool2dAttrs>(), x.shape(), dy.shape()), launch_on(out[0].device()));
}

void avg_pool_kernel(const OpCall& call, std::span<Tensor> out) {
  NoDeviceScope here;
  const Tensor x = call.inputs[0].contiguous();
  launch_avg_pool(x.raw_data(), out[0].raw_data(), element_type(x.dtype()),
                  geometry(call.attrs<Pool2dAttrs>(), x.shape(), out[0].shape()), launch_on(out[0].device()));
}

void avg_pool_backward_kernel(const OpCall& call, std::span<Tensor> out) {
  NoDeviceScope here;
  const Tensor dy = call.inputs[0].contiguous();
  launch_avg_pool_backward(dy.raw_data(), out[0].raw_data(), element_type(dy.dtype()),
                           geometry(call.attrs<Pool2dBackwardAttrs>().pool, out[0].shape(), dy.shape()),
                           launch_on(out[0].device()));
}

}  // namespace

// Called from add_conv_kernels (conv.cpp), which registers the whole conv.hpp family.
void add_pool_kernels(const OpList& ops) {
  set_kernel(ops, "max_pool2d", &max_pool_kernel);
  set_kernel(ops, "max_pool2d_backward", &max_pool_backward_kernel);
  set_kernel(ops, "avg_pool2d", &avg_pool_kernel);
  set_kernel(ops, "avg_pool2d_backward", &avg_pool_backward_kernel);
}

}  // namespace flowlet::detail::cuda
