// The executor. A plan runs in one of three modes (RunMode), chosen when it is built:
//   - sequential: the nodes in their topological order on the calling thread. No queue, no atomics,
//     no thread hop: the right choice when there is one thread, or nothing worth overlapping.
//   - dataflow: each node counts the producers it still waits for; the thread that finishes a
//     producer runs newly-ready nodes inline. Plans with asynchronous nodes (Recv, dequeue) and
//     partitions of a multi-device step run this way: an async node that must wait returns at once
//     and its completion (on whatever thread delivers the tensor) continues the partition on the
//     pool, so a waiting node holds no thread.
//   - concurrent: dataflow that also hands expensive ready nodes beyond the first to the shared
//     pool (runtime/thread_pool.hpp), so independent branches overlap without oversubscribing.
//     Chosen only where overlap can pay: two independent big nodes, one of which leaves threads
//     idle (a node whose kernel splits over every thread already has them all; fills_pool).
// In all, a slot's tensor is dropped as soon as its last reader has run, so memory peaks like
// the eager program's. A failing node cancels the step (later nodes, in every partition, are
// skipped; waiting Recvs are woken) and its error is rethrown once every running node has stopped.
#include "exec/executor.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <string_view>

#include "core/check.hpp"
#include "exec/graph_capture.hpp"
#include "runtime/thread_pool.hpp"
#include "ops/internal.hpp"

namespace flowlet::detail {
namespace {

// A node is worth a thread hop when it is big: a contraction (matmul) of this many multiply-adds or
// more, or any op writing this many elements. Smaller ones run inline. (Big ones also split
// themselves over the pool, so overlapping them only pays when two are independent.)
constexpr double kExpensiveMultiplyAdds = 1 << 22;
constexpr int64_t kExpensiveElements = 1 << 18;

// The multiply-adds of a contraction node (matmul, matmul_bias; 0 for any other node).
double multiply_adds(const Graph& g, const Node& node) {
  if (!node.op->has_flag(kContraction) || node.inputs.size() < 2 || node.outputs.empty()) return 0;
  const Shape& a = g.meta(node.inputs[0]).shape;
  const double k = a.size() >= 2 ? static_cast<double>(a[a.size() - 1]) : 0.0;
  return static_cast<double>(node.outputs[0].shape.numel()) * k;
}

int64_t largest_output(const Node& node) {
  int64_t most = 0;
  for (const TensorMeta& meta : node.outputs) most = std::max(most, meta.shape.numel());
  return most;
}

bool is_expensive(const Graph& g, const Node& node) {
  return largest_output(node) >= kExpensiveElements || multiply_adds(g, node) >= kExpensiveMultiplyAdds;
}

// Whether a node is big enough that its own kernel already keeps every thread of the budget busy:
// its parallel_for (kParallelGrain elements a chunk) or GEMM split (one thread per
// kExpensiveMultiplyAdds, as the matmul kernel splits) has a piece for each thread. Running two such
// nodes side by side cannot finish sooner than one after the other, each over all threads: it only
// halves the threads each gets, evicts one's working set from the shared cache with the other's,
// and pays thread hops (issue 18: the batch-1024 MLP step and the CNN step, concurrent at 2
// threads, were not faster than eager). Never true while ops are capped below the budget
// (FLOWLET_INTRA_OP_THREADS): then overlap is how the other threads get used.
bool fills_pool(const Graph& g, const Node& node) {
  const int threads = intra_op_threads();
  if (threads < thread_budget()) return false;
  return largest_output(node) >= kParallelGrain * threads ||
         multiply_adds(g, node) >= kExpensiveMultiplyAdds * threads;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int thread_number() {
  static std::atomic<int> next{0};
  thread_local const int number = next.fetch_add(1, std::memory_order_relaxed);
  return number;
}

// FLOWLET_EXECUTOR=sequential|dataflow|concurrent overrides the choice of mode (sequential stays
// dataflow where a plan has async nodes or is one of a group's partitions). Read whenever a plan is built
// (once per traced signature), so a benchmark or test can compare modes in one process.
std::optional<RunMode> forced_mode() {
  const char* env = std::getenv("FLOWLET_EXECUTOR");
  if (!env) return std::nullopt;
  if (std::string_view(env) == "sequential") return RunMode::sequential;
  if (std::string_view(env) == "concurrent") return RunMode::concurrent;
  if (std::string_view(env) == "dataflow") return RunMode::dataflow;
  return std::nullopt;
}

}  // namespace

[[noreturn]] void rethrow_from_node(const std::exception_ptr& error, const Node& node) {
  try {
    std::rethrow_exception(error);
  } catch (Error& e) {
    e.locate(node.label());
    throw;
  }
}

void StepShared::fail(std::exception_ptr e, const Node& node) {
  {
    std::lock_guard lock(mutex);
    if (error) return;
    error = std::move(e);
    error_node = &node;
  }
  cancellation.cancel();  // outside the lock: callbacks wake parked nodes, which take it again
}

void StepShared::partition_finished() {
  {
    std::lock_guard lock(mutex);
    if (--remaining != 0) return;
    all_finished.store(true, std::memory_order_release);
    finished.notify_all();
  }
  // A waiter parked in help_until sleeps on the pool's wake-up, not on `finished`. Only the pool is
  // touched from here: the waiter may already have returned and destroyed this StepShared.
  wake_helpers();
}

void StepShared::wait() {
  // The caller does not sleep while its step runs: it works for the pool (issue 18: with 2 threads
  // a concurrent plan's caller slept and every later node ran on the one worker, its parallel_for
  // splits finding no second thread). Ready nodes reach it as pool tasks, so it takes those, and
  // chunks of the nodes the worker runs. Then the wait below returns at once; it only orders this
  // thread after partition_finished's unlock (so `shared` outlives it), and is the whole wait where
  // helping is not allowed.
  auto done = [this] { return all_finished.load(std::memory_order_acquire); };
  help_until(FunctionRef<bool()>(done));
  std::unique_lock lock(mutex);
  finished.wait(lock, [&] { return remaining == 0; });
}

struct Plan::Step {
  // What a scheduled item's pool task (or an async kernel's completion) gets as its argument.
  struct Task {
    Step* step = nullptr;
    ItemIndex item;
  };

  Step(const Plan& plan_, StepShared& shared_)
      : plan(plan_), shared(shared_), values(static_cast<size_t>(plan_.num_slots_)), uses(plan_.initial_uses_.size()) {}

  const Plan& plan;
  StepShared& shared;
  IndexedVector<SlotIndex, Tensor> values;
  IndexedVector<SlotIndex, std::atomic<int32_t>> uses;
  IndexedVector<ItemIndex, std::atomic<int32_t>> pending;     // dataflow runs only
  IndexedVector<ItemIndex, std::atomic<uint8_t>> async_state;  // per item: 2 once both the kernel returned and done ran
  IndexedVector<ItemIndex, int64_t> async_start;               // per item, with statistics: when its kernel started
  std::atomic<int64_t> outstanding{0};                         // ready, running or waiting items
  IndexedVector<ItemIndex, Task> tasks;
};

// --- building the plan ---

struct Plan::Layout {
  IndexedVector<NodeIndex, SlotIndex> first_slot;  // per node: the slot of output 0
  IndexedVector<NodeIndex, ItemIndex> item_of;     // per node: its item (invalid for arguments, constants)
};

Plan::~Plan() = default;

Plan::Plan(std::shared_ptr<const Graph> graph, bool dynamic_shapes, std::vector<int32_t> global_ids, bool in_group)
    : graph_(std::move(graph)), dynamic_shapes_(dynamic_shapes), global_ids_(std::move(global_ids)) {
  const Layout layout = lay_out(*graph_);
  link_items(layout);
  mark_outputs(*graph_, layout);
  mode_ = choose_mode(in_group);
}

// Gives every live node its slots, and every op node an item with its kernel.
Plan::Layout Plan::lay_out(const Graph& g) {
  Layout layout{IndexedVector<NodeIndex, SlotIndex>(g.nodes().size()),
                IndexedVector<NodeIndex, ItemIndex>(g.nodes().size())};
  for (NodeIndex id(0); id.position() < g.nodes().size(); ++id) {
    const Node& node = g.node(id.value);
    if (node.removed) continue;
    const SlotIndex first(num_slots_);
    layout.first_slot[id] = first;
    num_slots_ += static_cast<int32_t>(node.outputs.size());
    if (node.kind == NodeKind::argument) {
      argument_slots_.emplace_back(node.argument, first);
      num_arguments_ = std::max(num_arguments_, node.argument + 1);
      continue;
    }
    if (node.kind == NodeKind::constant) {
      constant_slots_.emplace_back(first, node.value);
      continue;
    }
    Item item;
    item.node = id;
    item.op = node.op;
    item.async_kernel = node.op->async_kernels[static_cast<size_t>(node.device.kind())];
    item.kernel = item.async_kernel ? nullptr : node.op->kernels[static_cast<size_t>(node.device.kind())];
    if (!item.kernel && !item.async_kernel) fail<DeviceError>("{}: no kernel for device {}", node.label(), node.device);
    has_async_ |= item.async_kernel != nullptr;
    item.attributes = node.attributes.get();
    item.first_output = first;
    item.num_outputs = static_cast<int32_t>(node.outputs.size());
    item.allocate = !node.op->has_flag(kView) && !item.async_kernel;
    item.expensive = is_expensive(g, node);
    item.fills_pool = item.expensive && fills_pool(g, node);
    layout.item_of[id] = items_.push_back(item);
  }
  return layout;
}

// Where each item's inputs come from, which items wait for which, and which start ready.
void Plan::link_items(const Layout& layout) {
  initial_uses_ = IndexedVector<SlotIndex, int32_t>(static_cast<size_t>(num_slots_), 0);
  IndexedVector<ItemIndex, std::vector<ItemIndex>> waiting(items_.size());
  std::vector<ItemIndex> producers;
  for (ItemIndex i(0); i < items_.end_index(); ++i) {
    Item& item = items_[i];
    const Node& node = node_of(item);
    item.inputs = Range{static_cast<int32_t>(input_slots_.size()), static_cast<int32_t>(node.inputs.size())};
    producers.clear();
    for (const ValueRef& in : node.inputs) {
      const SlotIndex slot = layout.first_slot[NodeIndex(in.node)] + in.output;
      input_slots_.push_back(slot);
      ++initial_uses_[slot];
      if (const ItemIndex p = layout.item_of[NodeIndex(in.node)]; p.value >= 0) producers.push_back(p);
    }
    for (int32_t c : node.control_inputs) {
      if (const ItemIndex p = layout.item_of[NodeIndex(c)]; p.value >= 0) producers.push_back(p);
    }
    std::sort(producers.begin(), producers.end());
    producers.erase(std::unique(producers.begin(), producers.end()), producers.end());
    item.initial_pending = static_cast<int32_t>(producers.size());
    for (ItemIndex p : producers) waiting[p].push_back(i);
    if (producers.empty()) initially_ready_.push_back(i);
  }
  for (ItemIndex i(0); i < items_.end_index(); ++i) {
    items_[i].consumers = Range{static_cast<int32_t>(consumers_.size()), static_cast<int32_t>(waiting[i].size())};
    consumers_.insert(consumers_.end(), waiting[i].begin(), waiting[i].end());
  }
}

void Plan::mark_outputs(const Graph& g, const Layout& layout) {
  for (const ValueRef& out : g.outputs()) {
    const SlotIndex slot = layout.first_slot[NodeIndex(out.node)] + out.output;
    output_slots_.push_back(slot);
    output_is_constant_.push_back(g.node(out.node).kind == NodeKind::constant);
    initial_uses_[slot] += 1 << 20;  // outputs outlive the step
  }
}

RunMode Plan::choose_mode(bool in_group) const {
  // Overlap pays only when two big nodes are independent (neither waits for the other) and one of
  // them leaves threads idle; a chain of big nodes, or big nodes that each split over every thread,
  // run faster sequentially (fills_pool).
  // A plan wholly on GPUs gains nothing from host threads: its kernels queue on the device's one
  // compute stream in issue order (and only a sequential plan can be recorded as a CUDA Graph).
  const bool on_gpus = !items_.empty() && std::all_of(items_.begin(), items_.end(), [&](const Item& item) {
    return node_of(item).device.kind() == DeviceKind::cuda;
  });
  const std::optional<RunMode> forced = forced_mode();
  const bool concurrent =
      forced ? *forced == RunMode::concurrent : !on_gpus && thread_budget() > 1 && overlap_pays();
  if (concurrent) return RunMode::concurrent;
  const bool dataflow = has_async_ || in_group || forced == RunMode::dataflow;
  return dataflow ? RunMode::dataflow : RunMode::sequential;
}

bool Plan::overlap_pays() const {
  // Which of the first 64 expensive items each item waits for, directly or not (items are in
  // topological order, so one forward pass propagates it).
  IndexedVector<ItemIndex, uint64_t> waits_for(items_.size(), 0);
  IndexedVector<ItemIndex, int> bit(items_.size(), -1);
  uint64_t partial = 0;  // the expensive items that leave threads idle
  int expensive = 0;
  for (ItemIndex i(0); i < items_.end_index(); ++i) {
    if (!items_[i].expensive) continue;
    if (expensive == 64) {  // too many to track: assume overlap where some item leaves threads idle
      return partial != 0 || std::any_of(items_.begin(), items_.end(), [](const Item& item) {
               return item.expensive && !item.fills_pool;
             });
    }
    if (!items_[i].fills_pool) partial |= uint64_t{1} << expensive;
    bit[i] = expensive++;
  }
  if (partial == 0) return false;
  for (ItemIndex i(0); i < items_.end_index(); ++i) {
    const uint64_t mine = waits_for[i] | (bit[i] >= 0 ? uint64_t{1} << bit[i] : 0);
    for (ItemIndex c : consumers(items_[i])) waits_for[c] |= mine;
  }
  // Two expensive items are dependent when one's bit is in the other's ancestors. Since items are
  // in topological order, item j can only wait for earlier items.
  for (ItemIndex j(0); j < items_.end_index(); ++j) {
    if (bit[j] < 0) continue;
    const uint64_t earlier = (uint64_t{1} << bit[j]) - 1;    // expensive items before j
    const uint64_t independent = earlier & ~waits_for[j];   // ... that j does not wait for
    const bool j_partial = (partial >> bit[j]) & 1;
    if (independent != 0 && (j_partial || (independent & partial) != 0)) return true;
  }
  return false;
}

std::span<const SlotIndex> Plan::input_slots(const Item& item) const {
  return std::span<const SlotIndex>(input_slots_).subspan(static_cast<size_t>(item.inputs.first),
                                                          static_cast<size_t>(item.inputs.count));
}

std::span<const ItemIndex> Plan::consumers(const Item& item) const {
  return std::span<const ItemIndex>(consumers_).subspan(static_cast<size_t>(item.consumers.first),
                                                        static_cast<size_t>(item.consumers.count));
}

std::span<Tensor> Plan::output_values(Step& step, const Item& item) const {
  return std::span<Tensor>(step.values.data() + item.first_output.position(), static_cast<size_t>(item.num_outputs));
}

// --- running items ---

// Kept out of its callers: inlined into Plan::run, it pushes the Tensor destructors of its small
// arrays out of line (a call each per node; measured 10% on a chain of scalar adds).
[[gnu::noinline]] bool Plan::run_item(Step& step, ItemIndex index) const {
  const Item& item = items_[index];
  if (step.shared.cancellation.cancelled()) {
    complete_item(step, index, -1);
    return true;
  }
  const int64_t start = step.shared.stats ? now_ns() : 0;
  try {
    std::array<Tensor, 8> small_inputs;
    std::vector<Tensor> large_inputs;
    const auto slots = input_slots(item);
    std::span<Tensor> inputs(small_inputs.data(), slots.size());
    if (slots.size() > small_inputs.size()) {
      large_inputs.resize(slots.size());
      inputs = large_inputs;
    }
    for (size_t k = 0; k < slots.size(); ++k) inputs[k] = step.values[slots[k]];
    const OpCall call{*item.op, inputs, item.attributes, &step.shared.context};
    if (item.async_kernel) return start_async_item(step, index, call, start);
    run_kernel(step, item, call);
  } catch (...) {
    // An async kernel that throws has not called (and must not call) its done.
    step.shared.fail(std::current_exception(), node_of(item));
  }
  complete_item(step, index, start);
  return true;
}

[[gnu::noinline]] bool Plan::start_async_item(Step& step, ItemIndex index, const OpCall& call, int64_t start) const {
  const Item& item = items_[index];
  if (step.shared.stats) step.async_start[index] = start;
  step.async_state[index].store(0, std::memory_order_relaxed);
  item.async_kernel(call, output_values(step, item), AsyncDone{&Plan::async_done, &step.tasks[index]});
  // Whichever of this thread and the completion comes second goes on with the item.
  if (step.async_state[index].fetch_add(1, std::memory_order_acq_rel) == 0) return false;
  complete_item(step, index, start);
  return true;
}

void Plan::run_kernel(Step& step, const Item& item, const OpCall& call) const {
  // Outputs go straight into the item's slots: nobody reads them before the item completes.
  const Node& node = node_of(item);
  const std::span<Tensor> outputs = output_values(step, item);
  if (item.allocate && dynamic_shapes_ && !outputs.empty()) {
    OutputSpec spec;  // only here: building one per node would cost the common case
    spec.device = node.device;
    item.op->infer(call, spec);
    for (size_t k = 0; k < outputs.size(); ++k) {
      outputs[k] = Tensor::empty(spec.outputs[k].shape, spec.outputs[k].dtype, node.device);
    }
  } else if (item.allocate) {
    for (size_t k = 0; k < outputs.size(); ++k) {
      outputs[k] = Tensor::empty(node.outputs[k].shape, node.outputs[k].dtype, node.device);
    }
  }
  item.kernel(call, outputs);
}

void Plan::complete_item(Step& step, ItemIndex index, int64_t start) const {
  const Item& item = items_[index];
  if (step.shared.stats && start >= 0) {
    const int64_t end = now_ns();
    const int32_t id = global_ids_.empty() ? item.node.value : global_ids_[item.node.position()];
    std::lock_guard lock(step.shared.mutex);
    step.shared.stats->nodes.push_back({id, start - step.shared.start_ns, end - step.shared.start_ns, thread_number()});
  }
  // Drop inputs nobody else reads.
  for (SlotIndex slot : input_slots(item)) {
    if (step.uses[slot].fetch_sub(1, std::memory_order_acq_rel) == 1) step.values[slot] = Tensor();
  }
}

void Plan::async_done(void* task, std::exception_ptr error) {
  const auto [step, index] = *static_cast<Step::Task*>(task);  // a copy: the step may end before we do
  const Plan& plan = step->plan;
  if (error) step->shared.fail(std::move(error), plan.node_of(plan.items_[index]));
  if (step->async_state[index].fetch_add(1, std::memory_order_acq_rel) == 0) {
    return;  // the kernel has not returned yet: run_item goes on with the item
  }
  // The partition continues on a pool thread, not on the thread that delivered (often another
  // device's partition, which has its own work).
  schedule(&Plan::continue_task, task);
}

void Plan::continue_task(void* task) {
  const auto [step, index] = *static_cast<Step::Task*>(task);  // a copy: the step may end before we do
  const Plan& plan = step->plan;
  plan.complete_item(*step, index, step->shared.stats ? step->async_start[index] : -1);
  std::vector<ItemIndex> ready;
  plan.finish_item(*step, index, ready);
  plan.drain(*step, ready);
}

void Plan::run_sequential(Step& step) const {
  for (ItemIndex i(0); i < items_.end_index(); ++i) run_item(step, i);
}

void Plan::run_items(Step& step, int32_t begin, int32_t end) const {
  if (!sequential()) fail<InvalidArgument>("internal: run_items needs a sequential plan");
  CaptureRecorder* recorder = capture_recorder;
  for (ItemIndex i(begin); i < ItemIndex(end); ++i) {
    if (recorder) recorder->node = &node_of(items_[i]);
    run_item(step, i);
  }
  if (step.shared.error) rethrow_from_node(step.shared.error, *step.shared.error_node);
}

std::vector<Tensor> Plan::outputs(Step& step) const {
  std::vector<Tensor> result;
  result.reserve(output_slots_.size());
  for (size_t i = 0; i < output_slots_.size(); ++i) result.push_back(output(step, i));
  return result;
}

void Plan::drain(Step& step, std::vector<ItemIndex>& ready) const {
  while (!ready.empty()) {
    // Cheap nodes before expensive ones: a Send (or a small node feeding one) may be what another
    // partition or thread waits for, and holding it back behind a long chain of big nodes would
    // serialize the devices.
    auto pick = ready.end() - 1;
    if (items_[*pick].expensive) {
      const auto cheap = std::find_if(ready.rbegin() + 1, ready.rend(), [&](ItemIndex i) { return !items_[i].expensive; });
      if (cheap != ready.rend()) pick = std::next(cheap).base();
    }
    const ItemIndex index = *pick;
    ready.erase(pick);
    if (run_item(step, index)) finish_item(step, index, ready);
  }
}

void Plan::finish_item(Step& step, ItemIndex index, std::vector<ItemIndex>& ready) const {
  bool kept_expensive = false;
  for (ItemIndex c : consumers(items_[index])) {
    if (step.pending[c].fetch_sub(1, std::memory_order_acq_rel) != 1) continue;
    step.outstanding.fetch_add(1, std::memory_order_relaxed);
    const bool expensive = items_[c].expensive;
    if (mode_ != RunMode::concurrent || !expensive || (!kept_expensive && ready.empty())) {
      kept_expensive |= expensive;
      ready.push_back(c);  // run on this thread
    } else {
      schedule(&Plan::run_task, &step.tasks[c]);
    }
  }
  // The last item of the partition: from here on only the shared state is touched.
  if (step.outstanding.fetch_sub(1, std::memory_order_acq_rel) == 1) step.shared.partition_finished();
}

void Plan::run_task(void* task) {
  const auto [step, index] = *static_cast<Step::Task*>(task);  // a copy: the step may end before we do
  std::vector<ItemIndex> ready{index};
  step->plan.drain(*step, ready);
}

// --- steps ---

void Plan::StepDeleter::operator()(Step* step) const { delete step; }

Plan::StepPtr Plan::make_step(StepShared& shared, std::span<const Tensor> arguments) const {
  StepPtr step(new Step(*this, shared));
  feed(*step, arguments);
  return step;
}

void Plan::feed(Step& step, std::span<const Tensor> arguments) const {
  if (arguments.size() < static_cast<size_t>(num_arguments_)) {
    fail<InvalidArgument>("graph: expects {} tensor arguments; got {}", num_arguments_, arguments.size());
  }
  for (SlotIndex s(0); s < initial_uses_.end_index(); ++s) step.uses[s].store(initial_uses_[s], std::memory_order_relaxed);
  for (const auto& [index, slot] : argument_slots_) step.values[slot] = arguments[static_cast<size_t>(index)];
  for (const auto& [slot, value] : constant_slots_) step.values[slot] = value;
  if (sequential()) return;
  step.pending = IndexedVector<ItemIndex, std::atomic<int32_t>>(items_.size());
  step.tasks = IndexedVector<ItemIndex, Step::Task>(items_.size());
  for (ItemIndex i(0); i < items_.end_index(); ++i) {
    step.pending[i].store(items_[i].initial_pending, std::memory_order_relaxed);
    step.tasks[i] = Step::Task{&step, i};
  }
  if (has_async_) {
    step.async_state = IndexedVector<ItemIndex, std::atomic<uint8_t>>(items_.size());
    if (step.shared.stats) step.async_start = IndexedVector<ItemIndex, int64_t>(items_.size(), 0);
  }
}

void Plan::start(Step& step) const {
  // Only dataflow plans start this way: Executable builds every partition of a group in_group.
  if (items_.empty()) {
    step.shared.partition_finished();
    return;
  }
  step.outstanding.store(static_cast<int64_t>(initially_ready_.size()), std::memory_order_relaxed);
  std::vector<ItemIndex> ready(initially_ready_.rbegin(), initially_ready_.rend());
  drain(step, ready);
}

void Plan::start_task(void* step) {
  auto* s = static_cast<Step*>(step);
  s->plan.start(*s);
}

Tensor Plan::output(Step& step, size_t i) const {
  Tensor value = step.values[output_slots_.at(i)];
  // A constant output (folded, or captured) is the graph's own buffer: hand out a copy, so a
  // caller writing through data() cannot change what later calls return.
  if (output_is_constant_[i]) value = copy_to_contiguous(value);
  return value;
}

std::vector<Tensor> Plan::run(std::span<const Tensor> arguments, StepStats* stats) const {
  StepShared shared;
  shared.remaining = 1;
  if (stats) {
    stats->nodes.clear();
    if (stats->record_nodes) shared.stats = stats;
    shared.start_ns = now_ns();
  }
  Step step(*this, shared);
  feed(step, arguments);
  if (sequential()) {
    run_sequential(step);
  } else {
    start(step);
    shared.wait();
  }
  if (stats) stats->wall_ns = now_ns() - shared.start_ns;
  if (shared.error) rethrow_from_node(shared.error, *shared.error_node);
  return outputs(step);
}

}  // namespace flowlet::detail
