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
  std::atomic<bool> all_finished{false};  // remaining reached 0 (read unlocked by a helping waiter)
  std::exception_ptr error;
  const Node* error_node = nullptr;

  // Keeps the first error (with the node that threw it) and cancels the step.
  void fail(std::exception_ptr e, const Node& node);
  void partition_finished();
  // Until every partition finished. The waiting thread helps the pool meanwhile (runs ready nodes
  // handed to it, takes parallel_for chunks) and parks only when there is nothing to take.
  void wait();
};

// An index that indexes only the vectors of its own kind (IndexedVector<I, T>): a slot cannot be
// used as an item by mistake, and the conversions to size_t live here instead of at every use.
template <class Tag>
struct Index {
  int32_t value = -1;

  constexpr Index() = default;
  constexpr explicit Index(int32_t v) : value(v) {}
  constexpr explicit Index(size_t v) : value(static_cast<int32_t>(v)) {}
  constexpr size_t position() const { return static_cast<size_t>(value); }
  constexpr Index operator+(int32_t offset) const { return Index(value + offset); }
  constexpr Index& operator++() {
    ++value;
    return *this;
  }
  friend constexpr auto operator<=>(Index, Index) = default;
};

template <class I, class T>
class IndexedVector {
 public:
  IndexedVector() = default;
  explicit IndexedVector(size_t size) : values_(size) {}
  IndexedVector(size_t size, const T& value) : values_(size, value) {}

  T& operator[](I i) { return values_[i.position()]; }
  const T& operator[](I i) const { return values_[i.position()]; }
  size_t size() const { return values_.size(); }
  bool empty() const { return values_.empty(); }
  I end_index() const { return I(values_.size()); }
  I push_back(T value) {
    values_.push_back(std::move(value));
    return I(values_.size() - 1);
  }
  auto begin() const { return values_.begin(); }
  auto end() const { return values_.end(); }
  T* data() { return values_.data(); }

 private:
  std::vector<T> values_;
};

using NodeIndex = Index<struct NodeTag>;  // a node of the plan's graph
using ItemIndex = Index<struct ItemTag>;  // an op node the plan runs, in topological order
using SlotIndex = Index<struct SlotTag>;  // one output value of a node
using PartitionIndex = Index<struct PartitionTag>;  // one device's part of a graph (Executable)

// How a plan runs its items, chosen once when it is built (FLOWLET_EXECUTOR=sequential|concurrent,
// read as each plan is built, forces one for tests and benchmarks).
enum class RunMode : uint8_t {
  sequential,  // in topological order on the calling thread: no queue, no atomics, no thread hop
  dataflow,    // by pending counts, on the threads that finish producers (async items, partitions)
  concurrent,  // dataflow that also hands expensive ready items beyond the first to the pool
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
  RunMode mode() const { return mode_; }

  // --- for CUDA Graph recording (exec/graph_capture.cpp): one sequential step run in pieces ---
  bool sequential() const { return mode_ == RunMode::sequential; }
  int32_t num_items() const { return items_.end_index().value; }
  const Node& item_node(int32_t item) const { return node_of(items_[ItemIndex(item)]); }
  // Runs items [begin, end) of `step` in order on the calling thread (a sequential plan's step made
  // by make_step) and rethrows the first error with its node's name.
  void run_items(Step& step, int32_t begin, int32_t end) const;
  std::vector<Tensor> outputs(Step& step) const;  // after every item ran

 private:
  // A run of consecutive entries in one of the plan's flat tables.
  struct Range {
    int32_t first = 0;
    int32_t count = 0;
  };
  struct Item {
    NodeIndex node;
    const Op* op = nullptr;
    KernelFn kernel = nullptr;
    AsyncKernelFn async_kernel = nullptr;  // set instead of kernel for ops that wait (recv, dequeue)
    const void* attributes = nullptr;
    Range inputs;              // into input_slots_
    SlotIndex first_output;    // outputs are consecutive slots
    int32_t num_outputs = 0;
    Range consumers;           // into consumers_ (items waiting on this one, data or control)
    int32_t initial_pending = 0;  // producer items this one waits for
    bool allocate = true;         // false for views and async ops, whose kernels make their outputs
    bool expensive = false;       // worth handing to another thread
    bool fills_pool = false;      // expensive, and its own kernel already splits over every thread
  };
  struct Layout;  // what the constructor works out about the graph's nodes before linking items

  const Node& node_of(const Item& item) const { return graph_->node(item.node.value); }
  std::span<const SlotIndex> input_slots(const Item& item) const;
  std::span<const ItemIndex> consumers(const Item& item) const;
  std::span<Tensor> output_values(Step& step, const Item& item) const;

  Layout lay_out(const Graph& g);
  void link_items(const Layout& layout);
  void mark_outputs(const Graph& g, const Layout& layout);
  RunMode choose_mode(bool in_group) const;
  bool overlap_pays() const;  // two independent expensive items, one of them leaving threads idle

  void feed(Step& step, std::span<const Tensor> arguments) const;
  // Runs one item. False when an async kernel is still waiting: its completion finishes it later.
  bool run_item(Step& step, ItemIndex item) const;
  bool start_async_item(Step& step, ItemIndex index, const OpCall& call, int64_t start) const;
  void run_kernel(Step& step, const Item& item, const OpCall& call) const;
  void complete_item(Step& step, ItemIndex item, int64_t start) const;  // statistics; drops dead inputs
  void run_sequential(Step& step) const;
  void drain(Step& step, std::vector<ItemIndex>& ready) const;
  void finish_item(Step& step, ItemIndex item, std::vector<ItemIndex>& ready) const;
  static void run_task(void* task);
  static void async_done(void* task, std::exception_ptr error);
  static void continue_task(void* task);

  std::shared_ptr<const Graph> graph_;
  bool dynamic_shapes_;
  std::vector<int32_t> global_ids_;
  RunMode mode_ = RunMode::sequential;
  bool has_async_ = false;
  IndexedVector<ItemIndex, Item> items_;  // op nodes, in topological order
  std::vector<SlotIndex> input_slots_;    // per item input, the slot it reads
  std::vector<ItemIndex> consumers_;
  IndexedVector<SlotIndex, int32_t> initial_uses_;  // per slot: items reading it (+1 if it is a graph output)
  std::vector<std::pair<int32_t, SlotIndex>> argument_slots_;  // (argument index, slot)
  std::vector<std::pair<SlotIndex, Tensor>> constant_slots_;
  std::vector<SlotIndex> output_slots_;
  std::vector<bool> output_is_constant_;
  std::vector<ItemIndex> initially_ready_;
  int32_t num_slots_ = 0;
  int32_t num_arguments_ = 0;
};

// Rethrows `error` with "node '...' (recorded at ...): " in front of its message when it is a
// flowlet::Error (any subclass, type kept: Error::locate), so callers can still catch OutOfRange and
// friends. Other exceptions pass unchanged.
[[noreturn]] void rethrow_from_node(const std::exception_ptr& error, const Node& node);

}  // namespace flowlet::detail
