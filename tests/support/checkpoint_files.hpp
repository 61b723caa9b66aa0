// Test support for checkpoint tests: a temporary directory, whole-file reads and writes, the exact
// contents of variables (dtype, shape and raw bytes, so NaN payloads and -0 count), and bit flips.
#pragma once

#include <doctest/doctest.h>
#include <fmt/core.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include <flowlet/flowlet.hpp>

#include "support/reference.hpp"

namespace test {

// A fresh directory from mkdtemp under $TMPDIR (or /tmp), named <prefix>_XXXXXX, removed with its
// contents at scope exit.
struct TempDir {
  std::string path;
  explicit TempDir(std::string_view prefix = "flowlet_ckpt") {
    const char* base = std::getenv("TMPDIR");
    std::string pattern =
        std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/" + std::string(prefix) + "_XXXXXX";
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code error;
    std::filesystem::remove_all(path, error);
  }
  std::string file(const std::string& name) const { return path + "/" + name; }
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_file(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

// Exact contents of a variable: dtype, shape and raw bytes.
inline std::string contents(const fl::Variable& v) {
  const fl::Tensor t = v.value().contiguous();
  std::string text = fmt::format("{} {} ", fl::dtype_name(t.dtype()), shape_text(t.shape()));
  text.append(static_cast<const char*>(t.raw_data()), static_cast<size_t>(t.numel()) * fl::dtype_size(t.dtype()));
  return text;
}

inline std::vector<std::string> contents(const std::vector<fl::Variable>& vars) {
  std::vector<std::string> all;
  for (const fl::Variable& v : vars) all.push_back(contents(v));
  return all;
}

// `bytes` with bit `bit` (0 = least significant) of byte `at` flipped.
inline std::string with_bit_flipped(std::string bytes, size_t at, int bit) {
  bytes[at] = static_cast<char>(bytes[at] ^ (1 << bit));
  return bytes;
}

// The SIGKILL tests' child: forks a process that runs `saves(report)`, which saves forever and
// calls report() after each finished save; waits for `reported` reports, then `delay`, kills the
// child with SIGKILL and reaps it. Only saves may run in the child (fork does not copy the thread
// pool, so no ops).
inline void kill_saving_child(const std::function<void(const std::function<void()>& report)>& saves, int reported,
                              std::chrono::microseconds delay) {
  int report[2];
  REQUIRE(::pipe(report) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::close(report[0]);
    try {
      saves([&] {
        if (::write(report[1], "s", 1) != 1) ::_exit(2);
      });
    } catch (...) {
      ::_exit(1);
    }
    ::_exit(0);
  }
  ::close(report[1]);
  char byte;
  for (int k = 0; k < reported; ++k) REQUIRE(::read(report[0], &byte, 1) == 1);
  std::this_thread::sleep_for(delay);
  ::kill(child, SIGKILL);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  ::close(report[0]);
  CHECK(WIFSIGNALED(status));
}

}  // namespace test
