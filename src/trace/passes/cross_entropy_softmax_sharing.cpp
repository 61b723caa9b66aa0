// share_cross_entropy_softmax: the last step of fuse_cross_entropy_grad. A traced training step
// holds the forward loss softmax_cross_entropy(logits, labels) and, after the fusion above it, the
// loss gradient softmax_cross_entropy_grad(logits, labels[, g]); both compute exp(x - max) / sum
// of the same rows. Where both read the same logits and labels values, the forward becomes
// softmax_cross_entropy_with_probs (the same loss, bit for bit, plus the softmax as output 1, from
// the exps the loss takes anyway) and the gradient softmax_cross_entropy_grad_from_probs reading
// that output: one exp pass instead of two (ops/cross_entropy_grad.hpp; the probs are the softmax
// op's bits, so the gradient is too).
//
// Where: a live softmax_cross_entropy_grad node and a live softmax_cross_entropy (or an already
// converted with_probs) node on the same device with inputs[0] and inputs[1] the same values, the
// forward before the gradient in node order. A forward whose loss nobody used was pruned before
// this runs (optimize's first prune): then there is nothing to share and the gradient keeps its own
// softmax. Two gradients of one loss both read the one forward's probs.
//
// Relies on (flowlet/graph.hpp): topological order, live inputs. Keeps: both nodes at their ids,
// names and uses; the forward's output 0 is unchanged and it gains output 1; the gradient's other
// inputs and control inputs stay, its new input (the forward) comes before it. The forward
// allocates one [N, C] buffer more, which the gradient frees after reading.
#include <vector>

#include "ops/cross_entropy_grad.hpp"
#include "ops/known_ops.hpp"
#include "trace/passes/passes.hpp"
#include "trace/passes/pattern_readers.hpp"

namespace flowlet::detail {

void share_cross_entropy_softmax(Graph& graph) {
  static const Op* const loss_op = find_op("softmax_cross_entropy");
  if (loss_op == nullptr) return;
  std::vector<int32_t> forwards;  // live loss nodes seen so far, in node order
  for (size_t i = 0; i < graph.nodes().size(); ++i) {
    const auto id = static_cast<int32_t>(i);
    const Node& node = graph.node(id);
    if (is_live_op(node, loss_op) || is_live_op(node, &cross_entropy_probs_op)) {
      forwards.push_back(id);
      continue;
    }
    if (!is_live_op(node, &cross_entropy_grad_op)) continue;
    for (int32_t f : forwards) {
      Node& forward = graph.node(f);
      if (forward.device != node.device || forward.inputs.size() != 2 || forward.inputs[0] != node.inputs[0] ||
          forward.inputs[1] != node.inputs[1]) {
        continue;
      }
      if (forward.op == loss_op) {
        forward.op = &cross_entropy_probs_op;
        forward.outputs.push_back(graph.meta(node.inputs[0]));  // probs: the logits' shape and dtype
      }
      Node& gradient = graph.node(id);
      gradient.op = &cross_entropy_grad_from_probs_op;
      gradient.inputs[0] = ValueRef{f, 1};
      break;
    }
  }
}

}  // namespace flowlet::detail
