// The recording side of trace(): while a TraceBuilder is active on a thread, dispatch() records
// each op call as a graph node and hands back symbolic tensors instead of running kernels.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "flowlet/graph.hpp"
#include "flowlet/op.hpp"

namespace flowlet::detail {

class TraceBuilder {
 public:
  TraceBuilder();
  TraceBuilder(const TraceBuilder&) = delete;
  TraceBuilder& operator=(const TraceBuilder&) = delete;

  uint32_t id() const { return id_; }
  Graph& graph() { return graph_; }

  // A symbolic tensor standing for the traced function's tensor argument `index`.
  Tensor add_argument(const TensorMeta& meta, Device device, int32_t index);

  // Records `op` on `inputs` (validated and inferred by dispatch, its only caller) and fills
  // `outputs` with symbolic tensors. Returns the node id. A stateful op is ordered on the resource
  // its Op::resource names (see order_effect); without one, on the host (prints and callbacks
  // keep their program order). Op::node_name, when set, starts the node's name.
  int32_t record(const Op& op, std::span<const Tensor> inputs, const void* attributes, const OutputSpec& spec,
                 std::span<Tensor> outputs);

  // The graph value a tensor stands for: a symbolic tensor of this trace, or a concrete tensor,
  // which becomes a constant node (one per tensor, however often it is used).
  ValueRef value_of(const Tensor& t);

  // Orders a stateful node against earlier ones on the same resource (a variable, the output
  // stream) in program order: reads after the last write, a write after the last write and every
  // read since. Every write is also an effect: it runs even when no output needs it.
  void order_effect(int32_t node, const void* resource, bool writes);

  // The graph's outputs, from the tensors the function returned.
  void set_outputs(std::span<const Tensor> outputs);

 private:
  struct ResourceUse {
    int32_t last_write = -1;
    std::vector<int32_t> reads_since_write;
  };

  Graph graph_;
  uint32_t id_;
  std::unordered_map<const void*, int32_t> constants_;  // TensorImpl -> constant node
  std::vector<Tensor> constant_keepalive_;              // keeps those addresses unique
  std::unordered_map<const void*, ResourceUse> resources_;
  std::vector<int32_t> effects_;
};

// The trace being recorded on this thread, or null (the eager case).
TraceBuilder* active_trace();

// While a gradient rule runs for traced forward node `forward`, the nodes it records remember it
// (Node::gradient_of), so the placer can run them where the forward op runs.
class GradientOfScope {
 public:
  explicit GradientOfScope(int32_t forward);
  ~GradientOfScope();
  GradientOfScope(const GradientOfScope&) = delete;
  GradientOfScope& operator=(const GradientOfScope&) = delete;

 private:
  int32_t previous_;
};

// Makes `builder` the active trace of this thread for the scope's lifetime (null: run eagerly).
class ActiveTraceScope {
 public:
  explicit ActiveTraceScope(TraceBuilder* builder);
  ~ActiveTraceScope();
  ActiveTraceScope(const ActiveTraceScope&) = delete;
  ActiveTraceScope& operator=(const ActiveTraceScope&) = delete;

 private:
  TraceBuilder* previous_;
};

// A symbolic tensor (no elements) with `meta`'s shape and dtype on `device`.
Tensor make_symbolic(const TensorMeta& meta, Device device, uint32_t trace_id, int32_t node, int32_t output);

// InvalidArgument when a symbolic tensor reaches an op outside the trace that made it.
[[noreturn]] void fail_foreign_symbolic(const Op& op, const Tensor& t);

}  // namespace flowlet::detail

