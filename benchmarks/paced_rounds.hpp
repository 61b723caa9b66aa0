// Interleaved rounds for contenders whose threads may keep running after they return (flowlet's
// idle pool workers poll 2 ms; threaded OpenBLAS spins ~0.1 s; libtorch's OpenMP worker may spin
// under libgomp's default wait policy, though bench_reduce measured it quiet within 0.5 ms here).
// Whatever one contender leaves spinning takes the second core from whichever runs next, so a
// plain alternation can hand one contender's spin to the other (docs/notes19/reduce.md suspected
// this for flowlet's interleaved 0.81 against its own section's 0.95). Before every sample:
//   1. the process is left to go quiet: sleep in 2 ms steps until no thread of it burned more than
//      0.2 ms of CPU in a step (at most 300 ms; the wait is recorded per contender, as what the one
//      before it left running);
//   2. the contender runs untimed for `warm_ms` (at least one call), so that its own threads are
//      awake and placed, as in a program that calls it over and over;
//   3. one timed sample of `calls` calls.
// Each round runs every contender once, in the balanced order of round_order.hpp. Medians per
// contender and per-round ratios come from the samples.
//
//   std::vector<bench::PacedContender> all;
//   all.push_back({"flowlet", [&] { ... }});
//   bench::run_paced_rounds(all, bench::Pacing{});
//   double gbs = bytes / all[0].median_ns();
// Nothing here sets a peer's environment (GOMP_SPINCOUNT, OMP_WAIT_POLICY): users get libtorch's
// defaults, so the comparison does too.
#pragma once

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "harness.hpp"
#include "round_order.hpp"

namespace flowlet_bench {

struct Pacing {
  int rounds = 12;         // a multiple of round_order_cycle(contenders) balances the orders
  double warm_ms = 20;     // untimed calls before each sample
  double sample_ms = 30;   // one timed sample lasts about this long
  bool quiet = true;       // false: no wait before a sample (to see what the pacing removes)
};

// Reads a pacing option at argv[i] (--rounds N, --warm-ms MS, --sample-ms MS, --no-quiet), moving
// i past its value; false when argv[i] is not one of them. For the benchmarks' own option loops.
inline bool parse_pacing_option(int argc, char** argv, int& i, Pacing& pacing) {
  const std::string arg = argv[i];
  const bool has_value = i + 1 < argc;
  if (arg == "--rounds" && has_value) pacing.rounds = std::max(1, std::atoi(argv[++i]));
  else if (arg == "--warm-ms" && has_value) pacing.warm_ms = std::atof(argv[++i]);
  else if (arg == "--sample-ms" && has_value) pacing.sample_ms = std::atof(argv[++i]);
  else if (arg == "--no-quiet") pacing.quiet = false;
  else return false;
  return true;
}

// The median (the mean of the two middle values for an even count; 0 for none).
inline double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : (v[h - 1] + v[h]) / 2;
}

struct PacedContender {
  PacedContender(std::string name_, std::function<void()> call_) : name(std::move(name_)), call(std::move(call_)) {}
  std::string name;
  std::function<void()> call;
  int64_t calls = 1;                  // calls per sample (calibrated by run_paced_rounds)
  std::vector<double> per_call_ns;    // one entry per round
  std::vector<double> quiet_wait_ms;  // how long the process took to go quiet after this one's sample

  double median_ns() const { return median_of(per_call_ns); }
};

// CPU time of every thread of this process so far, in ms.
inline double process_cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) / 1e6;
}

// Sleeps in `step_ms` steps until a step in which the process used less than `idle_fraction` of
// one core, at most `limit_ms`; returns the time waited in ms (0 when it was quiet at once, up to
// one step).
inline double wait_until_quiet(double step_ms = 2, double idle_fraction = 0.1, double limit_ms = 300) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto step = std::chrono::microseconds(static_cast<int64_t>(step_ms * 1e3));
  for (;;) {
    const auto before_wall = Clock::now();
    const double before_cpu = process_cpu_ms();
    std::this_thread::sleep_for(step);
    const double wall_ms = std::chrono::duration<double, std::milli>(Clock::now() - before_wall).count();
    const double waited_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    if (process_cpu_ms() - before_cpu < idle_fraction * wall_ms) return waited_ms - wall_ms;
    if (waited_ms > limit_ms) return waited_ms;
  }
}

// After one call of `call` from a quiet process, how long (ms) the process keeps burning CPU:
// the time until the first 0.5 ms window with under 10 % of a core used (0.5 ms resolution).
inline double busy_after_call_ms(const std::function<void()>& call) {
  wait_until_quiet();
  call();
  return wait_until_quiet(0.5);
}

inline void run_paced_rounds(std::vector<PacedContender>& all, const Pacing& pacing) {
  using Clock = std::chrono::steady_clock;
  auto warm = [&](PacedContender& c) {
    const auto until = Clock::now() + std::chrono::microseconds(static_cast<int64_t>(pacing.warm_ms * 1e3));
    do c.call();
    while (Clock::now() < until);
  };
  auto sample_ns = [](PacedContender& c) {
    const auto start = Clock::now();
    for (int64_t i = 0; i < c.calls; ++i) {
      c.call();
      clobber_memory();
    }
    return std::chrono::duration<double, std::nano>(Clock::now() - start).count() / static_cast<double>(c.calls);
  };
  for (PacedContender& c : all) {  // calibrate: calls per sample for about sample_ms
    wait_until_quiet();
    warm(c);
    c.calls = 1;
    const double ns = sample_ns(c);
    c.calls = std::clamp<int64_t>(static_cast<int64_t>(pacing.sample_ms * 1e6 / std::max(ns, 1.0)), 1, 1 << 20);
  }
  for (int round = 0; round < pacing.rounds; ++round) {
    PacedContender* previous = nullptr;
    for (size_t index : round_order(all.size(), round)) {
      PacedContender& c = all[index];
      const double waited = pacing.quiet ? wait_until_quiet() : 0.0;
      if (previous && pacing.quiet) previous->quiet_wait_ms.push_back(waited);
      warm(c);
      c.per_call_ns.push_back(sample_ns(c));
      previous = &c;
    }
    if (previous && pacing.quiet) previous->quiet_wait_ms.push_back(wait_until_quiet());
  }
}

}  // namespace flowlet_bench
