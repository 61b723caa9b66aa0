// The text an example prints after "<program>: " for the error that ended it. The examples' own
// option and input errors already start with "<program>: "; that prefix is dropped here so that
// the program is named once.
#pragma once

#include <string_view>

namespace examples {

inline const char* without_program(std::string_view program, const char* what) {
  const std::string_view text(what);
  if (text.size() >= program.size() + 2 && text.starts_with(program) && text.substr(program.size(), 2) == ": ") {
    return what + program.size() + 2;
  }
  return what;
}

}  // namespace examples
