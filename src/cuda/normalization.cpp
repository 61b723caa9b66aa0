// batch_norm_training / _backward / _inference, layer_norm / _backward and dropout on CUDA: host
// side (layouts, launches) of kernels/normalization.cu. The op rules (src/ops/normalization.cpp,
// src/ops/dropout.cpp) have checked shapes and dtypes: every input has x's dtype.
#include <algorithm>

#include "core/check.hpp"
#include "core/device_scope_state.hpp"
#include "cuda/kernels/conv_launch.hpp"
#include "cuda/register.hpp"
#include "cuda/runtime.hpp"
#include "ops/conv_attrs.hpp"

namespace flowlet::detail::cuda {
namespace {

// x [N, C, ...] as [outer = N, channels = C, inner = the product of the rest].
ChannelLayout channels_of(const Shape& s) {
  ChannelLayout l;
  l.outer = s[0];
  l.channels = s[1];
  l.inner = 1;
  for (size_t d = 2; d < s.size(); ++d) l.inner *= s[d];
  return l;
}

// Rows and columns of layer norm: the last `normalized_dims` axes are a row.
void rows_of(const Shape& s, int64_t normalized_dims, int64_t& rows, int64_t& cols) {
  rows = 1, cols = 1;
  const size_t lead = s.size() - static_cast<size_t>(normalized_dims);
  for (size_t d = 0; d < s.size(); ++d) (d < lead ? rows : cols) *= s[d];
}

// The partial sums' buffer of the batch norm kernels (from the caching allocator: stream ordered).
Tensor batch_norm_scratch(const ChannelLayout& l, const Launch& on, Device device) {
  return Tensor::empty(Shape{std::max<int64_t>(batch_norm_scratch_doubles(l, on), 1)}, f64, device);
}

void batch_norm_training_kernel(const OpCall& call, std::span<Tensor> out) {
  NoDeviceScope here;
  const Tensor x = call.inputs[0].contiguous();
  const Tensor gamma = call.inputs[1].contiguous(), beta = call.inputs[2].contiguous();
  const ChannelLayout l = channels_of(x.shape());
  const Launch on = launch_on(x.device());
  const Tensor scratch = batch_norm_scratch(l, on, x.device());
  launch_batch_norm_training(x.raw_data(), gamma.raw_data(), beta.raw_data(), out[0].raw_data(), out[1].raw_data(),
                             out[2].raw_data(), element_type(x.dtype()), l, call.attrs<NormAttrs>().eps,
                             static_cast<double*>(scratch.raw_data()), on);
}

void batch_norm_inference_kernel(const OpCall& call, std::span<Tensor> out) {
  NoDeviceScope here;
  const Tensor x = call.inputs[0].contiguous();
  const Tensor gamma = call.inputs[1].contiguous(), beta = call.inputs[2].contiguous();
  const Tensor mean = call.inputs[3].contiguous(), var = call.inputs[4].contiguous();
  launch_batch_norm_inference(x.raw_data(), gamma.raw_data(), beta.raw_data(), mean.raw_data(), var.raw_data(),
                              out[0].raw_data(), element_type(x.dtype()), channels_of(x.shape()),
                              call.attrs<NormAttrs>().eps, launch_on(x.device()));
}

void batch_norm_backward_kernel(const OpCall& call, std::span<Tensor> out) {
  NoDeviceScope here;
  const Tensor x = call.inputs[0].contiguous();
  const Tensor gamma = call.inputs[1].contiguous(), mean = call.inputs[2].contiguous();
  const Tensor var = call.inputs[3].contiguous(), dy = call.inputs[4].contiguous();
  const ChannelLayout l = channels_of(x.shape());
  const Launch on = launch_on(x.device());
  const Tensor scratch = batch_norm_scratch(l, on, x.device());
  launch_batch_norm_backward(x.raw_data(), gamma.raw_data(), mean.raw_data(), var.raw_data(), dy.raw_data(),
                             out[0].raw_data(), out[1].raw_data(), out[2].raw_data(), element_type(x.dtype()), l,
                             call.attrs<NormAttrs>().eps, static_cast<double*>(scratch.raw_data()), on);
}

void layer_norm_kernel(const OpCall& call, std::span<Tensor> out) {
  NoDeviceScope here;
  const Tensor x = call.inputs[0].contiguous();
  const Tensor gamma = call.inputs[1].contiguous(), beta = call.inputs[2].contiguous();
  const NormAttrs& attrs = call.attrs<NormAttrs>();
  int64_t rows = 0, cols = 0;
  rows_of(x.shape(), attrs.normalized_dims, rows, cols);
  launch_layer_norm(x.raw_data(), gamma.raw_data(), beta.raw_data(), out[0].raw_data(), out[1].raw_data(),
                    out[2].raw_data(), element_type(x.dtype()), rows, cols, attrs.eps, launch_on(x.device()));
}

void layer_norm_backward_kernel(const OpCall& call, std::span<Tensor> out) {
  NoDeviceScope here;
  const Tensor x = call.inputs[0].contiguous();
  const Tensor gamma = call.inputs[1].contiguous(), mean = call.inputs[2].contiguous();
  const Tensor rstd = call.inputs[3].contiguous(), dy = call.inputs[4].contiguous();
  int64_t rows = 0, cols = 0;
  rows_of(x.shape(), call.attrs<NormAttrs>().normalized_dims, rows, cols);
  launch_layer_norm_backward(x.raw_data(), gamma.raw_data(), mean.raw_data(), rstd.raw_data(), dy.raw_data(),
                             out[0].raw_data(), out[1].raw_data(), out[2].raw_data(), element_type(x.dtype()), rows,
                             cols, launch_on(x.device()));
}

// The state is read by the kernel on the device (no host round trip), so it must be there.
void dropout_kernel(const OpCall& call, std::span<Tensor> out) {
  NoDeviceScope here;
  const Tensor x = call.inputs[0].contiguous();
  const Tensor state = call.inputs[1].contiguous();
  if (state.device() != x.device()) {
    fail<DeviceError>("dropout: the random state on {} must be on x's device {}", state.device(), x.device());
  }
  launch_dropout(x.raw_data(), out[0].raw_data(), element_type(x.dtype()), x.numel(),
                 static_cast<const int64_t*>(state.raw_data()), call.attrs<DropoutAttrs>().rate, launch_on(x.device()));
}

}  // namespace

void add_normalization_kernels(const OpList& ops) {
  set_kernel(ops, "batch_norm_training", &batch_norm_training_kernel);
  set_kernel(ops, "batch_norm_backward", &batch_norm_backward_kernel);
  set_kernel(ops, "batch_norm_inference", &batch_norm_inference_kernel);
  set_kernel(ops, "layer_norm", &layer_norm_kernel);
  set_kernel(ops, "layer_norm_backward", &layer_norm_backward_kernel);
  set_kernel(ops, "dropout", &dropout_kernel);
}

}  // namespace flowlet::detail::cuda
