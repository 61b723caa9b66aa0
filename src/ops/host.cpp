// print and host_callback: stateful ops (never pruned, folded or merged) whose kernels call host code.
#include "flowlet/ops/host.hpp"

#include <cstdio>

#include <fmt/format.h>

#include "core/check.hpp"
#include "flowlet/core/format.hpp"
#include "flowlet/dispatch.hpp"
#include "ops/internal.hpp"
#include "ops/registry.hpp"

namespace flowlet {
namespace detail {
namespace {

struct PrintAttrs {
  std::string label;
  std::string describe() const { return fmt::format("label='{}'", label); }
};

struct CallbackAttrs {
  std::function<void(const std::vector<Tensor>&)> fn;
  std::string describe() const { return "fn=<host function>"; }
};

void print_infer(const OpCall& call, OutputSpec& spec) {
  spec.outputs[0] = TensorMeta{call.inputs[0].shape(), call.inputs[0].dtype()};
}

void print_kernel(const OpCall& call, std::span<Tensor> outputs) {
  const std::string& label = call.attrs<PrintAttrs>().label;
  const std::string text = label.empty() ? fmt::format("{}\n", call.inputs[0]) : fmt::format("{}: {}\n", label, call.inputs[0]);
  std::fputs(text.c_str(), stderr);
  outputs[0] = call.inputs[0];
}

void callback_infer(const OpCall& call, OutputSpec& spec) {
  if (!call.attrs<CallbackAttrs>().fn) fail<InvalidArgument>("host_callback: fn is empty; got an empty std::function");
  spec.count = 0;
}

// The callback is host code: inputs on another device (a GPU) reach it as host copies, so it may
// read elements (data<T>(), item()) whatever device the node ran on. The copy waits for the
// device, so the values are those the node's inputs had.
void callback_kernel(const OpCall& call, std::span<Tensor>) {
  std::vector<Tensor> inputs;
  inputs.reserve(call.inputs.size());
  for (const Tensor& t : call.inputs) {
    inputs.push_back(t.device().kind() == DeviceKind::cpu ? t : copy_to_device(t, Device(DeviceKind::cpu, 0)));
  }
  call.attrs<CallbackAttrs>().fn(inputs);
}

}  // namespace

// One kernel for every device kind (kAnyDevice): formatting copies a GPU tensor to the host first
// (core/format.cpp), and the callback gets host copies.
Op print_op{"print", 1, 1, kStateful | kView | kAnyDevice, &print_infer, {&print_kernel}, nullptr,
            &copy_attributes<PrintAttrs>, &describe_attributes<PrintAttrs>};
Op host_callback_op{"host_callback", 0, -1, kStateful | kView | kAnyDevice, &callback_infer, {&callback_kernel},
                    nullptr, &copy_attributes<CallbackAttrs>, &describe_attributes<CallbackAttrs>};

void add_host_ops(std::vector<Op*>& ops) { ops.insert(ops.end(), {&print_op, &host_callback_op}); }

}  // namespace detail

Tensor print(const Tensor& t, std::string label) {
  return dispatch(detail::print_op, {t}, detail::PrintAttrs{std::move(label)});
}

void host_callback(std::function<void(const std::vector<Tensor>&)> fn, std::vector<Tensor> inputs) {
  const detail::CallbackAttrs attrs{std::move(fn)};
  dispatch_all(detail::host_callback_op, inputs, &attrs);
}

}  // namespace flowlet
