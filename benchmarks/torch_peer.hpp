// libtorch as an optional peer: its headers when the build found it (FLOWLET_BENCH_HAVE_TORCH),
// and a one-line description of the libtorch a run measured (or "libtorch: not available").
#pragma once

#include <algorithm>
#include <string>
#include <thread>

#include <fmt/core.h>

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

}  // namespace flowlet_bench
