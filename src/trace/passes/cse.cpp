// eliminate_common_subexpressions: nodes that compute the same value become one.
//
// Two op nodes are the same when they have the same op, device (and device request, colocation and
// the forward node they are a gradient of),
// inputs, control inputs and attributes (compared through the op's describe_attributes, which
// prints every field; an op that has attributes but no describe_attributes merges only nodes sharing
// one attribute object). Two constants are the same when they are the same view of the same storage, or are small (at most
// kMaxComparedElements) host tensors with equal dtype, shape and bytes.
//
// Relies on: nodes() in topological order (a forward sweep has already merged a node's inputs, so
// equal inputs are equal ids); a non-stateful op is a function of its inputs and attributes.
// Keeps: topological order (a duplicate's users, data and control, move to the first copy, which
// comes earlier); outputs and effects (redirected the same way); stateful nodes and arguments never
// merge. Duplicates are marked removed.
#include <algorithm>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "flowlet/core/format.hpp"
#include "trace/passes/passes.hpp"

namespace flowlet::detail {
namespace {

constexpr int64_t kMaxComparedElements = 16;

// The bytes of a host tensor's elements in row-major order, as hex (it may be a strided view).
std::string element_bytes_hex(const Tensor& t) {
  const auto size = static_cast<int64_t>(dtype_size(t.dtype()));
  std::string hex;
  for (int64_t i = 0; i < t.numel(); ++i) {
    int64_t offset = 0;
    int64_t rest = i;
    for (int64_t d = t.rank() - 1; d >= 0; --d) {
      const auto axis = static_cast<size_t>(d);
      offset += (rest % t.shape()[axis]) * t.strides()[axis];
      rest /= t.shape()[axis];
    }
    const auto* at = static_cast<const unsigned char*>(t.raw_data()) + offset * size;
    for (int64_t b = 0; b < size; ++b) hex += fmt::format("{:02x}", at[b]);
  }
  return hex;
}

std::optional<std::string> constant_key(const Node& n) {
  const Tensor& t = n.value;
  if (!t.defined()) return std::nullopt;
  if (t.numel() <= kMaxComparedElements && t.device().kind() == DeviceKind::cpu) {
    return fmt::format("constant {} {} {} {}", t.dtype(), t.shape(), n.device, element_bytes_hex(t));
  }
  return fmt::format("view {} {} {} [{}] {} {}", static_cast<const void*>(t.storage().get()), t.offset(), t.shape(),
                     fmt::join(t.strides().begin(), t.strides().end(), ", "), t.dtype(), n.device);
}

// Everything before the attribute text has a fixed grammar, so two different nodes cannot print
// the same key.
std::optional<std::string> op_key(const Node& n) {
  if (n.is_stateful()) return std::nullopt;
  // The placement constraints count too: nodes recorded in different DeviceScopes, or colocated
  // with different variables, may land on different devices.
  std::string key = fmt::format("op {} {} requested {} colocate {} gradient_of {} in", static_cast<const void*>(n.op),
                                n.device, n.requested_device ? n.requested_device->str() : "none", n.colocate_with,
                                n.gradient_of);
  for (const ValueRef& in : n.inputs) key += fmt::format(" {}:{}", in.node, in.output);
  key += " control";
  for (int32_t c : n.control_inputs) key += fmt::format(" {}", c);
  if (!n.attributes) return key + " attributes none";
  if (!n.op->describe_attributes) return key + fmt::format(" attributes at {}", n.attributes.get());
  return key + " attributes " + n.op->describe_attributes(n.attributes.get());
}

}  // namespace

void eliminate_common_subexpressions(Graph& graph) {
  std::vector<Node>& nodes = graph.mutable_nodes();
  std::vector<int32_t> forward(nodes.size(), -1);  // a removed duplicate -> the node kept instead
  auto resolve = [&](int32_t id) {
    const int32_t to = forward[static_cast<size_t>(id)];
    return to >= 0 ? to : id;
  };
  std::unordered_map<std::string, int32_t> first;
  for (size_t i = 0; i < nodes.size(); ++i) {
    Node& n = nodes[i];
    if (n.removed) continue;
    for (ValueRef& in : n.inputs) in.node = resolve(in.node);
    for (int32_t& c : n.control_inputs) c = resolve(c);
    // Merging may make two control inputs one; sorted, they also compare equal between nodes.
    std::sort(n.control_inputs.begin(), n.control_inputs.end());
    n.control_inputs.erase(std::unique(n.control_inputs.begin(), n.control_inputs.end()), n.control_inputs.end());

    std::optional<std::string> key;
    if (n.kind == NodeKind::op) key = op_key(n);
    if (n.kind == NodeKind::constant) key = constant_key(n);
    if (!key) continue;
    const auto [kept, inserted] = first.try_emplace(std::move(*key), static_cast<int32_t>(i));
    if (inserted) continue;
    forward[i] = kept->second;
    n.removed = true;
  }
  std::vector<ValueRef> outputs = graph.outputs();
  for (ValueRef& out : outputs) out.node = resolve(out.node);
  graph.set_outputs(std::move(outputs));
  std::vector<int32_t> effects = graph.effects();
  for (int32_t& e : effects) e = resolve(e);
  graph.set_effects(std::move(effects));
}

}  // namespace flowlet::detail
