// The shared reader table and node tests of the producer-consumer rewrite passes
// (pattern_readers.hpp).
#include "trace/passes/pattern_readers.hpp"

#include <algorithm>

#include "flowlet/core/device.hpp"
#include "ops/elementwise_ops.hpp"

namespace flowlet::detail {

Readers::Readers(const Graph& graph)
    : of(graph.nodes().size()), pinned(graph.nodes().size(), false), ordered(graph.nodes().size(), false) {
  const auto nodes = graph.nodes();
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].removed) continue;
    for (const ValueRef& in : nodes[i].inputs) {
      if (in.output == 0) of[static_cast<size_t>(in.node)].push_back(static_cast<int32_t>(i));
    }
    for (int32_t c : nodes[i].control_inputs) pinned[static_cast<size_t>(c)] = ordered[static_cast<size_t>(c)] = true;
  }
  for (const ValueRef& out : graph.outputs()) pinned[static_cast<size_t>(out.node)] = true;
  for (int32_t e : graph.effects()) pinned[static_cast<size_t>(e)] = ordered[static_cast<size_t>(e)] = true;
}

bool is_live_op(const Node& n, const Op* op) { return op != nullptr && !n.removed && n.kind == NodeKind::op && n.op == op; }

bool is_zero_scalar(const Node& n) {
  if (n.removed || n.kind != NodeKind::constant || !n.value.defined() || n.value.shape().rank() != 0) return false;
  if (!is_floating(n.value.dtype())) return false;
  return n.value.to(Device("cpu")).astype(f64).item<double>() == 0.0;
}

void merge_control_inputs(Node& into, const Node& from) {
  std::vector<int32_t>& c = into.control_inputs;
  c.insert(c.end(), from.control_inputs.begin(), from.control_inputs.end());
  std::sort(c.begin(), c.end());
  c.erase(std::unique(c.begin(), c.end()), c.end());
}

std::optional<std::vector<int32_t>> relu_takeover_tests(const Graph& graph, const Readers& readers, int32_t relu_id) {
  const Node& relu = graph.node(relu_id);
  // The relu node goes away (its value lives on in the producer): nothing may be ordered on it.
  if (relu.inputs.size() != 1 || readers.ordered[static_cast<size_t>(relu_id)]) return std::nullopt;
  const ValueRef x = relu.inputs[0];
  const Node& producer = graph.node(x.node);
  if (x.output != 0 || producer.outputs.size() != 1 || producer.device != relu.device) return std::nullopt;
  if (readers.pinned[static_cast<size_t>(x.node)]) return std::nullopt;
  // The producer takes the relu's control inputs: each must come before it, or the order breaks.
  for (int32_t c : relu.control_inputs) {
    if (c >= x.node) return std::nullopt;
  }
  const Op& greater = elementwise_op(ElementwiseOp::greater);
  std::vector<int32_t> tests;
  int relu_reads = 0;
  for (int32_t reader : readers.of[static_cast<size_t>(x.node)]) {
    if (reader == relu_id) {
      ++relu_reads;
      continue;
    }
    const Node& n = graph.node(reader);
    const bool is_positive_test = is_live_op(n, &greater) && reader > relu_id && n.inputs.size() == 2 &&
                                  n.inputs[0] == x && n.inputs[1].node != x.node &&
                                  is_zero_scalar(graph.node(n.inputs[1].node));
    if (!is_positive_test) return std::nullopt;
    tests.push_back(reader);
  }
  if (relu_reads != 1) return std::nullopt;
  return tests;
}

void take_over_relu(Graph& graph, int32_t relu_id, const std::vector<int32_t>& tests) {
  const ValueRef relu_value{relu_id, 0};
  const ValueRef x = graph.node(relu_id).inputs[0];
  for (int32_t t : tests) graph.node(t).inputs[0] = relu_value;
  Node& relu = graph.node(relu_id);
  merge_control_inputs(graph.node(x.node), relu);
  graph.replace_uses(relu_value, x);
  relu.removed = true;
}

}  // namespace flowlet::detail
