// Roofline calibration and its cache (roofline.hpp). The measurements start their own threads,
// one per thread of the budget: this is the tool measuring the machine, not a library kernel, and
// each thread does what one of flowlet's pool threads does (a chunk of a stream, one BLAS call).
#include "roofline.hpp"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <thread>
#include <vector>

#include <fmt/format.h>

namespace flowlet_bench {
namespace {

using Clock = std::chrono::steady_clock;

std::string cpu_model() {
  std::ifstream info("/proc/cpuinfo");
  std::string line;
  while (std::getline(info, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown cpu";
}

std::string cache_file() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  std::filesystem::path dir = xdg != nullptr && *xdg != '\0' ? std::filesystem::path(xdg)
                              : home != nullptr            ? std::filesystem::path(home) / ".cache"
                                                           : std::filesystem::temp_directory_path();
  return (dir / "flowlet" / "roofline.json").string();
}

// Runs body(thread_index) on `threads` threads at once; returns the wall seconds.
template <class Body>
double timed_on_threads(int threads, Body body) {
  const auto start = Clock::now();
  std::vector<std::thread> workers;
  for (int t = 1; t < threads; ++t) workers.emplace_back(body, t);
  body(0);
  for (auto& w : workers) w.join();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double measure_triad(int threads) {
  const size_t n = size_t{16} << 20;  // 16 Mi floats = 64 MB per array
  std::unique_ptr<float[]> a(new float[n]), b(new float[n]), c(new float[n]);
  // First touch on the threads that use the memory, as the pool's kernels would.
  const auto chunk = [&](int t) { return std::pair(n * t / threads, n * (t + 1) / threads); };
  timed_on_threads(threads, [&](int t) {
    auto [lo, hi] = chunk(t);
    for (size_t i = lo; i < hi; ++i) a[i] = 0.0f, b[i] = 1.0f, c[i] = 2.0f;
  });
  double best = 1e30;
  for (int rep = 0; rep < 8; ++rep) {
    best = std::min(best, timed_on_threads(threads, [&](int t) {
      auto [lo, hi] = chunk(t);
      float* __restrict pa = a.get();
      const float* __restrict pb = b.get();
      const float* __restrict pc = c.get();
      for (size_t i = lo; i < hi; ++i) pa[i] = pb[i] + 3.0f * pc[i];
    }));
  }
  volatile float sink = a[n / 2];
  (void)sink;
  return 3.0 * static_cast<double>(n) * sizeof(float) / best;
}

template <class T>
double measure_gemm(int threads) {
  const int n = 1024;
  openblas_set_num_threads(1);  // one BLAS thread per worker, as inside flowlet
  std::vector<std::vector<T>> a(threads, std::vector<T>(size_t(n) * n, T(0.5))), c(a);
  double best = 1e30;
  for (int rep = 0; rep < 8; ++rep) {  // best of 8: other processes may share the cores
    best = std::min(best, timed_on_threads(threads, [&](int t) {
      const T* x = a[t].data();
      if constexpr (std::is_same_v<T, float>) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, x, n, x, n, 0.0f, c[t].data(), n);
      } else {
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0, x, n, x, n, 0.0, c[t].data(), n);
      }
    }));
  }
  return 2.0 * n * double(n) * n * threads / best;
}

// The cache: one line per key, `  "<key>": {"bytes_per_second": B, "sgemm_flops": S, "dgemm_flops": D}`.
std::map<std::string, std::string> read_cache(const std::string& path) {
  std::map<std::string, std::string> entries;
  std::ifstream file(path);
  std::string line;
  static const std::regex entry(R"re(^\s*"((?:[^"\\]|\\.)*)"\s*:\s*(\{[^}]*\})\s*,?\s*$)re");
  while (std::getline(file, line)) {
    std::smatch m;
    if (std::regex_match(line, m, entry)) entries[m[1]] = m[2];
  }
  return entries;
}

double field(const std::string& object, const std::string& name) {
  const std::regex pattern("\"" + name + R"re("\s*:\s*([0-9.eE+-]+))re");
  std::smatch m;
  if (!std::regex_search(object, m, pattern)) return 0;
  return std::strtod(m[1].str().c_str(), nullptr);
}

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

Roofline load_or_measure_roofline(int threads, bool recalibrate) {
  Roofline r;
  r.key = fmt::format("{}|threads={}", cpu_model(), threads);
  r.cache_path = cache_file();
  auto entries = read_cache(r.cache_path);
  const std::string key = escape(r.key);
  if (!recalibrate && entries.count(key) != 0) {
    const std::string& e = entries[key];
    r.bytes_per_second = field(e, "bytes_per_second");
    r.sgemm_flops = field(e, "sgemm_flops");
    r.dgemm_flops = field(e, "dgemm_flops");
    r.from_cache = r.bytes_per_second > 0 && r.sgemm_flops > 0 && r.dgemm_flops > 0;
    if (r.from_cache) return r;
  }
  r.bytes_per_second = measure_triad(threads);
  r.sgemm_flops = measure_gemm<float>(threads);
  r.dgemm_flops = measure_gemm<double>(threads);
  entries[key] = fmt::format(R"({{"bytes_per_second": {:.6g}, "sgemm_flops": {:.6g}, "dgemm_flops": {:.6g}}})",
                             r.bytes_per_second, r.sgemm_flops, r.dgemm_flops);
  std::error_code error;
  std::filesystem::create_directories(std::filesystem::path(r.cache_path).parent_path(), error);
  const std::string temporary = r.cache_path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << "{\n";
    size_t i = 0;
    for (const auto& [k, v] : entries) out << "  \"" << k << "\": " << v << (++i < entries.size() ? ",\n" : "\n");
    out << "}\n";
    if (!out) error = std::make_error_code(std::errc::io_error);
  }
  if (!error) std::filesystem::rename(temporary, r.cache_path, error);
  if (error) {
    std::filesystem::remove(temporary, error);
    fmt::print(stderr, "flowlet-bench: warning: cannot write the roofline cache {}\n", r.cache_path);
  }
  return r;
}

}  // namespace flowlet_bench
