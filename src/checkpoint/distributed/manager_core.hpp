// ManagerCore: the state behind DistributedCheckpointManager (its sources, communicators,
// background writer and the time rule), and the save and restore protocols built from the
// smaller files next to it: layout (directories), save_job (what the background thread does),
// reader (a checkpoint being restored), agreement (processes agreeing), variables_source.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/distributed/background_writer.hpp"
#include "checkpoint/distributed/source.hpp"
#include "checkpoint/distributed/variables_source.hpp"
#include "collective/communicator.hpp"
#include "flowlet/distributed_checkpoint.hpp"

namespace flowlet::detail::ckpt {

class ManagerCore {
 public:
  ManagerCore(std::string directory, DistributedCheckpointOptions options);
  ~ManagerCore();

  void add_variables(const std::vector<Variable>& variables);
  void add_source(std::shared_ptr<Source> source, std::string_view op);

  void save(int64_t step, const std::map<std::string, int64_t>& metadata);
  bool maybe_save(int64_t step, const std::map<std::string, int64_t>& metadata);
  void wait();
  std::optional<RestoredCheckpoint> restore_latest();
  RestoredCheckpoint restore(const std::string& path);

  std::vector<std::string> checkpoints() const;
  std::optional<std::string> latest() const;
  const std::string& directory() const { return directory_; }
  const DistributedCheckpointOptions& options() const { return options_; }
  CheckpointSaveStats last_save_stats() const;

 private:
  // Every process agrees that it restores `path` (the same string everywhere), then restores it.
  RestoredCheckpoint restore_agreed(const std::string& path, std::string_view op);
  // Adds `names` to those the checkpoints hold: InvalidArgument after a save or restore, for a
  // name that is empty, "__metadata__", not UTF-8 or already taken.
  void claim_names(const std::vector<std::string>& names, std::string_view op);
  void check_same_everywhere(const std::string& mine, std::string_view op, std::string_view what);

  std::string directory_;
  DistributedCheckpointOptions options_;
  ProcessView view_;
  // Made in the constructor when the job has several processes: one for the training thread (the
  // time rule, restores), one for the background thread (gathering shard records).
  std::shared_ptr<Communicator> training_comm_, background_comm_;
  std::vector<std::shared_ptr<Source>> sources_;
  std::shared_ptr<VariablesSource> variables_;  // among sources_, made by the first add(variables)
  std::set<std::string> tensor_names_;
  bool frozen_ = false;  // after the first save or restore nothing more may be added
  std::chrono::steady_clock::time_point last_save_began_;
  mutable std::mutex stats_mutex_;  // the background thread writes stats_, any thread reads it
  CheckpointSaveStats stats_;
  BackgroundWriter writer_;  // last: joined before the communicators go
};

}  // namespace flowlet::detail::ckpt
