// Graph rendering: Graphviz DOT and JSON, for FLOWLET_DUMP_GRAPHS and for people reading a graph.
//
// Both list live nodes only, in node order, under their ids (so ids may skip removed nodes). Neither
// runs an op: constant values are read straight from host memory, so a dump taken while a trace
// is recording records nothing into it. Source locations are resolved here (slow: addr2line), which
// is why only dumps ask for them.
#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "flowlet/core/format.hpp"
#include "flowlet/graph.hpp"
#include "ops/internal.hpp"
#include "ops/transfer.hpp"
#include "trace/json_text.hpp"

namespace flowlet {
namespace {

using detail::json_escape;

// A constant's values are shown in DOT labels when it has at most this many elements.
constexpr int64_t kMaxShownValues = 4;

std::string_view kind_name(NodeKind kind) {
  switch (kind) {
    case NodeKind::op: return "op";
    case NodeKind::argument: return "argument";
    case NodeKind::constant: return "constant";
  }
  return "unknown";
}

// An op node without an op breaks an invariant, but dumps must still draw it.
std::string_view op_name(const Node& n) {
  if (n.kind != NodeKind::op) return "";
  return n.op ? n.op->name : "(no op)";
}

std::string attributes_text(const Node& n) {
  if (n.kind != NodeKind::op || !n.op || !n.attributes) return "";
  if (!n.op->describe_attributes) return "(attributes not describable)";
  return n.op->describe_attributes(n.attributes.get());
}

// Element `index` (row-major) of a host tensor as text; the tensor may be a strided view.
std::string element_text(const Tensor& t, int64_t index) {
  return detail::visit_element(t, index, [](auto value) -> std::string {
    if constexpr (std::is_same_v<decltype(value), bool>) return value ? "true" : "false";
    else return fmt::format("{}", value);
  });
}

// "[1, 2, 3]" for a small constant on the host; "" when it is large or elsewhere.
std::string small_values_text(const Tensor& t) {
  if (!t.defined() || t.numel() > kMaxShownValues || t.device().kind() != DeviceKind::cpu) return "";
  std::string text = "[";
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (i > 0) text += ", ";
    text += element_text(t, i);
  }
  return text + "]";
}

std::string dot_escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}


std::string metas_text(const Node& n) {
  std::string text;
  for (const TensorMeta& m : n.outputs) {
    if (!text.empty()) text += ", ";
    text += fmt::format("{} {}", m.shape, m.dtype);
  }
  return fmt::format("{} @ {}", text, n.device);
}

}  // namespace

std::string Graph::to_dot() const {
  // optimize() dumps before it checks invariants, so this must draw a broken graph too: references
  // to nodes or outputs that do not exist are drawn as "invalid" rather than thrown on.
  auto valid = [&](ValueRef v) {
    return v.node >= 0 && static_cast<size_t>(v.node) < nodes_.size() && v.output >= 0 &&
           static_cast<size_t>(v.output) < nodes_[static_cast<size_t>(v.node)].outputs.size();
  };
  std::vector<bool> is_output(nodes_.size(), false);
  std::vector<bool> is_effect(nodes_.size(), false);
  for (const ValueRef& out : outputs_) {
    if (valid(out)) is_output[static_cast<size_t>(out.node)] = true;
  }
  for (int32_t e : effects_) {
    if (e >= 0 && static_cast<size_t>(e) < nodes_.size()) is_effect[static_cast<size_t>(e)] = true;
  }

  std::string dot = "digraph flowlet {\n  node [shape=box, fontname=\"monospace\"];\n";
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const Node& n = nodes_[i];
    if (n.removed) continue;
    std::vector<std::string> lines{n.name};
    std::string shape = "box";
    switch (n.kind) {
      case NodeKind::op: {
        lines.push_back(std::string(op_name(n)));
        if (std::string attrs = attributes_text(n); !attrs.empty()) lines.push_back(std::move(attrs));
        break;
      }
      case NodeKind::argument:
        lines.push_back(fmt::format("argument {}", n.argument));
        shape = "ellipse";
        break;
      case NodeKind::constant:
        lines.push_back("constant");
        if (std::string values = small_values_text(n.value); !values.empty()) lines.push_back(std::move(values));
        shape = "note";
        break;
    }
    lines.push_back(metas_text(n));
    if (n.requested_device) lines.push_back(fmt::format("requested {}", *n.requested_device));
    if (!n.placement_reason.empty() && n.kind == NodeKind::op) lines.push_back("placed: " + n.placement_reason);
    if (n.kind == NodeKind::op) {
      if (const std::string& where = n.source.describe(); !where.empty()) lines.push_back(where);
    }
    std::string label;
    for (const std::string& line : lines) label += (label.empty() ? "" : "\\n") + dot_escape(line);
    // Graph outputs get a double border, effects a bold one.
    std::string extra;
    if (is_output[i]) extra += ", peripheries=2";
    if (is_effect[i]) extra += ", style=bold";
    dot += fmt::format("  n{} [label=\"{}\", shape={}{}];\n", i, label, shape, extra);
    for (const ValueRef& in : n.inputs) {
      std::string edge = "invalid";
      if (valid(in)) {
        const Node& from = nodes_[static_cast<size_t>(in.node)];
        const std::string port = from.outputs.size() > 1 ? fmt::format("#{} ", in.output) : "";
        edge = fmt::format("{}{}", port, from.outputs[static_cast<size_t>(in.output)].shape);
      }
      dot += fmt::format("  n{} -> n{} [label=\"{}\"];\n", in.node, i, edge);
    }
    for (int32_t c : n.control_inputs) {
      // A recv's control input is its send: in the partitioned graph that edge is the rendezvous.
      const bool rendezvous = n.kind == NodeKind::op && n.op == &detail::recv_op;
      dot += fmt::format("  n{} -> n{} [{}];\n", c, i,
                         rendezvous ? "style=bold, color=red, label=\"rendezvous\"" : "style=dashed");
    }
  }
  // One box per device when the graph spans several (its partitions).
  std::vector<std::pair<Device, std::string>> clusters;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i].removed) continue;
    auto it = std::find_if(clusters.begin(), clusters.end(), [&](const auto& c) { return c.first == nodes_[i].device; });
    if (it == clusters.end()) it = clusters.insert(clusters.end(), {nodes_[i].device, std::string()});
    it->second += fmt::format(" n{};", i);
  }
  if (clusters.size() > 1) {
    for (const auto& [device, members] : clusters) {
      dot += fmt::format("  subgraph \"cluster_{0}\" {{ label=\"{0}\"; style=rounded;{1} }}\n", device, members);
    }
  }
  return dot + "}\n";
}

std::string Graph::to_json() const {
  std::string json = "{\"nodes\":[";
  bool first = true;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const Node& n = nodes_[i];
    if (n.removed) continue;
    if (!first) json += ",";
    first = false;
    json += fmt::format("{{\"id\":{},\"name\":\"{}\",\"kind\":\"{}\"", i, json_escape(n.name), kind_name(n.kind));
    // Every node has every key ("" where it does not apply), so readers need no special cases.
    json += fmt::format(",\"op\":\"{}\",\"attributes\":\"{}\"", json_escape(op_name(n)),
                        json_escape(attributes_text(n)));
    json += fmt::format(",\"placement_reason\":\"{}\"", json_escape(n.placement_reason));
    if (n.kind == NodeKind::argument) json += fmt::format(",\"argument\":{}", n.argument);
    json += ",\"inputs\":[";
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      json += fmt::format("{}[{},{}]", k > 0 ? "," : "", n.inputs[k].node, n.inputs[k].output);
    }
    json += fmt::format("],\"control_inputs\":[{}],\"device\":\"{}\",\"requested_device\":{},\"outputs\":[",
                        fmt::join(n.control_inputs, ","), json_escape(n.device.str()),
                        n.requested_device ? fmt::format("\"{}\"", n.requested_device->str()) : "null");
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      const TensorMeta& m = n.outputs[k];
      json += fmt::format("{}{{\"shape\":[{}],\"dtype\":\"{}\"}}", k > 0 ? "," : "",
                          fmt::join(m.shape.begin(), m.shape.end(), ","), m.dtype);
    }
    json += "]";
    const std::string source = n.kind == NodeKind::op ? n.source.describe() : "";
    json += fmt::format(",\"source\":\"{}\"", json_escape(source));
    json += "}";
  }
  json += "],\"outputs\":[";
  for (size_t k = 0; k < outputs_.size(); ++k) {
    json += fmt::format("{}[{},{}]", k > 0 ? "," : "", outputs_[k].node, outputs_[k].output);
  }
  json += fmt::format("],\"effects\":[{}]}}", fmt::join(effects_, ","));
  return json;
}

}  // namespace flowlet
