// The executor: runs one graph partition (a whole graph when it has one device). A Plan is built
// once per graph and never changes (kernels, where each input comes from, how many producers each
// node waits for); every run keeps its own step state, so one plan serves concurrent calls. Several
// partitions of one graph run as one step through Executable (exec/executable.hpp), sharing a
// StepShared: the rendezvous, the cancellation, the first error and the statistics.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "runtime/cancellation.hpp"
#include "runtime/step_context.hpp"
#include "flowlet/graph.hpp"

namespace flowlet::detail {

// What one run did, node by node (for timelines): times in ns since the step began.
struct StepStats {
  struct NodeRun {
    int32_t node = -1;  // id in the whole graph (not the partition)
    int64_t start_ns = 0;
    int64_t end_ns = 0;
    int thread = 0;  // a small number per thread, for timeline rows
  };
  bool record_nodes = true;  // false: only the totals below (no per-node clock reads or locking)
  std::vector<NodeRun> nodes;
  int64_t wall_ns = 0;
  int64_t bytes_transferred = 0;  // by Send/Recv pairs between the partitions
  int64_t transfers = 0;          // Send/Recv pairs that ran (control edges included)
};

// The part of one step that every partition shares.
struct StepShared {
  Cancellation cancellation;  // a failing node cancels every partition
  StepContext context{nullptr, &cancellation};
  StepStats* stats = nullptr;  // set only when nodes are recorded
  int64_t start_ns = 0;

  std::mutex mutex;  // guards everything below (and stats->nodes)
  std::condition_variable finished;
  int remaining = 0;  // partitions still running
  std::exception_ptr error;
  const Node* error_node = nullptr;

  // Keeps the first error (with the node that threw it) and cancels the step.
  void fail(std::exception_ptr e, const Node& node);
  void partition_finished();
  void wait();  // until every partition finished
};

class Plan {
 public:
  struct Step;
  struct StepDeleter {
    void operator()(Step* step) const;
  };
  using StepPtr = std::unique_ptr<Step, StepDeleter>;

  // `dynamic_shapes`: some argument dimensions vary between calls, so output shapes are inferred
  // at run time instead of taken from the graph. `global_ids`: for a partition, each node's id in
  // the whole graph (statistics name those); empty for a whole graph. `in_group`: runs as one of
  // several partitions of a step, so it must never block a thread while waiting for another.
  Plan(std::shared_ptr<const Graph> graph, bool dynamic_shapes, std::vector<int32_t> global_ids = {},
       bool in_group = false);
  ~Plan();

  // Runs the graph on `arguments` (one per argument node, by index) and returns its outputs.
  // An op that fails cancels the rest of the step and its error is rethrown, same type, with
  // the node's name and recorded source line in front of the message.
  std::vector<Tensor> run(std::span<const Tensor> arguments, StepStats* stats = nullptr) const;

  // --- for Executable: one partition's share of a step ---
  StepPtr make_step(StepShared& shared, std::span<const Tensor> arguments) const;
  // Runs what is ready on the calling thread; the rest follows on pool threads (as Recvs and other
  // waits complete). shared.partition_finished() is called when the partition is done. For plans
  // built in_group (and run() of plans with async nodes).
  void start(Step& step) const;
  static void start_task(void* step);  // schedule()-able start()
  // Output i of the partition's graph, after the step finished.
  Tensor output(Step& step, size_t i) const;

  const Graph& graph() const { return *graph_; }

  // --- for CUDA Graph recording (exec/graph_capture.cpp): one sequential step run in pieces ---
  bool sequential() const { return !dataflow_; }
  int32_t num_items() const { return static_cast<int32_t>(items_.size()); }
  const Node& item_node(int32_t item) const { return graph_->node(items_[static_cast<size_t>(item)].node); }
  // Runs items [begin, end) of `step` in order on the calling thread (a sequential plan's step made
  // by make_step) and rethrows the first error with its node's name.
  void run_items(Step& step, int32_t begin, int32_t end) const;
  std::vector<Tensor> outputs(Step& step) const;  // after every item ran

 private:
  struct Item {
    int32_t node = -1;        // graph node id
    const Op* op = nullptr;
    KernelFn kernel = nullptr;
    AsyncKernelFn async_kernel = nullptr;  // set instead of kernel for ops that wait (recv, dequeue)
    const void* attributes = nullptr;
    int32_t first_input = 0;  // into input_slots_
    int32_t num_inputs = 0;
    int32_t first_output = 0;  // slot of output 0; outputs are consecutive
    int32_t num_outputs = 0;
    int32_t first_consumer = 0;  // into consumers_ (items waiting on this one, data or control)
    int32_t num_consumers = 0;
    int32_t initial_pending = 0;  // producer items this one waits for
    bool allocate = true;         // false for views and async ops, whose kernels make their outputs
    bool expensive = false;       // worth handing to another thread
  };

  bool has_independent_expensive_items() const;
  void feed(Step& step, std::span<const Tensor> arguments) const;
  // Runs one item. False when an async kernel is still waiting: its completion finishes it later.
  bool run_item(Step& step, int32_t item) const;
  void complete_item(Step& step, int32_t item, int64_t start) const;  // statistics; drops dead inputs
  void run_sequential(Step& step) const;
  void drain(Step& step, std::vector<int32_t>& ready) const;
  void finish_item(Step& step, int32_t item, std::vector<int32_t>& ready) const;
  static void run_task(void* context);
  static void async_done(void* context, std::exception_ptr error);
  static void continue_task(void* context);

  std::shared_ptr<const Graph> graph_;
  bool dynamic_shapes_;
  std::vector<int32_t> global_ids_;
  bool concurrent_ = false;  // hands expensive ready items to the pool
  bool dataflow_ = false;    // runs by pending counts (concurrent, async items, or part of a group)
  bool has_async_ = false;
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

// Rethrows `error` as the same flowlet::Error subclass with "node '...' (recorded at ...): " in
// front, so callers can still catch OutOfRange and friends. Other exceptions pass unchanged.
[[noreturn]] void rethrow_from_node(const std::exception_ptr& error, const Node& node);

}  // namespace flowlet::detail
