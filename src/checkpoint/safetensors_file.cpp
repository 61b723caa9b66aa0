// The safetensors file writer and validating reader (see safetensors_file.hpp for the layout).
#include "checkpoint/safetensors_file.hpp"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>

#include "checkpoint/header_json.hpp"
#include "core/check.hpp"
#include "core/user_text.hpp"

namespace flowlet::checkpoint {

namespace {

static_assert(std::endian::native == std::endian::little,
              "checkpoints store little-endian bytes as they are in memory");

constexpr std::string_view kMetadataKey = "__metadata__";
constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // the limit Python's safetensors enforces

// safetensors dtype names, indexed by DType.
constexpr std::array<std::string_view, kNumDTypes> kSafetensorsNames = {"F32", "F64",  "I32", "I64",
                                                                        "U8",  "BOOL", "F16", "BF16"};

std::string errno_text(int error) { return std::strerror(error); }

// Closes a file descriptor on scope exit.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void write_all(int fd, const void* data, size_t bytes, const std::string& tmp_path, std::string_view op) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, std::min<size_t>(bytes, 1u << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      detail::fail<InvalidArgument>("{}: cannot write '{}': {}", op, tmp_path, errno_text(errno));
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

std::string parent_directory(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// The whole header text, padded so that 8 + size is a multiple of 8, with `header_crc32` filled in.
std::string build_header(const std::vector<NamedTensor>& tensors, int64_t step, uint32_t data_crc,
                         const std::vector<std::pair<std::string, std::string>>& extra_metadata) {
  std::string json = "{\"__metadata__\":{\"step\":\"" + std::to_string(step) +
                     "\",\"format\":\"flowlet\",\"crc32\":\"" + hex32(data_crc) + "\"";
  for (const auto& [key, value] : extra_metadata) {
    json += ',';
    append_json_string(json, key);
    json += ':';
    append_json_string(json, value);
  }
  json += ",\"header_crc32\":\"";
  const size_t header_crc_pos = json.size();
  json += "00000000\"}";
  uint64_t offset = 0;
  for (const NamedTensor& t : tensors) {
    const uint64_t bytes = static_cast<uint64_t>(t.value.numel()) * dtype_size(t.value.dtype());
    json += ',';
    append_json_string(json, t.name);
    json += fmt::format(":{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                        safetensors_dtype_name(t.value.dtype()), fmt::join(t.value.shape().to_vector(), ","), offset,
                        offset + bytes);
    offset += bytes;
  }
  json += '}';
  json.append((8 - json.size() % 8) % 8, ' ');  // 8 + json.size() is then a multiple of 8

  uint8_t prefix[8];
  const uint64_t length = json.size();
  std::memcpy(prefix, &length, 8);
  uint32_t crc = crc32_update(0, prefix, 8);
  crc = crc32_update(crc, json.data(), json.size());
  json.replace(header_crc_pos, 8, hex32(crc));
  return json;
}

// InvalidArgument "<op>: '<path>' is not a valid flowlet checkpoint: <why>".
template <class... Args>
[[noreturn]] void corrupt(std::string_view op, const std::string& path, fmt::format_string<Args...> format,
                          Args&&... args) {
  throw InvalidArgument(fmt::format("{}: '{}' is not a valid flowlet checkpoint: {}", op, path,
                                    fmt::format(format, std::forward<Args>(args)...)));
}

std::atomic<uint64_t> g_save_counter{0};

}  // namespace

std::string_view safetensors_dtype_name(DType dtype) { return kSafetensorsNames[static_cast<int>(dtype)]; }

std::optional<DType> dtype_from_safetensors(std::string_view name) {
  for (int i = 0; i < kNumDTypes; ++i) {
    if (kSafetensorsNames[i] == name) return static_cast<DType>(i);
  }
  return std::nullopt;
}

uint32_t crc32_update(uint32_t crc, const void* data, size_t bytes) {
  const auto* p = static_cast<const Bytef*>(data);
  while (bytes > 0) {  // zlib takes uInt lengths
    const auto chunk = static_cast<uInt>(std::min<size_t>(bytes, 1u << 30));
    crc = static_cast<uint32_t>(::crc32(crc, p, chunk));
    p += chunk;
    bytes -= chunk;
  }
  return crc;
}

std::string hex32(uint32_t value) { return fmt::format("{:08x}", value); }

bool parse_hex32(std::string_view text, uint32_t& value) {
  if (text.size() != 8) return false;
  value = 0;
  for (const char c : text) {
    uint32_t digit;
    if (c >= '0' && c <= '9') {
      digit = static_cast<uint32_t>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      digit = static_cast<uint32_t>(c - 'a' + 10);
    } else {
      return false;  // lowercase only: one spelling per value
    }
    value = value * 16 + digit;
  }
  return true;
}

bool parse_int64(std::string_view text, int64_t& value) {
  const bool negative = !text.empty() && text[0] == '-';
  const std::string_view digits = negative ? text.substr(1) : text;
  if (digits.empty() || digits.size() > 19) return false;
  if (digits[0] == '0' && (digits.size() > 1 || negative)) return false;
  uint64_t magnitude = 0;
  for (const char c : digits) {
    if (c < '0' || c > '9') return false;
    magnitude = magnitude * 10 + static_cast<uint64_t>(c - '0');
  }
  const uint64_t limit = negative ? uint64_t{1} << 63 : (uint64_t{1} << 63) - 1;
  if (magnitude > limit) return false;
  value = negative ? static_cast<int64_t>(0 - magnitude) : static_cast<int64_t>(magnitude);
  return true;
}

void write_file_atomically(const std::string& path, const std::vector<ByteSpan>& parts, std::string_view op,
                           const std::function<void()>& before_rename) {
  // Unique per process and per call, so concurrent saves to one path never share a temporary file.
  const std::string tmp_path = fmt::format("{}.tmp.{}.{}", path, ::getpid(), g_save_counter.fetch_add(1));
  Fd file(::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (file.fd < 0) {
    detail::fail<InvalidArgument>(
        "{}: cannot create '{}' (next to '{}'): {}; check that the directory exists and is writable", op, tmp_path,
        path, errno_text(errno));
  }
  try {
    for (const ByteSpan& part : parts) {
      if (part.bytes > 0) write_all(file.fd, part.data, part.bytes, tmp_path, op);
    }
    if (::fsync(file.fd) != 0)
      detail::fail<InvalidArgument>("{}: cannot fsync '{}': {}", op, tmp_path, errno_text(errno));
    const int fd = file.fd;
    file.fd = -1;
    if (::close(fd) != 0) detail::fail<InvalidArgument>("{}: cannot close '{}': {}", op, tmp_path, errno_text(errno));
    if (before_rename) before_rename();
    if (::rename(tmp_path.c_str(), path.c_str()) != 0) {
      detail::fail<InvalidArgument>("{}: cannot rename '{}' to '{}': {}", op, tmp_path, path, errno_text(errno));
    }
  } catch (...) {
    ::unlink(tmp_path.c_str());
    throw;
  }
  // Make the rename itself durable. Some file systems cannot fsync a directory (EINVAL): nothing more to do there.
  const std::string directory = parent_directory(path);
  Fd dir(::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.fd < 0 || (::fsync(dir.fd) != 0 && errno != EINVAL)) {
    detail::fail<InvalidArgument>("{}: saved '{}' but cannot fsync its directory '{}': {}", op, path, directory,
                                  errno_text(errno));
  }
}

WrittenFile write_safetensors_file(const std::string& path, const std::vector<NamedTensor>& tensors, int64_t step,
                                   const std::vector<std::pair<std::string, std::string>>& extra_metadata,
                                   std::string_view op, const std::function<void()>& before_rename) {
  uint32_t data_crc = 0;
  uint64_t data_bytes = 0;
  for (const NamedTensor& t : tensors) {
    const size_t bytes = static_cast<size_t>(t.value.numel()) * dtype_size(t.value.dtype());
    if (bytes > 0) data_crc = crc32_update(data_crc, t.value.raw_data(), bytes);
    data_bytes += bytes;
  }
  const std::string header = build_header(tensors, step, data_crc, extra_metadata);
  const uint64_t header_bytes = header.size();
  const uint32_t prefix_crc = crc32_update(crc32_update(0, &header_bytes, 8), header.data(), header.size());
  WrittenFile written;
  written.bytes = static_cast<int64_t>(8 + header_bytes + data_bytes);
  written.crc32 = static_cast<uint32_t>(::crc32_combine(prefix_crc, data_crc, static_cast<z_off_t>(data_bytes)));

  std::vector<ByteSpan> parts = {{&header_bytes, 8}, {header.data(), header.size()}};
  for (const NamedTensor& t : tensors) {
    parts.push_back({t.value.raw_data(), static_cast<size_t>(t.value.numel()) * dtype_size(t.value.dtype())});
  }
  write_file_atomically(path, parts, op, before_rename);
  return written;
}

// ---------------------------------------------------------------------------------------------
// Reading.

SafetensorsFile::SafetensorsFile(std::string path, std::string_view op) : path_(std::move(path)), op_(op) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever. The type is
  // checked on the open descriptor, so the file cannot be swapped between the check and the reads.
  fd_ = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd_ < 0) detail::fail<InvalidArgument>("{}: cannot open '{}': {}", op_, path_, errno_text(errno));
  struct stat info {};
  if (::fstat(fd_, &info) != 0) {
    const int error = errno;
    ::close(fd_);
    detail::fail<InvalidArgument>("{}: cannot stat '{}': {}", op_, path_, errno_text(error));
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd_);
    detail::fail<InvalidArgument>("{}: '{}' is not a regular file; got a {}; checkpoints are regular files", op_, path_,
                                  detail::file_type_name(info.st_mode));
  }
  size_ = static_cast<uint64_t>(info.st_size);
  try {
    const std::string& p = path_;
    const uint64_t file_size = size_;
    if (file_size < 8) corrupt(op_, p, "the file has {} bytes, fewer than the 8-byte header length", file_size);
    uint8_t prefix[8];
    read(prefix, 8, 0);
    uint64_t header_bytes;
    std::memcpy(&header_bytes, prefix, 8);
    if (header_bytes > file_size - 8) {
      corrupt(op_, p, "the header length is {} bytes but only {} bytes follow it (truncated?)", header_bytes,
              file_size - 8);
    }
    if (header_bytes > kMaxHeaderBytes)
      corrupt(op_, p, "the header length is {} bytes, above the 100 MiB limit", header_bytes);
    std::string text(header_bytes, '\0');
    read(text.data(), text.size(), 8);
    header_.prefix_crc = crc32_update(crc32_update(0, prefix, 8), text.data(), text.size());

    const JsonValue root = parse_header_json(text, op_, p);
    if (root.kind != JsonValue::Kind::object) corrupt(op_, p, "the header is not a JSON object");

    SafetensorsHeader& header = header_;
    header.data_start = 8 + header_bytes;
    header.data_bytes = file_size - header.data_start;

    // Metadata: format, step and both checksums.
    const JsonValue* metadata = root.find(kMetadataKey);
    if (metadata == nullptr) corrupt(op_, p, "the header has no __metadata__ (not written by flowlet?)");
    if (metadata->kind != JsonValue::Kind::object) corrupt(op_, p, "__metadata__ is not an object");
    for (const auto& [key, value] : metadata->members) {
      if (value.kind != JsonValue::Kind::string) corrupt(op_, p, "__metadata__ value \"{}\" is not a string", key);
      header.metadata.emplace(key, value.string);
    }
    const auto field = [&](std::string_view key) -> const JsonValue& {
      const JsonValue* value = metadata->find(key);
      if (value == nullptr) corrupt(op_, p, "__metadata__ has no \"{}\"", key);
      return *value;
    };
    if (field("format").string != "flowlet")
      corrupt(op_, p, "__metadata__ format is \"{}\", not \"flowlet\"", field("format").string);
    if (!parse_int64(field("step").string, header.step))
      corrupt(op_, p, "__metadata__ step \"{}\" is not an integer", field("step").string);
    if (!parse_hex32(field("crc32").string, header.data_crc)) {
      corrupt(op_, p, "__metadata__ crc32 \"{}\" is not 8 lowercase hex digits", field("crc32").string);
    }
    const JsonValue& header_crc_field = field("header_crc32");
    uint32_t header_crc;
    if (!parse_hex32(header_crc_field.string, header_crc) ||
        header_crc_field.raw_end - header_crc_field.raw_begin != 8) {
      corrupt(op_, p, "__metadata__ header_crc32 \"{}\" is not 8 lowercase hex digits", header_crc_field.string);
    }
    std::string zeroed = text;
    zeroed.replace(header_crc_field.raw_begin, 8, "00000000");
    const uint32_t actual_header_crc = crc32_update(crc32_update(0, prefix, 8), zeroed.data(), zeroed.size());
    if (actual_header_crc != header_crc) {
      corrupt(op_, p,
              "the header checksum does not match (the header is corrupt); got crc32 {} but the file records {}",
              hex32(actual_header_crc), hex32(header_crc));
    }

    // Tensor entries.
    for (const auto& [name, value] : root.members) {
      if (name == kMetadataKey) continue;
      if (value.kind != JsonValue::Kind::object) corrupt(op_, p, "entry \"{}\" is not an object", name);
      for (const auto& member : value.members) {
        if (member.first != "dtype" && member.first != "shape" && member.first != "data_offsets") {
          corrupt(op_, p, "entry \"{}\" has an unknown key \"{}\"", name, member.first);
        }
      }
      const JsonValue* dtype = value.find("dtype");
      const JsonValue* shape = value.find("shape");
      const JsonValue* offsets = value.find("data_offsets");
      if (dtype == nullptr || dtype->kind != JsonValue::Kind::string)
        corrupt(op_, p, "entry \"{}\" has no string \"dtype\"", name);
      if (shape == nullptr || shape->kind != JsonValue::Kind::array)
        corrupt(op_, p, "entry \"{}\" has no integer array \"shape\"", name);
      if (offsets == nullptr || offsets->kind != JsonValue::Kind::array || offsets->array.size() != 2) {
        corrupt(op_, p, "entry \"{}\" has no \"data_offsets\" [begin, end]", name);
      }
      SafetensorsEntry entry;
      entry.name = name;
      const auto dt = dtype_from_safetensors(dtype->string);
      if (!dt)
        corrupt(op_, p, "entry \"{}\" has unknown dtype \"{}\"; flowlet reads F32 F64 I32 I64 U8 BOOL F16 BF16", name,
                dtype->string);
      entry.dtype = *dt;
      uint64_t numel = 1;
      bool overflow = false;
      for (const int64_t d : shape->array) {
        if (d < 0)
          corrupt(op_, p, "entry \"{}\" has a negative dimension; got shape [{}]", name, fmt::join(shape->array, ", "));
        if (d != 0 && numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / static_cast<uint64_t>(d)) {
          overflow = true;
        }
        numel *= static_cast<uint64_t>(d);
      }
      if (shape->array.size() > 64) corrupt(op_, p, "entry \"{}\" has rank {}", name, shape->array.size());
      entry.shape = Shape(shape->array);
      const int64_t begin = offsets->array[0], end = offsets->array[1];
      if (begin < 0 || end < begin) corrupt(op_, p, "entry \"{}\" has bad data_offsets [{}, {}]", name, begin, end);
      entry.begin = static_cast<uint64_t>(begin);
      entry.end = static_cast<uint64_t>(end);
      if (entry.end > header.data_bytes) {
        corrupt(op_, p, "entry \"{}\" data_offsets [{}, {}] run past the {}-byte data section (truncated?)", name,
                begin, end, header.data_bytes);
      }
      // numel * size cannot overflow once numel fits in the data section.
      if (overflow || numel > header.data_bytes || numel * dtype_size(entry.dtype) != entry.end - entry.begin) {
        corrupt(op_, p, "entry \"{}\" holds {} bytes but {} of shape {} needs {}", name, entry.end - entry.begin,
                kSafetensorsNames[static_cast<int>(entry.dtype)], entry.shape,
                overflow ? std::string("more than 2^63") : std::to_string(numel * dtype_size(entry.dtype)));
      }
      header.entries.push_back(std::move(entry));
    }
    std::sort(header.entries.begin(), header.entries.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    uint64_t expected = 0;
    for (const SafetensorsEntry& entry : header.entries) {
      if (entry.begin != expected) {
        corrupt(op_, p, "entry \"{}\" starts at data offset {} but the previous data ends at {} (overlap or gap)",
                entry.name, entry.begin, expected);
      }
      expected = entry.end;
    }
    if (expected != header.data_bytes) {
      corrupt(op_, p, "the data section has {} bytes but the entries cover {} (truncated or trailing bytes)",
              header.data_bytes, expected);
    }
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

void SafetensorsFile::read(void* data, size_t bytes, uint64_t offset) const {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd_, p, std::min<size_t>(bytes, 1u << 30), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      detail::fail<InvalidArgument>("{}: cannot read '{}': {}", op_, path_, errno_text(errno));
    }
    if (n == 0) detail::fail<InvalidArgument>("{}: '{}' ended early (it shrank while being read)", op_, path_);
    p += n;
    bytes -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
}

uint32_t SafetensorsFile::read_data(const std::function<Tensor*(size_t)>& destination) const {
  std::vector<char> scratch;
  uint32_t crc = 0;
  for (size_t k = 0; k < header_.entries.size(); ++k) {
    const SafetensorsEntry& entry = header_.entries[k];
    const uint64_t bytes = entry.end - entry.begin;
    const uint64_t offset = header_.data_start + entry.begin;
    if (Tensor* t = destination(k)) {
      if (bytes > 0) {
        read(t->raw_data(), bytes, offset);
        crc = crc32_update(crc, t->raw_data(), bytes);
      }
    } else {
      scratch.resize(std::min<uint64_t>(bytes, 4u << 20));
      for (uint64_t done = 0; done < bytes;) {
        const size_t chunk = std::min<uint64_t>(bytes - done, scratch.size());
        read(scratch.data(), chunk, offset + done);
        crc = crc32_update(crc, scratch.data(), chunk);
        done += chunk;
      }
    }
  }
  return crc;
}

std::vector<Tensor> SafetensorsFile::read_all(uint32_t& file_crc) const {
  std::vector<Tensor> tensors;
  tensors.reserve(header_.entries.size());
  for (const SafetensorsEntry& entry : header_.entries) tensors.push_back(Tensor::empty(entry.shape, entry.dtype));
  const uint32_t crc = read_data([&](size_t k) { return &tensors[k]; });
  if (crc != header_.data_crc) {
    corrupt(op_, path_, "the data checksum does not match (the data is corrupt); got crc32 {} but the file records {}",
            hex32(crc), hex32(header_.data_crc));
  }
  for (size_t k = 0; k < tensors.size(); ++k) {
    if (tensors[k].dtype() != b8) continue;
    const auto* bytes = static_cast<const uint8_t*>(tensors[k].raw_data());
    for (int64_t j = 0; j < tensors[k].numel(); ++j) {
      if (bytes[j] > 1) {
        corrupt(op_, path_, "entry \"{}\" holds a BOOL byte that is neither 0 nor 1; got {} at element {}",
                header_.entries[k].name, bytes[j], j);
      }
    }
  }
  file_crc = static_cast<uint32_t>(::crc32_combine(header_.prefix_crc, crc, static_cast<z_off_t>(header_.data_bytes)));
  return tensors;
}

}  // namespace flowlet::checkpoint
