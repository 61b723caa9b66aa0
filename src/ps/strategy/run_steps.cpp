// The steps of a run() shared by the in-process cluster and the processes under mpirun: one
// worker's function with its scopes, goodbyes for stopped workers, seeding values, writing the
// servers' values back, and the counters' totals.
#include "ps/strategy/run_steps.hpp"

#include <algorithm>

#include "collective/transport/process.hpp"
#include "core/check.hpp"
#include "flowlet/collective.hpp"
#include "flowlet/ops/creation.hpp"
#include "flowlet/device_scope.hpp"
#include "flowlet/eager_scope.hpp"
#include "flowlet/ops/shape.hpp"
#include "state/mirrored_variable.hpp"
#include "state/variable_state.hpp"

namespace flowlet::detail::ps {

WorkerOutcome run_worker(StrategyCore& core, WorkerClient& client, int index, Device device, std::atomic<bool>& stop,
                         const WorkerFunction& worker_fn) {
  WorkerOutcome outcome;
  bool stopped = false;
  try {
    client.start();
    const WorkerContext context{&client, &core};
    WorkerScope worker_scope(&context);
    DeviceScope device_scope(device);
    WorkerRuntime runtime(core, client, index, device, stop);
    ::flowlet::ps::Worker worker = runtime.worker();
    worker_fn(worker);
  } catch (const WorkerStopped&) {
    stopped = true;
  } catch (const std::exception& e) {
    outcome.error = std::current_exception();
    outcome.stats.error = e.what();
  } catch (...) {
    outcome.error = std::current_exception();
    outcome.stats.error = "an exception that is not a std::exception";
  }
  try {
    client.finish();  // a stopped client sends nothing
  } catch (const std::exception& e) {
    if (!outcome.error) {
      outcome.error = std::current_exception();
      outcome.stats.error = e.what();
    }
  }
  // A function that caught WorkerStopped itself was stopped all the same.
  stopped = stopped || client.stopped();
  const std::string error = std::move(outcome.stats.error);
  outcome.stats = client.stats();
  outcome.stats.worker = index;
  outcome.stats.error = error;
  outcome.stats.stopped = stopped || outcome.error != nullptr;
  return outcome;
}

void say_goodbye_for(Transport& transport, int num_servers, int worker, int64_t clock) {
  const Bytes goodbye = encode(Message(Goodbye{worker, clock}));
  for (int s = 0; s < num_servers; ++s) transport.send(num_servers + worker, s, goodbye);
}

Variable variable_of(std::shared_ptr<VariableState> state) {
  // Variable has no public constructor from its state; VariableAccess reads the handle's own
  // member, which may be set here because `variable` itself is not const.
  Variable variable;
  const_cast<std::shared_ptr<VariableState>&>(VariableAccess::state(variable)) = std::move(state);
  return variable;
}

std::vector<Tensor> local_values(const std::vector<std::shared_ptr<VariableState>>& states) {
  std::vector<Tensor> values;
  values.reserve(states.size());
  for (const auto& state : states) {
    std::lock_guard lock(state->mutex);
    values.push_back(state->value);
  }
  return values;
}

Tensor joined_value(const VariablePlacement& placement, const std::vector<Tensor>& pieces, const Tensor& local) {
  const Device device = local.device();
  std::vector<Tensor> parts;
  parts.reserve(pieces.size());
  for (size_t i = 0; i < placement.pieces.size(); ++i) {
    const ShardPiece& piece = placement.pieces[i];
    Tensor part = i < pieces.size() ? pieces[i] : Tensor();
    if (!part.defined()) {
      part = placement.shape.rank() == 0 ? local : slice(local, 0, piece.row_begin, piece.rows());
    }
    parts.push_back(part.device() == device ? part : part.to(device));
  }
  if (parts.size() == 1) return parts[0].contiguous();
  return concat(parts, 0);
}

void store_values(const std::vector<std::shared_ptr<VariableState>>& states, const std::vector<Tensor>& values) {
  EagerScope eager;
  for (size_t i = 0; i < states.size(); ++i) {
    Variable variable = variable_of(states[i]);
    variable.assign(values[i]);
  }
}

ParameterServerStats combined_stats(TrainingMode mode, double wall_seconds, std::vector<ServerStats> servers,
                                    std::vector<WorkerStats> workers) {
  std::sort(servers.begin(), servers.end(),
            [](const ServerStats& a, const ServerStats& b) { return a.server < b.server; });
  std::sort(workers.begin(), workers.end(),
            [](const WorkerStats& a, const WorkerStats& b) { return a.worker < b.worker; });
  ParameterServerStats stats;
  stats.mode = mode;
  stats.wall_seconds = wall_seconds;
  for (const ServerStats& s : servers) {
    stats.updates_applied += s.updates_applied;
    stats.updates_dropped += s.updates_dropped;
    stats.max_staleness = std::max(stats.max_staleness, s.max_staleness);
    if (stats.staleness_histogram.size() < s.staleness_histogram.size()) {
      stats.staleness_histogram.resize(s.staleness_histogram.size(), 0);
    }
    for (size_t b = 0; b < s.staleness_histogram.size(); ++b) stats.staleness_histogram[b] += s.staleness_histogram[b];
  }
  stats.servers = std::move(servers);
  stats.workers = std::move(workers);
  return stats;
}

void check_processes_agree(Communicator& communicator, const std::vector<int64_t>& facts, const char* what) {
  std::vector<Tensor> reduced;
  for (ReduceOp op : {ReduceOp::max, ReduceOp::min}) {
    CollectiveCall call;
    call.kind = CollectiveKind::all_reduce;
    call.op = op;
    call.input = tensor_from_host(facts.data(), facts.size(), i64, Shape{static_cast<int64_t>(facts.size())}, Device());
    reduced.push_back(communicator.run(0, std::move(call)));
  }
  if (reduced[0].to_vector<int64_t>() != facts || reduced[1].to_vector<int64_t>() != facts) {
    fail<InvalidArgument>(
        "ParameterServerStrategy: the processes disagree on {} (every process must make its "
        "strategies with the same options, make the same server variables in the same order, and "
        "call run() at the same points); this is process {} of {}",
        what, process_index(), process_count());
  }
}

std::vector<int64_t> option_facts(const ParameterServerOptions& o) {
  FactHash h;
  h.add(o.num_servers).add(o.num_workers).add(o.mode).add(o.backup_workers).add(o.staleness);
  h.add(o.sharding.min_bytes_to_split).add(o.sharding.max_shards).add(o.timeout_seconds);
  for (int p : o.server_processes) h.add(p);
  const StepDelay& d = o.faults.step_delay;
  h.add(d.kind).add(d.seconds).add(d.sigma).add(d.worker).add(d.factor).add(o.faults.seed);
  for (const auto& [worker, step] : o.faults.stop_worker_at_step) h.add(worker).add(step);
  return {o.num_servers, h.value()};
}

std::vector<int64_t> placement_facts(const std::vector<VariablePlacement>& placements) {
  FactHash h;
  for (const VariablePlacement& p : placements) {
    h.add(p.shape.rank()).add(p.dtype);
    for (int64_t d : p.shape) h.add(d);
    for (const ShardPiece& piece : p.pieces) h.add(piece.server).add(piece.row_begin).add(piece.row_end);
  }
  return {static_cast<int64_t>(placements.size()), h.value()};
}

std::exception_ptr first_error(const std::vector<std::exception_ptr>& errors) {
  for (const std::exception_ptr& e : errors) {
    if (e) return e;
  }
  return nullptr;
}

}  // namespace flowlet::detail::ps
