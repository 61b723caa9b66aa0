// The executor. Two ways to run a plan, chosen when it is built:
//   - sequential: the nodes in their topological order on the calling thread. No queue, no atomics,
//     no thread hop: the right choice when there is one thread, or nothing worth overlapping.
//   - dataflow: each node counts the producers it still waits for; the thread that finishes a
//     producer runs cheap newly-ready nodes inline and (when the plan is concurrent) hands expensive
//     ones beyond the first to the shared pool (runtime/thread_pool.hpp), so independent branches
//     overlap without oversubscribing. Plans with asynchronous nodes (Recv, dequeue) and partitions
//     of a multi-device step always run this way: an async node that must wait returns at once and
//     its completion (on whatever thread delivers the tensor) continues the partition on the pool,
//     so a waiting node holds no thread.
// In both, a slot's tensor is dropped as soon as its last reader has run, so memory peaks like
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
#include <string_view>

#include "core/check.hpp"
#include "exec/graph_capture.hpp"
#include "runtime/thread_pool.hpp"
#include "ops/internal.hpp"

namespace flowlet::detail {
namespace {

// A node is worth a thread hop when it is big: a matmul of this many multiply-adds or more, or
// any op writing this many elements. Smaller ones run inline. (Big ones also split themselves
// over the pool, so overlapping them only pays when two are independent.)
constexpr double kExpensiveMultiplyAdds = 1 << 22;
constexpr int64_t kExpensiveElements = 1 << 18;

bool is_expensive(const Graph& g, const Node& node) {
  for (const TensorMeta& meta : node.outputs) {
    if (meta.shape.numel() >= kExpensiveElements) return true;
  }
  if (node.op->name == "matmul" && node.inputs.size() == 2 && !node.outputs.empty()) {
    const Shape& a = g.meta(node.inputs[0]).shape;
    const double k = a.size() >= 2 ? static_cast<double>(a[a.size() - 1]) : 0.0;
    return static_cast<double>(node.outputs[0].shape.numel()) * k >= kExpensiveMultiplyAdds;
  }
  return false;
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

}  // namespace

[[noreturn]] void rethrow_from_node(const std::exception_ptr& error, const Node& node) {
  const std::string prefix = node.label() + ": ";
  try {
    std::rethrow_exception(error);
  } catch (const ShapeError& e) {
    throw ShapeError(prefix + e.what());
  } catch (const DTypeError& e) {
    throw DTypeError(prefix + e.what());
  } catch (const DeviceError& e) {
    throw DeviceError(prefix + e.what());
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(prefix + e.what());
  } catch (const OutOfRange& e) {
    throw OutOfRange(prefix + e.what());
  } catch (const Cancelled& e) {
    throw Cancelled(prefix + e.what());
  } catch (const Error& e) {
    throw Error(prefix + e.what());
  }
}

namespace {

// FLOWLET_EXECUTOR=sequential|concurrent overrides the choice (tests and benchmarks use it).
int forced_mode() {
  static const int mode = [] {
    const char* env = std::getenv("FLOWLET_EXECUTOR");
    if (!env) return 0;
    if (std::string_view(env) == "sequential") return 1;
    if (std::string_view(env) == "concurrent") return 2;
    return 0;
  }();
  return mode;
}

}  // namespace

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
  std::lock_guard lock(mutex);
  if (--remaining == 0) finished.notify_all();
}

void StepShared::wait() {
  std::unique_lock lock(mutex);
  finished.wait(lock, [&] { return remaining == 0; });
}

struct Plan::Step {
  Step(const Plan& plan_, StepShared& shared_)
      : plan(plan_), shared(shared_), values(static_cast<size_t>(plan_.num_slots_)), uses(plan_.initial_uses_.size()) {}

  const Plan& plan;
  StepShared& shared;
  std::vector<Tensor> values;  // per slot
  std::vector<std::atomic<int32_t>> uses;
  std::unique_ptr<std::atomic<int32_t>[]> pending;     // dataflow runs only
  std::unique_ptr<std::atomic<uint8_t>[]> async_state;  // per item: 2 once both the kernel returned and done ran
  std::vector<int64_t> async_start;                     // per item, with statistics: when its kernel started
  std::atomic<int64_t> outstanding{0};                  // ready, running or waiting items
  std::vector<std::pair<Step*, int32_t>> tasks;         // the argument of each scheduled item
};

Plan::~Plan() = default;

Plan::Plan(std::shared_ptr<const Graph> graph, bool dynamic_shapes, std::vector<int32_t> global_ids, bool in_group)
    : graph_(std::move(graph)), dynamic_shapes_(dynamic_shapes), global_ids_(std::move(global_ids)) {
  const Graph& g = *graph_;
  const auto n = g.nodes().size();
  std::vector<int32_t> first_slot(n, -1), item_of(n, -1);
  for (size_t id = 0; id < n; ++id) {
    const Node& node = g.nodes()[id];
    if (node.removed) continue;
    first_slot[id] = num_slots_;
    num_slots_ += static_cast<int32_t>(node.outputs.size());
    if (node.kind == NodeKind::argument) {
      argument_slots_.emplace_back(node.argument, first_slot[id]);
      num_arguments_ = std::max(num_arguments_, node.argument + 1);
    } else if (node.kind == NodeKind::constant) {
      constant_slots_.emplace_back(first_slot[id], node.value);
    } else {
      item_of[id] = static_cast<int32_t>(items_.size());
      Item item;
      item.node = static_cast<int32_t>(id);
      item.op = node.op;
      item.kernel = node.op->kernels[static_cast<int>(node.device.kind())];
      item.async_kernel = node.op->async_kernels[static_cast<int>(node.device.kind())];
      if (!item.kernel && !item.async_kernel) {
        fail<DeviceError>("{}: no kernel for device {}", node.label(), node.device);
      }
      if (item.async_kernel) item.kernel = nullptr;
      has_async_ |= item.async_kernel != nullptr;
      item.attributes = node.attributes.get();
      item.first_output = first_slot[id];
      item.num_outputs = static_cast<int32_t>(node.outputs.size());
      item.allocate = !node.op->has_flag(kView) && !item.async_kernel;
      item.expensive = is_expensive(g, node);
      items_.push_back(item);
    }
  }
  initial_uses_.assign(static_cast<size_t>(num_slots_), 0);
  std::vector<std::vector<int32_t>> consumers(items_.size());
  for (size_t i = 0; i < items_.size(); ++i) {
    Item& item = items_[i];
    const Node& node = g.node(item.node);
    item.first_input = static_cast<int32_t>(input_slots_.size());
    item.num_inputs = static_cast<int32_t>(node.inputs.size());
    std::vector<int32_t> producers;
    for (const ValueRef& in : node.inputs) {
      const int32_t slot = first_slot.at(static_cast<size_t>(in.node)) + in.output;
      input_slots_.push_back(slot);
      ++initial_uses_[static_cast<size_t>(slot)];
      if (item_of[static_cast<size_t>(in.node)] >= 0) producers.push_back(item_of[static_cast<size_t>(in.node)]);
    }
    for (int32_t c : node.control_inputs) {
      if (item_of.at(static_cast<size_t>(c)) >= 0) producers.push_back(item_of[static_cast<size_t>(c)]);
    }
    std::sort(producers.begin(), producers.end());
    producers.erase(std::unique(producers.begin(), producers.end()), producers.end());
    item.initial_pending = static_cast<int32_t>(producers.size());
    for (int32_t p : producers) consumers[static_cast<size_t>(p)].push_back(static_cast<int32_t>(i));
    if (producers.empty()) initially_ready_.push_back(static_cast<int32_t>(i));
  }
  for (size_t i = 0; i < items_.size(); ++i) {
    items_[i].first_consumer = static_cast<int32_t>(consumers_.size());
    items_[i].num_consumers = static_cast<int32_t>(consumers[i].size());
    consumers_.insert(consumers_.end(), consumers[i].begin(), consumers[i].end());
  }
  for (const ValueRef& out : g.outputs()) {
    const int32_t slot = first_slot.at(static_cast<size_t>(out.node)) + out.output;
    output_slots_.push_back(slot);
    output_is_constant_.push_back(g.node(out.node).kind == NodeKind::constant);
    initial_uses_[static_cast<size_t>(slot)] += 1 << 20;  // outputs outlive the step
  }
  // Overlap pays only when two big nodes are independent (neither waits for the other); a chain of
  // big nodes runs faster sequentially, each split over every thread.
  // A plan wholly on GPUs gains nothing from host threads: its kernels queue on the device's one
  // compute stream in issue order (and only a sequential plan can be recorded as a CUDA Graph).
  const bool on_gpus = !items_.empty() && std::all_of(items_.begin(), items_.end(), [&](const Item& item) {
    return g.node(item.node).device.kind() == DeviceKind::cuda;
  });
  concurrent_ = forced_mode() == 2 ||
                (forced_mode() == 0 && !on_gpus && thread_budget() > 1 && has_independent_expensive_items());
  dataflow_ = concurrent_ || has_async_ || in_group;
}

bool Plan::has_independent_expensive_items() const {
  // Which of the first 64 expensive items each item waits for, directly or not (items are in
  // topological order, so one forward pass propagates it).
  std::vector<uint64_t> waits_for(items_.size(), 0);
  std::vector<int> bit(items_.size(), -1);
  int expensive = 0;
  for (size_t i = 0; i < items_.size(); ++i) {
    if (items_[i].expensive) {
      if (expensive == 64) return true;  // too many to track: assume some overlap
      bit[i] = expensive++;
    }
  }
  for (size_t i = 0; i < items_.size(); ++i) {
    const Item& item = items_[i];
    const uint64_t mine = waits_for[i] | (bit[i] >= 0 ? uint64_t{1} << bit[i] : 0);
    for (int32_t k = 0; k < item.num_consumers; ++k) {
      waits_for[static_cast<size_t>(consumers_[static_cast<size_t>(item.first_consumer + k)])] |= mine;
    }
  }
  // Two expensive items are dependent when one's bit is in the other's ancestors. Since items are
  // in topological order, item j can only wait for earlier items.
  for (size_t j = 0; j < items_.size(); ++j) {
    if (bit[j] < 0) continue;
    const uint64_t earlier = (uint64_t{1} << bit[j]) - 1;  // expensive items before j
    if ((waits_for[j] & earlier) != earlier) return true;  // some earlier big item is not an ancestor
  }
  return false;
}

bool Plan::run_item(Step& step, int32_t index) const {
  const Item& item = items_[static_cast<size_t>(index)];
  if (step.shared.cancellation.cancelled()) {
    complete_item(step, index, -1);
    return true;
  }
  const int64_t start = step.shared.stats ? now_ns() : 0;
  const Node& node = graph_->node(item.node);
  try {
    std::array<Tensor, 8> small_inputs;
    std::vector<Tensor> large_inputs;
    std::span<Tensor> inputs;
    if (item.num_inputs <= 8) {
      inputs = std::span<Tensor>(small_inputs.data(), static_cast<size_t>(item.num_inputs));
    } else {
      large_inputs.resize(static_cast<size_t>(item.num_inputs));
      inputs = large_inputs;
    }
    for (int32_t k = 0; k < item.num_inputs; ++k) {
      inputs[static_cast<size_t>(k)] = step.values[static_cast<size_t>(input_slots_[static_cast<size_t>(item.first_input + k)])];
    }
    const OpCall call{*item.op, inputs, item.attributes, &step.shared.context};
    if (item.async_kernel) {
      if (step.shared.stats) step.async_start[static_cast<size_t>(index)] = start;
      step.async_state[static_cast<size_t>(index)].store(0, std::memory_order_relaxed);
      item.async_kernel(call,
                        std::span<Tensor>(step.values.data() + item.first_output, static_cast<size_t>(item.num_outputs)),
                        AsyncDone{&Plan::async_done, &step.tasks[static_cast<size_t>(index)]});
      // Whichever of this thread and the completion comes second goes on with the item.
      if (step.async_state[static_cast<size_t>(index)].fetch_add(1, std::memory_order_acq_rel) == 0) return false;
      complete_item(step, index, start);
      return true;
    }
    std::array<Tensor, kMaxOutputs> outputs;
    if (item.allocate && item.num_outputs > 0) {
      if (dynamic_shapes_) {
        OutputSpec spec;
        spec.device = node.device;
        item.op->infer(call, spec);
        for (int32_t k = 0; k < item.num_outputs; ++k) {
          outputs[static_cast<size_t>(k)] = Tensor::empty(spec.outputs[static_cast<size_t>(k)].shape,
                                                          spec.outputs[static_cast<size_t>(k)].dtype, node.device);
        }
      } else {
        for (int32_t k = 0; k < item.num_outputs; ++k) {
          const TensorMeta& meta = node.outputs[static_cast<size_t>(k)];
          outputs[static_cast<size_t>(k)] = Tensor::empty(meta.shape, meta.dtype, node.device);
        }
      }
    }
    item.kernel(call, std::span<Tensor>(outputs.data(), static_cast<size_t>(item.num_outputs)));
    for (int32_t k = 0; k < item.num_outputs; ++k) {
      step.values[static_cast<size_t>(item.first_output + k)] = std::move(outputs[static_cast<size_t>(k)]);
    }
  } catch (...) {
    // An async kernel that throws has not called (and must not call) its done.
    step.shared.fail(std::current_exception(), node);
  }
  complete_item(step, index, start);
  return true;
}

void Plan::complete_item(Step& step, int32_t index, int64_t start) const {
  const Item& item = items_[static_cast<size_t>(index)];
  if (step.shared.stats && start >= 0) {
    const int64_t end = now_ns();
    const int32_t id = global_ids_.empty() ? item.node : global_ids_[static_cast<size_t>(item.node)];
    std::lock_guard lock(step.shared.mutex);
    step.shared.stats->nodes.push_back({id, start - step.shared.start_ns, end - step.shared.start_ns, thread_number()});
  }
  // Drop inputs nobody else reads.
  for (int32_t k = 0; k < item.num_inputs; ++k) {
    const auto slot = static_cast<size_t>(input_slots_[static_cast<size_t>(item.first_input + k)]);
    if (step.uses[slot].fetch_sub(1, std::memory_order_acq_rel) == 1) step.values[slot] = Tensor();
  }
}

void Plan::async_done(void* context, std::exception_ptr error) {
  auto* task = static_cast<std::pair<Step*, int32_t>*>(context);
  Step& step = *task->first;
  const Plan& plan = step.plan;
  if (error) step.shared.fail(std::move(error), plan.graph_->node(plan.items_[static_cast<size_t>(task->second)].node));
  if (step.async_state[static_cast<size_t>(task->second)].fetch_add(1, std::memory_order_acq_rel) == 0) {
    return;  // the kernel has not returned yet: run_item goes on with the item
  }
  // The partition continues on a pool thread, not on the thread that delivered (often another
  // device's partition, which has its own work).
  schedule(&Plan::continue_task, context);
}

void Plan::continue_task(void* context) {
  auto* task = static_cast<std::pair<Step*, int32_t>*>(context);
  Step& step = *task->first;
  const Plan& plan = step.plan;
  const int32_t index = task->second;
  plan.complete_item(step, index, step.shared.stats ? step.async_start[static_cast<size_t>(index)] : -1);
  std::vector<int32_t> ready;
  plan.finish_item(step, index, ready);
  plan.drain(step, ready);
}

void Plan::run_sequential(Step& step) const {
  for (int32_t i = 0; i < static_cast<int32_t>(items_.size()); ++i) run_item(step, i);
}

void Plan::run_items(Step& step, int32_t begin, int32_t end) const {
  if (dataflow_) fail<InvalidArgument>("internal: run_items needs a sequential plan");
  CaptureRecorder* recorder = capture_recorder;
  for (int32_t i = begin; i < end; ++i) {
    if (recorder) recorder->node = &item_node(i);
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

void Plan::drain(Step& step, std::vector<int32_t>& ready) const {
  while (!ready.empty()) {
    // Cheap nodes before expensive ones: a Send (or a small node feeding one) may be what another
    // partition or thread waits for, and holding it back behind a long chain of big nodes would
    // serialize the devices.
    size_t pick = ready.size() - 1;
    if (items_[static_cast<size_t>(ready[pick])].expensive) {
      for (size_t k = pick; k-- > 0;) {
        if (!items_[static_cast<size_t>(ready[k])].expensive) {
          pick = k;
          break;
        }
      }
    }
    const int32_t index = ready[pick];
    ready.erase(ready.begin() + static_cast<std::ptrdiff_t>(pick));
    if (run_item(step, index)) finish_item(step, index, ready);
  }
}

void Plan::finish_item(Step& step, int32_t index, std::vector<int32_t>& ready) const {
  const Item& item = items_[static_cast<size_t>(index)];
  bool kept_expensive = false;
  for (int32_t k = 0; k < item.num_consumers; ++k) {
    const int32_t c = consumers_[static_cast<size_t>(item.first_consumer + k)];
    if (step.pending[static_cast<size_t>(c)].fetch_sub(1, std::memory_order_acq_rel) != 1) continue;
    step.outstanding.fetch_add(1, std::memory_order_relaxed);
    const Item& next = items_[static_cast<size_t>(c)];
    if (!concurrent_ || !next.expensive || (!kept_expensive && ready.empty())) {
      kept_expensive |= next.expensive;
      ready.push_back(c);  // run on this thread
    } else {
      step.tasks[static_cast<size_t>(c)] = {&step, c};
      schedule(&Plan::run_task, &step.tasks[static_cast<size_t>(c)]);
    }
  }
  // The last item of the partition: from here on only the shared state is touched.
  if (step.outstanding.fetch_sub(1, std::memory_order_acq_rel) == 1) step.shared.partition_finished();
}

void Plan::run_task(void* context) {
  auto* task = static_cast<std::pair<Step*, int32_t>*>(context);
  std::vector<int32_t> ready{task->second};
  task->first->plan.drain(*task->first, ready);
}

void Plan::StepDeleter::operator()(Step* step) const { delete step; }

Plan::StepPtr Plan::make_step(StepShared& shared, std::span<const Tensor> arguments) const {
  StepPtr step(new Step(*this, shared));
  feed(*step, arguments);
  return step;
}

void Plan::feed(Step& step, std::span<const Tensor> arguments) const {
  if (static_cast<int32_t>(arguments.size()) < num_arguments_) {
    fail<InvalidArgument>("graph: expects {} tensor arguments; got {}", num_arguments_, arguments.size());
  }
  for (size_t s = 0; s < initial_uses_.size(); ++s) step.uses[s].store(initial_uses_[s], std::memory_order_relaxed);
  for (const auto& [index, slot] : argument_slots_) step.values[static_cast<size_t>(slot)] = arguments[static_cast<size_t>(index)];
  for (const auto& [slot, value] : constant_slots_) step.values[static_cast<size_t>(slot)] = value;
  if (!dataflow_) return;
  step.pending = std::make_unique<std::atomic<int32_t>[]>(items_.size());
  for (size_t i = 0; i < items_.size(); ++i) step.pending[i].store(items_[i].initial_pending, std::memory_order_relaxed);
  step.tasks.resize(items_.size());
  for (size_t i = 0; i < items_.size(); ++i) step.tasks[i] = {&step, static_cast<int32_t>(i)};
  if (has_async_) {
    step.async_state = std::make_unique<std::atomic<uint8_t>[]>(items_.size());
    if (step.shared.stats) step.async_start.assign(items_.size(), 0);
  }
}

void Plan::start(Step& step) const {
  // Only dataflow plans start this way: Executable builds every partition of a group in_group.
  if (items_.empty()) {
    step.shared.partition_finished();
    return;
  }
  step.outstanding.store(static_cast<int64_t>(initially_ready_.size()), std::memory_order_relaxed);
  std::vector<int32_t> ready(initially_ready_.rbegin(), initially_ready_.rend());
  drain(step, ready);
}

void Plan::start_task(void* context) {
  auto* step = static_cast<Step*>(context);
  step->plan.start(*step);
}

Tensor Plan::output(Step& step, size_t i) const {
  Tensor value = step.values[static_cast<size_t>(output_slots_.at(i))];
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
  if (dataflow_) {
    start(step);
    shared.wait();
  } else {
    run_sequential(step);
  }
  if (stats) stats->wall_ns = now_ns() - shared.start_ns;
  if (shared.error) rethrow_from_node(shared.error, *shared.error_node);
  return outputs(step);
}

}  // namespace flowlet::detail
