// Host side of concat, gather and scatter_add on CUDA. Indices are checked on the device (the
// kernels record the first bad position) and the host throws OutOfRange as the CPU does.
#include "core/check.hpp"
#include "core/device_scope_state.hpp"
#include "cuda/check.hpp"
#include "cuda/elementwise_args.hpp"
#include "cuda/register.hpp"
#include "cuda/runtime.hpp"
#include "ops/attributes.hpp"

namespace flowlet::detail::cuda {
namespace {

// Each input copied into its slice of the output (a strided view), as the CPU kernel does.
void concat_kernel(const OpCall& call, std::span<Tensor> out) {
  const auto axis = static_cast<size_t>(normalize_axis("concat", call.attrs<ConcatAttrs>().axis, out[0].rank()));
  const Launch on = launch_on(out[0].device());
  int64_t start = 0;
  for (const Tensor& t : call.inputs) {
    const Tensor slice = Tensor::view(out[0].storage(), t.shape(), out[0].strides(),
                                      out[0].offset() + start * out[0].strides()[axis], t.dtype());
    if (t.numel() > 0) launch_copy(elementwise_args<2>("concat", slice, {&t}), static_cast<int>(dtype_size(t.dtype())), on);
    start += t.shape()[axis];
  }
}

void gather_kernel(const OpCall& call, std::span<Tensor> out) {
  NoDeviceScope here;
  const Tensor params = call.inputs[0].contiguous();
  const Tensor indices = call.inputs[1].contiguous();
  const int64_t rows = params.shape()[0];
  const int64_t row = rows == 0 ? 0 : params.numel() / rows;
  if (indices.numel() == 0) return;
  const ErrorFlag bad_index(call, params.device());
  launch_gather(params.raw_data(), indices.raw_data(), element_type(indices.dtype()), out[0].raw_data(),
                indices.numel(), rows, row, static_cast<int>(dtype_size(params.dtype())), bad_index.data(),
                launch_on(params.device()));
  bad_index.throw_if_out_of_range("gather", "index", rows, indices);
}

void scatter_add_kernel(const OpCall& call, std::span<Tensor> out) {
  NoDeviceScope here;
  const Tensor indices = call.inputs[0].contiguous();
  const Tensor updates = call.inputs[1].contiguous();
  const int64_t rows = out[0].shape()[0];
  const int64_t row = rows == 0 ? 0 : out[0].numel() / rows;
  const Launch on = launch_on(out[0].device());
  const size_t bytes = static_cast<size_t>(out[0].numel()) * dtype_size(out[0].dtype());
  if (bytes > 0) FLOWLET_CUDA_CHECK(on.device, cudaMemsetAsync(out[0].raw_data(), 0, bytes, on.stream));
  if (indices.numel() == 0) return;
  const ErrorFlag bad_index(call, out[0].device());
  launch_scatter_add(indices.raw_data(), element_type(indices.dtype()), updates.raw_data(), out[0].raw_data(),
                     element_type(updates.dtype()), indices.numel(), rows, row, bad_index.data(), on);
  bad_index.throw_if_out_of_range("scatter_add", "index", rows, indices);
}

}  // namespace

void add_shape_kernels(const OpList& ops) {
  set_kernel(ops, "concat", &concat_kernel);
  set_kernel(ops, "gather", &gather_kernel);
  set_kernel(ops, "scatter_add", &scatter_add_kernel);
}

}  // namespace flowlet::detail::cuda
