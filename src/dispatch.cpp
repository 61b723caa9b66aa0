// The one dispatch path: check the call, infer outputs, allocate them, run the device's kernel.
// Tracing (record a node instead) and gradient tapes hook in here, never in per-op code: this is
// the only caller of TraceBuilder::record, graph-only ops (variables, queues) included.
#include "flowlet/dispatch.hpp"

#include <array>

#include "core/allocator.hpp"
#include "core/check.hpp"
#include "core/device_scope_state.hpp"
#include "flowlet/autodiff.hpp"
#include "ops/internal.hpp"
#include "trace/tracer.hpp"

namespace flowlet {
namespace {

std::string kernel_devices(const Op& op) {
  std::string names;
  for (int kind = 0; kind < kNumDeviceKinds; ++kind) {
    if (!op.kernels[kind] && !op.async_kernels[kind]) continue;
    if (!names.empty()) names += ", ";
    names += device_kind_name(static_cast<DeviceKind>(kind));
  }
  return names.empty() ? "none" : names;
}

[[noreturn, gnu::noinline]] void fail_no_kernel(const Op& op, Device device) {
  detail::fail<DeviceError>("{}: no kernel for device {}; kernels exist for: {}", op.name, device, kernel_devices(op));
}

[[noreturn, gnu::noinline]] void fail_graph_only(const Op& op) {
  detail::fail<InvalidArgument>(
      "{}: exists only in traced graphs; got an eager call; call the library function that records it "
      "inside a function passed to flowlet::trace",
      op.name);
}

// Runs `op` where its inputs are and leaves its outputs in `outputs`; returns how many there are.
int run_here(const Op& op, std::span<const Tensor> inputs, const void* attributes,
             std::array<Tensor, kMaxOutputs>& outputs) {
  const auto count = static_cast<int>(inputs.size());
  if (count < op.min_inputs || (op.max_inputs >= 0 && count > op.max_inputs)) {
    if (op.min_inputs == op.max_inputs) {
      detail::fail<InvalidArgument>("{}: expects {} inputs; got {}", op.name, op.min_inputs, count);
    }
    detail::fail<InvalidArgument>("{}: expects at least {} inputs; got {}", op.name, op.min_inputs, count);
  }
  detail::TraceBuilder* const trace = detail::active_trace();
  if (!trace && op.has_flag(kGraphOnly)) [[unlikely]] fail_graph_only(op);  // before its rule reads attributes
  OutputSpec spec;
  for (int i = 0; i < count; ++i) {
    if (!inputs[i].defined()) {
      detail::fail<InvalidArgument>("{}: input {} is an empty Tensor handle; got Tensor()", op.name, i);
    }
    if (inputs[i].impl_ptr()->trace_id != 0 && !trace) detail::fail_foreign_symbolic(op, inputs[i]);
    if (i == 0) {
      spec.device = inputs[0].device();
    } else if (inputs[i].device() != spec.device && !trace) {
      // While tracing, inputs may live on different devices: the placer chooses the node's device
      // and the partitioner moves what crosses (Send/Recv). Eagerly, moving is the caller's choice.
      detail::fail<DeviceError>("{}: inputs are on different devices; got input 0 on {} and input {} on {}",
                                op.name, spec.device, i, inputs[i].device());
    }
  }
  const OpCall call{op, inputs, attributes};
  op.infer(call, spec);
  // The size rule for every output: here for the outputs no allocation checks (traced nodes, views);
  // an eager op's outputs are checked by Tensor::empty as they are allocated (below).
  if (trace || op.has_flag(kView)) [[unlikely]] {
    for (int i = 0; i < spec.count; ++i) detail::check_size(op.name, spec.outputs[i].shape, spec.outputs[i].dtype);
  }
  check_device_exists(op.name, spec.device);
  const KernelFn kernel = op.kernels[static_cast<int>(spec.device.kind())];
  const std::span<Tensor> results(outputs.data(), static_cast<size_t>(spec.count));
  if (trace) {
    // Tracing: record a node instead of running the kernel; tapes record the symbolic outputs.
    // A graph-only node goes where the placer finds its kernel (a dequeue of GPU tensors runs on the host).
    if (!op.runs_on(spec.device.kind()) && !op.has_flag(kGraphOnly)) fail_no_kernel(op, spec.device);
    trace->record(op, inputs, attributes, spec, results);
  } else {
    if (!kernel) [[unlikely]] fail_no_kernel(op, spec.device);
    try {
      if (!op.has_flag(kView)) {
        for (int i = 0; i < spec.count; ++i) {
          outputs[i] = Tensor::empty(spec.outputs[i].shape, spec.outputs[i].dtype, spec.device);
        }
      }
      kernel(call, results);
    } catch (...) {
      detail::rethrow_naming_op(op.name, spec.device);  // out of memory and sizes name the op; other errors pass unchanged
    }
  }
  if (detail::any_tape_active()) {
    detail::record_on_tapes(op, inputs, attributes, std::span<const Tensor>(outputs.data(), static_cast<size_t>(spec.count)));
  }
  return spec.count;
}

// Inside an eager DeviceScope: copies the inputs that are elsewhere to the scope's device (through
// to_device, so tapes record the copies and gradients flow back), then runs there.
[[gnu::noinline]] int run_in_scope(const Op& op, std::span<const Tensor> inputs, const void* attributes,
                                   std::array<Tensor, kMaxOutputs>& outputs, Device device) {
  std::vector<Tensor> moved(inputs.begin(), inputs.end());
  for (size_t i = 0; i < moved.size(); ++i) {
    const Tensor& t = inputs[i];
    // Empty handles and stray symbolic tensors stay as they are, for run_here to report.
    if (!t.defined() || t.impl_ptr()->trace_id != 0 || t.device() == device) continue;
    size_t same = 0;  // an input used twice (x * x) is copied once
    while (same < i && inputs[same].impl_ptr() != t.impl_ptr()) ++same;
    moved[i] = same < i ? moved[same] : detail::copy_to_device(t, device);
  }
  return run_here(op, std::span<const Tensor>(moved.data(), moved.size()), attributes, outputs);
}

// Runs `op` on the innermost device scope's device when there is one and it applies, else where
// the inputs are. Ops that place their output themselves (to_device) and traces ignore scopes (a
// traced node records the scope as its requested device instead).
int run_op(const Op& op, std::span<const Tensor> inputs, const void* attributes,
           std::array<Tensor, kMaxOutputs>& outputs) {
  if (const detail::ScopeFrame* scope = detail::innermost_scope) [[unlikely]] {
    if (!op.has_flag(kPlacesOutput) && !detail::active_trace()) {
      for (const Tensor& t : inputs) {
        if (t.defined() && t.device() != scope->device) {
          return run_in_scope(op, inputs, attributes, outputs, scope->device);
        }
      }
    }
  }
  return run_here(op, inputs, attributes, outputs);
}

}  // namespace

Device default_device() {
  // A traced node records the scope as its requested device instead (the placer decides).
  const detail::ScopeFrame* frame = detail::innermost_scope;
  if (!frame || detail::active_trace()) return Device();
  return frame->device;
}

std::vector<Tensor> dispatch_all(const Op& op, std::span<const Tensor> inputs, const void* attributes) {
  std::array<Tensor, kMaxOutputs> outputs;
  const int count = run_op(op, inputs, attributes, outputs);
  return {outputs.begin(), outputs.begin() + count};
}

Tensor dispatch(const Op& op, std::span<const Tensor> inputs, const void* attributes) {
  std::array<Tensor, kMaxOutputs> outputs;
  const int count = run_op(op, inputs, attributes, outputs);
  if (count != 1) {
    detail::fail<InvalidArgument>("{}: has {} outputs; call dispatch_all", op.name, count);
  }
  return std::move(outputs[0]);
}

}  // namespace flowlet
