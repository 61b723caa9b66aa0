// libFuzzer target: restore_checkpoint on arbitrary file bytes (header JSON, offsets, checksums, data).
//
// Invariants checked on every input: restore either returns or throws a flowlet::Error (any other
// exception, a crash or a sanitizer report is a finding), and a restore that throws leaves every
// variable exactly as it was. The variables match the seed checkpoints (corpus/checkpoint_restore).
// Both checksums reject nearly every mutation before the entry and data checks, which a fuzzer
// cannot satisfy by chance, so each input is restored twice: as it is, and with both checksums
// recomputed over the mutated bytes.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <string>
#include <vector>

#include <zlib.h>

#include <flowlet/flowlet.hpp>

#include "memory_file.hpp"

namespace fl = flowlet;

namespace {

// The variables the seeds were saved from: several dtypes, rank 0, a zero-size dimension, a BOOL.
std::vector<fl::Variable> make_variables() {
  return {
      fl::Variable(fl::tensor(std::vector<float>{1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, 6.0f}, {2, 3}), "dense/kernel"),
      fl::Variable(fl::tensor({1.0 / 3.0, -1e300}), "bias"),
      fl::Variable(fl::scalar<int64_t>(-12345), "global_step"),
      fl::Variable(fl::tensor(std::vector<bool>{true, false, false, true}, {2, 2}), "mask"),
      fl::Variable(fl::zeros({0, 4}, fl::f32), "empty"),
  };
}

std::string snapshot(const std::vector<fl::Variable>& vars) {
  std::string bytes;
  for (const fl::Variable& v : vars) {
    const fl::Tensor t = v.value().contiguous();
    bytes += fl::dtype_name(t.dtype());
    bytes += fmt::format("{}", t.shape());
    bytes.append(static_cast<const char*>(t.raw_data()), static_cast<size_t>(t.numel()) * fl::dtype_size(t.dtype()));
  }
  return bytes;
}

void write_hex32(uint8_t* at, uint32_t value) {
  static constexpr char kDigits[] = "0123456789abcdef";
  for (int i = 7; i >= 0; --i, value >>= 4) at[i] = static_cast<uint8_t>(kDigits[value & 0xf]);
}

uint32_t crc32_of(const uint8_t* data, size_t size, uint32_t crc = 0) {
  return static_cast<uint32_t>(::crc32(crc, data, static_cast<uInt>(size)));
}

// The input with `crc32` (of the data section) and `header_crc32` (of the length and the header
// with its own value read as "00000000") recomputed where the header holds them; false when there
// is nothing to recompute.
bool with_checksums_recomputed(const uint8_t* data, size_t size, std::vector<uint8_t>& out) {
  if (size < 8) return false;
  uint64_t header_bytes;
  std::memcpy(&header_bytes, data, 8);
  if (header_bytes > size - 8) return false;
  out.assign(data, data + size);
  uint8_t* header = out.data() + 8;
  const std::string_view text(reinterpret_cast<const char*>(header), header_bytes);
  bool changed = false;
  constexpr std::string_view kDataCrc = "\"crc32\":\"", kHeaderCrc = "\"header_crc32\":\"";
  if (const size_t at = text.find(kDataCrc); at != std::string_view::npos && at + kDataCrc.size() + 8 <= text.size()) {
    write_hex32(header + at + kDataCrc.size(), crc32_of(header + header_bytes, size - 8 - header_bytes));
    changed = true;
  }
  if (const size_t at = text.find(kHeaderCrc); at != std::string_view::npos && at + kHeaderCrc.size() + 8 <= text.size()) {
    uint8_t* value = header + at + kHeaderCrc.size();
    std::memset(value, '0', 8);
    write_hex32(value, crc32_of(header, header_bytes, crc32_of(out.data(), 8)));
    changed = true;
  }
  return changed && !std::equal(out.begin(), out.end(), data);
}

void restore_keeps_invariants(fuzz::MemoryFile& file, const std::vector<fl::Variable>& vars, const uint8_t* data,
                              size_t size) {
  file.write(data, size);
  const std::string before = snapshot(vars);
  try {
    fl::restore_checkpoint(file.path(), vars);
  } catch (const fl::Error&) {
    if (snapshot(vars) != before) std::abort();  // a failed restore changed a variable
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemoryFile file("fuzz_checkpoint");
  static const std::vector<fl::Variable> vars = make_variables();
  static std::vector<uint8_t> repaired;
  restore_keeps_invariants(file, vars, data, size);
  if (with_checksums_recomputed(data, size, repaired)) restore_keeps_invariants(file, vars, repaired.data(), repaired.size());
  return 0;
}
