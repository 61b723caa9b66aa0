// MirroredStrategy: construction, scope(), and run()'s non-template core.
#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <optional>

#include "collective/mirrored/batch_split.hpp"
#include "collective/mirrored/mirrored_core.hpp"
#include "collective/mirrored/replica_step.hpp"
#include "core/check.hpp"
#include "flowlet/collective.hpp"
#include "flowlet/device_scope.hpp"
#include "flowlet/eager_scope.hpp"
#include "flowlet/mirrored.hpp"
#include "flowlet/ops/elementwise.hpp"
#include "flowlet/ops/shape.hpp"

namespace flowlet {

namespace detail {

namespace {

// Beyond this many functions (different types, or one lambda with changing captured values) the
// least recently used one's traces are dropped.
constexpr size_t kMaxFunctions = 16;
// Warn (once) when this many traced functions share one callable type: its captured values change.
constexpr long kRetraceWarningAfter = 4;

Device default_replica_device() {
  if (device_count(DeviceKind::cuda) > 0) return Device(DeviceKind::cuda, local_process_index());
  return Device(DeviceKind::cpu, 0);
}

std::vector<Device> checked_devices(std::vector<Device> devices) {
  if (devices.empty()) devices.push_back(default_replica_device());
  for (size_t i = 0; i < devices.size(); ++i) {
    check_device_exists("MirroredStrategy", devices[i]);
    if (devices[i].kind() != devices[0].kind()) {
      fail<DeviceError>("MirroredStrategy: replica devices must all be CPU devices or all GPUs; got {} and {}",
                        devices[0], devices[i]);
    }
    for (size_t j = 0; j < i; ++j) {
      if (devices[j] == devices[i]) {
        fail<InvalidArgument>("MirroredStrategy: replica devices must be distinct; got {} twice (positions {} and {})",
                              devices[i], j, i);
      }
    }
  }
  return devices;
}

MirroredOptions checked_options(MirroredOptions options) {
  if (options.bucket_bytes <= 0) {
    fail<InvalidArgument>("MirroredStrategy: bucket_bytes must be > 0; got {}", options.bucket_bytes);
  }
  if (!std::isfinite(options.collective_timeout_seconds)) {
    fail<InvalidArgument>("MirroredStrategy: collective_timeout_seconds must be finite; got {}",
                          options.collective_timeout_seconds);
  }
  return options;
}

// Waits for the results of collectives started on several local participants.
class Pending {
 public:
  explicit Pending(size_t count) : results_(count), errors_(count), remaining_(count) {}

  CollectiveDone done(size_t index) {
    return [this, index](Tensor result, std::exception_ptr error) {
      std::lock_guard lock(mutex_);
      results_[index] = std::move(result);
      errors_[index] = std::move(error);  // no copy left on the communicator's thread
      if (--remaining_ == 0) finished_.notify_all();
    };
  }
  // The communicator calls every `done` (a peer that never comes fails by its timeout).
  std::vector<Tensor> wait() {
    std::unique_lock lock(mutex_);
    finished_.wait(lock, [&] { return remaining_ == 0; });
    for (const std::exception_ptr& e : errors_) {
      if (e) std::rethrow_exception(e);
    }
    return std::move(results_);
  }

 private:
  std::mutex mutex_;
  std::condition_variable finished_;
  std::vector<Tensor> results_;
  std::vector<std::exception_ptr> errors_;
  size_t remaining_;
};

// A private copy of `t` on `device` (never sharing storage with `t`: the copies change independently).
Tensor private_copy(const Tensor& t, Device device) {
  return device == t.device() ? cast(t, t.dtype()) : t.to(device);
}

// The error run() reports: the first replica's that is neither a timeout nor a Cancelled (a replica
// that fails aborts its peers' collectives, or across processes makes them time out), else the first.
std::exception_ptr first_cause(const std::vector<std::exception_ptr>& errors) {
  std::exception_ptr first;
  for (const std::exception_ptr& e : errors) {
    if (!e) continue;
    if (!first) first = e;
    try {
      std::rethrow_exception(e);
    } catch (const DeadlineExceeded&) {
    } catch (const Cancelled&) {
    } catch (...) {
      return e;
    }
  }
  return first;
}

}  // namespace

MirroredCore::MirroredCore(std::vector<Device> local_devices, MirroredOptions opts)
    : devices(checked_devices(std::move(local_devices))), options(checked_options(std::move(opts))) {
  connect();
  threads = std::make_unique<ReplicaThreads>(local_size());
}

void MirroredCore::connect() {
  CommunicatorOptions communicator_options;
  communicator_options.timeout_seconds = options.collective_timeout_seconds;
  communicator = make_communicator(devices, communicator_options);
  contexts.clear();
  for (int l = 0; l < local_size(); ++l) contexts.push_back(ReplicaContext{communicator, l, this});
}

void MirroredCore::recover_from_failed_step() {
  if (communicator->processes() > 1) {
    // The other processes' replicas went on numbering their calls; only all of them together could
    // start a new communicator.
    broken_ = true;
    return;
  }
  // The replicas' collective calls may be out of step (a replica failed before a collective its
  // peers made): a new communicator starts them all from call 0, and the traces, which name the old
  // one in their collective nodes, are made again on the next run().
  drop_traces();
  connect();
}

void MirroredCore::drop_traces() {
  last_function = nullptr;
  last_graphs.assign(last_graphs.size(), nullptr);
  functions.clear();
}

MirroredFunction& MirroredCore::function(const FunctionKey& key) {
  for (auto it = functions.begin(); it != functions.end(); ++it) {
    if (it->key == key) {
      functions.splice(functions.begin(), functions, it);
      return functions.front();
    }
  }
  const auto same_type = std::count_if(functions.begin(), functions.end(),
                                       [&](const MirroredFunction& f) { return *f.key.type == *key.type; });
  if (same_type >= kRetraceWarningAfter && !warned_retracing_) {
    warned_retracing_ = true;
    fmt::print(stderr,
               "flowlet warning: MirroredStrategy::run: a callable of type {} came with {} different captured values, "
               "and each is traced anew; capture what changes between steps by reference\n",
               key.type->name(), same_type + 1);
  }
  MirroredFunction created{key, {}};
  for (int l = 0; l < local_size(); ++l) {
    TraceOptions trace_options = options.trace_options;
    trace_options.name = fmt::format("{} (replica {} on {})",
                                     trace_options.name == TraceOptions{}.name ? "MirroredStrategy::run"
                                                                               : trace_options.name,
                                     communicator->rank_of(l), devices[static_cast<size_t>(l)]);
    created.replicas.push_back(make_traced_core(std::move(trace_options)));
  }
  functions.push_front(std::move(created));
  if (functions.size() > kMaxFunctions) {
    if (last_function == &functions.back()) last_function = nullptr;
    functions.pop_back();
  }
  return functions.front();
}

std::vector<Tensor> MirroredCore::initial_copies(const Tensor& initial, const std::string& name) {
  std::vector<Tensor> copies;
  for (const Device& d : devices) copies.push_back(private_copy(initial, d));
  if (communicator->processes() == 1) return copies;
  // Global replica 0's value everywhere: one broadcast, every local participant taking part.
  Pending pending(copies.size());
  for (size_t l = 0; l < copies.size(); ++l) {
    CollectiveCall call;
    call.kind = CollectiveKind::broadcast;
    call.root = 0;
    call.input = copies[l].contiguous();
    try {
      communicator->start(static_cast<int>(l), std::move(call), pending.done(l));
    } catch (...) {
      // The calls not started complete with this error, so that the wait below ends (the started
      // ones end by themselves, at the latest by the timeout).
      for (size_t rest = l; rest < copies.size(); ++rest) pending.done(rest)(Tensor(), std::current_exception());
      break;
    }
  }
  try {
    return pending.wait();
  } catch (const DeadlineExceeded&) {
    throw;  // names the collective and the ranks that did not come
  } catch (const Error& e) {
    fail<InvalidArgument>("MirroredStrategy: creating mirrored variable '{}' broadcasts its initial value from "
                          "replica 0, which failed (every process must create its mirrored variables in the same "
                          "order, with the same shapes and dtypes): {}",
                          name, e.what());
  }
}

std::vector<std::shared_ptr<VariableState>> MirroredCore::live_variables() {
  std::lock_guard lock(variables_mutex_);
  std::vector<std::shared_ptr<VariableState>> live;
  std::erase_if(variables_, [&](const std::weak_ptr<VariableState>& weak) {
    auto state = weak.lock();
    if (!state) return true;
    live.push_back(std::move(state));
    return false;
  });
  return live;
}

std::vector<std::vector<Tensor>> run_mirrored(MirroredCore& core, const FunctionKey& key, TraceBody body,
                                              std::span<const Tensor> batches) {
  if (is_tracing()) {
    fail<InvalidArgument>("MirroredStrategy::run: called while a function is being traced; call run() from "
                          "eager code (fn itself is traced per replica)");
  }
  if (const ReplicaContext* replica = current_replica(); replica != nullptr) {
    fail<InvalidArgument>("MirroredStrategy::run: called inside another run() (replica {})", replica->local);
  }
  for (size_t i = 0; i < batches.size(); ++i) {
    const Tensor& b = batches[i];
    if (!b.defined()) fail<InvalidArgument>("MirroredStrategy::run: batch {} is an empty Tensor handle", i);
    if (b.is_symbolic()) fail<InvalidArgument>("MirroredStrategy::run: batch {} is a symbolic tensor", i);
    if (b.rank() == 0) {
      fail<ShapeError>("MirroredStrategy::run: batch {} must have a batch axis to split over the replicas; got a "
                       "scalar {}",
                       i, b.dtype());
    }
    if (b.shape()[0] != batches[0].shape()[0]) {
      fail<ShapeError>("MirroredStrategy::run: every batch must have the same number of rows (axis 0); got {} for "
                       "batch 0 and {} for batch {}",
                       batches[0].shape(), b.shape(), i);
    }
  }
  std::lock_guard run_lock(core.run_mutex);
  if (core.broken()) {
    fail<InvalidArgument>("MirroredStrategy::run: an earlier run() failed in a job of {} processes, which leaves "
                          "the replicas' collectives out of step; end the job (or restart it from a checkpoint)",
                          core.communicator->processes());
  }
  if (const uint64_t made = core.variables_made; made != core.variables_traced) {
    // New mirrored variables (a new model, most likely): the traces captured the old ones.
    core.drop_traces();
    core.variables_traced = made;
  }
  MirroredFunction& function = core.function(key);
  core.last_function = &function;
  core.last_graphs.assign(static_cast<size_t>(core.local_size()), nullptr);
  const int local_size = core.local_size();
  const int replicas = core.size();
  const int64_t global_rows = batches.empty() ? 0 : batches[0].shape()[0];

  std::vector<std::vector<Tensor>> outputs(static_cast<size_t>(local_size));
  // Every local replica traces (one at a time) before any runs: a trace that fails stops them all
  // here instead of leaving the others waiting in a collective.
  std::mutex barrier_mutex;
  std::condition_variable barrier;
  int traced = 0;
  bool trace_failed = false;

  auto replica_step = [&](int l) {
    const size_t local = static_cast<size_t>(l);
    const Device device = core.devices[local];
    const RowShare share = row_share(global_rows, replicas, core.communicator->rank_of(l));
    // Without batches every replica weighs the same.
    const ReplicaStep step{&core, batches.empty() ? 1 : share.rows, batches.empty() ? replicas : global_rows,
                           core.options.bucket_bytes};
    ReplicaScope replica(&core.contexts[local]);
    ReplicaStepScope step_scope(&step);
    std::optional<DeviceScope> on_device;
    std::vector<ArgSignature> signature;
    std::vector<Tensor> tensors;
    TracedCore& traced_core = *function.replicas[local];
    // Everything before the barrier is caught: a replica that throws here must still arrive there.
    std::exception_ptr prepare_error;
    try {
      std::vector<Tensor> slices;
      slices.reserve(batches.size());
      for (const Tensor& b : batches) {
        Tensor part = share.rows == b.shape()[0] ? b : slice(b, 0, share.start, share.rows);
        slices.push_back(part.device() == device ? part : part.to(device));
      }
      on_device.emplace(device);
      for (const Tensor& s : slices) describe_argument(s, signature, tensors);
      // The share is baked into the trace (the gradient weight rows / B): a new share is a new trace.
      ArgSignature share_entry;
      share_entry.value = fmt::format("replica rows {} of {}", step.rows, step.global_rows);
      signature.push_back(std::move(share_entry));
      describe_device_scope(signature);
      std::lock_guard trace_lock(core.trace_mutex);
      core.last_graphs[local] = &traced_graph(traced_core, signature, tensors, body);
    } catch (...) {
      prepare_error = std::current_exception();
    }
    {
      std::unique_lock lock(barrier_mutex);
      if (prepare_error) trace_failed = true;
      if (++traced == local_size) barrier.notify_all();
      // Each replica reaches this point by itself (tracing waits for no peer).
      barrier.wait(lock, [&] { return traced == local_size; });
    }
    if (prepare_error) std::rethrow_exception(prepare_error);
    if (trace_failed) return;  // another replica's trace failed: it reports the error
    try {
      outputs[local] = call_traced(traced_core, signature, tensors, body);
    } catch (const std::exception& e) {
      // This replica will make none of its step's remaining collectives: fail the peers' waiting
      // ones now instead of at the timeout (they report Cancelled; run() reports this error).
      core.communicator->abort(std::make_exception_ptr(Cancelled(fmt::format(
          "MirroredStrategy::run: replica {} ({}) failed, so its collectives will not come: {}",
          core.communicator->rank_of(l), device.str(), e.what()))));
      throw;
    }
  };
  const std::vector<std::exception_ptr> errors = core.threads->run_all(replica_step);
  if (std::exception_ptr error = first_cause(errors)) {
    // A failed trace ran no collective here, but in a job of several processes the other processes'
    // replicas ran theirs and now wait in vain: the job's collectives are out of step either way.
    if (!trace_failed || core.communicator->processes() > 1) core.recover_from_failed_step();
    std::rethrow_exception(error);
  }
  if (core.options.check_replicas_equal) core.check_replicas_equal();
  return outputs;
}

}  // namespace detail

MirroredStrategy::MirroredStrategy(std::vector<Device> local_devices, MirroredOptions options)
    : core_(std::make_shared<detail::MirroredCore>(std::move(local_devices), std::move(options))) {
  detail::MirroredCore& core = *core_;
  const std::weak_ptr<detail::MirroredCore> weak = core_;
  core.policy.strategy = &core;
  core.policy.devices = core.devices;
  core.policy.initial_copies = [&core](const Tensor& initial, const std::string& name) {
    return core.initial_copies(initial, name);  // called only while a Scope, which keeps `core` alive, is active
  };
  core.policy.created = [weak](const std::shared_ptr<detail::VariableState>& state) {
    // Also called for optimizer slots made later (mirror_like), possibly after the strategy ended.
    if (auto alive = weak.lock()) {
      std::lock_guard lock(alive->variables_mutex_);
      alive->variables_.push_back(state);
      ++alive->variables_made;
    }
  };
}

MirroredStrategy::~MirroredStrategy() = default;

int MirroredStrategy::num_replicas() const { return core_->size(); }
int MirroredStrategy::num_local_replicas() const { return core_->local_size(); }
const std::vector<Device>& MirroredStrategy::local_devices() const { return core_->devices; }
const MirroredOptions& MirroredStrategy::options() const { return core_->options; }

MirroredStrategy::Scope MirroredStrategy::scope() const { return Scope(core_, &core_->policy); }

MirroredStrategy::Scope::Scope(std::shared_ptr<const void> core, const void* policy)
    : core_(std::move(core)), active_(true) {
  previous_ = detail::exchange_mirrored_creation(static_cast<const detail::MirrorPolicy*>(policy));
}

MirroredStrategy::Scope::Scope(Scope&& other) noexcept
    : core_(std::move(other.core_)), previous_(other.previous_), active_(other.active_) {
  other.active_ = false;
}

MirroredStrategy::Scope::~Scope() {
  if (active_) detail::exchange_mirrored_creation(static_cast<const detail::MirrorPolicy*>(previous_));
}

void MirroredStrategy::check_replicas_equal() const {
  std::lock_guard run_lock(core_->run_mutex);
  core_->check_replicas_equal();
}

const Graph& MirroredStrategy::graph(int local) const {
  if (local < 0 || local >= core_->local_size()) {
    detail::fail<InvalidArgument>("MirroredStrategy::graph: local replica must be in [0, {}); got {}",
                                  core_->local_size(), local);
  }
  std::lock_guard run_lock(core_->run_mutex);
  const Graph* graph =
      static_cast<size_t>(local) < core_->last_graphs.size() ? core_->last_graphs[static_cast<size_t>(local)] : nullptr;
  if (graph == nullptr) {
    detail::fail<InvalidArgument>("MirroredStrategy::graph: no graph for local replica {}: run() has not run (or "
                                  "its last call failed)",
                                  local);
  }
  return *graph;
}

std::string MirroredStrategy::timeline_json(int local) const {
  if (local < 0 || local >= core_->local_size()) {
    detail::fail<InvalidArgument>("MirroredStrategy::timeline_json: local replica must be in [0, {}); got {}",
                                  core_->local_size(), local);
  }
  std::lock_guard run_lock(core_->run_mutex);
  if (core_->last_function == nullptr) return {};
  return detail::timeline_json(*core_->last_function->replicas[static_cast<size_t>(local)]);
}

}  // namespace flowlet
