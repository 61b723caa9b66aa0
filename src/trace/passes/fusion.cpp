// fuse_elementwise: chains and trees of elementwise ops over one shape become one fused_elementwise
// node (src/ops/fused.hpp), which runs them tile by tile so intermediates never reach memory.
//
// Relies on (flowlet/graph.hpp): nodes() is in a topological order; live nodes' inputs and control
// inputs name earlier live nodes; a node's outputs metas are what it produces.
// Keeps:
//   - topological order: a group becomes one node at the id of its LAST (root) node, whose uses
//     therefore stay as they are; every external input of the group feeds some member, so comes
//     before that member and before the root;
//   - outputs and effects: a node whose value is a graph output, is read by two consumer nodes, or
//     is a control input of any node is never absorbed (only a group's root may be any of these);
//     stateful, view and multi-output nodes never join a group, and neither does a node on another
//     device or kind of device than CPU (the fused op has only a CPU kernel);
//   - removed members stay in place with `removed` set (compact() drops them later);
//   - the root keeps its id, device, outputs and source; it takes the name "fused_<its suffix>" and
//     the union of the members' control inputs (all earlier than the root).
//
// A node is fusible when it is a live op node with kElementwise (not kView, not kStateful, not
// already fused; attributes, if any, describable), one output of dtype f32 or f64 (or b8 from f32
// or f64 inputs: a comparison whose mask a later step reads, as relu's gradient
// where(x > 0, g, 0) does; such a node is never a group's root), a CPU kernel,
// and inputs that each have its output's shape or are rank-0 (no f16/bf16 operands: their kernels
// upcast through whole-tensor copies). A fusible node joins the group of a fusible producer when
// every use of that producer's value is by this node, both have one shape and one device. Groups
// of one node stay as they are.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "ops/fused.hpp"
#include "trace/passes/passes.hpp"

namespace flowlet::detail {
namespace {

constexpr bool is_half(DType dt) { return dt == f16 || dt == bf16; }
constexpr bool is_float(DType dt) { return dt == f32 || dt == f64; }

bool is_fusible(const Graph& graph, const Node& node) {
  if (node.removed || node.kind != NodeKind::op || node.op == nullptr) return false;
  const Op& op = *node.op;
  if (!op.has_flag(kElementwise) || op.has_flag(kView) || op.has_flag(kStateful)) return false;
  if (&op == &fused_elementwise_op) return false;
  // The fused node's attribute text (CSE keys, dumps) must name every step's attributes.
  if (node.attributes && !op.describe_attributes) return false;
  if (node.device.kind() != DeviceKind::cpu || !op.kernels[static_cast<size_t>(DeviceKind::cpu)]) return false;
  if (node.outputs.size() != 1) return false;
  const TensorMeta& out = node.outputs[0];
  const bool comparison = out.dtype == b8;  // of floats: a mask for a later step (relu's gradient)
  if (!is_float(out.dtype) && !comparison) return false;
  if (node.inputs.empty()) return false;
  for (const ValueRef& in : node.inputs) {
    const TensorMeta& meta = graph.meta(in);
    if (is_half(meta.dtype)) return false;
    if (comparison && !is_float(meta.dtype)) return false;
    if (meta.shape.rank() != 0 && meta.shape != out.shape) return false;  // broadcasts: not a tile
  }
  return true;
}

// Who reads each node's output 0: no one, one consumer node, or more than that (two consumers, a
// graph output, another output index, or a control edge: anything that must see the node itself).
struct Uses {
  static constexpr int32_t kNone = -1;
  static constexpr int32_t kMany = -2;
  std::vector<int32_t> consumer;

  explicit Uses(const Graph& graph) : consumer(graph.nodes().size(), kNone) {
    const auto nodes = graph.nodes();
    for (size_t i = 0; i < nodes.size(); ++i) {
      const Node& n = nodes[i];
      if (n.removed) continue;
      for (const ValueRef& in : n.inputs) {
        if (in.output != 0) {
          mark_many(in.node);
        } else {
          add(in.node, static_cast<int32_t>(i));
        }
      }
      for (int32_t c : n.control_inputs) mark_many(c);
    }
    for (const ValueRef& out : graph.outputs()) mark_many(out.node);
    for (int32_t e : graph.effects()) mark_many(e);
  }

  void add(int32_t producer, int32_t user) {
    int32_t& c = consumer.at(static_cast<size_t>(producer));
    if (c == kNone) {
      c = user;
    } else if (c != user) {
      c = kMany;
    }
  }
  void mark_many(int32_t producer) { consumer.at(static_cast<size_t>(producer)) = kMany; }
  bool only_user_is(int32_t producer, int32_t user) const {
    return consumer.at(static_cast<size_t>(producer)) == user;
  }
};

// "fused_12" for a root named "maximum_12"; "fused_<name>" when the name has no numeric suffix.
std::string fused_name(const std::string& root_name) {
  const size_t underscore = root_name.rfind('_');
  if (underscore != std::string::npos && underscore + 1 < root_name.size() &&
      std::all_of(root_name.begin() + static_cast<std::ptrdiff_t>(underscore + 1), root_name.end(),
                  [](char c) { return c >= '0' && c <= '9'; })) {
    return "fused" + root_name.substr(underscore);
  }
  return "fused_" + root_name;
}

// Rewrites node `members.back()` (the root) into the fused node and removes the other members.
void fuse_group(Graph& graph, const std::vector<int32_t>& members) {
  FusedProgram program;
  std::vector<ValueRef> external;
  std::vector<int32_t> control;
  auto step_of = [&](int32_t id) -> int32_t {
    const auto it = std::find(members.begin(), members.end(), id);
    return it == members.end() ? -1 : static_cast<int32_t>(it - members.begin());
  };
  for (const int32_t id : members) {
    const Node& n = graph.node(id);
    FusedStep step{n.op, n.attributes, {}, n.outputs[0].dtype};
    for (const ValueRef& in : n.inputs) {
      const int32_t producer_step = step_of(in.node);
      if (producer_step >= 0) {
        step.operands.push_back({FusedOperand::Kind::step, producer_step});
        continue;
      }
      auto it = std::find(external.begin(), external.end(), in);
      if (it == external.end()) {
        external.push_back(in);
        program.input_dtypes.push_back(graph.meta(in).dtype);
        it = external.end() - 1;
      }
      step.operands.push_back({FusedOperand::Kind::input, static_cast<int32_t>(it - external.begin())});
    }
    program.steps.push_back(std::move(step));
    control.insert(control.end(), n.control_inputs.begin(), n.control_inputs.end());
  }
  std::sort(control.begin(), control.end());
  control.erase(std::unique(control.begin(), control.end()), control.end());

  for (size_t i = 0; i + 1 < members.size(); ++i) graph.node(members[i]).removed = true;
  Node& root = graph.node(members.back());
  root.op = &fused_elementwise_op;
  root.name = fused_name(root.name);
  root.inputs = std::move(external);
  root.control_inputs = std::move(control);
  root.attributes = std::make_shared<const FusedProgram>(std::move(program));
}

}  // namespace

void fuse_elementwise(Graph& graph) {
  const size_t count = graph.nodes().size();
  const Uses uses(graph);
  // group[i]: the root of the group node i belongs to (itself while alone); a node's group is
  // final once a later node has either absorbed it or cannot (nodes are visited in order).
  std::vector<int32_t> group(count, -1);
  std::vector<std::vector<int32_t>> members(count);
  for (size_t i = 0; i < count; ++i) {
    const Node& consumer = graph.node(static_cast<int32_t>(i));
    if (!is_fusible(graph, consumer)) continue;
    const auto id = static_cast<int32_t>(i);
    group[i] = id;
    members[i] = {id};
    for (const ValueRef& in : consumer.inputs) {
      const Node& producer = graph.node(in.node);
      const auto p = static_cast<size_t>(in.node);
      if (group[p] != in.node) continue;  // not fusible, or already absorbed (a repeated operand)
      if (!uses.only_user_is(in.node, id)) continue;
      if (producer.device != consumer.device || producer.outputs[0].shape != consumer.outputs[0].shape) continue;
      for (const int32_t m : members[p]) group[static_cast<size_t>(m)] = id;
      members[i].insert(members[i].end(), members[p].begin(), members[p].end());
      members[p].clear();
    }
  }
  for (size_t i = 0; i < count; ++i) {
    // A comparison joins a group only as a member: a group rooted at one (nothing float read its
    // mask) stays as it was.
    if (members[i].size() < 2 || !is_float(graph.node(static_cast<int32_t>(i)).outputs[0].dtype)) continue;
    std::sort(members[i].begin(), members[i].end());  // topological: steps run in node order
    fuse_group(graph, members[i]);
  }
}

}  // namespace flowlet::detail
