// Host side of the elementwise ops on CUDA: operands described with merged dimensions, then the
// launcher that kernels/binary.cu or kernels/unary.cu built for the op's row of
// kernels/elementwise_functors.hpp, found from the Op itself.
#include <optional>

#include "core/check.hpp"
#include "cuda/elementwise_args.hpp"
#include "cuda/register.hpp"
#include "cuda/runtime.hpp"
#include "ops/attributes.hpp"
#include "ops/elementwise_ops.hpp"

namespace flowlet::detail::cuda {
namespace {

ElementwiseLauncher launcher(ElementwiseOp id) {
  const ElementwiseLauncher binary = binary_launcher(id);
  return binary.launch != nullptr ? binary : unary_launcher(id);
}

void elementwise_kernel(const OpCall& call, std::span<Tensor> out) {
  if (out[0].numel() == 0) return;
  const std::optional<ElementwiseOp> id = elementwise_op_id(call.op);
  if (!id) fail<InvalidArgument>("{}: internal: not an elementwise op, so it has no CUDA launcher", call.op.name);
  const ElementwiseLauncher launch = launcher(*id);
  const std::span<const Tensor> in = call.inputs;
  const DType type = in[0].dtype();
  // The CPU kernel throws on an integer error (division by zero); here the kernel marks it and the
  // host throws after waiting for it (so integer div waits for the device, float div does not).
  std::optional<ErrorFlag> error;
  if (launch.error_message != nullptr && is_integral(type)) error.emplace(call, out[0].device());
  uint64_t* const error_slot = error ? error->data() : nullptr;
  const Launch on = launch_on(out[0].device());
  const char* name = call.op.name.data();  // Op names are string literals, so NUL-terminated
  switch (in.size()) {
    case 1: launch.launch(name, elementwise_args<2>(call.op.name, out[0], {&in[0]}), type, on, error_slot); break;
    case 2: launch.launch(name, elementwise_args<3>(call.op.name, out[0], {&in[0], &in[1]}), type, on, error_slot); break;
    default:
      launch.launch(name, elementwise_args<4>(call.op.name, out[0], {&in[0], &in[1], &in[2]}), type, on, error_slot);
  }
  if (error) error->throw_if_marked(fmt::format("{}: {}", call.op.name, launch.error_message));
}

void where_kernel(const OpCall& call, std::span<Tensor> out) {
  if (out[0].numel() == 0) return;
  const Tensor& a = call.inputs[1];
  launch_where(elementwise_args<4>("where", out[0], {&call.inputs[0], &a, &call.inputs[2]}),
               static_cast<int>(dtype_size(a.dtype())), launch_on(out[0].device()));
}

void cast_kernel(const OpCall& call, std::span<Tensor> out) {
  if (out[0].numel() == 0) return;
  const Tensor& t = call.inputs[0];
  launch_cast(elementwise_args<2>("cast", out[0], {&t}), element_type(out[0].dtype()), element_type(t.dtype()),
              launch_on(out[0].device()));
}

}  // namespace

void add_elementwise_kernels(const OpList& ops) {
  constexpr auto cuda = static_cast<size_t>(DeviceKind::cuda);
  for (size_t row = 0; row < kElementwiseOpCount; ++row) {
    const auto id = static_cast<ElementwiseOp>(row);
    if (launcher(id).launch != nullptr) elementwise_op(id).kernels[cuda] = &elementwise_kernel;
  }
  set_kernel(ops, "where", &where_kernel);
  set_kernel(ops, "cast", &cast_kernel);
}

}  // namespace flowlet::detail::cuda
