// fuse_cross_entropy_grad: the logits' gradient that softmax_cross_entropy's gradient rule records,
// mul(g, sub(softmax(logits), cast(one_hot(labels, C)))) with g [N, 1] (the loss's gradient
// reshaped; after constant folding often a constant), becomes one softmax_cross_entropy_grad node
// (src/ops/cross_entropy_grad.hpp): one pass over [N, C] where eager runs one_hot, the cast (gone
// for f32 logits: simplify_algebra drops casts to the same dtype), softmax, sub and mul, each a
// node, a pass and an [N, C] buffer.
//
// Where: a live mul with one operand g [N, 1] and the other output 0 of a live sub read by nothing
// else (not pinned); or, with no such mul, the sub alone, g = 1 (the fused node gets no g input):
// where simplify_algebra dropped a mul by a constant 1 (the mean over one row, batch 1), and only
// where the softmax is read by the sub alone (so it goes). The sub reads softmax(logits) over the last axis (1 or -1) of a rank-2 logits
// [N, C] first and, second, one_hot(labels, C) of labels [N], directly or through a cast to the
// logits' dtype; mul, sub, softmax, one_hot and cast on one CPU device; logits, g and the mul's
// output [N, C] one dtype, f32 or f64. The softmax and one_hot may have other readers (they then
// stay for them): the pattern computes the fused op's value whatever made it.
//
// Relies on (flowlet/graph.hpp): topological order, live inputs. Runs after place() (device
// checks) and before fuse_elementwise (which would otherwise fuse the sub and mul). Keeps: the mul
// (or the lone sub) becomes the fused node at its own id, name and uses; its inputs (logits, labels, g) come before
// the softmax, one_hot or mul that read them, so before it; it takes the control inputs of every
// node it replaces (all before it). The sub, and a softmax, cast or one_hot read only by the
// replaced chain, are removed (they stay in place with `removed` set).
//
// Last, share_cross_entropy_softmax (cross_entropy_softmax_sharing.cpp) lets a fused gradient read
// the softmax its forward loss node writes.
//
// Switched off with PassOptions::fuse_cross_entropy_grad = false or FLOWLET_DENSE_FUSION=0 (which
// turns off the dense-layer rewrites too: with it, a traced step runs the ops eager runs).
#include <optional>
#include <vector>

#include "ops/attributes.hpp"
#include "ops/cross_entropy_grad.hpp"
#include "ops/elementwise_ops.hpp"
#include "ops/known_ops.hpp"
#include "trace/passes/passes.hpp"
#include "trace/passes/pattern_readers.hpp"

namespace flowlet::detail {
namespace {

// The ops the pattern names, found once (softmax and one_hot keep their Op values to themselves).
struct PatternOps {
  const Op* mul = &elementwise_op(ElementwiseOp::mul);
  const Op* sub = &elementwise_op(ElementwiseOp::sub);
  const Op* softmax = find_op("softmax");
  const Op* one_hot = find_op("one_hot");
};

// Output 0 of a live node of `op` on `device` with one output, or false.
bool is_single_output(const Graph& graph, ValueRef v, const Op* op, const Device& device) {
  const Node& n = graph.node(v.node);
  return v.output == 0 && is_live_op(n, op) && n.outputs.size() == 1 && n.device == device;
}

// sub(softmax(logits), [cast](one_hot(labels, C))) ending in `diff`, as the pass fuses it.
struct LossChain {
  ValueRef logits, labels;
  int32_t sub = -1, softmax = -1, cast = -1, one_hot = -1;  // cast: -1 where there is none
};

// The chain whose sub writes `diff`, [N, C] in `out`'s dtype on `device`, or nullopt.
std::optional<LossChain> match_chain(const Graph& graph, const PatternOps& ops, ValueRef diff, const TensorMeta& out,
                                     const Device& device) {
  const int64_t n = out.shape[0], classes = out.shape[1];
  if (!is_single_output(graph, diff, ops.sub, device)) return std::nullopt;
  const Node& sub = graph.node(diff.node);
  if (sub.inputs.size() != 2 || sub.outputs[0].shape != out.shape || sub.outputs[0].dtype != out.dtype) return std::nullopt;

  const ValueRef probs = sub.inputs[0];
  if (!is_single_output(graph, probs, ops.softmax, device)) return std::nullopt;
  const Node& softmax = graph.node(probs.node);
  const int64_t axis = static_cast<const AxisAttrs*>(softmax.attributes.get())->axis;
  const ValueRef logits = softmax.inputs[0];
  const TensorMeta& lm = graph.meta(logits);
  if ((axis != 1 && axis != -1) || lm.shape != out.shape || lm.dtype != out.dtype) return std::nullopt;

  // The targets: one_hot(labels, C), or a cast of it to the logits' dtype.
  ValueRef targets = sub.inputs[1];
  int32_t cast = -1;
  if (is_single_output(graph, targets, &cast_op, device) && graph.node(targets.node).inputs.size() == 1) {
    if (graph.node(targets.node).outputs[0].dtype != out.dtype) return std::nullopt;
    cast = targets.node;
    targets = graph.node(targets.node).inputs[0];
  }
  if (!is_single_output(graph, targets, ops.one_hot, device)) return std::nullopt;
  const Node& one_hot = graph.node(targets.node);
  const ValueRef labels = one_hot.inputs[0];
  const TensorMeta& labels_meta = graph.meta(labels);
  if (static_cast<const OneHotAttrs*>(one_hot.attributes.get())->depth != classes ||
      labels_meta.shape != Shape{n} || (labels_meta.dtype != i32 && labels_meta.dtype != i64) ||
      one_hot.outputs[0].dtype != (cast < 0 ? out.dtype : f32)) {
    return std::nullopt;
  }
  return LossChain{logits, labels, diff.node, probs.node, cast, targets.node};
}

// A live two-input node writing one CPU [N, C] f32/f64 output: where a chain may end.
const TensorMeta* fusable_output(const Node& node) {
  if (node.inputs.size() != 2 || node.outputs.size() != 1 || node.device.kind() != DeviceKind::cpu) return nullptr;
  const TensorMeta& out = node.outputs[0];
  if (out.shape.rank() != 2 || (out.dtype != f32 && out.dtype != f64)) return nullptr;
  return &out;
}

// Node `id` (the mul, or the chain's own sub) becomes the fused node over `inputs`; what only the
// chain read goes.
void rewrite(Graph& graph, const Readers& readers, int32_t id, const LossChain& chain, std::vector<ValueRef> inputs) {
  Node& fused = graph.node(id);
  fused.op = &cross_entropy_grad_op;
  fused.inputs = std::move(inputs);
  fused.attributes = nullptr;
  for (int32_t replaced : {chain.sub, chain.softmax, chain.cast, chain.one_hot}) {
    if (replaced >= 0 && replaced != id) merge_control_inputs(fused, graph.node(replaced));
  }
  if (chain.sub != id) graph.node(chain.sub).removed = true;
  if (readers.only_reader_is_one_node(chain.softmax)) graph.node(chain.softmax).removed = true;
  const bool cast_goes = chain.cast < 0 || readers.only_reader_is_one_node(chain.cast);
  if (chain.cast >= 0 && cast_goes) graph.node(chain.cast).removed = true;
  if (cast_goes && readers.only_reader_is_one_node(chain.one_hot)) graph.node(chain.one_hot).removed = true;
}

// mul(g [N, 1], chain) in either order, the chain's sub read only by the mul.
void fuse_mul_at(Graph& graph, const Readers& readers, const PatternOps& ops, int32_t id) {
  const Node& mul = graph.node(id);
  const TensorMeta* out = fusable_output(mul);
  if (out == nullptr) return;
  for (int side = 0; side < 2; ++side) {
    const ValueRef diff = mul.inputs[static_cast<size_t>(side)];
    const ValueRef g = mul.inputs[static_cast<size_t>(1 - side)];
    const TensorMeta& gm = graph.meta(g);
    if (gm.shape != Shape{out->shape[0], 1} || gm.dtype != out->dtype) continue;
    if (!readers.only_reader_is_one_node(diff.node)) continue;
    const std::optional<LossChain> chain = match_chain(graph, ops, diff, *out, mul.device);
    if (!chain) continue;
    rewrite(graph, readers, id, *chain, {chain->logits, chain->labels, g});
    return;
  }
}

// The chain alone, g = 1: a loss whose gradient is 1 per row (the mean over one row, or a plain
// sum), where simplify_algebra dropped the mul by a constant 1. Only where the softmax goes with
// it (read by the sub alone): otherwise the fused node would compute a softmax a kept node also
// computes, where the sub it replaces only read it.
void fuse_sub_at(Graph& graph, const Readers& readers, const PatternOps& ops, int32_t id) {
  const Node& sub = graph.node(id);
  const TensorMeta* out = fusable_output(sub);
  if (out == nullptr) return;
  const std::optional<LossChain> chain = match_chain(graph, ops, ValueRef{id, 0}, *out, sub.device);
  if (!chain || !readers.only_reader_is_one_node(chain->softmax)) return;
  rewrite(graph, readers, id, *chain, {chain->logits, chain->labels});
}

}  // namespace

void fuse_cross_entropy_grad(Graph& graph) {
  static const PatternOps ops;
  if (ops.softmax == nullptr || ops.one_hot == nullptr) return;
  {
    const Readers readers(graph);
    for (size_t i = 0; i < graph.nodes().size(); ++i) {
      const auto id = static_cast<int32_t>(i);
      if (is_live_op(graph.node(id), ops.mul)) fuse_mul_at(graph, readers, ops, id);
    }
  }
  // Then the chains no mul took (readers again: the first loop removed nodes).
  const Readers readers(graph);
  for (size_t i = 0; i < graph.nodes().size(); ++i) {
    const auto id = static_cast<int32_t>(i);
    if (is_live_op(graph.node(id), ops.sub)) fuse_sub_at(graph, readers, ops, id);
  }
  share_cross_entropy_softmax(graph);
}

}  // namespace flowlet::detail
