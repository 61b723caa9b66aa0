// Host side of the elementwise ops on CUDA: operands described with merged dimensions, then the
// launcher that kernels/binary.cu or kernels/unary.cu exports under the op's name.
#include <optional>
#include <vector>

#include "core/check.hpp"
#include "cuda/elementwise_args.hpp"
#include "cuda/register.hpp"
#include "cuda/runtime.hpp"
#include "ops/attributes.hpp"

namespace flowlet::detail::cuda {
namespace {

using LaunchFn = decltype(NamedLauncher::launch);

// Op -> launcher, filled once while the op table is built (before any kernel can run).
struct Entry {
  const Op* op;
  LaunchFn launch;
};
std::vector<Entry>& launchers() {
  static std::vector<Entry> entries;
  return entries;
}
LaunchFn launcher(const Op& op) {
  for (const Entry& e : launchers()) {
    if (e.op == &op) return e.launch;
  }
  fail<InvalidArgument>("{}: internal: no CUDA launcher registered", op.name);
}

void binary_kernel(const OpCall& call, std::span<Tensor> out) {
  const Tensor& a = call.inputs[0];
  const Tensor& b = call.inputs[1];
  if (out[0].numel() == 0) return;
  const Launch on = launch_on(out[0].device());
  // The CPU kernel throws on an integer division by zero; here the kernel marks it and the host
  // throws after waiting for it (so integer div waits for the device, float div does not).
  std::optional<ErrorFlag> zero_divisor;
  if (call.op.name == "div" && is_integral(a.dtype())) zero_divisor.emplace(call, out[0].device());
  launcher(call.op)(elementwise_args<3>(call.op.name, out[0], {&a, &b}), element_type(a.dtype()), on,
                    zero_divisor ? zero_divisor->data() : nullptr);
  if (zero_divisor) zero_divisor->throw_if_marked("div: integer division by zero; got a zero divisor");
}

void unary_kernel(const OpCall& call, std::span<Tensor> out) {
  const Tensor& t = call.inputs[0];
  if (out[0].numel() == 0) return;
  launcher(call.op)(elementwise_args<2>(call.op.name, out[0], {&t}), element_type(t.dtype()),
                    launch_on(out[0].device()), nullptr);
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

void add_launchers(const OpList& ops, const NamedLauncher* list, KernelFn kernel) {
  for (const NamedLauncher* l = list; l->name != nullptr; ++l) {
    set_kernel(ops, l->name, kernel);
    for (const Op* op : ops) {
      if (op->name == l->name) launchers().push_back({op, l->launch});
    }
  }
}

}  // namespace

void add_elementwise_kernels(const OpList& ops) {
  add_launchers(ops, binary_launchers(), &binary_kernel);
  add_launchers(ops, unary_launchers(), &unary_kernel);
  set_kernel(ops, "where", &where_kernel);
  set_kernel(ops, "cast", &cast_kernel);
}

}  // namespace flowlet::detail::cuda
