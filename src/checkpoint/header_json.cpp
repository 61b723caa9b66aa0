// The strict header JSON parser: a recursive descent over the subset safetensors headers use.
#include "checkpoint/header_json.hpp"

#include <limits>
#include <unordered_set>

#include "core/check.hpp"
#include "core/user_text.hpp"

namespace flowlet::checkpoint {

namespace {

constexpr int kMaxDepth = 8;

// Length of the UTF-8 sequence starting at text[i], or 0 when it is not well-formed.
size_t utf8_sequence_length(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  if (lead < 0x80) return 1;
  size_t length;
  uint32_t code;
  if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2, code = lead & 0x1fu;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3, code = lead & 0x0fu;
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4, code = lead & 0x07u;
  } else {
    return 0;  // continuation byte, overlong 2-byte lead (c0, c1) or beyond U+10FFFF
  }
  if (i + length > text.size()) return 0;
  for (size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xc0u) != 0x80u) return 0;
    code = (code << 6) | (byte(i + k) & 0x3fu);
  }
  const bool overlong = (length == 3 && code < 0x800) || (length == 4 && code < 0x10000);
  const bool surrogate = code >= 0xd800 && code <= 0xdfff;
  if (overlong || surrogate || code > 0x10ffff) return 0;
  return length;
}

void append_utf8(std::string& out, uint32_t code) {
  if (code < 0x80) {
    out += static_cast<char>(code);
  } else if (code < 0x800) {
    out += static_cast<char>(0xc0 | (code >> 6));
    out += static_cast<char>(0x80 | (code & 0x3f));
  } else if (code < 0x10000) {
    out += static_cast<char>(0xe0 | (code >> 12));
    out += static_cast<char>(0x80 | ((code >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (code & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (code >> 18));
    out += static_cast<char>(0x80 | ((code >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((code >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (code & 0x3f));
  }
}

class Parser {
 public:
  Parser(std::string_view text, std::string_view op, std::string_view path, bool any_arrays = false)
      : text_(text), op_(op), path_(path), any_arrays_(any_arrays) {}

  JsonValue parse_document() {
    skip_whitespace();
    JsonValue value = parse_value(0);
    skip_whitespace();
    if (pos_ != text_.size()) error("unexpected text after the closing '}' (padding must be spaces)");
    return value;
  }

 private:
  [[noreturn]] void error(std::string_view why) const {
    if (any_arrays_) {
      detail::fail<InvalidArgument>("{}: '{}' is not valid JSON: {} at byte {}; got a {}-byte file", op_, path_, why,
                                    pos_, text_.size());
    }
    detail::fail<InvalidArgument>("{}: header of '{}' is not valid JSON: {} at byte {}; got a {}-byte header", op_,
                                  path_, why, pos_, text_.size());
  }

  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[pos_]; }

  void skip_whitespace() {
    while (!at_end() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  void expect(char c) {
    if (at_end() || text_[pos_] != c) error(fmt::format("expected '{}'", c));
    ++pos_;
  }

  JsonValue parse_value(int depth) {
    if (depth > kMaxDepth) error("nesting is too deep");
    if (at_end()) error("unexpected end of header");
    const char c = peek();
    if (c == '{') return parse_object(depth);
    if (c == '[') return any_arrays_ ? parse_any_array(depth) : parse_array();
    if (c == '"') return parse_string();
    if (c == '-' || (c >= '0' && c <= '9')) {
      JsonValue value;
      value.kind = JsonValue::Kind::integer;
      value.integer = parse_integer();
      return value;
    }
    error("expected an object, array, string or integer");
  }

  // After '{' or '[': true (and consumed) when `close` follows at once, the container being empty.
  bool empty_container(char close) {
    skip_whitespace();
    if (peek() != close) return false;
    ++pos_;
    return true;
  }

  // After an element: true at ',' (another element follows), false at `close`; both consumed.
  bool another_element(char close) {
    skip_whitespace();
    if (peek() == ',') {
      ++pos_;
      return true;
    }
    if (peek() == close) {
      ++pos_;
      return false;
    }
    error(fmt::format("expected ',' or '{}'", close));
  }

  JsonValue parse_object(int depth) {
    JsonValue value;
    value.kind = JsonValue::Kind::object;
    expect('{');
    if (empty_container('}')) return value;
    // Hashed, so that checking n keys for duplicates costs O(n) (a scan per key made 40,000 keys take 21 s).
    std::unordered_set<std::string> keys;
    do {
      skip_whitespace();
      if (peek() != '"') error("expected a string key");
      const size_t key_pos = pos_;
      std::string key = parse_string().string;
      if (!keys.insert(key).second) {
        pos_ = key_pos;
        error(fmt::format("duplicate key \"{}\"", detail::excerpt(key)));
      }
      skip_whitespace();
      expect(':');
      skip_whitespace();
      JsonValue member = parse_value(depth + 1);
      value.members.emplace_back(std::move(key), std::move(member));
    } while (another_element('}'));
    return value;
  }

  // An array whose elements `parse_element(value)` reads (after whitespace) and stores in `value`.
  template <typename ParseElement>
  JsonValue parse_array_of(ParseElement&& parse_element) {
    JsonValue value;
    value.kind = JsonValue::Kind::array;
    expect('[');
    if (empty_container(']')) return value;
    do {
      skip_whitespace();
      parse_element(value);
    } while (another_element(']'));
    return value;
  }

  JsonValue parse_array() {
    return parse_array_of([&](JsonValue& value) {
      const char c = peek();
      if (!(c == '-' || (c >= '0' && c <= '9'))) error("expected an integer (arrays hold integers only)");
      value.array.push_back(parse_integer());
    });
  }

  // An array of any values (manifests): every element in `items`, integers also in `array`.
  JsonValue parse_any_array(int depth) {
    return parse_array_of([&](JsonValue& value) {
      JsonValue item = parse_value(depth + 1);
      if (item.kind == JsonValue::Kind::integer) value.array.push_back(item.integer);
      value.items.push_back(std::move(item));
    });
  }

  int64_t parse_integer() {
    const bool negative = peek() == '-';
    if (negative) ++pos_;
    if (at_end() || peek() < '0' || peek() > '9') error("expected a digit");
    if (peek() == '0' && pos_ + 1 < text_.size() && text_[pos_ + 1] >= '0' && text_[pos_ + 1] <= '9') {
      error("leading zeros are not allowed");
    }
    // Accumulate as a negative number so that INT64_MIN parses.
    int64_t value = 0;
    constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
    while (!at_end() && peek() >= '0' && peek() <= '9') {
      const int digit = peek() - '0';
      if (value < (kMin + digit) / 10) error("integer out of range");
      value = value * 10 - digit;
      ++pos_;
    }
    if (peek() == '.' || peek() == 'e' || peek() == 'E') error("only integers are allowed");
    if (!negative) {
      if (value == kMin) error("integer out of range");
      value = -value;
    }
    return value;
  }

  uint32_t parse_hex4() {
    uint32_t code = 0;
    for (int k = 0; k < 4; ++k) {
      if (at_end()) error("unexpected end of header in a \\u escape");
      const char c = text_[pos_];
      uint32_t digit;
      if (c >= '0' && c <= '9') {
        digit = static_cast<uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        digit = static_cast<uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        digit = static_cast<uint32_t>(c - 'A' + 10);
      } else {
        error("bad hex digit in a \\u escape");
      }
      code = code * 16 + digit;
      ++pos_;
    }
    return code;
  }

  JsonValue parse_string() {
    JsonValue value;
    value.kind = JsonValue::Kind::string;
    expect('"');
    value.raw_begin = pos_;
    while (true) {
      if (at_end()) error("unterminated string");
      const auto c = static_cast<unsigned char>(text_[pos_]);
      if (c == '"') break;
      if (c < 0x20) error("raw control character in a string");
      if (c == '\\') {
        ++pos_;
        if (at_end()) error("unterminated escape");
        const char e = text_[pos_++];
        switch (e) {
          case '"':
            value.string += '"';
            break;
          case '\\':
            value.string += '\\';
            break;
          case '/':
            value.string += '/';
            break;
          case 'b':
            value.string += '\b';
            break;
          case 'f':
            value.string += '\f';
            break;
          case 'n':
            value.string += '\n';
            break;
          case 'r':
            value.string += '\r';
            break;
          case 't':
            value.string += '\t';
            break;
          case 'u': {
            uint32_t code = parse_hex4();
            if (code >= 0xdc00 && code <= 0xdfff) error("unpaired low surrogate in a \\u escape");
            if (code >= 0xd800 && code <= 0xdbff) {
              if (pos_ + 1 >= text_.size() || text_[pos_] != '\\' || text_[pos_ + 1] != 'u') {
                error("unpaired high surrogate in a \\u escape");
              }
              pos_ += 2;
              const uint32_t low = parse_hex4();
              if (low < 0xdc00 || low > 0xdfff) error("unpaired high surrogate in a \\u escape");
              code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
            }
            append_utf8(value.string, code);
            break;
          }
          default:
            --pos_;
            error("unknown escape");
        }
        continue;
      }
      const size_t length = utf8_sequence_length(text_, pos_);
      if (length == 0) error("invalid UTF-8");
      value.string.append(text_.substr(pos_, length));
      pos_ += length;
    }
    value.raw_end = pos_;
    ++pos_;  // closing quote
    return value;
  }

  std::string_view text_, op_, path_;
  bool any_arrays_ = false;
  size_t pos_ = 0;
};

}  // namespace

JsonValue parse_header_json(std::string_view text, std::string_view op, std::string_view path) {
  return Parser(text, op, path).parse_document();
}

JsonValue parse_json(std::string_view text, std::string_view op, std::string_view path) {
  return Parser(text, op, path, /*any_arrays=*/true).parse_document();
}

bool is_valid_utf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const size_t length = utf8_sequence_length(text, i);
    if (length == 0) return false;
    i += length;
  }
  return true;
}

void append_json_string(std::string& out, std::string_view text) {
  out += '"';
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
    } else {
      out += c;
    }
  }
  out += '"';
}

}  // namespace flowlet::checkpoint
