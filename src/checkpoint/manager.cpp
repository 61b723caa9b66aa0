// CheckpointManager: step-numbered checkpoint files in one directory, the newest N of the current lineage kept.
//
// Rules (also in docs/SEMANTICS.md, "Checkpoint manager"):
//  1. A checkpoint is a directory entry named `<prefix>-<decimal step>.safetensors` whose step fits
//     int64 (leading zeros allowed); every other name is ignored.
//  2. The directory is listed on every call. A directory that does not exist holds no checkpoint;
//     one that exists but cannot be listed is an error, never "no checkpoint" (that would restart
//     training at step 0).
//  3. save(step) first makes the new file durable. Checkpoints with a higher step belong to a run
//     that was rolled back (the user restored an older one and trained again): they are renamed to
//     `<name>.superseded` so that the new file is the latest, while their data stays on disk.
//  4. Then the lowest steps beyond max_to_keep are deleted; the file just written is never among them.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "checkpoint/step_name.hpp"
#include "core/check.hpp"
#include "core/user_text.hpp"
#include "flowlet/checkpoint.hpp"

namespace flowlet {

namespace {

constexpr std::string_view kSuffix = ".safetensors";
constexpr std::string_view kSupersededSuffix = ".superseded";

// The step of a file named `<prefix>-<digits>.safetensors`, or -1 for any other name (temporary
// files included) and for steps beyond int64.
int64_t step_of(std::string_view file, std::string_view prefix) {
  if (file.size() <= prefix.size() + 1 + kSuffix.size()) return -1;
  if (file.substr(0, prefix.size()) != prefix || file[prefix.size()] != '-') return -1;
  if (file.substr(file.size() - kSuffix.size()) != kSuffix) return -1;
  const std::string_view digits = file.substr(prefix.size() + 1, file.size() - prefix.size() - 1 - kSuffix.size());
  return checkpoint::step_of_digits(digits);
}

}  // namespace

CheckpointManager::CheckpointManager(std::string directory, int max_to_keep, std::string prefix)
    : directory_(std::move(directory)), max_to_keep_(max_to_keep), prefix_(std::move(prefix)) {
  if (directory_.empty()) detail::fail<InvalidArgument>("CheckpointManager: directory is empty; got \"\"");
  detail::check_path("CheckpointManager", "directory", directory_);
  if (max_to_keep_ < 1) {
    detail::fail<InvalidArgument>("CheckpointManager: max_to_keep must be at least 1; got {}", max_to_keep_);
  }
  if (prefix_.empty() || prefix_.find('/') != std::string::npos || prefix_.find('\0') != std::string::npos) {
    detail::fail<InvalidArgument>("CheckpointManager: prefix must be non-empty and contain no '/' or NUL; got \"{}\"",
                                  detail::excerpt(prefix_));
  }
}

std::string CheckpointManager::path_for(int64_t step) const {
  return fmt::format("{}/{}-{:06d}{}", directory_, prefix_, step, kSuffix);
}

std::string CheckpointManager::save(const std::vector<Variable>& vars, int64_t step) {
  constexpr std::string_view op = "CheckpointManager::save";
  if (step < 0) detail::fail<InvalidArgument>("{}: step must be >= 0; got {}", op, step);
  std::error_code error;
  std::filesystem::create_directories(directory_, error);
  if (error) detail::fail<InvalidArgument>("{}: cannot create directory '{}': {}", op, directory_, error.message());
  const std::string path = path_for(step);
  save_checkpoint(path, vars, step);

  // Only after the new file is durable: move the rolled-back future aside (rule 3), then prune (rule 4).
  std::vector<std::pair<int64_t, std::string>> kept;
  for (auto& [other_step, other_path] : list()) {
    if (other_path == path) continue;
    if (other_step < step) {
      kept.emplace_back(other_step, std::move(other_path));
      continue;
    }
    // A higher step, or the same step spelled with other leading zeros: either would hide the new file.
    const std::string aside = other_path + std::string(kSupersededSuffix);
    if (::rename(other_path.c_str(), aside.c_str()) != 0 && errno != ENOENT) {
      detail::fail<InvalidArgument>(
          "{}: saved step {} to '{}' but cannot move the rolled-back checkpoint '{}' aside: {}; latest() would "
          "return it instead; move or delete it by hand",
          op, step, path, other_path, std::strerror(errno));
    }
  }
  const size_t room = static_cast<size_t>(max_to_keep_) - 1;  // the new file takes one place
  const size_t excess = kept.size() > room ? kept.size() - room : 0;
  for (size_t i = 0; i < excess; ++i) std::filesystem::remove(kept[i].second, error);  // a leftover is harmless
  return path;
}

std::vector<std::pair<int64_t, std::string>> CheckpointManager::list() const {
  constexpr std::string_view op = "CheckpointManager";
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code error;
  std::filesystem::directory_iterator it(directory_, error);
  if (error == std::errc::no_such_file_or_directory) return found;  // not created yet: no checkpoint
  for (std::filesystem::directory_iterator end; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    const int64_t step = step_of(name, prefix_);
    if (step >= 0) found.emplace_back(step, directory_ + "/" + name);
  }
  if (error) {
    detail::fail<InvalidArgument>(
        "{}: cannot list directory '{}': {}; refusing to report no checkpoint for a directory it cannot read", op,
        directory_, error.message());
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::vector<std::string> CheckpointManager::checkpoints() const {
  std::vector<std::string> paths;
  for (auto& entry : list()) paths.push_back(std::move(entry.second));
  return paths;
}

std::optional<std::string> CheckpointManager::latest() const {
  std::vector<std::string> all = checkpoints();
  if (all.empty()) return std::nullopt;
  return std::move(all.back());
}

int64_t CheckpointManager::restore_latest(const std::vector<Variable>& vars) {
  const std::optional<std::string> path = latest();
  return path ? restore_checkpoint(*path, vars) : -1;
}

}  // namespace flowlet
