// TraceBuilder: turns the op calls of a function being traced into graph nodes.
#include "trace/tracer.hpp"

#include <atomic>
#include <utility>

#include "core/check.hpp"
#include "core/device_scope_state.hpp"
#include "flowlet/eager_scope.hpp"
#include "trace/source_trace.hpp"

namespace flowlet::detail {

namespace {
thread_local int32_t current_gradient_of = -1;
}  // namespace

GradientOfScope::GradientOfScope(int32_t forward) : previous_(current_gradient_of) { current_gradient_of = forward; }
GradientOfScope::~GradientOfScope() { current_gradient_of = previous_; }

namespace {

[[gnu::tls_model("initial-exec")]] thread_local TraceBuilder* active = nullptr;

uint32_t next_trace_id() {
  static std::atomic<uint32_t> counter{0};
  uint32_t id = counter.fetch_add(1, std::memory_order_relaxed) + 1;
  if (id == 0) id = counter.fetch_add(1, std::memory_order_relaxed) + 1;  // 0 means "not symbolic"
  return id;
}

}  // namespace

TraceBuilder* active_trace() { return active; }

ActiveTraceScope::ActiveTraceScope(TraceBuilder* builder) : previous_(active) { active = builder; }
ActiveTraceScope::~ActiveTraceScope() { active = previous_; }

Tensor make_symbolic(const TensorMeta& meta, Device device, uint32_t trace_id, int32_t node, int32_t output) {
  // A zero-byte storage carries the device; nothing ever reads through it.
  Tensor t = Tensor::view(make_ref<Storage>(nullptr, 0, device, nullptr), meta.shape, contiguous_strides(meta.shape),
                          0, meta.dtype);
  detail::TensorImpl* impl = t.impl_ptr();
  impl->trace_id = trace_id;
  impl->trace_node = node;
  impl->trace_output = output;
  return t;
}

void fail_foreign_symbolic(const Op& op, const Tensor& t) {
  fail<InvalidArgument>(
      "{}: got a symbolic tensor ({} {}) outside the trace that made it; a tensor created inside a traced "
      "function only exists in its graph: return it from the function instead of keeping it",
      op.name, t.shape(), t.dtype());
}

TraceBuilder::TraceBuilder() : id_(next_trace_id()) {}

Tensor TraceBuilder::add_argument(const TensorMeta& meta, Device device, int32_t index) {
  Node n;
  n.kind = NodeKind::argument;
  n.argument = index;
  n.outputs.push_back(meta);
  n.device = device;
  n.name = fmt::format("arg_{}", index);
  const int32_t id = graph_.add_node(std::move(n));
  return make_symbolic(meta, device, id_, id, 0);
}

ValueRef TraceBuilder::value_of(const Tensor& t) {
  const detail::TensorImpl* impl = t.impl_ptr();
  if (impl->trace_id == id_) return ValueRef{impl->trace_node, impl->trace_output};
  if (impl->trace_id != 0) {
    fail<InvalidArgument>(
        "trace: got a symbolic tensor ({} {}) from another traced function; pass values between traced functions "
        "as arguments and results",
        t.shape(), t.dtype());
  }
  if (auto found = constants_.find(impl); found != constants_.end()) return ValueRef{found->second, 0};
  const int32_t id = graph_.add_constant(t);
  constants_.emplace(impl, id);
  constant_keepalive_.push_back(t);
  return ValueRef{id, 0};
}

int32_t TraceBuilder::record(const Op& op, std::span<const Tensor> inputs, const void* attributes,
                             const OutputSpec& spec, std::span<Tensor> outputs) {
  Node n;
  n.kind = NodeKind::op;
  n.op = &op;
  n.inputs.reserve(inputs.size());
  for (const Tensor& in : inputs) n.inputs.push_back(value_of(in));
  if (attributes && op.copy_attributes) n.attributes = op.copy_attributes(attributes);
  for (int i = 0; i < spec.count; ++i) n.outputs.push_back(spec.outputs[static_cast<size_t>(i)]);
  n.device = spec.device;
  if (const ScopeFrame* scope = innermost_scope) {  // placement requests, kept for the placer
    if (!op.has_flag(kRunsAtResource)) n.requested_device = scope->requested;
    n.colocate_with = scope->colocate_with;
  }
  n.gradient_of = current_gradient_of;
  n.source = capture_source();
  const int32_t id = graph_.add_node(std::move(n));
  for (int i = 0; i < spec.count; ++i) {
    outputs[static_cast<size_t>(i)] = make_symbolic(spec.outputs[static_cast<size_t>(i)], spec.device, id_, id, i);
  }
  if (op.node_name) graph_.node(id).name = fmt::format("{}_{}", op.node_name(attributes), id);
  static const char host = 0;  // the resource every print and callback shares
  if (op.has_flag(kStateful)) {
    const ResourceAccess access = op.resource ? op.resource(attributes) : ResourceAccess{};
    order_effect(id, access.resource ? access.resource : &host, access.writes);
  }
  return id;
}

void TraceBuilder::order_effect(int32_t node, const void* resource, bool writes) {
  ResourceUse& use = resources_[resource];
  std::vector<int32_t>& control = graph_.node(node).control_inputs;
  if (use.last_write >= 0) control.push_back(use.last_write);
  if (writes) {
    control.insert(control.end(), use.reads_since_write.begin(), use.reads_since_write.end());
    use.reads_since_write.clear();
    use.last_write = node;
  } else {
    use.reads_since_write.push_back(node);
  }
  if (writes) effects_.push_back(node);  // an unused read may go; a write or a print may not
}

void TraceBuilder::set_outputs(std::span<const Tensor> outputs) {
  std::vector<ValueRef> refs;
  refs.reserve(outputs.size());
  for (const Tensor& t : outputs) {
    if (!t.defined()) fail<InvalidArgument>("trace: the traced function returned an empty Tensor handle");
    refs.push_back(value_of(t));
  }
  graph_.set_outputs(std::move(refs));
  graph_.set_effects(effects_);
}

}  // namespace flowlet::detail

namespace flowlet {

EagerScope::EagerScope() : suspended_(std::exchange(detail::active, nullptr)) {}
EagerScope::~EagerScope() { detail::active = suspended_; }

bool is_tracing() { return detail::active != nullptr; }

}  // namespace flowlet
