// The directory layout of distributed checkpoints and the clean-up after a save commits (layout.hpp).
#include "checkpoint/distributed/layout.hpp"

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "checkpoint/distributed/manifest.hpp"
#include "checkpoint/step_name.hpp"
#include "core/check.hpp"

namespace flowlet::detail::ckpt {

namespace fs = std::filesystem;

namespace {

bool has_manifest(const std::string& path) {
  struct stat info {};
  return ::stat((path + "/" + std::string(kManifestFile)).c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

}  // namespace

std::string step_directory(const std::string& directory, const std::string& prefix, int64_t step) {
  return fmt::format("{}/{}-{:06d}", directory, prefix, step);
}

int64_t step_of_name(std::string_view name, std::string_view prefix) {
  if (name.size() <= prefix.size() + 1 || name.substr(0, prefix.size()) != prefix || name[prefix.size()] != '-')
    return -1;
  const std::string_view digits = name.substr(prefix.size() + 1);
  return checkpoint::step_of_digits(digits);
}

int64_t step_of_path(const std::string& path, std::string_view prefix) {
  std::string name = fs::path(path).lexically_normal().filename().string();
  if (name.empty()) name = fs::path(path).lexically_normal().parent_path().filename().string();  // a trailing '/'
  const size_t superseded = name.find(".superseded");
  if (superseded != std::string::npos) name.resize(superseded);
  return step_of_name(name, prefix);
}

std::vector<StepDirectory> list_step_directories(const std::string& directory, const std::string& prefix,
                                                 std::string_view op) {
  std::vector<StepDirectory> found;
  std::error_code error;
  fs::directory_iterator it(directory, error);
  if (error == std::errc::no_such_file_or_directory) return found;  // not created yet: no checkpoint
  for (fs::directory_iterator end; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    const int64_t step = step_of_name(name, prefix);
    if (step < 0) continue;
    std::error_code type_error;
    if (!it->is_directory(type_error)) continue;
    StepDirectory entry;
    entry.step = step;
    entry.path = directory + "/" + name;
    entry.complete = has_manifest(entry.path);
    found.push_back(std::move(entry));
  }
  if (error) {
    detail::fail<InvalidArgument>(
        "{}: cannot list directory '{}': {}; refusing to report no checkpoint for a directory it cannot read", op,
        directory, error.message());
  }
  std::sort(found.begin(), found.end(), [](const StepDirectory& a, const StepDirectory& b) {
    return a.step != b.step ? a.step < b.step : a.path < b.path;
  });
  return found;
}

void clean_after_commit(const std::string& directory, const std::string& prefix, int64_t step,
                        const std::string& committed, int max_to_keep, const std::vector<std::string>& keep,
                        std::string_view op) {
  std::vector<StepDirectory> complete;
  for (StepDirectory& entry : list_step_directories(directory, prefix, op)) {
    if (entry.path == committed) continue;
    if (entry.step >= step) {
      if (!entry.complete) continue;  // possibly being written: never touched
      // A higher step, or the same step spelled with other leading zeros: either would hide the new one.
      std::string aside = entry.path + ".superseded";
      for (int n = 2; fs::exists(aside) && n < 1000; ++n) aside = fmt::format("{}.superseded.{}", entry.path, n);
      if (::rename(entry.path.c_str(), aside.c_str()) != 0 && errno != ENOENT) {
        detail::fail<InvalidArgument>(
            "{}: saved step {} to '{}' but cannot move the rolled-back checkpoint '{}' aside: {}; latest() would "
            "return it instead; move or delete it by hand",
            op, step, committed, entry.path, std::strerror(errno));
      }
      continue;
    }
    std::error_code ignored;
    if (!entry.complete) {
      fs::remove_all(entry.path, ignored);  // a save that never completed
    } else {
      complete.push_back(std::move(entry));
    }
  }
  const size_t room = static_cast<size_t>(max_to_keep) - 1;  // the new checkpoint takes one place
  const size_t excess = complete.size() > room ? complete.size() - room : 0;
  std::error_code ignored;
  for (size_t i = 0; i < excess; ++i) {
    // The manifest first: a deletion cut short by a crash leaves an incomplete directory (cleaned
    // by a later save), never a listed checkpoint that lost some of its shards.
    fs::remove(complete[i].path + "/" + std::string(kManifestFile), ignored);
    fs::remove_all(complete[i].path, ignored);  // a leftover is harmless
  }

  fs::directory_iterator it(committed, ignored);
  std::vector<fs::path> stray;
  for (fs::directory_iterator end; !ignored && it != end; it.increment(ignored)) {
    const std::string name = it->path().filename().string();
    if (name == kManifestFile || std::find(keep.begin(), keep.end(), name) != keep.end()) continue;
    stray.push_back(it->path());
  }
  for (const fs::path& path : stray) fs::remove_all(path, ignored);
}

}  // namespace flowlet::detail::ckpt
