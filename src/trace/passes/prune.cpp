// prune: removes every node that neither the graph's outputs nor its effects need.
//
// Relies on: inputs and control inputs name earlier nodes (one backward sweep sees every user of a
// node before the node itself); outputs() and effects() name live nodes.
// Keeps: argument nodes, always, even unused ones (the executor feeds arguments by position, so
// argument k must stay argument k); every node an output or effect reaches through data or control
// edges, stateful ones included. A stateful node nothing reaches (an unused variable read) goes:
// effects() lists every node whose effect must happen. Removed nodes only get `removed` set.
#include <vector>

#include "trace/passes/passes.hpp"

namespace flowlet::detail {

void prune(Graph& graph) {
  std::vector<Node>& nodes = graph.mutable_nodes();
  std::vector<bool> live(nodes.size(), false);
  for (const ValueRef& out : graph.outputs()) live.at(static_cast<size_t>(out.node)) = true;
  for (int32_t e : graph.effects()) live.at(static_cast<size_t>(e)) = true;
  // Users come after what they use, so walking backwards marks a node before reaching its inputs.
  for (size_t i = nodes.size(); i-- > 0;) {
    Node& n = nodes[i];
    if (n.removed) continue;
    if (!live[i] && n.kind != NodeKind::argument) {
      n.removed = true;
      continue;
    }
    for (const ValueRef& in : n.inputs) live.at(static_cast<size_t>(in.node)) = true;
    for (int32_t c : n.control_inputs) live.at(static_cast<size_t>(c)) = true;
  }
}

}  // namespace flowlet::detail
