// ParameterServerStrategy: variables live on server tasks, sharded; workers read them, compute
// gradients and push them; the servers' optimizers apply them, asynchronously, in synchronous steps
// (optionally with backup workers) or with bounded staleness (flowlet/ps_options.hpp).
//
//   ParameterServerOptions options;
//   options.num_servers = 2;
//   options.num_workers = 4;                       // in-process: worker threads
//   options.mode = TrainingMode::sync;
//   options.backup_workers = 1;                    // steps complete with the first 3 of 4 pushes
//   ParameterServerStrategy ps(options);
//   nn::Sequential model;
//   { auto scope = ps.scope(); build(model); }    // these variables live on the servers
//   const std::vector<Variable> params = model.parameters();
//   ParameterServerStats stats = ps.run(
//       [] { return std::make_unique<optim::Adam>(1e-3); },  // one optimizer per variable shard
//       [&](ps::Worker& worker) {                             // runs on every worker
//         auto step = trace([&](Tensor x, Tensor y) {
//           GradientTape tape;
//           Tensor loss = mean(softmax_cross_entropy(model(x), y));  // reads pull from the servers
//           worker.apply_gradients(tape.gradient(loss, params), params);  // pushes
//           return loss;
//         });
//         for (int i = 0; i < steps && !worker.should_stop(); ++i) step(x(worker.index(), i), y(...));
//       });
//   std::puts(stats.summary().c_str());
//
// One program, two kinds of cluster, one code path (only the transport differs):
//   - in one process (the default without a launcher): servers and workers are threads, messages
//     move in memory, and FaultInjection can delay steps and messages or stop workers;
//   - under `mpirun -np S+W`: processes options.server_processes serve (default the first S) and
//     the others work, over MPI point-to-point messages on a communicator of the strategy's own.
//     Every process runs the same program: constructs the strategy, makes the same variables in the
//     same order, and calls run() with the same arguments; a server process serves inside run() and
//     never calls the worker function.
//
// Variables made inside scope() are *server variables*. Each is placed by options.sharding: split
// by rows over the servers, or whole on one. Outside run() a server variable is an ordinary local
// variable (reads, assigns and checkpoints work as usual). run() seeds the servers from the local
// values (every process holds the same: same seed, same updates), serves, and at its end copies the
// servers' values back into every process's local variables. Inside run() on a worker:
//   - reading the variable pulls its current value from the servers (one message per shard); in a
//     traced step the pull is an asynchronous graph node;
//   - gather(variable, ids) pulls only the rows of the unique ids, one message per owning server;
//     a tape's gradient for the variable is then the gradient of those pulled rows (shape
//     [ids.numel(), cols], unique rows first, zeros after), which apply_gradients pushes as
//     (ids, rows) so that the servers update only those rows;
//   - Worker::apply_gradients pushes gradients, one message per server; assigning a server variable
//     there is an InvalidArgument (the servers own it while the run lasts).
//
// Optimizers run on the servers: run()'s factory makes one optimizer for every variable shard, so
// its slots live beside the shard and its iterations() count the updates that shard took. Any
// optim::Optimizer works there unchanged, a user's own subclass included. A sparse push updates only
// its rows: the optimizer's update runs on the gathered rows of the shard and of its slots, which are
// then written back (sparse SGD, Adagrad-like and "lazy" Adam: untouched rows and their slots keep
// their values).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "flowlet/core/tensor.hpp"
#include "flowlet/optim.hpp"
#include "flowlet/ps_options.hpp"
#include "flowlet/variable.hpp"

namespace flowlet {

namespace detail::ps {
class StrategyCore;
class WorkerRuntime;
struct StrategyAccess;  // src/ps/strategy/strategy_core.hpp: checkpoints reach the servers through it
}  // namespace detail::ps

namespace ps {

// What a worker function gets: who it is, and the way to push gradients.
class Worker {
 public:
  int index() const;        // 0 .. num_workers() - 1
  int num_workers() const;
  Device device() const;    // where this worker computes (in-process: its logical CPU device)
  int64_t steps() const;    // apply_gradients calls so far in this run

  // Pushes grads[i] for vars[i] (server variables of this strategy; an empty gradient is skipped)
  // to the servers that hold them: one message per server, each with this worker's step count and
  // the version it read. Dense gradients have their variable's shape; a variable read with
  // gather(variable, ids) in this step takes the gradient of its pulled rows. Eagerly it returns
  // once the messages are sent; in a traced step it records one asynchronous node per server.
  // Checks first: InvalidArgument (a variable of no server, counts), ShapeError, DTypeError.
  void apply_gradients(const std::vector<Tensor>& grads, const std::vector<Variable>& vars);

  // True once any worker called request_stop() in this run.
  bool should_stop() const;
  void request_stop();

 private:
  friend class detail::ps::WorkerRuntime;
  explicit Worker(detail::ps::WorkerRuntime* runtime) : runtime_(runtime) {}
  detail::ps::WorkerRuntime* runtime_;
};

}  // namespace ps

class ParameterServerStrategy {
 public:
  // InvalidArgument for inconsistent options (no servers, no workers, backup_workers >= num_workers,
  // negative staleness, server_processes out of range). Under mpirun: collective over the job's
  // processes (every process constructs its strategies in the same order).
  explicit ParameterServerStrategy(ParameterServerOptions options = {});
  ~ParameterServerStrategy();
  ParameterServerStrategy(const ParameterServerStrategy&) = delete;
  ParameterServerStrategy& operator=(const ParameterServerStrategy&) = delete;

  const ParameterServerOptions& options() const;
  int num_servers() const;
  int num_workers() const;
  bool in_process() const;  // the in-process cluster, or processes under mpirun
  // Under mpirun: this process serves (it never runs the worker function). False in-process.
  bool is_server() const;
  // Under mpirun: this process's worker index, or -1 on a server. -1 in-process.
  int worker_index() const;

  // While alive (on this thread), every Variable made is a server variable of this strategy.
  class Scope {
   public:
    ~Scope();
    Scope(Scope&& other) noexcept;
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    Scope& operator=(Scope&&) = delete;

   private:
    friend class ParameterServerStrategy;
    explicit Scope(std::shared_ptr<detail::ps::StrategyCore> core);
    std::shared_ptr<detail::ps::StrategyCore> core_;
    const void* previous_ = nullptr;
    bool active_ = false;
  };
  [[nodiscard]] Scope scope() const;

  // The server variables in creation order, and where each lives: the servers that hold its rows,
  // as {server, first row, end row} (a variable placed whole: one entry with all its rows; rank 0:
  // rows [0, 1)).
  struct Shard {
    int server = 0;
    int64_t row_begin = 0, row_end = 0;
  };
  std::vector<Variable> variables() const;
  std::vector<Shard> placement(const Variable& variable) const;  // InvalidArgument for another's

  using OptimizerFactory = std::function<std::unique_ptr<optim::Optimizer>()>;
  // Seeds the servers, runs worker_fn on every worker (in-process: one thread each, concurrently),
  // serves until every worker has finished, copies the servers' values into the local variables and
  // returns the run's counters (also kept: last_stats()). Optimizer state stays on the servers
  // between runs. A worker that throws is recorded (WorkerStats::error) and said goodbye for; when
  // any worker failed for a reason other than an injected stop, run() rethrows the first such
  // error after every worker finished (the servers' values are still copied back). Under mpirun:
  // collective over the job's processes.
  ParameterServerStats run(const OptimizerFactory& make_optimizer, const std::function<void(ps::Worker&)>& worker_fn);

  const ParameterServerStats& last_stats() const;

  // The optimizers of one server variable's shards after a run (in placement order), to inspect or
  // checkpoint their slots. In-process only (under mpirun they live in the server processes);
  // empty before the first run.
  std::vector<const optim::Optimizer*> optimizers(const Variable& variable) const;

 private:
  friend struct detail::ps::StrategyAccess;
  std::shared_ptr<detail::ps::StrategyCore> core_;
};

}  // namespace flowlet
