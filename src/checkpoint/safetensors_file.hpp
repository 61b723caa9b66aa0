// One safetensors file on disk, the way flowlet writes and reads it: shared by save_checkpoint /
// restore_checkpoint (one file per checkpoint) and the distributed manager (one file per shard).
//
// Layout: an 8-byte little-endian header length, a JSON header with one entry per tensor and
// `__metadata__` {"step", "format": "flowlet", "crc32" of the data section, "header_crc32", extra
// string pairs}, spaces so the data starts 8-byte aligned, then each tensor's raw bytes in order.
// `header_crc32` covers the 8-byte length and the whole header (padding included) with its own value
// read as "00000000", so any single corrupted byte anywhere in the file is detected.
//
// Writes are atomic: a temporary file in the same directory, fsync, rename, fsync of the directory.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "flowlet/core/tensor.hpp"

namespace flowlet::checkpoint {

// safetensors dtype names ("F32", ...) and back.
std::string_view safetensors_dtype_name(DType dtype);
std::optional<DType> dtype_from_safetensors(std::string_view name);

uint32_t crc32_update(uint32_t crc, const void* data, size_t bytes);
std::string hex32(uint32_t value);                         // 8 lowercase hex digits
bool parse_hex32(std::string_view text, uint32_t& value);  // exactly 8 lowercase hex digits
// Strict decimal int64: optional '-', digits, no leading zeros, no "-0".
bool parse_int64(std::string_view text, int64_t& value);

// A tensor to write: host, contiguous.
struct NamedTensor {
  std::string name;
  Tensor value;
};

// What a write produced: the file's size and the CRC-32 of all its bytes.
struct WrittenFile {
  int64_t bytes = 0;
  uint32_t crc32 = 0;
};

// Writes the bytes of `parts`, one after another, to `path` atomically: a temporary file
// `<path>.tmp.<pid>.<n>` in the same directory, fsync, rename over `path`, fsync of the directory, so
// a crash at any moment leaves the old file (or none) at `path`. `before_rename` runs once the data
// is durable, before the rename (a test hook). Errors: InvalidArgument "<op>: cannot ... '<file>': <why>".
struct ByteSpan {
  const void* data = nullptr;
  size_t bytes = 0;
};
void write_file_atomically(const std::string& path, const std::vector<ByteSpan>& parts, std::string_view op,
                           const std::function<void()>& before_rename = {});

// Writes `tensors` (names unique, valid UTF-8, not "__metadata__": the caller checks) to `path`
// atomically. `extra_metadata` adds string pairs to `__metadata__` (keys other than step, format,
// crc32, header_crc32). `before_rename` runs once the data is written, before the temporary file
// is renamed over `path` (a test hook). Errors: InvalidArgument "<op>: cannot ... '<file>': <why>".
WrittenFile write_safetensors_file(const std::string& path, const std::vector<NamedTensor>& tensors, int64_t step,
                                   const std::vector<std::pair<std::string, std::string>>& extra_metadata,
                                   std::string_view op, const std::function<void()>& before_rename = {});

struct SafetensorsEntry {
  std::string name;
  DType dtype = f32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // within the data section
};

struct SafetensorsHeader {
  int64_t step = 0;
  uint32_t data_crc = 0;                  // as recorded
  uint32_t prefix_crc = 0;                // CRC-32 of the 8-byte length and the header text as they are in the file
  std::vector<SafetensorsEntry> entries;  // sorted by begin; they tile [0, data_bytes)
  uint64_t data_start = 0, data_bytes = 0;
  std::map<std::string, std::string> metadata;  // every __metadata__ pair
};

// An open regular file whose header has been read and validated in full (everything except the
// data checksum). Errors are InvalidArgument naming `op` and the path:
// "<op>: '<path>' is not a valid flowlet checkpoint: <why>", "<op>: cannot open '<path>': ...".
class SafetensorsFile {
 public:
  SafetensorsFile(std::string path, std::string_view op);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const SafetensorsHeader& header() const { return header_; }
  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }

  // Reads `bytes` at file offset `offset` (the whole read or InvalidArgument).
  void read(void* data, size_t bytes, uint64_t offset) const;

  // Reads the data section in file order. `destination(k)` returns where entry k goes (a host
  // contiguous tensor of its shape) or nullptr to only checksum it. Returns the data's CRC-32.
  uint32_t read_data(const std::function<Tensor*(size_t)>& destination) const;

  // Every entry as a new host tensor, with the data checksum and BOOL bytes checked; `file_crc`
  // gets the CRC-32 of the whole file.
  std::vector<Tensor> read_all(uint32_t& file_crc) const;

 private:
  std::string path_;
  std::string op_;
  int fd_ = -1;
  uint64_t size_ = 0;
  SafetensorsHeader header_;
};

}  // namespace flowlet::checkpoint
