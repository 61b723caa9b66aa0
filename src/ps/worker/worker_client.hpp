// A worker's side of the parameter-server protocol: pulls (whole variables, or rows), pushes, the
// versions and step counts they carry, the injected faults, and the counters. It knows no op: the
// graph ops (src/ps/ops/) call it from their kernels, eagerly or in a traced step.
//
// Versions and clocks, per server s:
//   - clock(s): the steps this worker pushed to s. Every step pushes to every server exactly once
//     (Worker::apply_gradients records one push per server, possibly empty), so after a step all
//     clocks equal steps().
//   - A pull from s carries clock(s) and min_version(s): 0, except in sync mode, where after a push
//     computed from version r the next pull waits for version r + 1.
//   - A push to s carries the version the step read from s: the smallest version of the replies from
//     s since the previous push to s (none: the last version seen from s, 0 at first).
//
// Steps and faults: the first push of a new step (whichever server it goes to) does the step's
// bookkeeping once: a stop injected at this step number throws WorkerStopped (then every later
// call throws it too and finish() sends nothing); otherwise the injected delay is drawn
// (straggler: (factor - 1) x the time since the previous step's delay ended, or since start() for
// the first), the step's time (up to the delay's end) is recorded, and steps() grows by one. The
// delay stands for this worker's computing time, so it delays only this worker's messages and
// holds no shared thread: the push, the step's other pushes and every pull or push issued after
// them while the delay runs wait in an ordered queue, which the client's own timer thread sends
// when the delay ends (the messages to each server keep the order they were issued in). push()
// waits for that on the caller's thread (eagerly: the worker's own thread); push_async() returns
// at once and its `done` runs after the send, on the timer thread (a traced step's ps_push node
// uses it, so the process's thread pool, which every in-process worker shares, never waits for one
// worker's delay). finish() lets the queued messages leave before its Goodbyes; destruction
// without finish() fails the queued pushes with Cancelled.
//
// Timeouts: a pull whose reply has not come within the timeout fails with DeadlineExceeded naming
// the server, the variable and the worker (a watchdog thread checks every pending request). The
// watchdog allows 0.2 s beyond the timeout, so that a server's own deadline error for a pull it
// parked (which names the workers it waits for) arrives first.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <cstdint>
#include <memory>
#include <vector>

#include "flowlet/core/error.hpp"
#include "flowlet/core/tensor.hpp"
#include "flowlet/ps_options.hpp"
#include "ps/sharding.hpp"
#include "ps/transport/transport.hpp"

namespace flowlet::detail::ps {

// Thrown by a worker that fault injection stopped (FaultInjection::stop_worker_at_step).
class WorkerStopped : public Cancelled {
 public:
  using Cancelled::Cancelled;
};

struct WorkerConfig {
  int worker = 0;  // its endpoint is num_servers + worker
  int num_servers = 1;
  int num_workers = 1;
  TrainingMode mode = TrainingMode::async;
  std::chrono::duration<double> timeout{300.0};
  Device device;  // where pulled values are put
  FaultInjection faults;
};

// One variable's gradient for a push, in whole-variable terms (the client cuts it per server).
struct VariableGradient {
  int32_t var_id = 0;
  Tensor grad;  // dense: the variable's shape; sparse: [n, row shape...]
  Tensor ids;   // sparse: i64 [n] global row ids, unique except for entries < 0, which are skipped
};

class WorkerClient {
 public:
  using Done = std::function<void(Tensor value, std::exception_ptr error)>;

  WorkerClient(WorkerConfig config, std::vector<VariablePlacement> placements, Transport& transport);
  ~WorkerClient();  // detaches; pending pulls fail with Cancelled
  WorkerClient(const WorkerClient&) = delete;
  WorkerClient& operator=(const WorkerClient&) = delete;

  const WorkerConfig& config() const;
  const VariablePlacement& placement(int32_t var_id) const;  // InvalidArgument when unknown
  const std::vector<VariablePlacement>& placements() const;

  void start();  // attaches to the transport; the step clock starts

  // The whole variable on config().device: one request per piece, the replies concatenated along
  // axis 0 in row order. `done` runs once, on a transport or watchdog thread (or inside this call
  // when it fails at once).
  void pull(int32_t var_id, Done done);
  // Rows `ids` (i64 [n], global row indices, each in [0, rows), unique) of the variable, as
  // [n, row shape...] in the order of `ids`: one request per server owning any of them.
  // OutOfRange (through `done`) for an id out of range.
  void pull_rows(int32_t var_id, const Tensor& ids, Done done);

  // Sends server `server` its part of this step's gradients (rows of dense gradients in its pieces;
  // sparse ids it owns, made local). Returns once the message is handed to the transport. Throws
  // WorkerStopped (see the top), InvalidArgument for a var_id this client does not know.
  void push(int server, const std::vector<VariableGradient>& grads);
  // The same, without waiting: returns at once and calls `done` exactly once, with null once the
  // message is handed to the transport (inside this call when its step has no delay left and
  // nothing waits before it; else on the client's timer thread when the delay ends), or with the
  // error push() would throw. Never throws.
  void push_async(int server, std::vector<VariableGradient> grads, std::function<void(std::exception_ptr)> done);

  // Says goodbye to every server (nothing when stopped) and detaches. Idempotent.
  void finish();

  int64_t steps() const;
  bool stopped() const;
  WorkerStats stats() const;  // steps, step times, stopped, transport counters of its endpoint

  // A number no other client of this process has had: a graph node holding a client pointer checks
  // with alive() that the client is still the one it was traced with (not a later one at the same
  // address), and refuses to run otherwise.
  uint64_t serial() const;
  static bool alive(const WorkerClient* client, uint64_t serial);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The worker a thread is running, if any: set by ParameterServerStrategy::run around a worker
// function (in-process: on each worker thread; under mpirun: on the thread that calls run()).
struct WorkerContext {
  WorkerClient* client = nullptr;
  const void* strategy = nullptr;  // identity of the strategy's core
};
const WorkerContext* current_worker();
class WorkerScope {
 public:
  explicit WorkerScope(const WorkerContext* context);
  ~WorkerScope();
  WorkerScope(const WorkerScope&) = delete;
  WorkerScope& operator=(const WorkerScope&) = delete;

 private:
  const WorkerContext* previous_;
};

}  // namespace flowlet::detail::ps
