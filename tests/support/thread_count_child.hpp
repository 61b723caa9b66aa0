// Runs one test case of this test binary again in a child process with FLOWLET_NUM_THREADS (and
// FLOWLET_INTRA_OP_THREADS) set, and returns what the child printed after "BITS ". The pool reads
// the thread count once per process, so checking that results do not depend on it takes one process
// per count. The child is told apart by `marker` being set in its environment.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>

#include <doctest/doctest.h>
#include <fmt/format.h>

namespace flowlet_test {

inline std::string bits_from_child(const char* marker, const char* test_case, int threads) {
  char self[4096] = {};
  const ssize_t length = readlink("/proc/self/exe", self, sizeof self - 1);
  REQUIRE(length > 0);
  const std::string command =
      fmt::format("{}=1 FLOWLET_NUM_THREADS={} FLOWLET_INTRA_OP_THREADS={} '{}' --test-case='{}' 2>&1",
                  marker, threads, threads, self, test_case);
  FILE* child = popen(command.c_str(), "r");
  REQUIRE(child != nullptr);
  std::string output;
  char buffer[4096];
  while (std::fgets(buffer, sizeof buffer, child) != nullptr) output += buffer;
  CHECK(pclose(child) == 0);
  const size_t at = output.find("BITS ");
  REQUIRE(at != std::string::npos);
  return output.substr(at + 5, output.find('\n', at) - at - 5);
}

// A whole "bit-identical whatever the thread count" test case: in the child (marker set) print
// bits() and stop; here compare bits() with what each thread count's child printed.
template <class Bits>
void check_bits_across_thread_counts(const char* marker, const char* test_case, Bits&& bits,
                                     std::initializer_list<int> thread_counts) {
  if (std::getenv(marker) != nullptr) {
    std::printf("BITS %s\n", bits().c_str());
    return;
  }
  const std::string here = bits();
  for (int threads : thread_counts) {
    CAPTURE(threads);
    CHECK(bits_from_child(marker, test_case, threads) == here);
  }
}

}  // namespace flowlet_test
