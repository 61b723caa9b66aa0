// The executor: runs a finished graph. A Plan is built once per graph and never changes (kernels,
// where each input comes from, how many producers each node waits for); every run keeps its own
// step state, so one plan serves concurrent calls.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "flowlet/graph.hpp"

namespace flowlet::detail {

// What one run did, node by node (for timelines): times in ns since the step began.
struct StepStats {
  struct NodeRun {
    int32_t node = -1;
    int64_t start_ns = 0;
    int64_t end_ns = 0;
    int thread = 0;  // a small number per thread, for timeline rows
  };
  std::vector<NodeRun> nodes;
  int64_t wall_ns = 0;
};

class Plan {
 public:
  // `dynamic_shapes`: some argument dimensions vary between calls, so output shapes are inferred
  // at run time instead of taken from the graph.
  Plan(std::shared_ptr<const Graph> graph, bool dynamic_shapes);

  // Runs the graph on `arguments` (one per argument node, by index) and returns its outputs.
  // An op that fails cancels the rest of the step and its error is rethrown, same type, with
  // the node's name and recorded source line in front of the message.
  std::vector<Tensor> run(std::span<const Tensor> arguments, StepStats* stats = nullptr) const;

  const Graph& graph() const { return *graph_; }

 private:
  struct Step;
  struct Item {
    int32_t node = -1;        // graph node id
    const Op* op = nullptr;
    KernelFn kernel = nullptr;
    const void* attributes = nullptr;
    int32_t first_input = 0;  // into input_slots_
    int32_t num_inputs = 0;
    int32_t first_output = 0;  // slot of output 0; outputs are consecutive
    int32_t num_outputs = 0;
    int32_t first_consumer = 0;  // into consumers_ (items waiting on this one, data or control)
    int32_t num_consumers = 0;
    int32_t initial_pending = 0;  // producer items this one waits for
    bool allocate = true;         // false for views, whose kernels make their outputs
    bool expensive = false;       // worth handing to another thread
  };

  bool has_independent_expensive_items() const;
  void run_item(Step& step, int32_t item) const;
  void run_sequential(Step& step) const;
  void run_concurrent(Step& step) const;
  void finish_item(Step& step, int32_t item, std::vector<int32_t>& ready) const;
  static void run_task(void* context);

  std::shared_ptr<const Graph> graph_;
  bool dynamic_shapes_;
  bool concurrent_ = false;           // independent expensive branches exist and threads are available
  std::vector<Item> items_;           // op nodes, in topological order
  std::vector<int32_t> input_slots_;  // per item input, the slot it reads
  std::vector<int32_t> consumers_;
  std::vector<int32_t> initial_uses_;  // per slot: items reading it (+1 if it is a graph output)
  std::vector<std::pair<int32_t, int32_t>> argument_slots_;  // (argument index, slot)
  std::vector<std::pair<int32_t, Tensor>> constant_slots_;
  std::vector<int32_t> output_slots_;
  std::vector<bool> output_is_constant_;
  std::vector<int32_t> initially_ready_;
  int32_t num_slots_ = 0;
  int32_t num_arguments_ = 0;
};

}  // namespace flowlet::detail
