// Parameter-server training: the options a ParameterServerStrategy takes and the counters it
// reports (flowlet/parameter_server.hpp has the strategy itself; docs/DISTRIBUTED.md the reference).
// Plain data, so that every layer of the implementation can read it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "flowlet/core/device.hpp"

namespace flowlet {

// How the servers combine the workers' gradients.
enum class TrainingMode : uint8_t {
  // Every push is applied when it arrives. A server's version counts the pushes it applied; an
  // update's staleness is that version at apply time minus the version the worker had read.
  async,
  // Steps: a server's version is the number of steps it completed. Step v takes the first
  // num_workers - backup_workers pushes computed from version v, applies their mean once, and
  // drops every later push computed from v (counted); a worker whose push was dropped goes on from
  // the newest version. Applied updates have staleness 0.
  sync,
  // Stale synchronous parallel: every push is applied when it arrives, but a worker that has pushed
  // c steps waits to read until every live worker has pushed at least c - staleness steps. A server's
  // version is the fewest steps any live worker has pushed to it, so every applied update has
  // staleness <= `staleness`. staleness = 0 is sync without backups (every step waits for everyone).
  bounded_staleness,
};

std::string to_string(TrainingMode mode);

// Which variables are split by rows over the servers and which live whole on one.
struct ShardingPolicy {
  // A variable of rank >= 1 holding at least this many bytes (and at least 2 rows) is split by
  // rows over the servers: server s of S gets rows / S of them (the first rows % S servers one
  // more), in order. Smaller ones are placed whole, round-robin over the servers in creation order.
  int64_t min_bytes_to_split = int64_t{1} << 20;
  // Split over at most this many servers (the first ones); 0: all of them.
  int max_shards = 0;
};

// A worker's extra time per step, to study stragglers (applied before the step's gradients are
// pushed, as if computing them took longer).
struct StepDelay {
  enum class Kind : uint8_t { none, constant, log_normal, straggler };
  Kind kind = Kind::none;
  double seconds = 0;  // constant: every step of every worker; log_normal: the median
  double sigma = 0;    // log_normal: the standard deviation of log(delay)
  int worker = 0;      // straggler: this worker's steps take `factor` times as long as measured
  double factor = 1;

  static StepDelay none() { return {}; }
  static StepDelay constant(double seconds) { return {Kind::constant, seconds, 0, 0, 1}; }
  static StepDelay log_normal(double median_seconds, double sigma) {
    return {Kind::log_normal, median_seconds, sigma, 0, 1};
  }
  static StepDelay straggler(int worker, double factor) { return {Kind::straggler, 0, 0, worker, factor}; }
};

// Faults injected into a run, for experiments and tests. Step delays and stops work in both kinds
// of cluster; message delays only in the in-process one (MPI carries the processes' messages).
struct FaultInjection {
  StepDelay step_delay;
  double message_delay_seconds = 0;  // every message is delivered this much later
  // {worker, k}: the worker stops silently when it would push its k-th step (k >= 1), as a crashed
  // worker would: it sends nothing more, not even a goodbye; its worker function ends there.
  std::vector<std::pair<int, int64_t>> stop_worker_at_step;
  uint64_t seed = 0;  // of the random delays
};

struct ParameterServerOptions {
  int num_servers = 1;
  // The in-process cluster: this many worker threads (>= 1). Under mpirun: every process that does
  // not serve is a worker, and this must be 0 or their number.
  int num_workers = 0;
  TrainingMode mode = TrainingMode::async;
  int backup_workers = 0;  // sync: steps complete with the first num_workers - backup_workers pushes
  int staleness = 0;       // bounded_staleness: k >= 0
  ShardingPolicy sharding;
  // A read (or a sync step) waiting longer than this throws DeadlineExceeded naming the server and
  // the workers it waits for. <= 0: FLOWLET_PS_TIMEOUT, or 300 when unset.
  double timeout_seconds = 0;
  // Which kind of cluster: `automatic` is `processes` when the job has several processes, else
  // `in_process`.
  enum class Cluster : uint8_t { automatic, in_process, processes };
  Cluster cluster = Cluster::automatic;
  // Under mpirun: the process indices that serve (default: 0 .. num_servers - 1). The others work,
  // worker i being the i-th of them in process order.
  std::vector<int> server_processes;
  // In-process: server s runs on server_devices[s] and worker w on worker_devices[w] (CPU devices).
  // Empty: cpu:s and cpu:(num_servers + w) when the process has that many logical CPU devices
  // (set_logical_cpu_devices), else cpu:0 for all.
  std::vector<Device> server_devices;
  std::vector<Device> worker_devices;
  FaultInjection faults;
};

// Counters of one server over one run().
struct ServerStats {
  int server = 0;
  int64_t version = 0;          // at the end of the run
  int64_t updates_applied = 0;  // pushes applied (sync: pushes that went into a step)
  int64_t updates_dropped = 0;  // sync: pushes that came after their step completed
  int64_t steps = 0;            // sync: steps completed; otherwise equal to updates_applied
  // staleness_histogram[s]: applied pushes of staleness s (the last bucket also counts larger ones).
  std::vector<int64_t> staleness_histogram;
  int64_t max_staleness = 0;
  int64_t bytes_received = 0, bytes_sent = 0;
  int64_t messages_received = 0, messages_sent = 0;
};

// Counters of one worker over one run().
struct WorkerStats {
  int worker = 0;
  int64_t steps = 0;                // apply_gradients calls that pushed
  std::vector<double> step_seconds; // the wall time of each step (push to push), in order
  bool stopped = false;             // stopped by fault injection (or failed)
  std::string error;                // what its worker function threw, if anything
  int64_t bytes_received = 0, bytes_sent = 0;
  int64_t messages_received = 0, messages_sent = 0;
};

struct ParameterServerStats {
  TrainingMode mode = TrainingMode::async;
  double wall_seconds = 0;
  int64_t updates_applied = 0, updates_dropped = 0;  // over every server
  std::vector<int64_t> staleness_histogram;          // summed over the servers
  int64_t max_staleness = 0;
  std::vector<ServerStats> servers;
  std::vector<WorkerStats> workers;
  // A table of the above (one line per server and per worker), as the examples print it.
  std::string summary() const;
};

}  // namespace flowlet
