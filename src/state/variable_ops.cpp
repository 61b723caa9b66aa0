// read_variable, assign_variable and assign_matmul: the graph-only stateful ops that stand for a
// variable in a graph. The tracer orders them per variable in program order (control edges), so a
// traced step reads and updates exactly as the eager one does.
#include "state/variable_ops.hpp"

#include <array>

#include "core/check.hpp"
#include "flowlet/dispatch.hpp"
#include "flowlet/ops/elementwise.hpp"
#include "ops/gemm.hpp"
#include "ops/registry.hpp"
#include "runtime/step_context.hpp"
#include "state/optimizer_update.hpp"

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
  // No device check: the placer runs the update on the variable's device and the partitioner
  // moves the value there (the kernel's apply_variable_update checks what it is given).
  check_variable_update(assign_mode_name(attrs.mode), *attrs.state, call.inputs[0], /*check_device=*/false);
  spec.count = 0;
}

void assign_kernel(const OpCall& call, std::span<Tensor>) {
  const auto& attrs = call.attrs<VariableAttrs>();
  // The executor hands over results it computed; they are not shared with the caller's tensors.
  apply_variable_update(*attrs.state, attrs.mode, call.inputs[0], /*adopt=*/true, attrs.scale,
                        /*recording_graph=*/recording_of(call.step) != nullptr);
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

namespace {

ResourceAccess reads_variable(const void* attributes) {
  return {static_cast<const VariableAttrs*>(attributes)->state.get(), /*writes=*/false};
}
ResourceAccess writes_variable(const void* attributes) {
  return {static_cast<const VariableAttrs*>(attributes)->state.get(), /*writes=*/true};
}

const std::string& variable_name(const VariableAttrs& attrs) {
  static const std::string unnamed = "variable";
  return attrs.state->name.empty() ? unnamed : attrs.state->name;
}
std::string read_node_name(const void* attributes) {
  return "read_" + variable_name(*static_cast<const VariableAttrs*>(attributes));
}
std::string update_node_name(const void* attributes) {
  const auto& attrs = *static_cast<const VariableAttrs*>(attributes);
  return fmt::format("{}_{}", assign_mode_name(attrs.mode), variable_name(attrs));
}

constexpr uint32_t kVariableOp = kGraphOnly | kStateful | kView;

}  // namespace

// read_variable and assign_variable serve every device kind with their one kernel (kAnyDevice): a
// read hands out the variable's tensor wherever it lives, and apply_variable_update touches
// elements on the host only for a CPU variable (on a GPU it dispatches ops on the variable's device).
// A read runs where the variable lives, whatever scope it is in (eagerly too: the value is copied
// to the scope's device by the op that uses it), so its node carries no placement request.
Op read_variable_op{.name = "read_variable",
                    .flags = kVariableOp | kAnyDevice | kRunsAtResource,
                    .infer = &read_infer,
                    .kernels = {&read_kernel},
                    .copy_attributes = &copy_attributes<VariableAttrs>,
                    .describe_attributes = &describe_attributes<VariableAttrs>,
                    .resource = &reads_variable,
                    .node_name = &read_node_name};
Op assign_variable_op{.name = "assign_variable",
                      .min_inputs = 1,
                      .max_inputs = 1,
                      .flags = kVariableOp | kAnyDevice,
                      .infer = &assign_infer,
                      .kernels = {&assign_kernel},
                      .copy_attributes = &copy_attributes<VariableAttrs>,
                      .describe_attributes = &describe_attributes<VariableAttrs>,
                      .resource = &writes_variable,
                      .node_name = &update_node_name};

// The CUDA kernel (cuBLAS, beta = 1) is registered by src/cuda/linalg.cpp. The fuse_variable_updates
// pass makes these nodes out of assign_variable ones, keeping their names.
Op assign_matmul_op{.name = "assign_matmul",
                    .min_inputs = 2,
                    .max_inputs = 2,
                    .flags = kVariableOp,
                    .infer = &assign_matmul_infer,
                    .kernels = {&assign_matmul_kernel},
                    .copy_attributes = &copy_attributes<VariableAttrs>,
                    .describe_attributes = &describe_attributes<VariableAttrs>,
                    .resource = &writes_variable,
                    .node_name = &update_node_name};

// Also registers optimizer_update (state/optimizer_update.hpp), the other op that writes variables.
void add_state_ops(std::vector<Op*>& ops) {
  ops.insert(ops.end(), {&read_variable_op, &assign_variable_op, &assign_matmul_op, &optimizer_update_op});
}

Tensor record_variable_read(const std::shared_ptr<VariableState>& state) {
  return dispatch(read_variable_op, {}, VariableAttrs{state, AssignMode::assign});
}

void record_variable_update(const std::shared_ptr<VariableState>& state, AssignMode mode, const Tensor& t,
                            double scale) {
  {
    // The update's own errors ("assign_add: update is an empty Tensor handle ..."), before
    // dispatch's generic ones.
    std::lock_guard lock(state->mutex);
    check_variable_update(assign_mode_name(mode), *state, t, /*check_device=*/false);
  }
  const VariableAttrs attrs{state, mode, scale};
  dispatch_all(assign_variable_op, std::span<const Tensor>(&t, 1), &attrs);
}

}  // namespace flowlet::detail
