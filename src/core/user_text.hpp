// Strings from users in messages and system calls: bounded, escaped excerpts, and paths checked for NUL bytes.
#pragma once

#include <sys/stat.h>

#include <cstddef>
#include <string>
#include <string_view>

#include "core/check.hpp"

namespace flowlet::detail {

// `text` as it may appear inside quotes in a message: bytes outside printable ASCII as \xNN, and
// at most `limit` bytes of it followed by "... (N bytes)", so a hostile 1 MiB argument cannot make
// a 1 MiB message.
inline std::string excerpt(std::string_view text, size_t limit = 64) {
  std::string out;
  const size_t shown = text.size() <= limit ? text.size() : limit;
  for (size_t i = 0; i < shown; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c >= 0x7f || c == '\\') {
      out += c == '\\' ? std::string("\\\\") : fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  if (shown < text.size()) out += fmt::format("... ({} bytes)", text.size());
  return out;
}

// InvalidArgument unless `path` can reach the operating system unchanged: the C calls stop at the
// first NUL, so "/tmp/a\0.bak" would silently name "/tmp/a". `what` names the argument ("path").
inline void check_path(std::string_view op, std::string_view what, std::string_view path) {
  const size_t nul = path.find('\0');
  if (nul == std::string_view::npos) return;
  fail<InvalidArgument>("{}: {} contains a NUL byte at offset {}; got '{}'; paths cannot contain NUL", op, what, nul,
                        excerpt(path));
}

// What kind of file a stat mode describes, for "not a regular file; got a FIFO" messages.
inline std::string_view file_type_name(mode_t mode) {
  if (S_ISREG(mode)) return "regular file";
  if (S_ISDIR(mode)) return "directory";
  if (S_ISFIFO(mode)) return "FIFO";
  if (S_ISCHR(mode)) return "character device";
  if (S_ISBLK(mode)) return "block device";
  if (S_ISSOCK(mode)) return "socket";
  return "special file";
}

}  // namespace flowlet::detail
