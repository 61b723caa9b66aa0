// A strict parser for the JSON subset of a safetensors header (objects, strings, integers, arrays of
// integers) and of a distributed checkpoint's manifest (the same, with arrays of any of these).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flowlet::checkpoint {

struct JsonValue {
  // Declared here and defaulted after the class: `members` holds JsonValues, and clang with
  // libstdc++ rejects special members implied while the class is still incomplete.
  JsonValue();
  JsonValue(const JsonValue&);
  JsonValue(JsonValue&&) noexcept;
  JsonValue& operator=(const JsonValue&);
  JsonValue& operator=(JsonValue&&) noexcept;
  ~JsonValue();

  enum class Kind { object, string, integer, array };
  Kind kind = Kind::integer;
  std::string string;                                      // decoded (escapes resolved); Kind::string
  size_t raw_begin = 0, raw_end = 0;                       // byte span of the string's raw text, quotes excluded
  int64_t integer = 0;                                     // Kind::integer
  std::vector<int64_t> array;                              // Kind::array: its integer elements
  std::vector<JsonValue> items;                            // Kind::array, parse_json only: every element
  std::vector<std::pair<std::string, JsonValue>> members;  // Kind::object, in file order, keys unique

  // The member named `key` of an object, or nullptr. Linear: for the few lookups of known keys.
  const JsonValue* find(std::string_view key) const;
};

inline JsonValue::JsonValue() = default;
inline JsonValue::JsonValue(const JsonValue&) = default;
inline JsonValue::JsonValue(JsonValue&&) noexcept = default;
inline JsonValue& JsonValue::operator=(const JsonValue&) = default;
inline JsonValue& JsonValue::operator=(JsonValue&&) noexcept = default;
inline JsonValue::~JsonValue() = default;

inline const JsonValue* JsonValue::find(std::string_view key) const {
  for (const auto& [name, value] : members) {
    if (name == key) return &value;
  }
  return nullptr;
}

// Parses `text`: one JSON value, optionally followed by whitespace (the header's padding), nothing else.
// Rejects floats, true/false/null, duplicate keys, invalid UTF-8, raw control characters in strings,
// integers outside int64 and nesting deeper than 8. On failure throws InvalidArgument
// "<op>: header of '<path>' is not valid JSON: <why> at byte <n>; got ...".
JsonValue parse_header_json(std::string_view text, std::string_view op, std::string_view path);

// Like parse_header_json, for a manifest: arrays may hold objects, strings and integers (every
// element is in `items`; integers also in `array`), nesting up to 8 deep. On failure throws
// InvalidArgument "<op>: '<path>' is not valid JSON: <why> at byte <n>; got a <size>-byte file".
JsonValue parse_json(std::string_view text, std::string_view op, std::string_view path);

// True when `text` is well-formed UTF-8 (no overlong forms, surrogates or code points above U+10FFFF).
bool is_valid_utf8(std::string_view text);

// Appends `text` as a JSON string literal (quotes, escapes for '"', '\\' and control characters).
void append_json_string(std::string& out, std::string_view text);

}  // namespace flowlet::checkpoint
