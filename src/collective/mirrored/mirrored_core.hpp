// The state behind a MirroredStrategy (flowlet/mirrored.hpp): its replicas, communicator, replica
// threads, the traces of the functions run() was given, and its mirrored variables.
#pragma once

#include <atomic>
#include <list>
#include <memory>
#include <mutex>
#include <vector>

#include "collective/communicator.hpp"
#include "collective/mirrored/replica_threads.hpp"
#include "collective/replica_context.hpp"
#include "flowlet/mirrored.hpp"
#include "state/mirrored_variable.hpp"

namespace flowlet::detail {

// One function run() was given: a traced core per local replica (a replica's trace records its own
// copies of the mirrored variables and its own participant in the collectives).
struct MirroredFunction {
  FunctionKey key;
  std::vector<std::shared_ptr<TracedCore>> replicas;
};

class MirroredCore {
 public:
  MirroredCore(std::vector<Device> devices, MirroredOptions options);

  int local_size() const { return static_cast<int>(devices.size()); }
  int size() const { return communicator->size(); }

  // The traces of `key`'s function, made on its first run (most recently used kept first).
  MirroredFunction& function(const FunctionKey& key);
  // Global replica 0's `initial` on every local device (a broadcast when there are several processes).
  std::vector<Tensor> initial_copies(const Tensor& initial, const std::string& name);
  // The mirrored variables still alive, in creation order.
  std::vector<std::shared_ptr<VariableState>> live_variables();
  void check_replicas_equal();
  // After a run() in which a replica failed: a process's replicas get a new communicator (their
  // calls may be out of step) and trace again; in a job of several processes the strategy refuses
  // further runs instead (broken()).
  void recover_from_failed_step();
  // Forgets every function's traces (the next run() traces again).
  void drop_traces();
  bool broken() const { return broken_; }

  std::vector<Device> devices;
  MirroredOptions options;
  std::shared_ptr<Communicator> communicator;
  std::vector<ReplicaContext> contexts;  // contexts[l]: local replica l
  MirrorPolicy policy;

  std::mutex run_mutex;    // one run() at a time
  std::mutex trace_mutex;  // replicas trace one after another (fn's C++ code need not be thread-safe)
  std::list<MirroredFunction> functions;
  MirroredFunction* last_function = nullptr;
  // Mirrored variables made so far (in scope(), and optimizer state mirrored with them), and the
  // count when the traces were made: a new model or optimizer gets new traces even from a callable
  // whose bytes repeat (a new step lambda at the old one's address, capturing a new model at the
  // old one's address). The first step's trace makes the optimizer's slots, so the second traces
  // once more.
  std::atomic<uint64_t> variables_made{0};
  uint64_t variables_traced = 0;
  std::vector<const Graph*> last_graphs;  // per local replica: the graph its last run() ran
  std::unique_ptr<ReplicaThreads> threads;

 private:
  void connect();  // a new communicator and replica contexts

  bool broken_ = false;
  bool warned_retracing_ = false;
  std::mutex variables_mutex_;
  std::vector<std::weak_ptr<VariableState>> variables_;
  friend class ::flowlet::MirroredStrategy;
};

}  // namespace flowlet::detail
