// libtorch as an optional peer: its headers when the build found it (FLOWLET_BENCH_HAVE_TORCH),
// and a one-line description of the libtorch a run measured (or "libtorch: not available").
#pragma once

#include <exception>

#include <algorithm>
#include <string>
#include <thread>

#include <fmt/core.h>

#include "harness.hpp"

#ifdef FLOWLET_BENCH_HAVE_TORCH
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <c10/core/GradMode.h>       // at::NoGradGuard (torch::NoGradGuard is an alias of it)
#include <c10/core/InferenceMode.h>  // c10::InferenceMode
#endif

namespace flowlet_bench {

#ifdef FLOWLET_BENCH_HAVE_TORCH
inline constexpr bool have_torch = true;

// "1.13.0", read from libtorch's own build description (no torch/csrc/api headers needed).
inline std::string torch_version() {
  std::string config = at::show_config();
  const std::string key = "TORCH_VERSION=";
  auto start = config.find(key);
  if (start == std::string::npos) return "unknown version";
  start += key.size();
  return config.substr(start, config.find_first_of(", \n", start) - start);
}

inline std::string torch_cpu_capability() {
  std::string config = at::show_config();
  const std::string key = "CPU capability usage: ";
  auto start = config.find(key);
  if (start == std::string::npos) return "unknown";
  start += key.size();
  return config.substr(start, config.find('\n', start) - start);
}

// Lets libtorch use every hardware thread, as flowlet may (Debian's build defaults to fewer), and
// prints what the run measured.
inline void print_torch_setup(bool use_all_threads) {
  int default_threads = at::get_num_threads();
  if (use_all_threads) at::set_num_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  fmt::print("   libtorch {} (kernels {}), intra-op threads {} (default {})\n", torch_version(),
             torch_cpu_capability(), at::get_num_threads(), default_threads);
}
#else
inline constexpr bool have_torch = false;

inline void print_torch_setup(bool /*use_all_threads*/) { fmt::print("   libtorch: not available\n"); }
#endif

// The body of every benchmark's main(): header, peer setup, then `run_all`. A failure is reported
// and the program still exits 0, because benchmarks never gate.
template <class RunAll>
int run_benchmark(const char* program, const char* title, bool torch_uses_all_threads, RunAll run_all) {
  print_header(title);
  print_torch_setup(torch_uses_all_threads);
  try {
    run_all();
  } catch (const std::exception& error) {
    fmt::print("{}: stopped early: {}\n", program, error.what());
  }
  return 0;
}

}  // namespace flowlet_bench
