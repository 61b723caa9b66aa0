// CheckpointManager: step-numbered checkpoint files in one directory, the newest N kept.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "core/check.hpp"
#include "flowlet/checkpoint.hpp"

namespace flowlet {

namespace {

constexpr std::string_view kSuffix = ".safetensors";

// The step of a file named `<prefix>-<digits>.safetensors`, or -1 for any other name (temporary files included).
int64_t step_of(std::string_view file, std::string_view prefix) {
  if (file.size() <= prefix.size() + 1 + kSuffix.size()) return -1;
  if (file.substr(0, prefix.size()) != prefix || file[prefix.size()] != '-') return -1;
  if (file.substr(file.size() - kSuffix.size()) != kSuffix) return -1;
  const std::string_view digits = file.substr(prefix.size() + 1, file.size() - prefix.size() - 1 - kSuffix.size());
  if (digits.size() > 18) return -1;
  int64_t step = 0;
  for (const char c : digits) {
    if (c < '0' || c > '9') return -1;
    step = step * 10 + (c - '0');
  }
  return step;
}

}  // namespace

CheckpointManager::CheckpointManager(std::string directory, int max_to_keep, std::string prefix)
    : directory_(std::move(directory)), max_to_keep_(max_to_keep), prefix_(std::move(prefix)) {
  if (directory_.empty()) detail::fail<InvalidArgument>("CheckpointManager: directory is empty; got \"\"");
  if (max_to_keep_ < 1) {
    detail::fail<InvalidArgument>("CheckpointManager: max_to_keep must be at least 1; got {}", max_to_keep_);
  }
  if (prefix_.empty() || prefix_.find('/') != std::string::npos) {
    detail::fail<InvalidArgument>("CheckpointManager: prefix must be non-empty and contain no '/'; got \"{}\"",
                                  prefix_);
  }
}

std::string CheckpointManager::path_for(int64_t step) const {
  return fmt::format("{}/{}-{:06d}{}", directory_, prefix_, step, kSuffix);
}

std::string CheckpointManager::save(const std::vector<Variable>& vars, int64_t step) {
  if (step < 0) detail::fail<InvalidArgument>("CheckpointManager::save: step must be >= 0; got {}", step);
  std::error_code error;
  std::filesystem::create_directories(directory_, error);
  if (error) {
    detail::fail<InvalidArgument>("CheckpointManager::save: cannot create directory '{}': {}", directory_,
                                  error.message());
  }
  const std::string path = path_for(step);
  save_checkpoint(path, vars, step);
  // Only after the new file is durable: drop the oldest beyond max_to_keep.
  const std::vector<std::string> all = checkpoints();
  const size_t excess = all.size() > static_cast<size_t>(max_to_keep_) ? all.size() - max_to_keep_ : 0;
  for (size_t i = 0; i < excess; ++i) std::filesystem::remove(all[i], error);  // best effort: a leftover is harmless
  return path;
}

std::vector<std::string> CheckpointManager::checkpoints() const {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code error;
  for (std::filesystem::directory_iterator it(directory_, error), end; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    const int64_t step = step_of(name, prefix_);
    if (step >= 0) found.emplace_back(step, directory_ + "/" + name);
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> paths;
  paths.reserve(found.size());
  for (auto& entry : found) paths.push_back(std::move(entry.second));
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
