// The steps of a run() that both kinds of cluster take: running one worker's function, saying a
// stopped worker's goodbye, reading the local values that seed the servers, writing the servers'
// values back, and adding up the counters.
#pragma once

#include <atomic>
#include <exception>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "ps/strategy/strategy_core.hpp"

namespace flowlet::detail::ps {

// How one worker's run went.
struct WorkerOutcome {
  WorkerStats stats;         // the client's counters, with the worker's index, stopped and error
  std::exception_ptr error;  // what its function threw, unless fault injection stopped it
};

// Runs `worker_fn` as worker `index` on this thread: starts `client`, makes the worker's scopes
// (WorkerScope, so reads of server variables pull; DeviceScope of `device`), calls the function,
// and finishes the client at once (its goodbye lets sync and bounded-staleness servers stop waiting
// for it). Never throws: errors are in the outcome.
WorkerOutcome run_worker(StrategyCore& core, WorkerClient& client, int index, Device device, std::atomic<bool>& stop,
                         const WorkerFunction& worker_fn);

// The goodbye a stopped worker never sent (it stopped as a crashed one would), sent for it from its
// endpoint to every server, so that the servers' runs can end.
void say_goodbye_for(Transport& transport, int num_servers, int worker, int64_t clock);

// A handle to the variable `state` is the state of.
Variable variable_of(std::shared_ptr<VariableState> state);
// Each variable's local value (what the servers are seeded from), in the order given.
std::vector<Tensor> local_values(const std::vector<std::shared_ptr<VariableState>>& states);
// The whole variable from its pieces' values (placement order): concatenated along axis 0 on the
// variable's device. An undefined piece (a server that failed before it had one) leaves the
// variable's local rows there.
Tensor joined_value(const VariablePlacement& placement, const std::vector<Tensor>& pieces, const Tensor& local);
// Assigns values[i] to states[i] (eagerly, outside any worker scope).
void store_values(const std::vector<std::shared_ptr<VariableState>>& states, const std::vector<Tensor>& values);

// The run's counters: per server and per worker (sorted by index) and their totals.
ParameterServerStats combined_stats(TrainingMode mode, double wall_seconds, std::vector<ServerStats> servers,
                                    std::vector<WorkerStats> workers);

// Under mpirun: returns when every process passed the same `facts` (a fixed number of them), and
// throws InvalidArgument on every process otherwise, naming `what` they disagree on. Collective.
void check_processes_agree(Communicator& communicator, const std::vector<int64_t>& facts, const char* what);
// A 64-bit FNV-1a hash, to fold many facts into one.
class FactHash {
 public:
  template <class T>
  requires std::is_trivially_copyable_v<T> FactHash& add(const T& value) {
    const auto* p = reinterpret_cast<const unsigned char*>(&value);
    for (size_t i = 0; i < sizeof(T); ++i) hash_ = (hash_ ^ p[i]) * 1099511628211ull;
    return *this;
  }
  FactHash& add(const std::string& text) {
    add(text.size());
    for (char c : text) add(c);
    return *this;
  }
  int64_t value() const { return static_cast<int64_t>(hash_); }

 private:
  uint64_t hash_ = 14695981039346656037ull;
};
// The facts every process must agree on: its options, and its server variables' placements.
std::vector<int64_t> option_facts(const ParameterServerOptions& options);
std::vector<int64_t> placement_facts(const std::vector<VariablePlacement>& placements);

// The error run() reports: the earliest of `errors` in the order given that is set.
std::exception_ptr first_error(const std::vector<std::exception_ptr>& errors);

}  // namespace flowlet::detail::ps
