// place: chooses the device of every op node. The constraints, in the order they win:
//   1. explicit requests (a DeviceScope around the code that recorded the node);
//   2. colocation groups: a variable and every op that reads or updates its state (and ops a user
//      put in a ColocateWith scope) run where the variable lives; a request that disagrees is an
//      error, not a silent move;
//   2b. gradient ops run where their forward op runs (what TensorFlow calls colocating gradients
//      with ops): the backward pass of a layer stays on the layer's device;
//   3. kernel availability: a node whose device has no kernel for its op falls back to a device
//      that has one (soft placement), and says so;
//   4. a cost rule for the rest, so that few bytes cross devices:
//      a. a node whose every consumer ends up on one device D (by rules 1-2, or by this rule), and
//         whose output is at least as large as its inputs (constants aside: each device gets its own
//         copy), runs on D: the scatter-add of an embedding gradient joins the table's update there,
//         so the gathered rows cross, not a table-sized gradient;
//      b. otherwise it follows its inputs, preferring the device of the largest input;
//      nodes without inputs or consumers, and ops that chose a device themselves (a copy with
//      .to(device)), keep the device they were traced with.
// Every op node ends with `device` set and `placement_reason` saying which rule decided.
//
// Relies on: graph invariants (flowlet/graph.hpp), so inputs are placed before their consumers.
// Keeps: graph structure (no node or edge changes); only `device` and `placement_reason` change.
#include <optional>
#include <unordered_map>
#include <vector>

#include "core/check.hpp"
#include "state/variable_ops.hpp"
#include "trace/passes/passes.hpp"

namespace flowlet::detail {
namespace {

// The variable a node reads or updates, or the one it was asked to colocate with.
const VariableState* variable_of(const Node& n) {
  if (n.op == &read_variable_op || n.op == &assign_variable_op || n.op == &assign_matmul_op) {
    return static_cast<const VariableAttrs*>(n.attributes.get())->state.get();
  }
  return static_cast<const VariableState*>(n.colocate_with);
}

std::string available_devices(DeviceKind kind) {
  const int count = device_count(kind);
  if (count == 0) return fmt::format("no {} devices", device_kind_name(kind));
  return fmt::format("{0}:0 .. {0}:{1}", device_kind_name(kind), count - 1);
}

bool has_kernel(const Node& n, Device d) { return n.op->runs_on(d.kind()); }

int64_t bytes_of(const TensorMeta& meta) { return meta.shape.numel() * static_cast<int64_t>(dtype_size(meta.dtype)); }

// The live forward node whose gradient rule recorded `n`, or null.
const Node* forward_of(const Graph& graph, const Node& n) {
  if (n.gradient_of < 0 || static_cast<size_t>(n.gradient_of) >= graph.nodes().size()) return nullptr;
  const Node& forward = graph.node(n.gradient_of);
  return forward.removed ? nullptr : &forward;
}

// Rule 4a, decided backwards (consumers before producers): the device each node joins, if any.
std::vector<std::optional<Device>> join_consumers(
    const Graph& graph, const std::unordered_map<const VariableState*, Device>& variable_devices) {
  const size_t n = graph.nodes().size();
  std::vector<std::vector<int32_t>> consumers(n);
  for (size_t i = 0; i < n; ++i) {
    const Node& node = graph.nodes()[i];
    if (node.removed) continue;
    for (const ValueRef& in : node.inputs) consumers[static_cast<size_t>(in.node)].push_back(static_cast<int32_t>(i));
  }
  std::vector<std::optional<Device>> target(n);  // pinned (rules 1-2) or joined
  std::vector<std::optional<Device>> joined(n);
  for (size_t i = n; i-- > 0;) {
    const Node& node = graph.nodes()[i];
    if (node.removed || node.kind != NodeKind::op) continue;
    if (const VariableState* v = variable_of(node)) {
      target[i] = variable_devices.at(v);
      continue;
    }
    if (node.requested_device) {
      target[i] = *node.requested_device;
      continue;
    }
    if (node.op->has_flag(kPlacesOutput) || consumers[i].empty() || forward_of(graph, node)) continue;
    std::optional<Device> common = target[static_cast<size_t>(consumers[i][0])];
    for (int32_t c : consumers[i]) {
      if (!common || target[static_cast<size_t>(c)] != common) {
        common.reset();
        break;
      }
    }
    if (!common) continue;
    int64_t output_bytes = 0, input_bytes = 0;
    for (const TensorMeta& meta : node.outputs) output_bytes += bytes_of(meta);
    for (const ValueRef& in : node.inputs) {
      if (graph.node(in.node).kind != NodeKind::constant) input_bytes += bytes_of(graph.meta(in));
    }
    if (output_bytes >= input_bytes) target[i] = joined[i] = common;
  }
  return joined;
}

}  // namespace

void place(Graph& graph) {
  // Where each variable used in the graph lives.
  std::unordered_map<const VariableState*, Device> variable_devices;
  for (const Node& n : graph.nodes()) {
    if (n.removed || n.kind != NodeKind::op) continue;
    if (const VariableState* v = variable_of(n)) {
      std::lock_guard lock(v->mutex);
      variable_devices.emplace(v, v->value.device());
    }
  }
  const std::vector<std::optional<Device>> joined = join_consumers(graph, variable_devices);
  for (size_t i = 0; i < graph.nodes().size(); ++i) {
    Node& n = graph.node(static_cast<int32_t>(i));
    if (n.removed) continue;
    if (n.kind != NodeKind::op) {
      n.placement_reason = n.kind == NodeKind::argument ? "where the argument is" : "where the constant is";
      continue;
    }
    if (n.requested_device) check_device_exists(n.op->name, *n.requested_device);
    if (const VariableState* v = variable_of(n)) {  // rule 2 (checked against rule 1)
      const Device home = variable_devices.at(v);
      if (n.requested_device && *n.requested_device != home) {
        fail<DeviceError>(
            "placement: {} asks for {}, but it {} variable '{}', which lives on {}; a variable and every op that "
            "reads or updates it share a device: move the variable (create it on {}) or drop the request",
            n.label(), *n.requested_device, n.colocate_with ? "is colocated with" : "reads or updates", v->name, home,
            *n.requested_device);
      }
      n.device = home;
      n.placement_reason = fmt::format("colocated with variable '{}'", v->name);
    } else if (n.requested_device) {  // rule 1
      n.device = *n.requested_device;
      n.placement_reason = "requested";
    } else if (const Node* forward = n.op->has_flag(kPlacesOutput) ? nullptr : forward_of(graph, n)) {  // rule 2b
      n.device = forward->device;
      n.placement_reason = fmt::format("with its forward op '{}' (a gradient)", forward->name);
    } else if (joined[i]) {  // rule 4a
      n.device = *joined[i];
      n.placement_reason = fmt::format("joins its consumers on {} (its output is at least as large as its inputs)",
                                       n.device);
    } else if (n.op->has_flag(kPlacesOutput)) {
      // The op chose its device itself (a copy with .to(device)): moving it would change its result.
      n.placement_reason = fmt::format("the op's own device (a copy to {})", n.device);
    } else if (!n.inputs.empty()) {  // rule 4
      const ValueRef* largest = &n.inputs[0];
      for (const ValueRef& in : n.inputs) {
        if (bytes_of(graph.meta(in)) > bytes_of(graph.meta(*largest))) largest = &in;
      }
      const Node& producer = graph.node(largest->node);
      n.device = producer.device;
      n.placement_reason = fmt::format("follows its largest input '{}'", producer.name);  // rule 4b
    } else {
      n.placement_reason = "as traced";
    }
    if (!has_kernel(n, n.device)) {  // rule 3
      const Device fallback(DeviceKind::cpu, 0);
      if (!has_kernel(n, fallback)) {
        fail<DeviceError>("placement: {} has no kernel on {} nor on {}; available: {}", n.label(), n.device, fallback,
                          available_devices(n.device.kind()));
      }
      n.placement_reason = fmt::format("soft placement: no kernel for '{}' on {}, so on {}", n.op->name, n.device,
                                       fallback);
      n.device = fallback;
    }
  }
}

}  // namespace flowlet::detail
