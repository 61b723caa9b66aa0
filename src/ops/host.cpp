// print and host_callback: stateful ops (never pruned, folded or merged) whose kernels call host code.
#include "flowlet/ops/host.hpp"

#include <cstdio>

#include <fmt/format.h>

#include "core/check.hpp"
#include "flowlet/core/format.hpp"
#include "flowlet/dispatch.hpp"

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

void callback_kernel(const OpCall& call, std::span<Tensor>) {
  call.attrs<CallbackAttrs>().fn(std::vector<Tensor>(call.inputs.begin(), call.inputs.end()));
}

}  // namespace

Op print_op{"print", 1, 1, kStateful | kView, &print_infer, {&print_kernel, nullptr}, nullptr,
            &copy_attributes<PrintAttrs>, &describe_attributes<PrintAttrs>};
Op host_callback_op{"host_callback", 0, -1, kStateful | kView, &callback_infer, {&callback_kernel, nullptr}, nullptr,
                    &copy_attributes<CallbackAttrs>, &describe_attributes<CallbackAttrs>};

}  // namespace detail

Tensor print(const Tensor& t, std::string label) {
  return dispatch(detail::print_op, {t}, detail::PrintAttrs{std::move(label)});
}

void host_callback(std::function<void(const std::vector<Tensor>&)> fn, std::vector<Tensor> inputs) {
  const detail::CallbackAttrs attrs{std::move(fn)};
  dispatch_all(detail::host_callback_op, inputs, &attrs);
}

}  // namespace flowlet
