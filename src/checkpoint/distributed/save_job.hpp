// One save of a distributed checkpoint after the copy: what the background thread does.
//
//  1. Every process writes its shard files into `<prefix>-<step>/` with the atomic safetensors
//     writer (`<shard>.<random id>.safetensors`, the step in its __metadata__).
//  2. The shards' records (file, size, CRC-32, where each tensor's rows are) or the error that
//     stopped the writes are all-gathered on the manager's background communicator.
//  3. Process 0 joins them into the manifest, validates it, writes `manifest.json` atomically (the
//     checkpoint now exists) and cleans up (superseded, retention, incomplete saves).
//  4. Process 0's outcome is all-gathered, so every process's save succeeds or fails alike.
//
// Test hook: FLOWLET_CHECKPOINT_TEST_WRITE_DELAY_MS=N (read once per process) sleeps N ms after each
// shard file's data is written and synced, before its rename, and before the manifest is written,
// so that a chaos test's SIGKILL can land inside a write. Unset or 0: no delay.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/distributed/source.hpp"
#include "collective/communicator.hpp"

namespace flowlet::detail::ckpt {

struct SaveJob {
  std::string op;  // names errors: "DistributedCheckpointManager::save"
  std::string directory, prefix;
  int max_to_keep = 5;
  int64_t step = 0;
  std::map<std::string, int64_t> metadata;
  std::map<std::string, std::string> attributes;
  std::vector<ShardContent> shards;  // this process's
  ProcessView view;
  Communicator* comm = nullptr;  // the background communicator; null in a job of one process
  double copy_seconds = 0;
  std::chrono::steady_clock::time_point copied;  // when the copy ended
};

// Runs steps 1-4; throws the agreed error (the same on every process). Collective.
CheckpointSaveStats run_save_job(SaveJob& job);

// The test hook's delay in ms (0 when unset).
int test_write_delay_ms();

}  // namespace flowlet::detail::ckpt
