// fuse_relu_bias_grad: a dense layer's backward through relu and bias, dz = where(y > 0, g, 0) and
// the bias gradient sum(dz, axes {0}, keepdims) (what add's gradient rule records for a bias
// broadcast over rows), becomes one relu_bias_grad node with both as outputs
// (src/ops/relu_bias_grad.hpp): one pass over y and g writing dz and summing its columns, where
// eager writes dz and reads it back for the sum.
//
// Where: a live sum over axis 0 (or -2) of a rank-2 value with keepdims, of a live where(c, g, z)
// whose c = greater(y, 0) is read by nothing else (not pinned), z is a +0 scalar constant, y and g
// have the where's [m, n] shape and its dtype (f32 or f64); where, greater and sum on one CPU
// device; the sum is not ordered (no control edge or effect names it) and waits for nothing after
// the where. dz may have any other readers (the weight and input gradients' matmuls).
//
// Relies on (flowlet/graph.hpp): topological order, live inputs. Runs after fuse_matmul_bias
// (which points relu's gradient tests at the layer's output) and before fuse_elementwise (which
// would otherwise fuse the comparison into the where). Keeps: the where becomes the
// relu_bias_grad node at its own id, name and uses of output 0; the sum's uses read its output 1
// (same shape [1, n] and dtype); it takes the comparison's and the sum's control inputs (all
// before it). Removed nodes stay in place with `removed` set.
//
// Switched off with PassOptions::fuse_relu_bias_grad = false or FLOWLET_DENSE_FUSION=0, which turns
// off both dense-layer rewrites (measuring; tests comparing with the unfused graph).
#include <cmath>

#include "ops/attributes.hpp"
#include "ops/elementwise_ops.hpp"
#include "ops/relu_bias_grad.hpp"
#include "trace/passes/passes.hpp"
#include "trace/passes/pattern_readers.hpp"

namespace flowlet::detail {
namespace {

bool is_positive_zero_scalar(const Node& n) {
  return is_zero_scalar(n) && !std::signbit(n.value.to(Device("cpu")).astype(f64).item<double>());
}

bool sums_rows_keeping_dims(const Node& sum, const TensorMeta& input) {
  if (!sum.attributes || input.shape.rank() != 2 || sum.outputs.size() != 1) return false;
  const auto& attrs = *static_cast<const ReduceAttrs*>(sum.attributes.get());
  return !attrs.all_axes && attrs.keepdims && attrs.axes.size() == 1 && (attrs.axes[0] == 0 || attrs.axes[0] == -2);
}

// Rewrites sum node `id` and the where it reads, when they match (see the header comment).
void fuse_at(Graph& graph, const Readers& readers, const Op* where_op, int32_t id) {
  const Node& sum = graph.node(id);
  if (sum.inputs.size() != 1 || readers.ordered[static_cast<size_t>(id)]) return;
  const ValueRef dz = sum.inputs[0];
  const Node& where = graph.node(dz.node);
  if (dz.output != 0 || !is_live_op(where, where_op) || where.inputs.size() != 3 ||
      where.outputs.size() != 1 || where.device != sum.device || where.device.kind() != DeviceKind::cpu) {
    return;
  }
  const TensorMeta& out = where.outputs[0];
  if (!sums_rows_keeping_dims(sum, out) || (out.dtype != f32 && out.dtype != f64)) return;
  for (int32_t c : sum.control_inputs) {
    if (c >= dz.node) return;  // the where takes the sum's control inputs: they must come before it
  }
  const ValueRef mask = where.inputs[0], g = where.inputs[1];
  const Node& test = graph.node(mask.node);
  if (mask.output != 0 || !is_live_op(test, &elementwise_op(ElementwiseOp::greater)) || test.inputs.size() != 2 ||
      test.device != where.device || !is_positive_zero_scalar(graph.node(where.inputs[2].node))) {
    return;
  }
  if (!readers.only_reader_is_one_node(mask.node)) return;  // the mask's only reader is this where
  const ValueRef y = test.inputs[0];
  if (y.node == test.inputs[1].node || !is_zero_scalar(graph.node(test.inputs[1].node))) return;
  const TensorMeta& ym = graph.meta(y);
  const TensorMeta& gm = graph.meta(g);
  if (ym.shape != out.shape || ym.dtype != out.dtype || gm.shape != out.shape || gm.dtype != out.dtype) return;

  const TensorMeta column_sums = sum.outputs[0];
  Node& fused = graph.node(dz.node);
  fused.op = &relu_bias_grad_op;
  fused.inputs = {y, g};
  fused.outputs = {out, column_sums};
  fused.attributes = nullptr;
  merge_control_inputs(fused, graph.node(mask.node));
  merge_control_inputs(fused, graph.node(id));
  graph.node(mask.node).removed = true;
  graph.replace_uses(ValueRef{id, 0}, ValueRef{dz.node, 1});
  graph.node(id).removed = true;
}

}  // namespace

void fuse_relu_bias_grad(Graph& graph) {
  // Found by name once (the reduce and where ops keep their Op values to themselves).
  static const Op* const sum = find_op("sum");
  static const Op* const where = find_op("where");
  if (sum == nullptr || where == nullptr) return;
  const Readers readers(graph);
  for (size_t i = 0; i < graph.nodes().size(); ++i) {
    const auto id = static_cast<int32_t>(i);
    if (is_live_op(graph.node(id), sum)) fuse_at(graph, readers, where, id);
  }
}

}  // namespace flowlet::detail
