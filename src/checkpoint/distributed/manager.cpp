// DistributedCheckpointManager (flowlet/distributed_checkpoint.hpp): argument checks, the save
// protocol's training-thread half (the copy, handing it to the background writer), the time
// rule, and the collective restore that checks everything before it changes anything.
#include <cmath>
#include <filesystem>

#include "checkpoint/distributed/agreement.hpp"
#include "checkpoint/distributed/layout.hpp"
#include "checkpoint/distributed/manager_core.hpp"
#include "checkpoint/distributed/reader.hpp"
#include "checkpoint/distributed/save_job.hpp"
#include "checkpoint/distributed/variables_source.hpp"
#include "checkpoint/header_json.hpp"
#include "core/check.hpp"
#include "core/user_text.hpp"
#include "flowlet/collective.hpp"
#include "state/mirrored_variable.hpp"
#include "state/variable_state.hpp"

namespace flowlet {

namespace detail::ckpt {

namespace {

constexpr std::string_view kConstruct = "DistributedCheckpointManager";
constexpr std::string_view kAdd = "DistributedCheckpointManager::add";
constexpr std::string_view kSave = "DistributedCheckpointManager::save";
constexpr std::string_view kRestore = "DistributedCheckpointManager::restore";
constexpr std::string_view kRestoreLatest = "DistributedCheckpointManager::restore_latest";

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

ManagerCore::ManagerCore(std::string directory, DistributedCheckpointOptions options)
    : directory_(std::move(directory)), options_(std::move(options)) {
  if (directory_.empty()) detail::fail<InvalidArgument>("{}: directory is empty; got \"\"", kConstruct);
  detail::check_path(kConstruct, "directory", directory_);
  while (directory_.size() > 1 && directory_.back() == '/') directory_.pop_back();
  if (options_.max_to_keep < 1)
    detail::fail<InvalidArgument>("{}: max_to_keep must be at least 1; got {}", kConstruct, options_.max_to_keep);
  const std::string& prefix = options_.prefix;
  if (prefix.empty() || prefix.find('/') != std::string::npos || prefix.find('\0') != std::string::npos ||
      prefix.find(".superseded") != std::string::npos) {
    detail::fail<InvalidArgument>("{}: prefix must be non-empty and contain no '/', NUL or \".superseded\"; got \"{}\"",
                                  kConstruct, detail::excerpt(prefix));
  }
  if (options_.every_steps < 0)
    detail::fail<InvalidArgument>("{}: every_steps must be >= 0 (0: no step rule); got {}", kConstruct,
                                  options_.every_steps);
  if (!(options_.every_seconds >= 0) || !std::isfinite(options_.every_seconds))
    detail::fail<InvalidArgument>("{}: every_seconds must be finite and >= 0 (0: no time rule); got {}", kConstruct,
                                  options_.every_seconds);
  view_.process = process_index();
  view_.processes = process_count();
  if (view_.processes > 1) {
    training_comm_ = make_communicator({Device(DeviceKind::cpu, 0)});
    background_comm_ = make_communicator({Device(DeviceKind::cpu, 0)});
  }
  last_save_began_ = std::chrono::steady_clock::now();
}

ManagerCore::~ManagerCore() {
  try {
    writer_.wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "DistributedCheckpointManager('%s'): the last save failed: %s\n", directory_.c_str(),
                 e.what());
  } catch (...) {
    std::fprintf(stderr, "DistributedCheckpointManager('%s'): the last save failed\n", directory_.c_str());
  }
}

void ManagerCore::claim_names(const std::vector<std::string>& names, std::string_view op) {
  if (frozen_) {
    detail::fail<InvalidArgument>("{}: called after a save or restore of '{}'; add everything before the first one", op,
                                  directory_);
  }
  std::set<std::string> fresh;
  for (const std::string& name : names) {
    if (name.empty() || name == "__metadata__" || !checkpoint::is_valid_utf8(name)) {
      detail::fail<InvalidArgument>(
          "{}: '{}' cannot name a tensor in a checkpoint (empty, \"__metadata__\" or not UTF-8)", op,
          detail::excerpt(name));
    }
    if (tensor_names_.count(name) != 0 || !fresh.insert(name).second) {
      detail::fail<InvalidArgument>(
          "{}: the name '{}' is already among what the checkpoints hold; names must be unique", op,
          detail::excerpt(name));
    }
  }
  tensor_names_.insert(fresh.begin(), fresh.end());
}

void ManagerCore::add_source(std::shared_ptr<Source> source, std::string_view op) {
  if (source == nullptr) detail::fail<InvalidArgument>("{}: the source is null", op);
  claim_names(source->tensor_names(), op);
  sources_.push_back(std::move(source));
}

void ManagerCore::add_variables(const std::vector<Variable>& variables) {
  for (size_t i = 0; i < variables.size(); ++i) {
    const Variable& v = variables[i];
    if (!v.defined())
      detail::fail<InvalidArgument>("{}: variable {} is an empty Variable handle; got Variable()", kAdd, i);
    if (v.name().empty()) {
      detail::fail<InvalidArgument>(
          "{}: variable {} has an empty name; got a {} {} variable; give every variable a unique name", kAdd, i,
          v.dtype(), v.shape());
    }
    if (VariableAccess::state(v)->remote != nullptr) {
      detail::fail<InvalidArgument>(
          "{}: variable '{}' is a parameter-server variable; add its ParameterServerStrategy instead", kAdd, v.name());
    }
  }
  std::vector<std::string> names;
  for (const Variable& v : variables) names.push_back(v.name());
  claim_names(names, kAdd);
  // One source for every add(variables), so that all of them are balanced over the processes together.
  if (variables_ == nullptr) {
    variables_ = std::make_shared<VariablesSource>(std::vector<Variable>{}, std::string(kRestore));
    sources_.push_back(variables_);
  }
  variables_->append(variables);
}

void ManagerCore::save(int64_t step, const std::map<std::string, int64_t>& metadata) {
  if (step < 0) detail::fail<InvalidArgument>("{}: step must be >= 0; got {}", kSave, step);
  for (const auto& [key, value] : metadata) {
    if (key.empty() || !checkpoint::is_valid_utf8(key))
      detail::fail<InvalidArgument>("{}: metadata keys must be non-empty UTF-8; got \"{}\" = {}", kSave,
                                    detail::excerpt(key), value);
  }
  writer_.wait();  // one save in flight; rethrows the previous one's error
  frozen_ = true;
  const auto began = std::chrono::steady_clock::now();
  last_save_began_ = began;

  auto job = std::make_shared<SaveJob>();
  job->op = std::string(kSave);
  job->directory = directory_;
  job->prefix = options_.prefix;
  job->max_to_keep = options_.max_to_keep;
  job->step = step;
  job->metadata = metadata;
  job->view = view_;
  job->comm = background_comm_.get();
  // A snapshot refused on one process (a parameter-server save inside run()) must fail the save on
  // every process here, not leave the others' writer threads waiting for it in the gather.
  std::exception_ptr error;
  try {
    for (const std::shared_ptr<Source>& source : sources_) source->snapshot(view_, job->shards, job->attributes);
  } catch (...) {
    error = std::current_exception();
  }
  agree_on_outcome(training_comm_.get(), error);
  job->copied = std::chrono::steady_clock::now();
  job->copy_seconds = seconds_since(began);

  auto run = [this, job] {
    const CheckpointSaveStats stats = run_save_job(*job);
    const std::lock_guard<std::mutex> lock(stats_mutex_);
    stats_ = stats;
  };
  if (options_.background) {
    writer_.start(std::move(run));
  } else {
    run();
  }
}

bool ManagerCore::maybe_save(int64_t step, const std::map<std::string, int64_t>& metadata) {
  if (step < 0)
    detail::fail<InvalidArgument>("{}: step must be >= 0; got {}", "DistributedCheckpointManager::maybe_save", step);
  bool due = options_.every_steps > 0 && step % options_.every_steps == 0;
  if (options_.every_seconds > 0) {
    // Collective on every call (not only when the step rule is silent), so the processes stay in step.
    const bool time_due = seconds_since(last_save_began_) >= options_.every_seconds;
    due = any_process(training_comm_.get(), time_due) || due;
  }
  if (due) save(step, metadata);
  return due;
}

void ManagerCore::wait() { writer_.wait(); }

CheckpointSaveStats ManagerCore::last_save_stats() const {
  const std::lock_guard<std::mutex> lock(stats_mutex_);
  return stats_;
}

std::vector<std::string> ManagerCore::checkpoints() const {
  std::vector<std::string> paths;
  for (StepDirectory& entry : list_step_directories(directory_, options_.prefix, kConstruct)) {
    if (entry.complete) paths.push_back(std::move(entry.path));
  }
  return paths;
}

std::optional<std::string> ManagerCore::latest() const {
  std::vector<std::string> all = checkpoints();
  if (all.empty()) return std::nullopt;
  return std::move(all.back());
}

void ManagerCore::check_same_everywhere(const std::string& mine, std::string_view op, std::string_view what) {
  const std::vector<std::string> seen = all_gather_strings(training_comm_.get(), mine);
  for (const std::string& other : seen) {
    if (other == mine) continue;
    std::string listing;
    for (size_t p = 0; p < seen.size(); ++p) {
      listing += fmt::format("{}process {}: '{}'", p == 0 ? "" : ", ", p, seen[p].empty() ? "(none)" : seen[p]);
    }
    detail::fail<InvalidArgument>(
        "{}: the processes see different {} in '{}'; got {}; is the directory shared by every process?", op, what,
        directory_, listing);
  }
}

std::optional<RestoredCheckpoint> ManagerCore::restore_latest() {
  writer_.wait();
  frozen_ = true;
  std::string mine;
  std::exception_ptr error;
  try {
    mine = latest().value_or("");
  } catch (...) {
    error = std::current_exception();
  }
  agree_on_outcome(training_comm_.get(), error);
  check_same_everywhere(mine, kRestoreLatest, "latest checkpoints");
  if (mine.empty()) return std::nullopt;
  return restore_agreed(mine, kRestoreLatest);
}

RestoredCheckpoint ManagerCore::restore(const std::string& path) {
  detail::check_path(kRestore, "path", path);
  if (path.empty()) detail::fail<InvalidArgument>("{}: path is empty; got \"\"", kRestore);
  writer_.wait();
  frozen_ = true;
  check_same_everywhere(path, kRestore, "paths to restore");
  return restore_agreed(path, kRestore);
}

RestoredCheckpoint ManagerCore::restore_agreed(const std::string& path, std::string_view op) {
  std::unique_ptr<CheckpointReader> reader;
  std::exception_ptr error;
  try {
    reader = std::make_unique<CheckpointReader>(path, step_of_path(path, options_.prefix), std::string(op));
    for (const std::shared_ptr<Source>& source : sources_) source->load(view_, *reader);
    // Every shard is checked by at least one process, also those no source read.
    for (size_t k = 0; k < reader->manifest().shards.size(); ++k) {
      if (static_cast<int>(k % static_cast<size_t>(view_.processes)) == view_.process) reader->validate_shard(k);
    }
  } catch (...) {
    error = std::current_exception();
  }
  agree_on_outcome(training_comm_.get(), error);
  for (const std::shared_ptr<Source>& source : sources_) source->commit();
  RestoredCheckpoint restored;
  restored.step = reader->step();
  restored.path = reader->path();
  restored.metadata = reader->manifest().metadata;
  restored.saved_processes = reader->saved_processes();
  restored.saved_cluster = reader->manifest().cluster;
  // The time rule counts from the restore: a resumed job does not save at its first step.
  last_save_began_ = std::chrono::steady_clock::now();
  return restored;
}

void ManagerAccess::add_source(DistributedCheckpointManager& manager, std::shared_ptr<Source> source) {
  manager.core_->add_source(std::move(source), kAdd);
}

}  // namespace detail::ckpt

DistributedCheckpointManager::DistributedCheckpointManager(std::string directory, DistributedCheckpointOptions options)
    : core_(std::make_unique<detail::ckpt::ManagerCore>(std::move(directory), std::move(options))) {}
DistributedCheckpointManager::~DistributedCheckpointManager() = default;

void DistributedCheckpointManager::add(const std::vector<Variable>& variables) { core_->add_variables(variables); }
void DistributedCheckpointManager::save(int64_t step, const std::map<std::string, int64_t>& metadata) {
  core_->save(step, metadata);
}
bool DistributedCheckpointManager::maybe_save(int64_t step, const std::map<std::string, int64_t>& metadata) {
  return core_->maybe_save(step, metadata);
}
void DistributedCheckpointManager::wait() { core_->wait(); }
std::optional<RestoredCheckpoint> DistributedCheckpointManager::restore_latest() { return core_->restore_latest(); }
RestoredCheckpoint DistributedCheckpointManager::restore(const std::string& path) { return core_->restore(path); }
std::vector<std::string> DistributedCheckpointManager::checkpoints() const { return core_->checkpoints(); }
std::optional<std::string> DistributedCheckpointManager::latest() const { return core_->latest(); }
const std::string& DistributedCheckpointManager::directory() const { return core_->directory(); }
const DistributedCheckpointOptions& DistributedCheckpointManager::options() const { return core_->options(); }
CheckpointSaveStats DistributedCheckpointManager::last_save_stats() const { return core_->last_save_stats(); }

}  // namespace flowlet
