// A discrete-event model of the parameter servers' training modes (flowlet/ps_options.hpp), to
// predict step time and throughput for clusters larger than the ones we can run: W workers, each
// step drawn from a measured distribution of compute times, a pull and a push latency, and one
// server queue that applies pushes one at a time.
//
//   ps::SimulationConfig config;
//   config.step_seconds = measured;                 // e.g. WorkerStats::step_seconds of a real run
//   config.slow_workers = {{0, 3.0}};               // worker 0 is 3x slower
//   config.server_seconds = 20e-6;                  // the server's time per push
//   std::puts(ps::simulation_table(config).c_str());  // 10 ... 1,000 workers, every mode
//
// The model, per worker, repeats one step: pull (pull_seconds; the worker reads the version the
// server has when the pull starts), compute (a sample of step_seconds times the worker's factor),
// push (push_seconds until it reaches the server). The server serves pushes first come, first
// served, server_seconds each. A worker's next step starts once the server handled its push (a
// server handles one worker's messages in order, so the next pull is answered after the push), and,
// by mode:
//   - async: at once. The version counts applied pushes; staleness = version at apply - version read.
//   - sync with b backup workers: step v completes when the server has served workers - b pushes
//     read at version v; later pushes for v are dropped on arrival at the head of the queue (no
//     service time) and their workers go on from the newest version. Workers whose push went in
//     wait for the step to complete. updates_applied counts the pushes that went into a step.
//   - bounded staleness k: every push is applied when served; a worker that has c pushes applied
//     waits until every worker has at least c - k applied. The version is the fewest pushes any
//     worker has applied (k = 0 behaves as sync without backups).
// A worker's step time runs from the start of one step (its pull) to the start of the next, so it
// includes waiting for the server and for other workers; it is counted once the next step starts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flowlet/ps_options.hpp"

namespace flowlet::ps {

struct SlowWorker {
  int worker = 0;     // its index
  double factor = 1;  // its compute time is multiplied by this (> 0)
};

struct SimulationConfig {
  int workers = 4;  // >= 1, backups included
  TrainingMode mode = TrainingMode::async;
  int backup_workers = 0;  // sync only: 0 <= b < workers
  int staleness = 0;       // bounded_staleness only: k >= 0
  // The empirical distribution of one step's compute time: every step takes one of these (sampled
  // uniformly with replacement), times the worker's factor. Non-empty, each finite and >= 0.
  std::vector<double> step_seconds;
  std::vector<SlowWorker> slow_workers;  // stragglers; workers beyond `workers` are ignored
  double pull_seconds = 0;               // from a pull's start to its values at the worker
  double push_seconds = 0;               // from the end of compute to the push at the server
  double server_seconds = 0;             // the server's service time per push
  // The run ends when the server has applied steps x workers pushes (sync: `steps` completed
  // steps of workers - backup_workers pushes): about `steps` steps of each worker. >= 1.
  int64_t steps = 100;
  uint64_t seed = 0;  // of the compute-time samples; equal configs and seeds give equal results
};

struct SimulationResult {
  TrainingMode mode = TrainingMode::async;
  int workers = 0, backup_workers = 0, staleness = 0;
  double seconds = 0;            // simulated time at the end of the run
  int64_t updates_applied = 0;   // pushes applied (sync: that went into a step)
  int64_t updates_dropped = 0;   // sync: pushes that came after their step completed
  int64_t versions = 0;          // the server's version at the end (sync: steps completed)
  double updates_per_second = 0; // updates_applied / seconds
  double versions_per_second = 0;
  int64_t worker_steps = 0;      // completed worker steps the step-time figures are taken over
  double step_mean = 0, step_p50 = 0, step_p99 = 0;  // worker step seconds, every worker pooled
  double dropped_fraction = 0;   // dropped / (applied + dropped)
  double mean_staleness = 0;     // over applied updates
  int64_t max_staleness = 0;
  double server_utilization = 0; // the share of `seconds` the server spent serving pushes
};

// Runs the model. InvalidArgument (naming the field and its value) for a config outside the
// ranges above, and when a step could take no time at all (every latency 0 and mean compute 0).
SimulationResult simulate(const SimulationConfig& config);

// One line of a table: a mode with its backups or staleness.
struct SimulatedMode {
  TrainingMode mode = TrainingMode::async;
  int backup_workers = 0;
  int staleness = 0;
};
// async, sync, sync with 1 backup, bounded staleness 2: the modes the examples compare.
std::vector<SimulatedMode> default_simulated_modes();
// "async", "sync", "sync+1 backup", "staleness 2".
std::string describe(const SimulatedMode& mode);

// Runs `base` (its workers, mode, backups and staleness replaced) for every worker count and mode
// and returns the table as text: one line per run with step time (mean, p50, p99), updates and
// steps per second, dropped share, staleness and server utilization.
std::string simulation_table(const SimulationConfig& base, const std::vector<int>& workers = {10, 30, 100, 300, 1000},
                             const std::vector<SimulatedMode>& modes = default_simulated_modes());

}  // namespace flowlet::ps
