// Escaping text for the JSON that graph dumps and timelines write by hand (names come from users).
#pragma once

#include <string>
#include <string_view>

#include <fmt/format.h>

namespace flowlet::detail {

inline std::string json_escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<int>(c));
        } else {
          out += c;
        }
    }
  }
  return out;
}

}  // namespace flowlet::detail
