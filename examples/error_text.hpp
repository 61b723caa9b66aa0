// The text an example prints after "<program>: " for the error that ended it, and the main() wrapper
// that prints it. The examples' own option and input errors already start with "<program>: "; that
// prefix is dropped here so that the program is named once.
#pragma once

#include <cstdio>
#include <exception>
#include <string>
#include <string_view>

namespace examples {

inline const char* without_program(std::string_view program, const char* what) {
  const std::string_view text(what);
  if (text.size() >= program.size() + 2 && text.starts_with(program) && text.substr(program.size(), 2) == ": ") {
    return what + program.size() + 2;
  }
  return what;
}

// Runs an example's body: its exit status, or 1 after "<program>: <error>" on stderr. The text starts
// on a new line when a progress bar may be half drawn on the terminal.
template <class Body>
int run_reporting_errors(std::string_view program, Body&& body, bool progress_bar = true) {
  try {
    return body();
  } catch (const std::exception& e) {
    const std::string name(program);
    std::fprintf(stderr, "%s%s: %s\n", progress_bar ? "\n" : "", name.c_str(), without_program(program, e.what()));
    return 1;
  }
}

}  // namespace examples
