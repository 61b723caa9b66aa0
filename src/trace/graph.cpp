// Graph: node storage, rewiring and the invariant check. Rendering (DOT, JSON) is in graph_dump.cpp.
#include "flowlet/graph.hpp"

#include <algorithm>
#include <unordered_map>

#include "core/check.hpp"

namespace flowlet {

std::string Node::label() const {
  std::string text = fmt::format("node '{}'", name);
  if (kind == NodeKind::op) {
    const std::string& where = source.describe();
    if (!where.empty()) text += fmt::format(" (recorded at {})", where);
  }
  return text;
}

size_t Graph::num_nodes() const {
  return static_cast<size_t>(std::count_if(nodes_.begin(), nodes_.end(), [](const Node& n) { return !n.removed; }));
}

const TensorMeta& Graph::meta(ValueRef v) const {
  const Node& n = node(v.node);
  if (v.output < 0 || static_cast<size_t>(v.output) >= n.outputs.size()) {
    detail::fail<InvalidArgument>("Graph::meta: {} has {} outputs; got output {}", n.name, n.outputs.size(), v.output);
  }
  return n.outputs[static_cast<size_t>(v.output)];
}

int32_t Graph::add_node(Node node) {
  const auto id = static_cast<int32_t>(nodes_.size());
  if (node.name.empty()) {
    std::string_view base = node.kind == NodeKind::argument ? "arg" : node.kind == NodeKind::constant ? "const" : node.op->name;
    node.name = fmt::format("{}_{}", base, names_given_);
  }
  ++names_given_;
  nodes_.push_back(std::move(node));
  return id;
}

int32_t Graph::add_constant(Tensor value) {
  Node n;
  n.kind = NodeKind::constant;
  n.outputs.push_back(TensorMeta{value.shape(), value.dtype()});
  n.device = value.device();
  n.value = std::move(value);
  return add_node(std::move(n));
}

void Graph::replace_uses(ValueRef from, ValueRef to) {
  for (Node& n : nodes_) {
    if (n.removed) continue;
    for (ValueRef& in : n.inputs) {
      if (in == from) in = to;
    }
  }
  for (ValueRef& out : outputs_) {
    if (out == from) out = to;
  }
}

void Graph::compact() {
  std::vector<int32_t> new_id(nodes_.size(), -1);
  std::vector<Node> kept;
  kept.reserve(nodes_.size());
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i].removed) continue;
    new_id[i] = static_cast<int32_t>(kept.size());
    kept.push_back(std::move(nodes_[i]));
  }
  auto remap = [&](int32_t id) {
    const int32_t mapped = new_id.at(static_cast<size_t>(id));
    if (mapped < 0) detail::fail<InvalidArgument>("Graph::compact: a live reference names removed node {}", id);
    return mapped;
  };
  for (Node& n : kept) {
    for (ValueRef& in : n.inputs) in.node = remap(in.node);
    // A control input on a removed node is dropped: what it ordered no longer exists.
    std::erase_if(n.control_inputs, [&](int32_t c) { return new_id.at(static_cast<size_t>(c)) < 0; });
    for (int32_t& c : n.control_inputs) c = new_id[static_cast<size_t>(c)];
    if (n.gradient_of >= 0) n.gradient_of = new_id.at(static_cast<size_t>(n.gradient_of));  // -1 if it went
  }
  for (ValueRef& out : outputs_) out.node = remap(out.node);
  for (int32_t& e : effects_) e = remap(e);
  nodes_ = std::move(kept);
}

void Graph::check_invariants() const {
  auto check_ref = [&](int32_t from, int32_t id, const char* what) {
    if (id < 0 || static_cast<size_t>(id) >= nodes_.size()) {
      detail::fail<InvalidArgument>("Graph: {} of node {} names node {}, which does not exist", what, from, id);
    }
    if (nodes_[static_cast<size_t>(id)].removed) {
      detail::fail<InvalidArgument>("Graph: {} of node {} names removed node {}", what, from, id);
    }
    if (from >= 0 && id >= from) {
      detail::fail<InvalidArgument>("Graph: {} of node {} names node {}, which does not come earlier", what, from, id);
    }
  };
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const Node& n = nodes_[i];
    if (n.removed) continue;
    const auto id = static_cast<int32_t>(i);
    for (const ValueRef& in : n.inputs) {
      check_ref(id, in.node, "an input");
      if (in.output < 0 || static_cast<size_t>(in.output) >= nodes_[static_cast<size_t>(in.node)].outputs.size()) {
        detail::fail<InvalidArgument>("Graph: node {} reads output {} of node {}, which has {} outputs", id,
                                      in.output, in.node, nodes_[static_cast<size_t>(in.node)].outputs.size());
      }
    }
    for (int32_t c : n.control_inputs) check_ref(id, c, "a control input");
    if (n.kind == NodeKind::op && n.op == nullptr) detail::fail<InvalidArgument>("Graph: op node {} has no op", id);
  }
  for (const ValueRef& out : outputs_) check_ref(-1, out.node, "a graph output");
  for (int32_t e : effects_) check_ref(-1, e, "a graph effect");
}

}  // namespace flowlet
