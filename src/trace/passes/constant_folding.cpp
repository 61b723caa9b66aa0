// fold_constants: an op node whose inputs are all constants runs now, once, and becomes a constant.
//
// Relies on: nodes() in topological order (a forward sweep folds chains: a folded node is a constant
// by the time its users are looked at); constant values are fixed; a non-stateful op is a function
// of its inputs and attributes (random ops too: their seed is an attribute).
// Keeps: node ids, names and order: the node turns into a constant in place (a new constant node
// would be appended after its users and break the order); its output meta (a result whose shape or
// dtype differs from the traced meta is not folded); outputs and effects (stateful nodes are never
// folded). Its control inputs would be dropped, so a node that has any is left alone; control
// inputs that name it stay valid (a constant is ready at once).
//
// Not folded: multi-output nodes; results over kMaxFoldedElements elements (the graph would hold
// them for its lifetime); ops with no inputs over kMaxCreatedElements (a fill at run time is cheap,
// the memory is not); nodes whose device kind has no kernel; nodes whose op throws (the error then
// happens at run time, where it names the node).
//
// Runs ops through dispatch_all, so optimize() must not run while a trace is recording.
#include <array>
#include <vector>

#include "flowlet/dispatch.hpp"
#include "trace/passes/passes.hpp"

namespace flowlet::detail {
namespace {

constexpr int64_t kMaxFoldedElements = int64_t{1} << 20;
constexpr int64_t kMaxCreatedElements = int64_t{1} << 16;

bool foldable(const Graph& graph, const Node& n) {
  if (n.kind != NodeKind::op || n.is_stateful() || n.outputs.size() != 1 || !n.control_inputs.empty()) return false;
  if (!n.op->kernels[static_cast<size_t>(n.device.kind())]) return false;
  const int64_t numel = n.outputs[0].shape.numel();
  if (numel > (n.inputs.empty() ? kMaxCreatedElements : kMaxFoldedElements)) return false;
  for (const ValueRef& in : n.inputs) {
    const Node& producer = graph.node(in.node);
    if (producer.kind != NodeKind::constant || !producer.value.defined()) return false;
  }
  return true;
}

}  // namespace

void fold_constants(Graph& graph) {
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < graph.nodes().size(); ++i) {
    Node& n = graph.node(static_cast<int32_t>(i));
    if (n.removed || !foldable(graph, n)) continue;
    inputs.clear();
    for (const ValueRef& in : n.inputs) inputs.push_back(graph.node(in.node).value);
    std::vector<Tensor> results;
    try {
      results = dispatch_all(*n.op, inputs, n.attributes.get());
    } catch (const Error&) {
      continue;  // leave it: running the graph raises the same error, naming this node
    }
    const TensorMeta& traced = n.outputs[0];
    if (results.size() != 1 || results[0].shape() != traced.shape || results[0].dtype() != traced.dtype ||
        results[0].device() != n.device) {
      continue;  // the op disagrees with its traced meta: not ours to paper over
    }
    n.kind = NodeKind::constant;
    n.value = std::move(results[0]);
    n.op = nullptr;
    n.inputs.clear();
    n.attributes.reset();  // the name stays: a dump shows "add_3 / constant", so its origin is visible
  }
}

}  // namespace flowlet::detail
