// Checkpoints: variables saved to and restored from safetensors files atomically, and a manager keeping the last N.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "flowlet/variable.hpp"

namespace flowlet {

// Example:
//   std::vector<Variable> vars = {w, b, adam_m, adam_v};
//   save_checkpoint("/ckpt/model.safetensors", vars, /*step=*/1000);
//   int64_t step = restore_checkpoint("/ckpt/model.safetensors", vars);   // 1000
//
// The file is a safetensors file (readable by Python's `safetensors` and NumPy): an 8-byte little-endian
// header length, a JSON header with one entry per variable keyed by its name() plus `__metadata__`
// {"step", "format": "flowlet", "crc32" of the data section, "header_crc32"}, spaces so the data starts
// 8-byte aligned, then each value's raw little-endian row-major bytes.
//
// Saving is atomic: it writes `path.tmp.<pid>.<n>` in the same directory, fsyncs it, renames it over
// `path` and fsyncs the directory, so a crash at any moment leaves the previous file (or none) at
// `path`. Names must be non-empty, valid UTF-8, unique and not `__metadata__`, and `path` must hold
// no NUL byte (InvalidArgument).
void save_checkpoint(std::string path, std::vector<Variable> vars, int64_t step);

// Restores every variable in `vars` (by name; the file may hold more) and returns the saved step.
// Everything is checked before any variable changes: a path holding a NUL byte, a missing file, one
// that is not a regular file (a FIFO is refused without waiting for a writer), a truncated or corrupt file
// (bad header, offsets or checksum) is InvalidArgument; a variable that is absent is
// InvalidArgument, one saved with another dtype DTypeError, another shape ShapeError. Each
// message names the file and, where there is one, the variable. On any error no variable changes.
int64_t restore_checkpoint(std::string path, std::vector<Variable> vars);

// Example:
//   CheckpointManager manager("/ckpt/run1", /*max_to_keep=*/3);
//   int64_t step = manager.restore_latest(vars) + 1;   // -1 when there is no checkpoint yet
//   for (; step < steps; ++step) {
//     train_step();
//     if (step % 1000 == 0) manager.save(vars, step);  // writes /ckpt/run1/ckpt-001000.safetensors
//   }
//
// Files are `<directory>/<prefix>-<step, 6+ digits>.safetensors`; the directory is created on the
// first save. The manager keeps no state of its own (it lists the directory on every call), so a
// new manager over the same directory sees earlier checkpoints. The rules (docs/SEMANTICS.md):
//  - the newest save is always the latest: saving step s renames every checkpoint with a step
//    >= s (a run rolled back to an older checkpoint and trained again) to `<its name>.superseded`,
//    out of the manager's sight but still on disk for restore_checkpoint;
//  - then all but the `max_to_keep` highest steps are deleted; never the file just written;
//  - a directory that does not exist holds no checkpoint; one that cannot be listed (permissions,
//    not a directory) is InvalidArgument from every call, never "no checkpoint".
// Not safe for concurrent saves from several threads or processes into the same directory.
class CheckpointManager {
 public:
  // InvalidArgument unless max_to_keep >= 1, prefix is non-empty without '/', and neither holds a NUL.
  explicit CheckpointManager(std::string directory, int max_to_keep = 5, std::string prefix = "ckpt");

  // Saves to the file for `step` (InvalidArgument when step < 0) and returns its path, which
  // latest() returns next.
  std::string save(const std::vector<Variable>& vars, int64_t step);
  // The path of the checkpoint with the highest step, if any.
  std::optional<std::string> latest() const;
  // Restores the latest checkpoint and returns its step, or -1 (changing nothing) when there is none.
  int64_t restore_latest(const std::vector<Variable>& vars);
  // Paths of the checkpoints in the directory, lowest step first.
  std::vector<std::string> checkpoints() const;

  const std::string& directory() const { return directory_; }

 private:
  std::string path_for(int64_t step) const;
  // (step, path) of every checkpoint, lowest step first.
  std::vector<std::pair<int64_t, std::string>> list() const;

  std::string directory_;
  int max_to_keep_;
  std::string prefix_;
};

}  // namespace flowlet
