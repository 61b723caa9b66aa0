// Graph: the dataflow graph that trace() records. Ops are nodes, tensors are edges (a node output
// feeding node inputs), variables and other state are touched only by stateful nodes, and control
// edges order nodes that share no data (a variable's reads before its next update).
//
// Invariants every pass keeps (passes live in src/trace/passes/, each opening with its own):
//   - node ids are indices into nodes(); a removed node stays in place with `removed` set until
//     compact() renumbers, so ids held during a pass stay valid;
//   - every input and control input of a live node names a live node that comes earlier in
//     nodes() (the vector is in a topological order);
//   - outputs() and effects() name live nodes; a stateful node is never folded or deduplicated,
//     and is removed only when it is not an effect and nothing needs it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "flowlet/core/device.hpp"
#include "flowlet/core/tensor.hpp"
#include "flowlet/op.hpp"

namespace flowlet {

// One edge source: output `output` of node `node`.
struct ValueRef {
  int32_t node = -1;
  int32_t output = 0;
  friend bool operator==(const ValueRef&, const ValueRef&) = default;
};

enum class NodeKind : uint8_t {
  op,        // runs `op` on its inputs
  argument,  // the traced function's tensor argument number `argument`, fed at every call
  constant,  // a tensor fixed when the graph was built (a captured eager tensor, a folded value)
};

// Where the user's code recorded a node: return addresses captured at trace time, resolved to
// "file:line (function)" only when someone asks (an error message, to_dot).
struct SourceTrace {
  std::vector<void*> frames;
  // "file:line" of the first frame outside flowlet when debug information has it, else the
  // function's name, else "". Cached after the first call.
  const std::string& describe() const;

 private:
  mutable std::shared_ptr<const std::string> resolved_;
};

struct Node {
  NodeKind kind = NodeKind::op;
  const Op* op = nullptr;  // kind == op
  std::string name;        // unique in its graph: "matmul_3", "arg_0", "const_2"
  std::vector<ValueRef> inputs;
  std::vector<int32_t> control_inputs;      // nodes that must finish before this one starts
  std::shared_ptr<const void> attributes;   // the op's attribute struct (copied), or null
  std::vector<TensorMeta> outputs;          // shape and dtype of each output as traced
  Device device;                            // where it runs
  std::optional<Device> requested_device;   // kind == op: the DeviceScope it was recorded in, for the placer
  const void* colocate_with = nullptr;      // kind == op: the ColocateWith variable's identity(), or null
  int32_t gradient_of = -1;                 // kind == op: the forward node whose gradient rule recorded it, or -1
  std::string placement_reason;             // why `device` (the placer's answer; empty before it ran)
  int32_t argument = -1;                    // kind == argument
  Tensor value;                             // kind == constant
  SourceTrace source;                       // kind == op: where the user recorded it
  bool removed = false;

  bool is_stateful() const { return kind == NodeKind::op && op->has_flag(kStateful); }
  // "op 'name'" plus " (recorded at file:line)" when known: the prefix of every error about it.
  std::string label() const;
};

class Graph {
 public:
  // --- reading ---
  size_t num_nodes() const;  // live nodes
  std::span<const Node> nodes() const { return nodes_; }  // including removed ones (skip them)
  const Node& node(int32_t id) const { return nodes_.at(static_cast<size_t>(id)); }
  const std::vector<ValueRef>& outputs() const { return outputs_; }  // what a call returns
  const std::vector<int32_t>& effects() const { return effects_; }   // stateful nodes that must run
  const TensorMeta& meta(ValueRef v) const;

  std::string to_dot() const;   // Graphviz: one box per live node (op, attributes, device, shapes)
  std::string to_json() const;  // {"nodes":[{"id","name","kind","op","inputs","control","device","requested_device",...}],"outputs","effects"}

  // --- building and rewriting (the tracer and the passes) ---
  Node& node(int32_t id) { return nodes_.at(static_cast<size_t>(id)); }
  std::vector<Node>& mutable_nodes() { return nodes_; }
  int32_t add_node(Node node);  // appends; gives it a unique name when `name` is empty
  // A constant node holding `value` (on value's device).
  int32_t add_constant(Tensor value);
  void set_outputs(std::vector<ValueRef> outputs) { outputs_ = std::move(outputs); }
  void set_effects(std::vector<int32_t> effects) { effects_ = std::move(effects); }
  // Every use of `from` (node inputs and graph outputs) now reads `to`.
  void replace_uses(ValueRef from, ValueRef to);
  // Drops removed nodes and renumbers the rest, keeping their order.
  void compact();
  // Throws InvalidArgument naming the broken invariant (tests and debug checks call it).
  void check_invariants() const;

 private:
  std::vector<Node> nodes_;
  std::vector<ValueRef> outputs_;
  std::vector<int32_t> effects_;
  int64_t names_given_ = 0;
};

}  // namespace flowlet
