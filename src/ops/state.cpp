// read_variable and assign_variable: the stateful nodes that stand for a variable in a graph. The
// tracer orders them per variable in program order (control edges), so a traced step reads and
// updates exactly as the eager one does.
#include "ops/state.hpp"

#include <array>

#include "core/check.hpp"
#include "trace/tracer.hpp"

namespace flowlet::detail {
namespace {

constexpr std::array<const char*, 3> mode_names{"assign", "assign_add", "assign_sub"};

void read_infer(const OpCall& call, OutputSpec& spec) {
  const VariableState& s = *call.attrs<VariableAttrs>().state;
  std::lock_guard lock(s.mutex);
  spec.outputs[0] = TensorMeta{s.value.shape(), s.value.dtype()};
  spec.device = s.value.device();
}

void read_kernel(const OpCall& call, std::span<Tensor> outputs) {
  const VariableState& s = *call.attrs<VariableAttrs>().state;
  std::lock_guard lock(s.mutex);
  outputs[0] = s.value;  // values are never changed in place: the tensor read stays valid
}

void assign_infer(const OpCall& call, OutputSpec& spec) {
  const auto& attrs = call.attrs<VariableAttrs>();
  std::lock_guard lock(attrs.state->mutex);
  check_variable_update(mode_names[static_cast<size_t>(attrs.mode)], *attrs.state, call.inputs[0]);
  spec.count = 0;
}

void assign_kernel(const OpCall& call, std::span<Tensor>) {
  const auto& attrs = call.attrs<VariableAttrs>();
  // The executor hands over results it computed; they are not shared with the caller's tensors.
  apply_variable_update(*attrs.state, attrs.mode, call.inputs[0], /*adopt=*/true);
}

}  // namespace

std::string VariableAttrs::describe() const {
  return fmt::format("variable='{}', mode={}", state->name, mode_names[static_cast<size_t>(mode)]);
}

Op read_variable_op{"read_variable", 0, 0, kStateful | kView, &read_infer, {&read_kernel, nullptr}, nullptr,
                    &copy_attributes<VariableAttrs>, &describe_attributes<VariableAttrs>};
Op assign_variable_op{"assign_variable", 1, 1, kStateful | kView, &assign_infer, {&assign_kernel, nullptr}, nullptr,
                      &copy_attributes<VariableAttrs>, &describe_attributes<VariableAttrs>};

Tensor record_variable_read(const std::shared_ptr<VariableState>& state) {
  TraceBuilder* trace = active_trace();
  const VariableAttrs attrs{state, AssignMode::assign};
  const Tensor value = [&] {
    ActiveTraceScope eager(nullptr);
    std::lock_guard lock(state->mutex);
    return state->value;
  }();
  OutputSpec spec;
  spec.outputs[0] = TensorMeta{value.shape(), value.dtype()};
  spec.device = value.device();
  std::array<Tensor, 1> out;
  const int32_t node = trace->record(read_variable_op, {}, &attrs, spec, out, state.get(), /*writes=*/false);
  trace->graph().node(node).name = fmt::format("read_{}_{}", state->name.empty() ? "variable" : state->name, node);
  return out[0];
}

void record_variable_update(const std::shared_ptr<VariableState>& state, AssignMode mode, const Tensor& t) {
  TraceBuilder* trace = active_trace();
  {
    std::lock_guard lock(state->mutex);
    check_variable_update(mode_names[static_cast<size_t>(mode)], *state, t);
  }
  const VariableAttrs attrs{state, mode};
  OutputSpec spec;
  spec.count = 0;
  spec.device = t.device();
  const Tensor inputs[] = {t};
  const int32_t node = trace->record(assign_variable_op, inputs, &attrs, spec, {}, state.get(), /*writes=*/true);
  trace->graph().node(node).name =
      fmt::format("{}_{}_{}", mode_names[static_cast<size_t>(mode)], state->name.empty() ? "variable" : state->name, node);
}

}  // namespace flowlet::detail
