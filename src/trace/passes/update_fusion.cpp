// fuse_variable_updates: `v -= scale * (a @ b)`, the shape of every SGD step on a weight, becomes
// one GEMM that accumulates into the variable's buffer (assign_matmul), so the gradient a @ b is
// never written to memory and read back. At batch 1 that gradient is as large as the weight.
// f32, f64, f16 and bf16 weights (halves with f32 accumulation) fuse.
//
// Relies on: graph invariants (flowlet/graph.hpp); assign_variable nodes carry VariableAttrs.
// Keeps: the rewritten node keeps its id, name, control inputs and place in effects(), so its
// ordering against the variable's other reads and updates is unchanged; the matmul it absorbs had
// no other use (nor was a graph output), so nothing else changes.
#include <vector>

#include "ops/known_ops.hpp"
#include "state/variable_ops.hpp"
#include "trace/passes/passes.hpp"

namespace flowlet::detail {

void fuse_variable_updates(Graph& graph) {
  std::vector<int32_t> uses(graph.nodes().size(), 0);
  for (const Node& n : graph.nodes()) {
    if (n.removed) continue;
    for (const ValueRef& in : n.inputs) ++uses[static_cast<size_t>(in.node)];
    for (int32_t c : n.control_inputs) ++uses[static_cast<size_t>(c)];
  }
  for (const ValueRef& out : graph.outputs()) ++uses[static_cast<size_t>(out.node)];

  for (size_t i = 0; i < graph.nodes().size(); ++i) {
    Node& update = graph.node(static_cast<int32_t>(i));
    if (update.removed || update.op != &assign_variable_op) continue;
    const auto& attrs = *static_cast<const VariableAttrs*>(update.attributes.get());
    // Only where assign_matmul has a kernel (CPU: BLAS; CUDA: cuBLAS, once the backend registered it).
    if (attrs.mode == AssignMode::assign || !assign_matmul_op.runs_on(update.device.kind())) continue;
    Node& product = graph.node(update.inputs[0].node);
    if (product.removed || product.kind != NodeKind::op || product.op != &matmul_op ||
        uses[static_cast<size_t>(update.inputs[0].node)] != 1 || product.device != update.device) {
      continue;
    }
    const TensorMeta& a = graph.meta(product.inputs[0]);
    const TensorMeta& b = graph.meta(product.inputs[1]);
    // Every floating dtype: f16/bf16 accumulate in f32 on both backends (CPU: the weight is upcast,
    // updated by the f32 GEMM and rounded back once; CUDA: cuBLAS with CUBLAS_COMPUTE_32F and
    // beta = 1), so the fused update rounds once where the unfused one rounds the half gradient,
    // its product with the learning rate and the sum: traced half steps differ from eager ones by
    // about an ulp of the weight per step (never worse than the unfused rounding).
    if (a.shape.size() != 2 || b.shape.size() != 2 || !is_floating(a.dtype)) continue;
    update.op = &assign_matmul_op;
    update.inputs = product.inputs;
    update.control_inputs.insert(update.control_inputs.end(), product.control_inputs.begin(),
                                 product.control_inputs.end());
    product.removed = true;
  }
}

}  // namespace flowlet::detail
