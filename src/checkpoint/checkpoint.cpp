// save_checkpoint / restore_checkpoint: the safetensors layout, atomic writes, restores that check before assigning.
//
// Integrity: `crc32` covers the data section and `header_crc32` covers the 8-byte length and the
// whole header (padding included) with its own value read as "00000000", so any single corrupted
// byte anywhere in the file is detected, including the step, which no variable check would catch.
#include "flowlet/checkpoint.hpp"

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
#include <map>
#include <memory>
#include <optional>

#include "checkpoint/header_json.hpp"
#include "core/check.hpp"
#include "core/user_text.hpp"

namespace flowlet {

namespace {

using checkpoint::JsonValue;

static_assert(std::endian::native == std::endian::little,
              "checkpoints store little-endian bytes as they are in memory");

constexpr std::string_view kSave = "save_checkpoint";
constexpr std::string_view kRestore = "restore_checkpoint";
constexpr std::string_view kMetadataKey = "__metadata__";
constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // the limit Python's safetensors enforces

// safetensors dtype names, indexed by DType.
constexpr std::array<std::string_view, kNumDTypes> kSafetensorsNames = {"F32", "F64",  "I32", "I64",
                                                                        "U8",  "BOOL", "F16", "BF16"};

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

void write_all(int fd, const void* data, size_t bytes, const std::string& tmp_path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, std::min<size_t>(bytes, 1u << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      detail::fail<InvalidArgument>("{}: cannot write '{}': {}", kSave, tmp_path, errno_text(errno));
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

void check_names(std::string_view op, const std::vector<Variable>& vars) {
  std::map<std::string_view, size_t> seen;
  for (size_t i = 0; i < vars.size(); ++i) {
    if (!vars[i].defined()) {
      detail::fail<InvalidArgument>("{}: variable {} is an empty Variable handle; got Variable()", op, i);
    }
    const std::string& name = vars[i].name();
    if (name.empty()) {
      detail::fail<InvalidArgument>(
          "{}: variable {} has an empty name; got a {} {} variable; give every variable a unique name", op, i,
          vars[i].dtype(), vars[i].shape());
    }
    if (name == kMetadataKey) {
      detail::fail<InvalidArgument>("{}: variable {} is named '__metadata__', which safetensors reserves; rename it",
                                    op, i);
    }
    if (!checkpoint::is_valid_utf8(name)) {
      detail::fail<InvalidArgument>("{}: variable {} has a name that is not valid UTF-8; got {} bytes", op, i,
                                    name.size());
    }
    const auto [it, inserted] = seen.emplace(name, i);
    if (!inserted) {
      detail::fail<InvalidArgument>("{}: duplicate variable name '{}'; got it at positions {} and {}", op, name,
                                    it->second, i);
    }
  }
}

// The whole header text for `values`, padded so that 8 + size is a multiple of 8, with `header_crc32` filled in.
std::string build_header(const std::vector<Variable>& vars, const std::vector<Tensor>& values, int64_t step,
                         uint32_t data_crc) {
  std::string json = "{\"__metadata__\":{\"step\":\"" + std::to_string(step) +
                     "\",\"format\":\"flowlet\",\"crc32\":\"" + hex32(data_crc) + "\",\"header_crc32\":\"";
  const size_t header_crc_pos = json.size();
  json += "00000000\"}";
  uint64_t offset = 0;
  for (size_t i = 0; i < vars.size(); ++i) {
    const Tensor& t = values[i];
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * dtype_size(t.dtype());
    json += ',';
    checkpoint::append_json_string(json, vars[i].name());
    json += fmt::format(":{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                        kSafetensorsNames[static_cast<int>(t.dtype())], fmt::join(t.shape().to_vector(), ","), offset,
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

// ---------------------------------------------------------------------------------------------
// Reading.

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

struct Header {
  int64_t step = 0;
  uint32_t data_crc = 0;
  std::vector<Entry> entries;  // sorted by begin; they tile [0, data_bytes)
  uint64_t data_start = 0, data_bytes = 0;
};

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

// Strict decimal int64: optional '-', digits, no leading zeros, no "-0".
bool parse_step(std::string_view text, int64_t& value) {
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

void read_exact(int fd, void* data, size_t bytes, uint64_t offset, const std::string& path) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, p, std::min<size_t>(bytes, 1u << 30), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      detail::fail<InvalidArgument>("{}: cannot read '{}': {}", kRestore, path, errno_text(errno));
    }
    if (n == 0) detail::fail<InvalidArgument>("{}: '{}' ended early (it shrank while being read)", kRestore, path);
    p += n;
    bytes -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
}

// InvalidArgument "restore_checkpoint: '<path>' is not a valid flowlet checkpoint: <why>".
template <class... Args>
[[noreturn]] void corrupt(const std::string& path, fmt::format_string<Args...> format, Args&&... args) {
  throw InvalidArgument(fmt::format("{}: '{}' is not a valid flowlet checkpoint: {}", kRestore, path,
                                    fmt::format(format, std::forward<Args>(args)...)));
}

// Reads and validates everything except the data checksum; throws InvalidArgument naming `path`.
Header read_header(int fd, uint64_t file_size, const std::string& path) {
  if (file_size < 8) corrupt(path, "the file has {} bytes, fewer than the 8-byte header length", file_size);
  uint8_t prefix[8];
  read_exact(fd, prefix, 8, 0, path);
  uint64_t header_bytes;
  std::memcpy(&header_bytes, prefix, 8);
  if (header_bytes > file_size - 8) {
    corrupt(path, "the header length is {} bytes but only {} bytes follow it (truncated?)", header_bytes,
            file_size - 8);
  }
  if (header_bytes > kMaxHeaderBytes)
    corrupt(path, "the header length is {} bytes, above the 100 MiB limit", header_bytes);
  std::string text(header_bytes, '\0');
  read_exact(fd, text.data(), text.size(), 8, path);

  const JsonValue root = checkpoint::parse_header_json(text, kRestore, path);
  if (root.kind != JsonValue::Kind::object) corrupt(path, "the header is not a JSON object");

  Header header;
  header.data_start = 8 + header_bytes;
  header.data_bytes = file_size - header.data_start;

  // Metadata: format, step and both checksums.
  const JsonValue* metadata = root.find(kMetadataKey);
  if (metadata == nullptr) corrupt(path, "the header has no __metadata__ (not written by flowlet?)");
  if (metadata->kind != JsonValue::Kind::object) corrupt(path, "__metadata__ is not an object");
  for (const auto& [key, value] : metadata->members) {
    if (value.kind != JsonValue::Kind::string) corrupt(path, "__metadata__ value \"{}\" is not a string", key);
  }
  const auto field = [&](std::string_view key) -> const JsonValue& {
    const JsonValue* value = metadata->find(key);
    if (value == nullptr) corrupt(path, "__metadata__ has no \"{}\"", key);
    return *value;
  };
  if (field("format").string != "flowlet")
    corrupt(path, "__metadata__ format is \"{}\", not \"flowlet\"", field("format").string);
  if (!parse_step(field("step").string, header.step))
    corrupt(path, "__metadata__ step \"{}\" is not an integer", field("step").string);
  if (!parse_hex32(field("crc32").string, header.data_crc)) {
    corrupt(path, "__metadata__ crc32 \"{}\" is not 8 lowercase hex digits", field("crc32").string);
  }
  const JsonValue& header_crc_field = field("header_crc32");
  uint32_t header_crc;
  if (!parse_hex32(header_crc_field.string, header_crc) || header_crc_field.raw_end - header_crc_field.raw_begin != 8) {
    corrupt(path, "__metadata__ header_crc32 \"{}\" is not 8 lowercase hex digits", header_crc_field.string);
  }
  std::string zeroed = text;
  zeroed.replace(header_crc_field.raw_begin, 8, "00000000");
  const uint32_t actual_header_crc = crc32_update(crc32_update(0, prefix, 8), zeroed.data(), zeroed.size());
  if (actual_header_crc != header_crc) {
    corrupt(path, "the header checksum does not match (the header is corrupt); got crc32 {} but the file records {}",
            hex32(actual_header_crc), hex32(header_crc));
  }

  // Tensor entries.
  for (const auto& [name, value] : root.members) {
    if (name == kMetadataKey) continue;
    if (value.kind != JsonValue::Kind::object) corrupt(path, "entry \"{}\" is not an object", name);
    for (const auto& member : value.members) {
      if (member.first != "dtype" && member.first != "shape" && member.first != "data_offsets") {
        corrupt(path, "entry \"{}\" has an unknown key \"{}\"", name, member.first);
      }
    }
    const JsonValue* dtype = value.find("dtype");
    const JsonValue* shape = value.find("shape");
    const JsonValue* offsets = value.find("data_offsets");
    if (dtype == nullptr || dtype->kind != JsonValue::Kind::string)
      corrupt(path, "entry \"{}\" has no string \"dtype\"", name);
    if (shape == nullptr || shape->kind != JsonValue::Kind::array)
      corrupt(path, "entry \"{}\" has no integer array \"shape\"", name);
    if (offsets == nullptr || offsets->kind != JsonValue::Kind::array || offsets->array.size() != 2) {
      corrupt(path, "entry \"{}\" has no \"data_offsets\" [begin, end]", name);
    }
    Entry entry;
    entry.name = name;
    const auto dt = dtype_from_safetensors(dtype->string);
    if (!dt)
      corrupt(path, "entry \"{}\" has unknown dtype \"{}\"; flowlet reads F32 F64 I32 I64 U8 BOOL F16 BF16", name,
              dtype->string);
    entry.dtype = *dt;
    uint64_t numel = 1;
    bool overflow = false;
    for (const int64_t d : shape->array) {
      if (d < 0)
        corrupt(path, "entry \"{}\" has a negative dimension; got shape [{}]", name, fmt::join(shape->array, ", "));
      if (d != 0 && numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / static_cast<uint64_t>(d)) {
        overflow = true;
      }
      numel *= static_cast<uint64_t>(d);
    }
    if (shape->array.size() > 64) corrupt(path, "entry \"{}\" has rank {}", name, shape->array.size());
    entry.shape = Shape(shape->array);
    const int64_t begin = offsets->array[0], end = offsets->array[1];
    if (begin < 0 || end < begin) corrupt(path, "entry \"{}\" has bad data_offsets [{}, {}]", name, begin, end);
    entry.begin = static_cast<uint64_t>(begin);
    entry.end = static_cast<uint64_t>(end);
    if (entry.end > header.data_bytes) {
      corrupt(path, "entry \"{}\" data_offsets [{}, {}] run past the {}-byte data section (truncated?)", name, begin,
              end, header.data_bytes);
    }
    // numel * size cannot overflow once numel fits in the data section.
    if (overflow || numel > header.data_bytes || numel * dtype_size(entry.dtype) != entry.end - entry.begin) {
      corrupt(path, "entry \"{}\" holds {} bytes but {} of shape {} needs {}", name, entry.end - entry.begin,
              kSafetensorsNames[static_cast<int>(entry.dtype)], entry.shape,
              overflow ? std::string("more than 2^63") : std::to_string(numel * dtype_size(entry.dtype)));
    }
    header.entries.push_back(std::move(entry));
  }
  std::sort(header.entries.begin(), header.entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  uint64_t expected = 0;
  for (const Entry& entry : header.entries) {
    if (entry.begin != expected) {
      corrupt(path, "entry \"{}\" starts at data offset {} but the previous data ends at {} (overlap or gap)",
              entry.name, entry.begin, expected);
    }
    expected = entry.end;
  }
  if (expected != header.data_bytes) {
    corrupt(path, "the data section has {} bytes but the entries cover {} (truncated or trailing bytes)",
            header.data_bytes, expected);
  }
  return header;
}

std::atomic<uint64_t> g_save_counter{0};

}  // namespace

void save_checkpoint(std::string path, std::vector<Variable> vars, int64_t step) {
  detail::check_path(kSave, "path", path);
  check_names(kSave, vars);
  // Snapshot every value first (a consistent set even if another thread updates a variable later).
  std::vector<Tensor> values;
  values.reserve(vars.size());
  uint32_t data_crc = 0;
  for (const Variable& var : vars) {
    const Tensor value = var.value();
    Tensor host = value.device().kind() == DeviceKind::cpu ? value.contiguous() : value.to(Device()).contiguous();
    if (host.numel() > 0) {
      data_crc = crc32_update(data_crc, host.raw_data(), static_cast<size_t>(host.numel()) * dtype_size(host.dtype()));
    }
    values.push_back(std::move(host));
  }
  const std::string header = build_header(vars, values, step, data_crc);

  // Unique per process and per call, so concurrent saves to one path never share a temporary file.
  const std::string tmp_path = fmt::format("{}.tmp.{}.{}", path, ::getpid(), g_save_counter.fetch_add(1));
  Fd file(::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (file.fd < 0) {
    detail::fail<InvalidArgument>(
        "{}: cannot create '{}' (next to '{}'): {}; check that the directory exists and is writable", kSave, tmp_path,
        path, errno_text(errno));
  }
  try {
    const uint64_t header_bytes = header.size();
    write_all(file.fd, &header_bytes, 8, tmp_path);
    write_all(file.fd, header.data(), header.size(), tmp_path);
    for (const Tensor& t : values) {
      if (t.numel() > 0)
        write_all(file.fd, t.raw_data(), static_cast<size_t>(t.numel()) * dtype_size(t.dtype()), tmp_path);
    }
    if (::fsync(file.fd) != 0)
      detail::fail<InvalidArgument>("{}: cannot fsync '{}': {}", kSave, tmp_path, errno_text(errno));
    const int fd = file.fd;
    file.fd = -1;
    if (::close(fd) != 0)
      detail::fail<InvalidArgument>("{}: cannot close '{}': {}", kSave, tmp_path, errno_text(errno));
    if (::rename(tmp_path.c_str(), path.c_str()) != 0) {
      detail::fail<InvalidArgument>("{}: cannot rename '{}' to '{}': {}", kSave, tmp_path, path, errno_text(errno));
    }
  } catch (...) {
    ::unlink(tmp_path.c_str());
    throw;
  }
  // Make the rename itself durable. Some file systems cannot fsync a directory (EINVAL): nothing more to do there.
  const std::string directory = parent_directory(path);
  Fd dir(::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.fd < 0 || (::fsync(dir.fd) != 0 && errno != EINVAL)) {
    detail::fail<InvalidArgument>("{}: saved '{}' but cannot fsync its directory '{}': {}", kSave, path, directory,
                                  errno_text(errno));
  }
}

int64_t restore_checkpoint(std::string path, std::vector<Variable> vars) {
  detail::check_path(kRestore, "path", path);
  check_names(kRestore, vars);
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever. The type is
  // checked on the open descriptor, so the file cannot be swapped between the check and the reads.
  Fd file(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (file.fd < 0) detail::fail<InvalidArgument>("{}: cannot open '{}': {}", kRestore, path, errno_text(errno));
  struct stat info {};
  if (::fstat(file.fd, &info) != 0)
    detail::fail<InvalidArgument>("{}: cannot stat '{}': {}", kRestore, path, errno_text(errno));
  if (!S_ISREG(info.st_mode)) {
    detail::fail<InvalidArgument>("{}: '{}' is not a regular file; got a {}; checkpoints are regular files", kRestore,
                                  path, detail::file_type_name(info.st_mode));
  }
  const Header header = read_header(file.fd, static_cast<uint64_t>(info.st_size), path);

  // Match every requested variable before reading the data.
  std::map<std::string_view, size_t> by_name;
  for (size_t i = 0; i < header.entries.size(); ++i) by_name.emplace(header.entries[i].name, i);
  std::vector<std::optional<size_t>> requested_by(header.entries.size());  // entry -> variable index
  std::vector<Device> devices(vars.size());
  for (size_t i = 0; i < vars.size(); ++i) {
    const std::string& name = vars[i].name();
    const Tensor current = vars[i].value();
    devices[i] = current.device();
    const auto it = by_name.find(name);
    if (it == by_name.end()) {
      std::vector<std::string_view> names;
      for (size_t k = 0; k < header.entries.size() && k < 10; ++k) names.push_back(header.entries[k].name);
      detail::fail<InvalidArgument>("{}: variable '{}' is not in checkpoint '{}'; got {} entries: {}{}", kRestore, name,
                                    path, header.entries.size(), fmt::join(names, ", "),
                                    header.entries.size() > 10 ? ", ..." : "");
    }
    const Entry& entry = header.entries[it->second];
    if (entry.dtype != current.dtype()) {
      detail::fail<DTypeError>(
          "{}: dtype of variable '{}' differs from checkpoint '{}'; got {} in the file, expected {}", kRestore, name,
          path, entry.dtype, current.dtype());
    }
    if (!(entry.shape == current.shape())) {
      detail::fail<ShapeError>(
          "{}: shape of variable '{}' differs from checkpoint '{}'; got {} in the file, expected {}", kRestore, name,
          path, entry.shape, current.shape());
    }
    requested_by[it->second] = i;
  }

  // Read the data section in file order into new host tensors, checksumming everything.
  std::vector<Tensor> loaded(vars.size());
  std::vector<char> scratch;
  uint32_t crc = 0;
  for (size_t k = 0; k < header.entries.size(); ++k) {
    const Entry& entry = header.entries[k];
    const uint64_t bytes = entry.end - entry.begin;
    const uint64_t offset = header.data_start + entry.begin;
    if (requested_by[k]) {
      Tensor t = Tensor::empty(entry.shape, entry.dtype, Device());
      if (bytes > 0) {
        read_exact(file.fd, t.raw_data(), bytes, offset, path);
        crc = crc32_update(crc, t.raw_data(), bytes);
      }
      loaded[*requested_by[k]] = std::move(t);
    } else {
      scratch.resize(std::min<uint64_t>(bytes, 4u << 20));
      for (uint64_t done = 0; done < bytes;) {
        const size_t chunk = std::min<uint64_t>(bytes - done, scratch.size());
        read_exact(file.fd, scratch.data(), chunk, offset + done, path);
        crc = crc32_update(crc, scratch.data(), chunk);
        done += chunk;
      }
    }
  }
  if (crc != header.data_crc) {
    detail::fail<InvalidArgument>(
        "{}: '{}' is not a valid flowlet checkpoint: the data checksum does not match (the data is corrupt); got crc32 "
        "{} but the file records {}",
        kRestore, path, hex32(crc), hex32(header.data_crc));
  }
  for (size_t i = 0; i < vars.size(); ++i) {
    if (loaded[i].dtype() != b8) continue;
    const auto* bytes = static_cast<const uint8_t*>(loaded[i].raw_data());
    for (int64_t j = 0; j < loaded[i].numel(); ++j) {
      if (bytes[j] > 1) {
        detail::fail<InvalidArgument>(
            "{}: variable '{}' in '{}' holds a BOOL byte that is neither 0 nor 1; got {} at element {}", kRestore,
            vars[i].name(), path, bytes[j], j);
      }
    }
  }
  for (size_t i = 0; i < vars.size(); ++i) {
    if (devices[i] != Device()) loaded[i] = loaded[i].to(devices[i]);
  }

  // Everything checked: assign.
  for (size_t i = 0; i < vars.size(); ++i) vars[i].assign(loaded[i]);
  return header.step;
}

}  // namespace flowlet
