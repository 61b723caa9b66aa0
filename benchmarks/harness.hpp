// The shared benchmark harness: warm-up, auto-scaled repeated samples, percentiles, and a printer
// that sets each flowlet figure beside a peer's measured in the same run, with the ratio and target.
//
// Example:
//   namespace bench = flowlet_bench;
//   bench::Section section("add 1-element", bench::Metric::time());
//   bench::Result ours = section.run("flowlet", [&] { bench::do_not_optimize(a + b); });
//   bench::Result peer = section.run("libtorch", [&] { bench::do_not_optimize(at::add(x, y)); });
//   section.compare(ours, peer, bench::Target::at_most(0.33, "aim 0.20"));
//
// Benchmarks never gate: a missed target is printed, never turned into an exit status.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/core.h>

namespace flowlet_bench {

// Makes the compiler believe `value` is read (and memory written), so the work producing it stays.
template <class T>
inline __attribute__((always_inline)) void do_not_optimize(const T& value) {
  asm volatile("" : : "r"(&value) : "memory");
}
// Makes the compiler believe all memory may have been read and written.
inline __attribute__((always_inline)) void clobber_memory() { asm volatile("" : : : "memory"); }

struct Options {
  int samples = 15;               // timed samples (each one a batch of calls)
  double sample_seconds = 0.020;  // the inner iteration count is scaled so a batch takes about this
  double warmup_seconds = 0.050;  // untimed calls first (at least two)
};

// Per-call times in nanoseconds over the samples.
struct Stats {
  double median_ns = 0;
  double p10_ns = 0;
  double p90_ns = 0;
  int64_t iterations = 0;  // calls per sample
  int samples = 0;
};

namespace detail {
using Clock = std::chrono::steady_clock;

template <class F>
double time_batch_ns(F& body, int64_t iterations) {
  auto start = Clock::now();
  for (int64_t i = 0; i < iterations; ++i) {
    body();
    clobber_memory();
  }
  auto stop = Clock::now();
  return std::chrono::duration<double, std::nano>(stop - start).count();
}

// Linear interpolation between the closest ranks of sorted `values`.
inline double percentile(const std::vector<double>& sorted, double fraction) {
  if (sorted.empty()) return 0;
  double position = fraction * static_cast<double>(sorted.size() - 1);
  auto low = static_cast<size_t>(std::floor(position));
  size_t high = std::min(low + 1, sorted.size() - 1);
  double weight = position - static_cast<double>(low);
  return sorted[low] * (1 - weight) + sorted[high] * weight;
}
}  // namespace detail

// Warms up, picks an inner iteration count so that one sample takes about
// options.sample_seconds, then times options.samples samples.
template <class F>
Stats measure(F&& body, const Options& options = {}) {
  // Warm-up: caches, allocator pools, thread pools, lazy initialization.
  auto warm_start = detail::Clock::now();
  for (int calls = 0;; ++calls) {
    body();
    double elapsed = std::chrono::duration<double>(detail::Clock::now() - warm_start).count();
    if (calls >= 1 && elapsed >= options.warmup_seconds) break;
  }
  // Calibrate: grow the batch until it takes a measurable share of the sample time.
  const double target_ns = options.sample_seconds * 1e9;
  int64_t iterations = 1;
  double elapsed_ns = detail::time_batch_ns(body, iterations);
  while (elapsed_ns < target_ns * 0.25 && iterations < (int64_t{1} << 40)) {
    double grow = elapsed_ns > 0 ? target_ns * 0.5 / elapsed_ns : 100.0;
    iterations = std::max(iterations * 2, static_cast<int64_t>(static_cast<double>(iterations) * std::min(grow, 100.0)));
    elapsed_ns = detail::time_batch_ns(body, iterations);
  }
  iterations = std::max<int64_t>(1, std::llround(static_cast<double>(iterations) * target_ns / elapsed_ns));

  std::vector<double> per_call;
  per_call.reserve(static_cast<size_t>(options.samples));
  for (int sample = 0; sample < options.samples; ++sample) {
    per_call.push_back(detail::time_batch_ns(body, iterations) / static_cast<double>(iterations));
  }
  std::sort(per_call.begin(), per_call.end());
  Stats stats;
  stats.median_ns = detail::percentile(per_call, 0.5);
  stats.p10_ns = detail::percentile(per_call, 0.1);
  stats.p90_ns = detail::percentile(per_call, 0.9);
  stats.iterations = iterations;
  stats.samples = options.samples;
  return stats;
}

// One contender's figure, or why there is none ("not available", "failed: ...").
struct Result {
  std::string name;
  std::optional<Stats> stats;
  std::string missing;
};

inline Result unavailable(std::string name, std::string why = "not available") {
  return Result{std::move(name), std::nullopt, std::move(why)};
}

// What a row reports: time per call (lower is better) or a rate (work per second, higher is better).
struct Metric {
  bool is_rate = false;
  std::string unit;          // "GB/s", "GFLOP/s"; empty for time
  double work_per_call = 0;  // in `unit` seconds: bytes / 1e9 for GB/s, flops / 1e9 for GFLOP/s

  static Metric time() { return Metric{}; }
  static Metric rate(std::string unit, double work_per_call) { return Metric{true, std::move(unit), work_per_call}; }
};

// A bound on a ratio (flowlet / peer, in the metric's own sense: time over time, rate over rate).
struct Target {
  bool at_most_bound = true;
  double bound = 0;
  std::string note;  // e.g. "aim 0.20"

  static Target at_most(double bound, std::string note = "") { return Target{true, bound, std::move(note)}; }
  static Target at_least(double bound, std::string note = "") { return Target{false, bound, std::move(note)}; }
  bool met(double ratio) const { return at_most_bound ? ratio <= bound : ratio >= bound; }
};

inline std::string format_time_ns(double ns) {
  if (ns < 1e3) return fmt::format("{:.1f} ns", ns);
  if (ns < 1e6) return fmt::format("{:.2f} us", ns / 1e3);
  if (ns < 1e9) return fmt::format("{:.2f} ms", ns / 1e6);
  return fmt::format("{:.2f} s", ns / 1e9);
}

inline std::string env_or_unset(const char* name) {
  const char* value = std::getenv(name);
  return value ? fmt::format("{}={}", name, value) : fmt::format("{} (unset)", name);
}

inline std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(colon + 2);
    }
  }
  return "unknown cpu";
}

inline std::string load_average() {
  std::ifstream loadavg("/proc/loadavg");
  std::string one, five, fifteen;
  if (!(loadavg >> one >> five >> fifteen)) return "unknown";
  return fmt::format("{} {} {}", one, five, fifteen);
}

// The lines every benchmark opens with, so that two runs can be told apart and noise judged.
inline void print_header(const std::string& title) {
  fmt::print("== flowlet benchmark: {}\n", title);
  fmt::print("   cpu: {}, {} hardware threads, load average {}\n", cpu_model(),
             std::thread::hardware_concurrency(), load_average());
  fmt::print("   {}  {}\n", env_or_unset("OPENBLAS_CORETYPE"), env_or_unset("OPENBLAS_L2_SIZE"));
  fmt::print("   figures: median over samples [p10, p90]; every peer measured in this run\n");
}

// A group of contenders on one problem: prints one row per contender, then the comparisons.
class Section {
 public:
  // `label` starts every comparison line; `detail` (units, what is counted) only the heading.
  Section(std::string label, Metric metric, const std::string& detail = "")
      : label_(std::move(label)), metric_(std::move(metric)) {
    fmt::print("\n-- {}{}{}\n", label_, detail.empty() ? "" : ": ", detail);
  }

  // Measures `body`, prints its row and returns the figure. An exception from `body` becomes a
  // "failed: ..." result, so one broken contender never hides the others.
  template <class F>
  Result run(std::string name, F&& body, const Options& options = {}) {
    Result result{std::move(name), std::nullopt, {}};
    try {
      result.stats = measure(body, options);
    } catch (const std::exception& error) {
      result.missing = fmt::format("failed: {}", error.what());
    }
    print_row(result);
    return result;
  }

  // Prints a contender that could not run here (for example libtorch missing).
  Result skip(std::string name, std::string why = "not available") {
    Result result = unavailable(std::move(name), std::move(why));
    print_row(result);
    return result;
  }

  // `label  ours X  peer Y  ratio R (target ...)`; ratio = ours / peer in the metric's sense.
  void compare(const Result& ours, const Result& peer, const std::optional<Target>& target) const {
    std::string line = fmt::format("   {}  {} {}  {}{}{}  ratio ", label_, ours.name, figure(ours), peer.name,
                                   peer.stats ? " " : ": ", figure(peer));
    std::optional<double> ratio;
    if (ours.stats && peer.stats && ours.stats->median_ns > 0 && peer.stats->median_ns > 0) {
      // For time, ours/peer time; for a rate, ours/peer rate (= peer time / our time).
      ratio = metric_.is_rate ? peer.stats->median_ns / ours.stats->median_ns
                              : ours.stats->median_ns / peer.stats->median_ns;
      line += fmt::format("{:.2f}", *ratio);
    } else {
      line += "n/a";
    }
    if (target) {
      const char* verdict = ratio ? (target->met(*ratio) ? ": met" : ": MISSED") : "";
      line += fmt::format(" (target {} {:.2f}{}{}{})", target->at_most_bound ? "<=" : ">=", target->bound,
                          target->note.empty() ? "" : ", ", target->note, verdict);
    } else {
      line += " (no target; for information)";
    }
    fmt::print("{}\n", line);
  }

  // The headline figure of a result: time per call, or the rate.
  std::string figure(const Result& result) const {
    if (!result.stats) return result.missing;
    return metric_.is_rate ? format_rate(result.stats->median_ns) : format_time_ns(result.stats->median_ns);
  }

 private:
  std::string format_rate(double ns) const {
    double value = ns > 0 ? metric_.work_per_call / (ns * 1e-9) : 0;
    return fmt::format("{:.2f} {}", value, metric_.unit);
  }

  void print_row(const Result& result) const {
    if (!result.stats) {
      fmt::print("   {:<32} {}\n", result.name, result.missing);
      return;
    }
    const Stats& s = *result.stats;
    if (metric_.is_rate) {  // a rate's p10 comes from the time's p90 and the other way round
      fmt::print("   {:<32} {:>14}  [{}, {}]  {} per call  ({} calls x {} samples)\n", result.name,
                 format_rate(s.median_ns), format_rate(s.p90_ns), format_rate(s.p10_ns), format_time_ns(s.median_ns),
                 s.iterations, s.samples);
    } else {
      fmt::print("   {:<32} {:>12}  [{}, {}]  ({} calls x {} samples)\n", result.name, format_time_ns(s.median_ns),
                 format_time_ns(s.p10_ns), format_time_ns(s.p90_ns), s.iterations, s.samples);
    }
  }

  std::string label_;
  Metric metric_;
};

}  // namespace flowlet_bench
