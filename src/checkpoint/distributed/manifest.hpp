// A distributed checkpoint's manifest (`manifest.json`): what it holds, how it is written as JSON,
// and the strict parser and validator that read it back.
//
// {"format": "flowlet-distributed-checkpoint", "version": 1, "step": 120, "processes": 2,
//  "cluster": "2 processes", "attributes": {"ps.servers": "2"}, "metadata": {"epoch": 3},
//  "shards": [{"name": "variables-p0", "file": "variables-p0.1f2e....safetensors", "bytes": 4096,
//              "crc32": "89abcdef", "process": 0}, ...],
//  "tensors": [{"name": "w", "dtype": "F32", "shape": [784, 256],
//               "pieces": [{"shard": "variables-p0", "entry": "w", "rows": [0, 784]}]}, ...],
//  "manifest_crc32": "01234567"}
//
// `manifest_crc32` is the CRC-32 of the whole text with its own value read as "00000000", so a
// flipped byte anywhere is detected even where the JSON stays valid.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/distributed/source.hpp"

namespace flowlet::detail::ckpt {

inline constexpr std::string_view kManifestFormat = "flowlet-distributed-checkpoint";
inline constexpr int64_t kManifestVersion = 1;
inline constexpr std::string_view kManifestFile = "manifest.json";
inline constexpr uint64_t kMaxManifestBytes = 256u << 20;

struct ShardRecord {
  std::string name;  // ShardContent::name
  std::string file;  // in the checkpoint's directory
  int64_t bytes = 0;
  uint32_t crc32 = 0;
  int process = 0;  // which process wrote it
};

struct Manifest {
  int64_t step = -1;
  int processes = 1;
  std::string cluster;                            // "2 processes", for messages
  std::map<std::string, std::string> attributes;  // the sources' (Source::snapshot)
  std::map<std::string, int64_t> metadata;        // save()'s
  std::vector<ShardRecord> shards;
  std::vector<TensorRecord> tensors;
};

// The manifest as JSON text, `manifest_crc32` filled in.
std::string manifest_to_json(const Manifest& manifest);

// Parses `text` read from `path`. `validate`: also apply validate_manifest (a full manifest); false
// for the partial records processes send to process 0 (shards and pieces of one process).
// InvalidArgument "<op>: manifest '<path>' is not valid: <field>: <why>".
Manifest parse_manifest(std::string_view text, const std::string& path, std::string_view op, bool validate = true);

// Checks the manifest's consistency: names unique, shard names [a-z0-9_-]+ and files plain names
// ending in .safetensors, processes in range, dtypes known, pieces naming existing shards and tiling
// every tensor's rows exactly, sizes that fit the shard files. Throws as parse_manifest does.
void validate_manifest(const Manifest& manifest, const std::string& path, std::string_view op);

// The bytes of rows [row_begin, row_end) of a tensor of `shape` and `dtype` (rank 0: the element).
int64_t piece_bytes(const Shape& shape, DType dtype, int64_t row_begin, int64_t row_end);

}  // namespace flowlet::detail::ckpt
