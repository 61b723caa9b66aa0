// The Reader of a checkpoint being restored: its manifest (read, parsed and validated on
// construction) and its shard files, each validated in full the first time it is touched.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/distributed/manifest.hpp"
#include "checkpoint/distributed/source.hpp"

namespace flowlet::detail::ckpt {

class CheckpointReader final : public Reader {
 public:
  // Reads `<path>/manifest.json` (InvalidArgument naming it when it is missing, too large, corrupt,
  // or of another step than the directory's name says: `expected_step` >= 0).
  CheckpointReader(std::string path, int64_t expected_step, std::string op);

  int64_t step() const override { return manifest_.step; }
  const std::string& path() const override { return path_; }
  int saved_processes() const override { return manifest_.processes; }
  const std::map<std::string, std::string>& attributes() const override { return manifest_.attributes; }
  const std::vector<TensorRecord>& tensors() const override { return manifest_.tensors; }
  const TensorRecord* find(const std::string& tensor) const override;
  using Reader::read;
  Tensor read(const std::string& tensor, int64_t row_begin, int64_t row_end) override;

  const Manifest& manifest() const { return manifest_; }
  const std::string& manifest_path() const { return manifest_path_; }
  // Validates shard `index` (of manifest().shards) in full: size and CRC-32 against the manifest,
  // the safetensors structure and checksums, the step, every entry the manifest places in it.
  void validate_shard(size_t index);

 private:
  struct LoadedShard {
    std::map<std::string, Tensor> entries;
  };
  LoadedShard& shard(const std::string& name);

  std::string path_, manifest_path_, op_;
  Manifest manifest_;
  std::map<std::string, size_t> tensor_index_, shard_index_;
  std::map<size_t, std::unique_ptr<LoadedShard>> loaded_;
};

}  // namespace flowlet::detail::ckpt
