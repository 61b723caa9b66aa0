// The manifest's JSON writer, strict parser and validator (format in manifest.hpp).
#include "checkpoint/distributed/manifest.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <set>

#include "checkpoint/header_json.hpp"
#include "checkpoint/safetensors_file.hpp"
#include "core/check.hpp"
#include "core/user_text.hpp"

namespace flowlet::detail::ckpt {

namespace {

using checkpoint::JsonValue;
constexpr std::string_view kCrcKey = "manifest_crc32";

template <class... Args>
[[noreturn]] void invalid(std::string_view op, const std::string& path, std::string_view field,
                          fmt::format_string<Args...> format, Args&&... args) {
  throw InvalidArgument(fmt::format("{}: manifest '{}' is not valid: {}: {}", op, path, field,
                                    fmt::format(format, std::forward<Args>(args)...)));
}

void append_string(std::string& out, std::string_view text) { checkpoint::append_json_string(out, text); }

bool is_shard_name(std::string_view name) {
  if (name.empty() || name.size() > 200) return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-'; });
}

bool is_plain_file_name(std::string_view name) {
  return !name.empty() && name.size() <= 255 && name != "." && name != ".." &&
         name.find('/') == std::string_view::npos && name.find('\0') == std::string_view::npos;
}

// Typed access to one object's members, naming the field in every error.
class Fields {
 public:
  Fields(const JsonValue& object, std::string field, std::string_view op, const std::string& path)
      : object_(object), field_(std::move(field)), op_(op), path_(path) {
    if (object.kind != JsonValue::Kind::object) invalid(op_, path_, field_, "not an object");
  }
  void only(std::initializer_list<std::string_view> keys) const {
    for (const auto& [key, value] : object_.members) {
      if (std::find(keys.begin(), keys.end(), key) == keys.end())
        invalid(op_, path_, field_, "unknown key \"{}\"", detail::excerpt(key));
    }
  }
  std::string name(std::string_view key) const {
    return field_.empty() ? std::string(key) : field_ + "." + std::string(key);
  }
  const JsonValue& get(std::string_view key, JsonValue::Kind kind, std::string_view kind_name) const {
    const JsonValue* value = object_.find(key);
    if (value == nullptr) invalid(op_, path_, name(key), "missing");
    if (value->kind != kind) invalid(op_, path_, name(key), "not {}", kind_name);
    return *value;
  }
  int64_t integer(std::string_view key, int64_t low, int64_t high) const {
    const int64_t value = get(key, JsonValue::Kind::integer, "an integer").integer;
    if (value < low || value > high) invalid(op_, path_, name(key), "{} is outside [{}, {}]", value, low, high);
    return value;
  }
  const std::string& string(std::string_view key) const { return get(key, JsonValue::Kind::string, "a string").string; }
  const JsonValue& object(std::string_view key) const { return get(key, JsonValue::Kind::object, "an object"); }
  const JsonValue& array(std::string_view key) const { return get(key, JsonValue::Kind::array, "an array"); }

 private:
  const JsonValue& object_;
  std::string field_;
  std::string_view op_;
  const std::string& path_;
};

constexpr int64_t kMaxInt = std::numeric_limits<int64_t>::max();

}  // namespace

int64_t piece_bytes(const Shape& shape, DType dtype, int64_t row_begin, int64_t row_end) {
  int64_t row = static_cast<int64_t>(dtype_size(dtype));
  for (int64_t d = 1; d < shape.rank(); ++d) row *= shape[d];
  return shape.rank() == 0 ? row : row * (row_end - row_begin);
}

std::string manifest_to_json(const Manifest& m) {
  std::string out = "{\"format\":";
  append_string(out, kManifestFormat);
  out +=
      fmt::format(",\"version\":{},\"step\":{},\"processes\":{},\"cluster\":", kManifestVersion, m.step, m.processes);
  append_string(out, m.cluster);
  out += ",\"attributes\":{";
  bool first = true;
  for (const auto& [key, value] : m.attributes) {
    if (!first) out += ',';
    first = false;
    append_string(out, key);
    out += ':';
    append_string(out, value);
  }
  out += "},\"metadata\":{";
  first = true;
  for (const auto& [key, value] : m.metadata) {
    if (!first) out += ',';
    first = false;
    append_string(out, key);
    out += fmt::format(":{}", value);
  }
  out += "},\n\"shards\":[";
  for (size_t i = 0; i < m.shards.size(); ++i) {
    const ShardRecord& s = m.shards[i];
    out += i == 0 ? "\n" : ",\n";
    out += "{\"name\":";
    append_string(out, s.name);
    out += ",\"file\":";
    append_string(out, s.file);
    out +=
        fmt::format(",\"bytes\":{},\"crc32\":\"{}\",\"process\":{}}}", s.bytes, checkpoint::hex32(s.crc32), s.process);
  }
  out += "],\n\"tensors\":[";
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const TensorRecord& t = m.tensors[i];
    out += i == 0 ? "\n" : ",\n";
    out += "{\"name\":";
    append_string(out, t.name);
    out += fmt::format(",\"dtype\":\"{}\",\"shape\":[{}],\"pieces\":[", checkpoint::safetensors_dtype_name(t.dtype),
                       fmt::join(t.shape.to_vector(), ","));
    for (size_t k = 0; k < t.pieces.size(); ++k) {
      const PieceRecord& p = t.pieces[k];
      if (k > 0) out += ',';
      out += "{\"shard\":";
      append_string(out, p.shard);
      out += ",\"entry\":";
      append_string(out, p.entry);
      out += fmt::format(",\"rows\":[{},{}]}}", p.row_begin, p.row_end);
    }
    out += "]}";
  }
  out += "],\n\"manifest_crc32\":\"";
  const size_t crc_pos = out.size();
  out += "00000000\"}\n";
  out.replace(crc_pos, 8, checkpoint::hex32(checkpoint::crc32_update(0, out.data(), out.size())));
  return out;
}

Manifest parse_manifest(std::string_view text, const std::string& path, std::string_view op, bool validate) {
  const JsonValue root = checkpoint::parse_json(text, op, path);
  const Fields top(root, "", op, path);
  top.only({"format", "version", "step", "processes", "cluster", "attributes", "metadata", "shards", "tensors",
            std::string_view(kCrcKey)});
  if (validate) {
    // The checksum first: a flipped byte is reported as corruption, not as whatever field it hit.
    const JsonValue& crc_field = top.get(kCrcKey, JsonValue::Kind::string, "a string");
    uint32_t recorded;
    if (!checkpoint::parse_hex32(crc_field.string, recorded) || crc_field.raw_end - crc_field.raw_begin != 8)
      invalid(op, path, kCrcKey, "\"{}\" is not 8 lowercase hex digits", detail::excerpt(crc_field.string));
    std::string zeroed(text);
    zeroed.replace(crc_field.raw_begin, 8, "00000000");
    const uint32_t actual = checkpoint::crc32_update(0, zeroed.data(), zeroed.size());
    if (actual != recorded) {
      invalid(op, path, kCrcKey,
              "the checksum does not match (the manifest is corrupt); got crc32 {} but it records {}",
              checkpoint::hex32(actual), checkpoint::hex32(recorded));
    }
  }
  Manifest m;
  if (top.string("format") != kManifestFormat)
    invalid(op, path, "format", "\"{}\" is not \"{}\"", detail::excerpt(top.string("format")), kManifestFormat);
  const int64_t version = top.integer("version", 0, kMaxInt);
  if (version != kManifestVersion)
    invalid(op, path, "version", "{} is not supported; this build reads version {}", version, kManifestVersion);
  m.step = top.integer("step", 0, kMaxInt);
  m.processes = static_cast<int>(top.integer("processes", 1, 1 << 20));
  m.cluster = top.string("cluster");
  for (const auto& [key, value] : top.object("attributes").members) {
    if (value.kind != JsonValue::Kind::string) invalid(op, path, "attributes." + key, "not a string");
    m.attributes.emplace(key, value.string);
  }
  for (const auto& [key, value] : top.object("metadata").members) {
    if (value.kind != JsonValue::Kind::integer) invalid(op, path, "metadata." + key, "not an integer");
    m.metadata.emplace(key, value.integer);
  }
  const JsonValue& shards = top.array("shards");
  for (size_t i = 0; i < shards.items.size(); ++i) {
    const Fields f(shards.items[i], fmt::format("shards[{}]", i), op, path);
    f.only({"name", "file", "bytes", "crc32", "process"});
    ShardRecord s;
    s.name = f.string("name");
    s.file = f.string("file");
    s.bytes = f.integer("bytes", 0, kMaxInt);
    if (!checkpoint::parse_hex32(f.string("crc32"), s.crc32))
      invalid(op, path, f.name("crc32"), "\"{}\" is not 8 lowercase hex digits", detail::excerpt(f.string("crc32")));
    s.process = static_cast<int>(f.integer("process", 0, 1 << 20));
    m.shards.push_back(std::move(s));
  }
  const JsonValue& tensors = top.array("tensors");
  for (size_t i = 0; i < tensors.items.size(); ++i) {
    const Fields f(tensors.items[i], fmt::format("tensors[{}]", i), op, path);
    f.only({"name", "dtype", "shape", "pieces"});
    TensorRecord t;
    t.name = f.string("name");
    const auto dtype = checkpoint::dtype_from_safetensors(f.string("dtype"));
    if (!dtype) invalid(op, path, f.name("dtype"), "unknown dtype \"{}\"", detail::excerpt(f.string("dtype")));
    t.dtype = *dtype;
    const JsonValue& shape = f.array("shape");
    if (shape.array.size() != shape.items.size()) invalid(op, path, f.name("shape"), "not an array of integers");
    if (shape.array.size() > 64) invalid(op, path, f.name("shape"), "rank {} is above 64", shape.array.size());
    for (const int64_t d : shape.array) {
      if (d < 0) invalid(op, path, f.name("shape"), "negative dimension; got [{}]", fmt::join(shape.array, ", "));
    }
    t.shape = Shape(shape.array);
    const JsonValue& pieces = f.array("pieces");
    for (size_t k = 0; k < pieces.items.size(); ++k) {
      const Fields pf(pieces.items[k], fmt::format("tensors[{}].pieces[{}]", i, k), op, path);
      pf.only({"shard", "entry", "rows"});
      PieceRecord p;
      p.shard = pf.string("shard");
      p.entry = pf.string("entry");
      const JsonValue& rows = pf.array("rows");
      if (rows.array.size() != 2 || rows.items.size() != 2) invalid(op, path, pf.name("rows"), "not [begin, end]");
      p.row_begin = rows.array[0];
      p.row_end = rows.array[1];
      t.pieces.push_back(std::move(p));
    }
    m.tensors.push_back(std::move(t));
  }
  if (validate) validate_manifest(m, path, op);
  return m;
}

void validate_manifest(const Manifest& m, const std::string& path, std::string_view op) {
  if (m.step < 0) invalid(op, path, "step", "{} is negative", m.step);
  if (m.processes < 1) invalid(op, path, "processes", "{} is below 1", m.processes);
  std::map<std::string, size_t> shard_index;
  std::set<std::string> files;
  for (size_t i = 0; i < m.shards.size(); ++i) {
    const ShardRecord& s = m.shards[i];
    const std::string field = fmt::format("shards[{}]", i);
    if (!is_shard_name(s.name))
      invalid(op, path, field + ".name", "\"{}\" is not [a-z0-9_-]+", detail::excerpt(s.name));
    if (!shard_index.emplace(s.name, i).second) invalid(op, path, field + ".name", "\"{}\" appears twice", s.name);
    if (!is_plain_file_name(s.file) || s.file.size() < 12 || s.file.substr(s.file.size() - 12) != ".safetensors" ||
        s.file.rfind(s.name + ".", 0) != 0) {
      invalid(op, path, field + ".file", "\"{}\" is not \"{}.<id>.safetensors\"", detail::excerpt(s.file), s.name);
    }
    if (!files.insert(s.file).second) invalid(op, path, field + ".file", "\"{}\" appears twice", s.file);
    if (s.bytes < 8) invalid(op, path, field + ".bytes", "{} is below the 8-byte header length", s.bytes);
    if (s.process < 0 || s.process >= m.processes)
      invalid(op, path, field + ".process", "{} is outside [0, {})", s.process, m.processes);
  }
  std::set<std::string> names;
  std::set<std::pair<std::string, std::string>> entries;  // (shard, entry)
  std::vector<int64_t> shard_payload(m.shards.size(), 0);
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const TensorRecord& t = m.tensors[i];
    const std::string field = fmt::format("tensors[{}]", i);
    if (t.name.empty() || t.name == "__metadata__" || !checkpoint::is_valid_utf8(t.name))
      invalid(op, path, field + ".name", "\"{}\" is not a tensor name", detail::excerpt(t.name));
    if (!names.insert(t.name).second) invalid(op, path, field + ".name", "\"{}\" appears twice", t.name);
    // The tensor's size must fit int64 (the shards' sizes bound it further below).
    uint64_t numel = 1;
    for (int64_t d = 0; d < t.shape.rank(); ++d) {
      const auto dim = static_cast<uint64_t>(t.shape[d]);
      if (dim != 0 && numel > static_cast<uint64_t>(kMaxInt) / 8 / dim)
        invalid(op, path, field + ".shape", "{} holds more than 2^60 elements", t.shape);
      numel *= dim;
    }
    const int64_t rows = t.shape.rank() == 0 ? 1 : t.shape[0];
    if (t.pieces.empty() && rows > 0) invalid(op, path, field + ".pieces", "empty, but '{}' has {} rows", t.name, rows);
    int64_t expected = 0;
    for (size_t k = 0; k < t.pieces.size(); ++k) {
      const PieceRecord& p = t.pieces[k];
      const std::string pfield = fmt::format("{}.pieces[{}]", field, k);
      const auto shard = shard_index.find(p.shard);
      if (shard == shard_index.end())
        invalid(op, path, pfield + ".shard", "\"{}\" is not among the shards", detail::excerpt(p.shard));
      if (p.entry.empty() || p.entry == "__metadata__" || !checkpoint::is_valid_utf8(p.entry))
        invalid(op, path, pfield + ".entry", "\"{}\" is not an entry name", detail::excerpt(p.entry));
      if (!entries.emplace(p.shard, p.entry).second)
        invalid(op, path, pfield + ".entry", "\"{}\" is used twice in shard \"{}\"", detail::excerpt(p.entry), p.shard);
      if (p.row_begin != expected || p.row_end < p.row_begin || p.row_end > rows ||
          (t.shape.rank() == 0 && p.row_end != 1) || (p.row_end == p.row_begin && rows > 0)) {
        invalid(op, path, pfield + ".rows", "[{}, {}] does not continue the rows of '{}' at {} (of {} rows)",
                p.row_begin, p.row_end, t.name, expected, rows);
      }
      expected = p.row_end;
      shard_payload[shard->second] += piece_bytes(t.shape, t.dtype, p.row_begin, p.row_end);
    }
    if (expected != rows && !(rows == 0 && t.pieces.size() <= 1))
      invalid(op, path, field + ".pieces", "cover rows [0, {}) of '{}', which has {} rows", expected, t.name, rows);
  }
  for (size_t i = 0; i < m.shards.size(); ++i) {
    if (shard_payload[i] > m.shards[i].bytes - 8) {
      invalid(op, path, fmt::format("shards[{}].bytes", i), "{} bytes cannot hold the {} bytes of tensors it lists",
              m.shards[i].bytes, shard_payload[i]);
    }
  }
}

}  // namespace flowlet::detail::ckpt
