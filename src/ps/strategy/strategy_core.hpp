// The state behind a ParameterServerStrategy (flowlet/parameter_server.hpp): its checked options,
// the kind of cluster and this process's role in it, the server variables and how the strategy's
// scope makes them, the transport, the shard servers kept between runs (so optimizer state
// persists), and the last run's counters. run() itself lives in in_process_run.cpp (threads) and
// process_run.cpp (mpirun); what both do for one worker and at the end of a run is in run_steps.*.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collective/communicator.hpp"
#include "flowlet/parameter_server.hpp"
#include "ps/ops/server_variables.hpp"
#include "ps/server/shard_server.hpp"
#include "ps/transport/transport.hpp"
#include "state/remote_variable.hpp"

namespace flowlet::detail::ps {

using OptimizerFactory = ParameterServerStrategy::OptimizerFactory;
using WorkerFunction = std::function<void(::flowlet::ps::Worker&)>;

// Where this process stands in the strategy's cluster.
struct ClusterRole {
  bool in_process = true;
  // Under mpirun: the server this process is (or -1), the worker it is (or -1), and which process
  // hosts each endpoint (servers first, then workers, as in transport.hpp).
  int server = -1;
  int worker = -1;
  std::vector<int> endpoint_process;
};

// The options with every default resolved (num_workers under mpirun, the timeout, server_processes,
// the devices), or InvalidArgument / DeviceError naming the field and its value. Reads the job's
// placement (process_index / process_count) and FLOWLET_PS_TIMEOUT.
ParameterServerOptions resolved_options(ParameterServerOptions options);
ClusterRole role_of(const ParameterServerOptions& resolved);

// What the strategy's scope installs on its thread: every variable made becomes a server variable.
class ServerCreation final : public RemoteCreation {
 public:
  explicit ServerCreation(std::shared_ptr<ServerVariables> variables) : variables_(std::move(variables)) {}
  void created(const std::shared_ptr<VariableState>& state) const override { variables_->add(variables_, state); }

 private:
  std::shared_ptr<ServerVariables> variables_;
};

// Optimizer state that a checkpoint restored before this process's servers had their optimizers
// (src/ps/checkpoint/): run() checks it against the factory's optimizer before anything starts
// (check() throws InvalidArgument, and the run does not start), installs it into each of this
// process's servers once seeded (their optimizers made), then forgets it.
class PendingOptimizerState {
 public:
  virtual ~PendingOptimizerState() = default;
  virtual void check(const optim::Optimizer& made) const = 0;
  virtual void install(ShardServer& server, int index) const = 0;  // server `index` of the job
};

class StrategyCore {
 public:
  explicit StrategyCore(ParameterServerOptions options);
  ~StrategyCore();
  StrategyCore(const StrategyCore&) = delete;
  StrategyCore& operator=(const StrategyCore&) = delete;

  ParameterServerStats run(const OptimizerFactory& make_optimizer, const WorkerFunction& worker_fn);

  // The server variables' placement as the strategy's API reports it; InvalidArgument for a
  // variable that is not one of this strategy's.
  std::vector<ParameterServerStrategy::Shard> placement(const Variable& variable) const;
  std::vector<const optim::Optimizer*> optimizers(const Variable& variable) const;
  const ParameterServerStats& last_stats() const { return last_stats_; }  // written by run() only

  // What the servers call for every new variable piece: the factory of the run in progress.
  std::unique_ptr<optim::Optimizer> make_optimizer();

  // For checkpoints (src/ps/checkpoint/), which work between runs only. between_runs() holds off
  // run() while the caller holds the lock; inside a run (a worker function, or another thread while
  // run() is in progress) it throws InvalidArgument naming `function` and the strategy.
  [[nodiscard]] std::unique_lock<std::mutex> between_runs(const char* function) const;
  bool servers_made() const { return served_; }  // the first run() made this process's servers
  // This process's server `index` (null where another process serves it or none is made yet).
  ShardServer* server(int index) const;
  // The optimizer of the last run()'s factory, by name and slot names ("" and none before a run).
  const std::string& optimizer_name() const { return optimizer_name_; }
  const std::vector<std::string>& optimizer_slots() const { return optimizer_slots_; }
  // Set by a restore (under between_runs); run() checks, installs and clears it.
  std::shared_ptr<const PendingOptimizerState> pending_optimizer_state;

  const ParameterServerOptions options;  // resolved (see resolved_options)
  const ClusterRole role;
  const std::chrono::duration<double> timeout;
  const std::shared_ptr<ServerVariables> variables;
  const ServerCreation creation;

 private:
  ParameterServerStats run_in_process(const WorkerFunction& worker_fn);
  ParameterServerStats run_processes(const WorkerFunction& worker_fn);
  // Checks the variables against the servers made at the first run (made now if there are none):
  // servers know the variables they were made with, so a variable made after the first run cannot
  // be served (InvalidArgument).
  void prepare_servers(const std::vector<VariablePlacement>& placements);
  ServerConfig server_config(int server) const;
  WorkerConfig worker_config(int worker) const;
  int32_t id_of(const Variable& variable, const char* function) const;
  // After this process's servers were seeded: the pending optimizer state into them, then cleared.
  void install_pending_optimizer_state();

  // Declared before the servers, which refer to it, so that it outlives them.
  std::unique_ptr<Transport> transport_;
  // In-process: every server; under mpirun: this process's server at its index (others null).
  std::vector<std::unique_ptr<ShardServer>> servers_;
  bool served_ = false;          // the first run() made the servers (here: this process's, if any)
  size_t served_variables_ = 0;  // how many variables they were made with
  // Under mpirun: the start barrier, the final values and the counters go over `collectives_` (the
  // collective timeout); `end_` only carries the barrier after the workers finished, which waits
  // as long as the slowest worker trains, so its timeout is practically unlimited.
  std::shared_ptr<Communicator> collectives_, end_;

  mutable std::mutex run_mutex_;  // one run() at a time
  std::mutex factory_mutex_;
  const OptimizerFactory* factory_ = nullptr;  // during a run
  ParameterServerStats last_stats_;
  std::string optimizer_name_;
  std::vector<std::string> optimizer_slots_;
};

// What src/ps/checkpoint/ reaches a strategy's core through (a friend of ParameterServerStrategy).
struct StrategyAccess {
  static const std::shared_ptr<StrategyCore>& core(const ParameterServerStrategy& strategy) { return strategy.core_; }
};

// What a ps::Worker forwards to: one worker's client, index and device, and the run's stop flag.
class WorkerRuntime {
 public:
  WorkerRuntime(StrategyCore& core, WorkerClient& client, int index, Device device, std::atomic<bool>& stop)
      : core_(core), client_(client), index_(index), device_(device), stop_(stop) {}

  ::flowlet::ps::Worker worker() { return ::flowlet::ps::Worker(this); }

  int index() const { return index_; }
  int num_workers() const { return core_.options.num_workers; }
  Device device() const { return device_; }
  int64_t steps() const { return client_.steps(); }
  void apply_gradients(const std::vector<Tensor>& grads, const std::vector<Variable>& vars);
  bool should_stop() const { return stop_.load(std::memory_order_acquire); }
  void request_stop() { stop_.store(true, std::memory_order_release); }

 private:
  StrategyCore& core_;
  WorkerClient& client_;
  int index_;
  Device device_;
  std::atomic<bool>& stop_;
};

}  // namespace flowlet::detail::ps
