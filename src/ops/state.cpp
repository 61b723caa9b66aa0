// read_variable and assign_variable: the stateful nodes that stand for a variable in a graph. The
// tracer orders them per variable in program order (control edges), so a traced step reads and
// updates exactly as the eager one does.
#include "ops/state.hpp"

#include <array>

#include "core/check.hpp"
#include "flowlet/ops/elementwise.hpp"
#include "ops/gemm.hpp"
#include "trace/tracer.hpp"

namespace flowlet::detail {
namespace {


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
  check_variable_update(assign_mode_name(attrs.mode), *attrs.state, call.inputs[0]);
  spec.count = 0;
}

void assign_kernel(const OpCall& call, std::span<Tensor>) {
  const auto& attrs = call.attrs<VariableAttrs>();
  // The executor hands over results it computed; they are not shared with the caller's tensors.
  apply_variable_update(*attrs.state, attrs.mode, call.inputs[0], /*adopt=*/true, attrs.scale);
}

void assign_matmul_infer(const OpCall& call, OutputSpec& spec) {
  const auto& attrs = call.attrs<VariableAttrs>();
  const Tensor& a = call.inputs[0];
  const Tensor& b = call.inputs[1];
  std::lock_guard lock(attrs.state->mutex);
  const Tensor& value = attrs.state->value;
  if (a.rank() != 2 || b.rank() != 2 || a.shape()[1] != b.shape()[0] || a.dtype() != b.dtype() ||
      !(Shape{a.shape()[0], b.shape()[1]} == value.shape()) || a.dtype() != value.dtype() ||
      !is_floating(a.dtype())) {
    fail<ShapeError>("assign_matmul: a {} {} @ b {} {} does not update variable '{}' ({} {})", a.shape(), a.dtype(),
                     b.shape(), b.dtype(), attrs.state->name, value.shape(), value.dtype());
  }
  spec.count = 0;
}

void assign_matmul_kernel(const OpCall& call, std::span<Tensor>) {
  OutputSpec checked;
  assign_matmul_infer(call, checked);  // shapes may vary between calls (unknown dimensions)
  const auto& attrs = call.attrs<VariableAttrs>();
  VariableState& s = *attrs.state;
  const double alpha = attrs.mode == AssignMode::add ? attrs.scale : -attrs.scale;
  std::lock_guard lock(s.mutex);
  // A reader still holding the value keeps it: update a private copy instead.
  if (!exclusively_owned(s.value)) s.value = cast(s.value, s.value.dtype());
  gemm_into(call.inputs[0], call.inputs[1], s.value, alpha, 1.0);
}

}  // namespace

std::string VariableAttrs::describe() const {
  if (mode == AssignMode::assign) return fmt::format("variable='{}', mode=assign", state->name);
  return fmt::format("variable='{}', mode={}, scale={}", state->name, assign_mode_name(mode), scale);
}

// read_variable and assign_variable serve every device kind with one kernel (as send and recv do):
// a read hands out the variable's tensor wherever it lives, and apply_variable_update touches
// elements on the host only for a CPU variable (on a GPU it dispatches ops on the variable's device).
Op read_variable_op{"read_variable", 0, 0, kStateful | kView, &read_infer, {&read_kernel, &read_kernel}, nullptr,
                    &copy_attributes<VariableAttrs>, &describe_attributes<VariableAttrs>};
Op assign_variable_op{"assign_variable", 1, 1, kStateful | kView, &assign_infer, {&assign_kernel, &assign_kernel},
                      nullptr, &copy_attributes<VariableAttrs>, &describe_attributes<VariableAttrs>};

// The CUDA kernel (cuBLAS, beta = 1) is set by src/cuda/linalg.cpp when the op table is built.
Op assign_matmul_op{"assign_matmul", 2, 2, kStateful | kView, &assign_matmul_infer, {&assign_matmul_kernel, nullptr},
                    nullptr, &copy_attributes<VariableAttrs>, &describe_attributes<VariableAttrs>};

Tensor record_variable_read(const std::shared_ptr<VariableState>& state) {
  TraceBuilder* trace = active_trace();
  const VariableAttrs attrs{state, AssignMode::assign};
  const Tensor value = [&] {
    std::lock_guard lock(state->mutex);
    return state->value;
  }();
  OutputSpec spec;
  spec.outputs[0] = TensorMeta{value.shape(), value.dtype()};
  spec.device = value.device();
  std::array<Tensor, 1> out;
  const int32_t node = trace->record(read_variable_op, {}, &attrs, spec, out, state.get(), /*writes=*/false);
  // A read runs where the variable lives, whatever scope it is in (eagerly too: the value is
  // copied to the scope's device by the op that uses it), so it carries no request.
  trace->graph().node(node).requested_device.reset();
  trace->graph().node(node).name = fmt::format("read_{}_{}", state->name.empty() ? "variable" : state->name, node);
  return out[0];
}

void record_variable_update(const std::shared_ptr<VariableState>& state, AssignMode mode, const Tensor& t,
                            double scale) {
  TraceBuilder* trace = active_trace();
  {
    std::lock_guard lock(state->mutex);
    check_variable_update(assign_mode_name(mode), *state, t, /*check_device=*/false);
  }
  const VariableAttrs attrs{state, mode, scale};
  OutputSpec spec;
  spec.count = 0;
  spec.device = t.device();
  const Tensor inputs[] = {t};
  const int32_t node = trace->record(assign_variable_op, inputs, &attrs, spec, {}, state.get(), /*writes=*/true);
  trace->graph().node(node).name =
      fmt::format("{}_{}_{}", assign_mode_name(mode), state->name.empty() ? "variable" : state->name, node);
}

}  // namespace flowlet::detail
