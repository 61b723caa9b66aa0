// Checkpoints of whole jobs: every process writes its own shard file in the background, and a
// manifest written last makes the checkpoint exist. Restore checks everything before it changes
// anything, on every process, and may run on another cluster shape where that makes sense.
//
//   DistributedCheckpointManager checkpoints("/ckpt/run1", {.max_to_keep = 3, .every_seconds = 30});
//   checkpoints.add(model.parameters());          // plain or mirrored variables
//   checkpoints.add(optimizer.variables());       // slots and the step counter
//   int64_t first_step = 0;
//   if (const std::optional<RestoredCheckpoint> restored = checkpoints.restore_latest()) {
//     first_step = restored->step + 1;            // metadata holds the data position saved with it
//   }
//   for (int64_t step = first_step; step < steps; ++step) {
//     train_step(batch(step));
//     checkpoints.maybe_save(step, {{"epoch", epoch}, {"batch", index}});  // every 30 s
//   }
//   checkpoints.wait();                           // the last save is complete (or rethrows why not)
//
// Layout: `<directory>/<prefix>-<step, 6+ digits>/` holds one safetensors shard file per writer
// (`<shard>.<unique id>.safetensors`, written with save_checkpoint's atomic writer, its
// `__metadata__` step equal to the checkpoint's) and `manifest.json`, written last and atomically by
// process 0 once every shard is durable. It names every shard with its size and CRC-32, the step,
// the cluster shape that wrote it, where every tensor's rows are, and save()'s metadata. A
// checkpoint exists only when its manifest does: a crash at any moment leaves the previous
// checkpoint the latest. A save of step s that completes moves checkpoints with higher steps (a run
// rolled back by an explicit restore) aside as `<name>.superseded`, then deletes all but the
// max_to_keep newest, and the leftovers of saves that never completed below the newest.
//
// Who writes what: each variable added with add(variables) is written once, by one process (the
// variables are spread over the processes by size, so that the writes run in parallel); a mirrored
// variable is written from the process's replica-0 copy. A parameter-server strategy's variables
// and the optimizer state of its shards are written by the servers that hold them, one file per
// server. The directory must be shared by every process (a network file system across machines).
//
// Consistency: save() is collective and runs on the training thread between steps. It copies the
// values this process writes (the only time it holds training up), then hands the copy to a
// background thread that writes the shard files, gathers their sizes and checksums to process 0
// (on a communicator of the manager's own) and writes the manifest. A checkpoint therefore holds the
// state after exactly one step on every process. One save is in flight at a time: a save() while
// the previous one still writes waits for it first.
//
// Restore (collective): every process picks the same checkpoint (InvalidArgument naming what each
// saw when they differ, e.g. a directory that is not shared), validates the manifest, checks that
// the checkpoint fits this job (variables, dtypes, shapes, cluster shape), reads and validates every
// shard file it needs (size, CRC-32, safetensors structure, the step in it; every shard is read by
// at least one process), and only when every process succeeded does any variable change. Otherwise
// every process throws the same error (InvalidArgument, DTypeError or ShapeError) naming the file
// and the process that found it, and no variable changed on any process.
//
// Another cluster shape: variables added with add(variables) restore on any number of processes
// (a mirrored job saved by 2 processes resumes on 1). Server variables restore on any number of
// servers (rows re-sharded, optimizer slots with them); a different number of workers is refused
// (the per-worker data positions would not map), as is a checkpoint of another kind of job.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "flowlet/variable.hpp"

namespace flowlet {

class ParameterServerStrategy;

namespace detail::ckpt {
class ManagerCore;
struct ManagerAccess;
}  // namespace detail::ckpt

struct DistributedCheckpointOptions {
  int max_to_keep = 5;          // complete checkpoints kept, >= 1
  std::string prefix = "ckpt";  // non-empty, no '/'
  // maybe_save() saves when step % every_steps == 0 (0: no step rule) or when every_seconds have
  // passed since the last save began (0: no time rule); either rule suffices. Before the first
  // save the time rule counts from the manager's construction or its last restore. Under several
  // processes the time rule is agreed at each maybe_save() call (a small collective), so every
  // process saves at the same step.
  int64_t every_steps = 0;
  double every_seconds = 0;
  // Write in a background thread (save() returns after the copy). False: save() returns when the
  // checkpoint is complete.
  bool background = true;
};

// What a restore found.
struct RestoredCheckpoint {
  int64_t step = -1;
  std::string path;                         // the checkpoint's directory
  std::map<std::string, int64_t> metadata;  // what save() was given: the data position, ...
  int saved_processes = 1;                  // how many processes wrote it
  std::string saved_cluster;                // the job that wrote it, in words
};

// Timings of the last complete save, for benchmarks and logs.
struct CheckpointSaveStats {
  int64_t step = -1;
  double copy_seconds = 0;   // the copy on the training thread (what training waited)
  double write_seconds = 0;  // from the copy to the manifest being durable
  int64_t bytes = 0;         // this process's shard files
  int64_t total_bytes = 0;   // every process's shard files (process 0; others: their own)
};

class DistributedCheckpointManager {
 public:
  // Collective over the job's processes (every process constructs its managers in the same order,
  // like communicators). InvalidArgument for an empty directory, max_to_keep < 1, a bad prefix, a
  // NUL byte, negative every_steps or every_seconds.
  explicit DistributedCheckpointManager(std::string directory, DistributedCheckpointOptions options = {});
  // Waits for a save in flight; its error (if any) is printed to stderr, not thrown.
  ~DistributedCheckpointManager();
  DistributedCheckpointManager(const DistributedCheckpointManager&) = delete;
  DistributedCheckpointManager& operator=(const DistributedCheckpointManager&) = delete;

  // What the checkpoints hold; every process adds the same things in the same order, before the
  // first save or restore. InvalidArgument: an empty handle, a variable without a unique name
  // (among everything added), a server variable (add its strategy instead), adding after a save.
  void add(const std::vector<Variable>& variables);
  // The strategy's server variables and its servers' optimizer state (slots, step counters).
  void add(ParameterServerStrategy& strategy);

  // Saves the state now as checkpoint `step` (>= 0) with `metadata` (string keys, int64 values:
  // where the input pipeline is, ...). Collective. Rethrows the error of a failed earlier
  // background save first.
  void save(int64_t step, const std::map<std::string, int64_t>& metadata = {});
  // save() when the options' rules say so; true when it saved. Collective.
  bool maybe_save(int64_t step, const std::map<std::string, int64_t>& metadata = {});
  // Until the save in flight is complete; rethrows its error.
  void wait();

  // Restores the newest complete checkpoint; nullopt (changing nothing) when there is none.
  // Collective; see the top of this file for what is checked.
  std::optional<RestoredCheckpoint> restore_latest();
  // Restores the checkpoint in directory `path` (one of checkpoints(), or a superseded one).
  RestoredCheckpoint restore(const std::string& path);

  // The directories of the complete checkpoints, lowest step first (this process's view), and the
  // newest. InvalidArgument when the directory exists but cannot be listed.
  std::vector<std::string> checkpoints() const;
  std::optional<std::string> latest() const;
  const std::string& directory() const;
  const DistributedCheckpointOptions& options() const;
  CheckpointSaveStats last_save_stats() const;

 private:
  friend struct detail::ckpt::ManagerAccess;
  std::unique_ptr<detail::ckpt::ManagerCore> core_;
};

}  // namespace flowlet
