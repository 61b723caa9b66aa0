// What the resumable examples (mirrored_fashion_mnist.cpp, ps_embedding.cpp) share about
// checkpoints: their command-line options, the DistributedCheckpointOptions those make, and the
// lines they print for a restore and for the saves of a run.
//
//   --checkpoint-dir DIR            checkpoints go to DIR (default: none, no checkpoints)
//   --checkpoint-every-steps N      save every N steps (default 0: no step rule)
//   --checkpoint-every-seconds X    save when X seconds passed since the last save began
//                                   (default 30 when a directory is given; 0: no time rule)
//   --keep N                        complete checkpoints kept (default 3)
//   --resume                        restore the latest complete checkpoint in DIR first (a fresh
//                                   start, said so, when there is none)
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>

#include <fmt/format.h>

#include <flowlet/distributed_checkpoint.hpp>
#include <flowlet/flowlet.hpp>

namespace examples {

// Reads `text` as a whole number or a finite number; InvalidArgument "`program`: `option` ..." otherwise.
inline int64_t parse_integer(const std::string& program, const std::string& option, const std::string& text) {
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) {
    throw flowlet::InvalidArgument(fmt::format("{}: {} needs a whole number; got '{}'", program, option, text));
  }
  return value;
}
inline double parse_number(const std::string& program, const std::string& option, const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || !std::isfinite(value)) {
    throw flowlet::InvalidArgument(fmt::format("{}: {} needs a finite number; got '{}'", program, option, text));
  }
  return value;
}

inline std::string non_empty(const std::string& program, const std::string& option, std::string text) {
  if (text.empty()) throw flowlet::InvalidArgument(fmt::format("{}: {} needs a value; got ''", program, option));
  return text;
}

struct CheckpointFlags {
  std::string directory;  // empty: no checkpoints
  int64_t every_steps = 0;
  std::optional<double> every_seconds;  // unset: 30 when a directory is given
  int64_t keep = 3;
  bool resume = false;
  bool needs_directory = false;  // an option other than --checkpoint-dir was given

  bool enabled() const { return !directory.empty(); }

  // Takes `arg` when it is one of the options above (value() reads its value); false otherwise.
  template <class Value>
  bool parse(const std::string& program, const std::string& arg, Value& value) {
    if (arg == "--checkpoint-dir") directory = non_empty(program, arg, value());
    else if (arg == "--checkpoint-every-steps") every_steps = parse_integer(program, arg, value());
    else if (arg == "--checkpoint-every-seconds") every_seconds = parse_number(program, arg, value());
    else if (arg == "--keep") keep = parse_integer(program, arg, value());
    else if (arg == "--resume") resume = true;
    else return false;
    needs_directory = needs_directory || arg != "--checkpoint-dir";
    return true;
  }

  // After parsing: the values make sense together (InvalidArgument naming them otherwise).
  void check(const std::string& program) const {
    if (every_steps < 0 || (every_seconds && *every_seconds < 0) || keep < 1 || keep > 1'000'000) {
      throw flowlet::InvalidArgument(fmt::format(
          "{}: --checkpoint-every-steps and --checkpoint-every-seconds must be >= 0 and --keep in [1, 1000000]; "
          "got {}, {}, {}",
          program, every_steps, every_seconds.value_or(30), keep));
    }
    if (!enabled() && needs_directory) {
      throw flowlet::InvalidArgument(fmt::format(
          "{}: --resume, --keep, --checkpoint-every-steps and --checkpoint-every-seconds need --checkpoint-dir",
          program));
    }
  }

  double seconds() const { return every_seconds.value_or(30.0); }

  flowlet::DistributedCheckpointOptions options() const {
    flowlet::DistributedCheckpointOptions options;
    options.max_to_keep = static_cast<int>(keep);
    options.every_steps = every_steps;
    options.every_seconds = seconds();
    return options;
  }

  // "every 5 steps or 30 s", for the run's opening lines.
  std::string rules() const {
    std::string text;
    if (every_steps > 0) text = fmt::format("every {} steps", every_steps);
    if (seconds() > 0) text += fmt::format("{}every {:g} s", text.empty() ? "" : " or ", seconds());
    return text.empty() ? "only at the end" : text;
  }
};

// "resumed from checkpoint <dir> at step S (<position>), saved by N process(es), in X ms"
inline std::string describe_restore(const flowlet::RestoredCheckpoint& restored, const std::string& position,
                                    double seconds) {
  return fmt::format("resumed from checkpoint {} at step {} ({}), saved by {} process(es), in {:.1f} ms\n",
                     restored.path, restored.step, position, restored.saved_processes, seconds * 1e3);
}

// One line on a run's saves: how many, and the last complete one's figures.
inline std::string describe_saves(int64_t saves, const flowlet::CheckpointSaveStats& last) {
  if (saves == 0) return "checkpoints: none saved in this run\n";
  return fmt::format(
      "checkpoints: {} saved in this run; the last (step {}): copy {:.2f} ms (training waited), write {:.1f} ms "
      "(background), {} bytes (this process), {} bytes (all processes)\n",
      saves, last.step, last.copy_seconds * 1e3, last.write_seconds * 1e3, last.bytes, last.total_bytes);
}

// A value of the checkpoint's metadata that the example itself wrote; InvalidArgument naming the
// checkpoint when it is missing (a checkpoint of another program).
inline int64_t metadata_value(const flowlet::RestoredCheckpoint& restored, const std::string& key,
                              const std::string& program) {
  const auto found = restored.metadata.find(key);
  if (found == restored.metadata.end()) {
    throw flowlet::InvalidArgument(fmt::format(
        "{}: checkpoint {} has no '{}' in its metadata: not one of this program's", program, restored.path, key));
  }
  return found->second;
}

}  // namespace examples
