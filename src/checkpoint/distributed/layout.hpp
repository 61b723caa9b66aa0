// Where a distributed checkpoint lives on disk, and the housekeeping after a save commits.
//
//   <directory>/<prefix>-<step, 6+ digits>/manifest.json           a complete checkpoint
//   <directory>/<prefix>-<step>/<shard>.<id>.safetensors           its shard files
//   <directory>/<prefix>-<step>/...tmp...                          a write in progress (or a crash's leftover)
//   <directory>/<prefix>-<step>.superseded[.N]/                    moved aside by a later save of a lower step
//
// A checkpoint is complete when its directory holds manifest.json (written last, atomically).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace flowlet::detail::ckpt {

struct StepDirectory {
  int64_t step = -1;
  std::string path;
  bool complete = false;  // holds a manifest
};

// "<directory>/<prefix>-<step, at least 6 digits>".
std::string step_directory(const std::string& directory, const std::string& prefix, int64_t step);
// The step of a directory named `<prefix>-<digits>`, or -1 for any other name (superseded ones included).
int64_t step_of_name(std::string_view name, std::string_view prefix);
// The step in the name of a checkpoint directory path, superseded ones included ("ckpt-000012.superseded"), or -1.
int64_t step_of_path(const std::string& path, std::string_view prefix);

// Every step directory, lowest step first. A directory that does not exist holds none; one that
// cannot be listed is InvalidArgument naming `op` and the directory.
std::vector<StepDirectory> list_step_directories(const std::string& directory, const std::string& prefix,
                                                 std::string_view op);

// After the manifest of `committed` (step `step`) is durable, on one process (process 0):
//  1. complete checkpoints with a higher step (a rolled-back future) move aside as `.superseded`;
//  2. all but the `max_to_keep` newest complete checkpoints are deleted;
//  3. directories without a manifest below `step` (saves that never completed) are deleted;
//  4. files in `committed` other than the manifest and `keep` (its shard files) are deleted.
// Directories above `step` without a manifest are never touched: another save may be writing them.
// Throws InvalidArgument only when a superseded checkpoint cannot be moved aside (latest() would
// then name it); every other failure leaves a harmless leftover.
void clean_after_commit(const std::string& directory, const std::string& prefix, int64_t step,
                        const std::string& committed, int max_to_keep, const std::vector<std::string>& keep,
                        std::string_view op);

}  // namespace flowlet::detail::ckpt
