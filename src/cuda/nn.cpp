// Host side of softmax, log_softmax, softmax_cross_entropy and one_hot on CUDA. Labels and indices
// are checked on the device: a kernel records the first bad position, and the host waits for it and
// throws OutOfRange with the same message as the CPU (the one place these ops wait for the GPU).
#include "core/check.hpp"
#include "core/device_scope_state.hpp"
#include "cuda/register.hpp"
#include "cuda/runtime.hpp"
#include "ops/attributes.hpp"

namespace flowlet::detail::cuda {
namespace {

template <bool Log>
void softmax_kernel(const OpCall& call, std::span<Tensor> out) {
  NoDeviceScope here;
  const Tensor t = call.inputs[0].contiguous();
  const auto axis = static_cast<size_t>(normalize_axis(call.op.name, call.attrs<AxisAttrs>().axis, t.rank()));
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < axis; ++d) outer *= t.shape()[d];
  for (size_t d = axis + 1; d < t.shape().size(); ++d) inner *= t.shape()[d];
  launch_softmax(t.raw_data(), out[0].raw_data(), element_type(t.dtype()), outer, t.shape()[axis], inner, Log,
                 launch_on(out[0].device()));
}

void cross_entropy_kernel(const OpCall& call, std::span<Tensor> out) {
  NoDeviceScope here;
  const Tensor logits = call.inputs[0].contiguous();
  const Tensor labels = call.inputs[1].contiguous();
  const int64_t rows = logits.shape()[0], classes = logits.shape()[1];
  if (rows == 0) return;
  const ErrorFlag bad_label(call, logits.device());
  launch_cross_entropy(logits.raw_data(), labels.raw_data(), element_type(labels.dtype()), out[0].raw_data(),
                       element_type(logits.dtype()), rows, classes, bad_label.data(), launch_on(logits.device()));
  bad_label.throw_if_out_of_range("softmax_cross_entropy", "label", classes, labels);
}

void one_hot_kernel(const OpCall& call, std::span<Tensor> out) {
  NoDeviceScope here;
  const Tensor indices = call.inputs[0].contiguous();
  const int64_t depth = call.attrs<OneHotAttrs>().depth;
  if (indices.numel() == 0) return;
  const ErrorFlag bad_index(call, indices.device());
  launch_one_hot(indices.raw_data(), element_type(indices.dtype()), static_cast<float*>(out[0].raw_data()),
                 indices.numel(), depth, bad_index.data(), launch_on(indices.device()));
  bad_index.throw_if_out_of_range("one_hot", "index", depth, indices);
}

}  // namespace

void add_nn_kernels(const OpList& ops) {
  set_kernel(ops, "softmax", &softmax_kernel<false>);
  set_kernel(ops, "log_softmax", &softmax_kernel<true>);
  set_kernel(ops, "softmax_cross_entropy", &cross_entropy_kernel);
  set_kernel(ops, "one_hot", &one_hot_kernel);
}

}  // namespace flowlet::detail::cuda
