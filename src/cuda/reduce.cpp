// Host side of sum, max and argmax on CUDA: the input as a contiguous [outer, reduced, inner]
// block (the layout the CPU kernels use, ops/reduce_layout.hpp), then kernels/reduce.cu.
#include "core/check.hpp"
#include "core/device_scope_state.hpp"
#include "cuda/register.hpp"
#include "cuda/runtime.hpp"
#include "ops/reduce_layout.hpp"

namespace flowlet::detail::cuda {
namespace {

template <Reduction Op>
void reduce_kernel(const OpCall& call, std::span<Tensor> out) {
  NoDeviceScope here;  // the copy that blocks the input stays on its device
  const Tensor& t = call.inputs[0];
  const Blocked b = block_input(t, reduced_axes(call.op.name, t, call.attrs<ReduceAttrs>()));
  const Launch on = launch_on(out[0].device());
  const ElementType type = element_type(t.dtype());
  const int64_t scratch_bytes = reduce_scratch_bytes(Op, type, b.outer, b.reduced, b.inner, on);
  const Tensor scratch = scratch_bytes > 0 ? Tensor::empty(Shape{scratch_bytes}, u8, t.device()) : Tensor();
  launch_reduce(Op, b.data.raw_data(), out[0].raw_data(), type, b.outer, b.reduced, b.inner,
                scratch_bytes > 0 ? scratch.raw_data() : nullptr, on);
}

void argmax_kernel(const OpCall& call, std::span<Tensor> out) {
  NoDeviceScope here;
  const Tensor& t = call.inputs[0];
  const int64_t axis = normalize_axis("argmax", call.attrs<ArgmaxAttrs>().axis, t.rank());
  const Blocked b = block_input(t, {axis});
  launch_argmax(b.data.raw_data(), static_cast<int64_t*>(out[0].raw_data()), element_type(t.dtype()), b.outer,
                b.reduced, b.inner, launch_on(out[0].device()));
}

}  // namespace

void add_reduce_kernels(const OpList& ops) {
  set_kernel(ops, "sum", &reduce_kernel<Reduction::sum>);
  set_kernel(ops, "max", &reduce_kernel<Reduction::max>);
  set_kernel(ops, "argmax", &argmax_kernel);
}

}  // namespace flowlet::detail::cuda
