// simplify_algebra: rewrites that make a node's value available without running it.
//
//   x*1, 1*x, x+0, 0+x, x-0, x/1 -> x   only when the result has x's shape and dtype (a ones or zeros
//                                         constant that broadcasts x to a bigger shape, or promotes
//                                         it, changes the result, so it stays);
//   neg(neg(x)) -> x;  permute(permute(x)) -> x when the two permutations undo each other;
//   reshape(reshape(x)) -> reshape(x) with the outer shape;  reshape(x) -> x when x has that shape;
//   cast(x) -> x when x already has the target dtype.
//
// Relies on: nodes() in topological order (one forward sweep sees a node's inputs already
// simplified); a node's `outputs` metas are what it produces; a constant node's `value` is fixed.
// Keeps: topological order (a use is only ever redirected to an earlier node); outputs and effects
// (graph outputs are redirected too); stateful nodes are never rewritten, and neither is a node that
// has control inputs or is one (dropping it would drop an ordering). A rewritten node is marked
// removed; a reshape whose input moved may leave its inner reshape unused, for prune to remove.
//
// x+0 with x = -0.0 gives +0.0 when run and -0.0 after the rewrite; the two compare equal and
// compilers that simplify this pattern accept the same difference. Every other rewrite is exact.
#include <cstring>
#include <optional>
#include <vector>

#include "ops/elementwise_ops.hpp"
#include "ops/internal.hpp"
#include "ops/known_ops.hpp"
#include "trace/passes/passes.hpp"

namespace flowlet::detail {
namespace {

// Constants bigger than this are not scanned for all-ones or all-zeros (a pattern seen with
// captured scalars and small broadcasts, not with big tensors).
constexpr int64_t kMaxScannedElements = int64_t{1} << 20;

// Element `index` (row-major) of a host tensor, as a double (exact for every value 0 or 1 can
// round from, which is all the callers ask about).
double element_value(const Tensor& t, int64_t index) {
  return visit_element(t, index, [](auto value) { return static_cast<double>(value); });
}

bool same_meta(const TensorMeta& a, const TensorMeta& b) { return a.shape == b.shape && a.dtype == b.dtype; }

class Simplifier {
 public:
  explicit Simplifier(Graph& graph) : graph_(graph), forward_(graph.nodes().size()) {
    is_control_input_.assign(graph.nodes().size(), false);
    for (const Node& n : graph.nodes()) {
      if (n.removed) continue;
      for (int32_t c : n.control_inputs) is_control_input_.at(static_cast<size_t>(c)) = true;
    }
  }

  void run() {
    for (size_t i = 0; i < graph_.nodes().size(); ++i) {
      Node& n = graph_.node(static_cast<int32_t>(i));
      if (n.removed) continue;
      for (ValueRef& in : n.inputs) in = resolve(in);
      if (!rewritable(n, i)) continue;
      const ValueRef replacement = simplified(n);
      if (replacement.node < 0) continue;
      forward_[i] = replacement;
      n.removed = true;
    }
    std::vector<ValueRef> outputs = graph_.outputs();
    for (ValueRef& out : outputs) out = resolve(out);
    graph_.set_outputs(std::move(outputs));
  }

 private:
  // What `v` reads now that earlier nodes may have been replaced (forward_ targets are resolved
  // when they are set, so one step suffices).
  ValueRef resolve(ValueRef v) const {
    const ValueRef to = forward_[static_cast<size_t>(v.node)];
    return to.node >= 0 && v.output == 0 ? to : v;
  }

  bool rewritable(const Node& n, size_t id) const {
    return n.kind == NodeKind::op && !n.is_stateful() && n.outputs.size() == 1 && n.control_inputs.empty() &&
           !is_control_input_[id];
  }

  // The value that can stand for n's output, or node -1 when none.
  ValueRef simplified(Node& n) {
    const Op* op = n.op;
    const TensorMeta& out = n.outputs[0];
    if (const std::optional<ElementwiseOp> id = elementwise_op_id(*op)) {
      switch (*id) {
        case ElementwiseOp::mul:
        case ElementwiseOp::add: {  // x * 1, 1 * x, x + 0, 0 + x
          const double identity = *id == ElementwiseOp::mul ? 1.0 : 0.0;
          if (is_constant_filled(n.inputs[1], identity) && same_meta(graph_.meta(n.inputs[0]), out)) return n.inputs[0];
          if (is_constant_filled(n.inputs[0], identity) && same_meta(graph_.meta(n.inputs[1]), out)) return n.inputs[1];
          break;
        }
        case ElementwiseOp::sub:
        case ElementwiseOp::div: {  // x - 0, x / 1
          const double identity = *id == ElementwiseOp::div ? 1.0 : 0.0;
          if (is_constant_filled(n.inputs[1], identity) && same_meta(graph_.meta(n.inputs[0]), out)) return n.inputs[0];
          break;
        }
        case ElementwiseOp::neg:  // -(-x)
          if (const Node* inner = pure_producer(n.inputs[0], *op)) return inner->inputs[0];
          break;
        default:
          break;
      }
    } else if (op == &permute_op) {
      const Node* inner = pure_producer(n.inputs[0], permute_op);
      if (inner && permutations_cancel(*inner, n)) return inner->inputs[0];
    } else if (op == &reshape_op) {
      // The outer reshape's shape is absolute (or has a -1 resolved against the element count, which
      // the inner reshape kept), so it applies to the inner reshape's input as well.
      if (const Node* inner = pure_producer(n.inputs[0], reshape_op)) n.inputs[0] = inner->inputs[0];
      if (same_meta(graph_.meta(n.inputs[0]), out)) return n.inputs[0];
    } else if (op == &cast_op) {
      if (same_meta(graph_.meta(n.inputs[0]), out)) return n.inputs[0];
    }
    return ValueRef{};
  }

  // The node producing `v` when it is a live, non-stateful `op` node with one output.
  const Node* pure_producer(ValueRef v, const Op& op) const {
    const Node& p = graph_.node(v.node);
    if (p.removed || p.kind != NodeKind::op || p.is_stateful() || p.op != &op || p.outputs.size() != 1) {
      return nullptr;
    }
    return &p;
  }

  // True when `v` is a constant on the host whose every element equals `value`.
  bool is_constant_filled(ValueRef v, double value) const {
    const Node& c = graph_.node(v.node);
    if (c.kind != NodeKind::constant || !c.value.defined()) return false;
    const Tensor& t = c.value;
    if (t.device().kind() != DeviceKind::cpu || t.numel() > kMaxScannedElements) return false;
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (element_value(t, i) != value) return false;
    }
    return true;
  }

  // permute's attribute struct is private to its op; its own shape rule says where each axis goes
  // once every axis has a distinct length. So: push a probe of shape [2, 3, 4, ...] (zero strides
  // over one element, so any rank costs nothing) through both rules and see if it comes back.
  bool permutations_cancel(const Node& inner, const Node& outer) const {
    const TensorMeta& x = graph_.meta(inner.inputs[0]);
    Shape probe_shape;
    for (int64_t d = 0; d < x.shape.rank(); ++d) probe_shape.push_back(d + 2);
    const Tensor one = Tensor::empty(Shape{1}, x.dtype);
    try {
      Shape shape = probe_shape;
      for (const Node* step : {&inner, &outer}) {
        const Tensor probe = Tensor::view(one.storage(), shape, Strides(shape.size(), 0), 0, x.dtype);
        OutputSpec spec;
        step->op->infer(OpCall{*step->op, std::span<const Tensor>(&probe, 1), step->attributes.get()}, spec);
        shape = spec.outputs[0].shape;
      }
      return shape == probe_shape;
    } catch (const Error&) {
      return false;  // a rule that rejects the probe: leave the nodes alone
    }
  }

  Graph& graph_;
  std::vector<ValueRef> forward_;  // node -1: not replaced
  std::vector<bool> is_control_input_;
};

}  // namespace

void simplify_algebra(Graph& graph) { Simplifier(graph).run(); }

}  // namespace flowlet::detail
