// bench_gemm_burst: why a split GEMM can run at one thread's speed in short bursts (issue 18 goal 1,
// docs/notes19/gemm.md). Three probes, all in one process so that they share the peers' threads:
//   1. wake: a parallel_for of two equal busy chunks (fixed arithmetic, --chunk-us each) after an idle
//      pause, or right after one peer's sample; prints when the second thread started its chunk
//      (wake-up latency) and how long its chunk took beside the caller's (a second core shared
//      with a spinning thread makes it longer).
//   2. burst: flowlet matmul in samples of a few calls (as bench_gemm_shapes takes them) after an
//      idle pause, and right after one sample of each peer; beside a steady loop of many calls.
//   3. threads: the process's thread count before and after each peer's first call.
//   FLOWLET_NUM_THREADS=2 bench_gemm_burst [--trials 15] [--calls 4] [--chunk-us 1000] [--no-wake] [--no-burst]
//                                          [--shape m k n]...
#include <dirent.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <flowlet/flowlet.hpp>

#include "gemm_contenders.hpp"
#include "runtime/thread_pool.hpp"

namespace fl = flowlet;
namespace bench = flowlet_bench;

namespace {

using flowlet_bench::gemm::Clock;
using flowlet_bench::gemm::median;
using flowlet_bench::gemm::us_since;
using flowlet_bench::gemm::wait_until_process_idle;
using Product = flowlet_bench::gemm::Product<float>;

// Each thread of the process: its id, name and CPU time so far (ms), from /proc/self/task.
std::string thread_cpu_times() {
  std::string out;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      const std::string dir = std::string("/proc/self/task/") + e->d_name;
      std::ifstream comm(dir + "/comm"), stat(dir + "/stat");
      std::string name, text;
      std::getline(comm, name);
      std::getline(stat, text);
      // Fields after the ")" closing the name: state is field 3, utime 14, stime 15 (clock ticks).
      std::istringstream rest(text.substr(text.rfind(')') + 2));
      std::vector<std::string> f;
      for (std::string x; rest >> x;) f.push_back(x);
      const double ms = f.size() > 12 ? (std::stod(f[11]) + std::stod(f[12])) * 1000.0 / 100.0 : -1;
      // Field 39 is the CPU the thread last ran on.
      out += fmt::format(" {}:{}={:.0f}ms@cpu{}", e->d_name, name, ms, f.size() > 36 ? f[36] : "?");
      std::ifstream status(dir + "/status");
      for (std::string l; std::getline(status, l);) {
        if (l.rfind("Cpus_allowed_list:", 0) == 0) out += "[" + l.substr(l.find_first_not_of(" \t", 18)) + "]";
      }
    }
    closedir(d);
  }
  return out;
}

// A thread's time on a CPU and time runnable but waiting for one, in ms (/proc/.../schedstat).
std::pair<double, double> sched_ms(long tid) {
  std::ifstream in(fmt::format("/proc/self/task/{}/schedstat", tid));
  double run = 0, wait = 0;
  in >> run >> wait;
  return {run / 1e6, wait / 1e6};
}

int process_threads() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

// A dependent chain of multiply-adds: fixed work whose time doubles when the core is shared.
__attribute__((noinline)) double busy(int64_t steps) {
  double x = 1.0;
  for (int64_t i = 0; i < steps; ++i) {
    x = x * 1.0000001 + 1e-9;
    bench::clobber_memory();
  }
  return x;
}

// The pool worker's thread id: the thread that runs the second of two busy chunks.
long pool_worker_tid() {
  std::atomic<long> tid{0};
  const long caller = static_cast<long>(syscall(SYS_gettid));
  for (int attempt = 0; attempt < 100 && tid.load() == 0; ++attempt) {
    fl::detail::parallel_for(2, 1, [&](int64_t, int64_t) {
      const long me = static_cast<long>(syscall(SYS_gettid));
      if (me != caller) tid.store(me);
      bench::do_not_optimize(busy(200000));
    });
  }
  return tid.load();
}

struct Peer {
  std::string name;
  std::function<void()> call;
};

struct WakeResult {
  double start_us = -1;  // when the non-calling thread started its chunk (-1: the caller ran both)
  double helper_us = 0, caller_us = 0, total_us = 0;
};

WakeResult wake_probe(int64_t steps) {
  const auto caller = std::this_thread::get_id();
  Clock::time_point t0, start[2], end[2];
  bool by_caller[2] = {true, true};
  t0 = Clock::now();
  fl::detail::parallel_for(2, 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      start[c] = Clock::now();
      bench::do_not_optimize(busy(steps));
      end[c] = Clock::now();
      by_caller[c] = std::this_thread::get_id() == caller;
    }
  });
  const auto t1 = Clock::now();
  WakeResult r;
  r.total_us = us_since(t0, t1);
  for (int c = 0; c < 2; ++c) {
    if (by_caller[c]) r.caller_us = us_since(start[c], end[c]);
    else r.start_us = us_since(t0, start[c]), r.helper_us = us_since(start[c], end[c]);
  }
  return r;
}

void run_wake(const std::vector<Peer>& peers, int trials, double chunk_us) {
  // Calibrate chunk_us of busy work on the calling thread.
  int64_t steps = 1000000;
  const auto c0 = Clock::now();
  bench::do_not_optimize(busy(steps));
  steps = static_cast<int64_t>(static_cast<double>(steps) * chunk_us / std::max(us_since(c0, Clock::now()), 1.0));
  fmt::print("\n-- wake: parallel_for of two busy chunks (~{} us each on one thread), {} trials, medians\n", chunk_us,
             trials);
  fmt::print("{:<34} {:>10} {:>10} {:>10} {:>10} {:>8} {:>10}\n", "before the probe", "2nd start", "2nd chunk",
             "own chunk", "total us", "2nd ran", "max start");
  auto report = [&](const std::string& label, const std::function<void()>& before) {
    std::vector<double> start, helper, own, total;
    int helped = 0;
    for (int t = 0; t < trials; ++t) {
      before();
      const WakeResult r = wake_probe(steps);
      if (r.start_us >= 0) ++helped, start.push_back(r.start_us), helper.push_back(r.helper_us);
      own.push_back(r.caller_us);
      total.push_back(r.total_us);
    }
    fmt::print("{:<34} {:>10.1f} {:>10.1f} {:>10.1f} {:>10.1f} {:>5}/{} {:>10.1f}\n", label, median(start),
               median(helper), median(own), median(total), helped, trials,
               start.empty() ? 0.0 : *std::max_element(start.begin(), start.end()));
    std::fflush(stdout);
  };
  report("back to back", [] {});
  for (int idle_us : {20, 100, 1000, 10000, 100000}) {
    report(fmt::format("idle {} us", idle_us), [=] { std::this_thread::sleep_for(std::chrono::microseconds(idle_us)); });
  }
  for (const Peer& p : peers) {
    // One peer sample of about 2 ms, as bench_gemm_shapes takes it, right before the probe.
    report(fmt::format("after 2 ms of {}", p.name), [&] {
      const auto s = Clock::now();
      do p.call();
      while (us_since(s, Clock::now()) < 2000);
    });
  }
}

struct Gemm {
  int64_t m, k, n;
};

// Per-call times (us) of the first calls after the process went quiet, flowlet and threaded OpenBLAS
// in turn: shows whether the second thread took part in each call (about half a call's one-thread
// time) or missed it.
void run_calls(const Gemm& g, int trials, bool verbose_threads) {
  Product p(g.m, g.k, g.n, false, false);
  fmt::print("\n-- calls {}x{}x{}: per-call us of the first 10 calls after the process went quiet\n", g.m, g.k, g.n);
  fmt::print("   threads before:{}\n", thread_cpu_times());
  const int budget = fl::detail::thread_budget();
  const long worker = pool_worker_tid(), caller = static_cast<long>(syscall(SYS_gettid));
  if (verbose_threads) fmt::print("   pool worker thread {}, caller {}\n", worker, caller);
  for (int t = 0; t < trials; ++t) {
    for (int who = 0; who < 2; ++who) {  // flowlet, then threaded OpenBLAS, each after the process went quiet
      wait_until_process_idle();
      const auto w0 = sched_ms(worker), m0 = sched_ms(caller);
      std::string line = who == 0 ? "flowlet " : fmt::format("OB {}t   ", budget);
      for (int i = 0; i < 10; ++i) {
        const auto s = Clock::now();
        if (who == 0) p.flowlet_matmul();
        else p.openblas(budget);
        line += fmt::format(" {:6.0f}", us_since(s, Clock::now()));
      }
      const auto w1 = sched_ms(worker), m1 = sched_ms(caller);
      if (verbose_threads) {
        line += fmt::format("   worker run {:5.1f} wait {:5.1f} ms, caller run {:5.1f} wait {:5.1f} ms", w1.first - w0.first,
                            w1.second - w0.second, m1.first - m0.first, m1.second - m0.second);
      }
      fmt::print("  {}\n", line);
    }
  }
  fmt::print("   threads after:{}\n", thread_cpu_times());
  std::fflush(stdout);
}

void run_burst(const Gemm& g, const std::vector<Peer>& all_peers, int trials, int calls, int budget) {
  Product p(g.m, g.k, g.n, false, false);
  std::vector<Peer> peers;
  peers.push_back({"OpenBLAS 1t", [&] { p.openblas(1); }});
  peers.push_back({fmt::format("OpenBLAS {}t", budget), [&] { p.openblas(budget); }});
#ifdef FLOWLET_HAVE_DNNL
  peers.push_back({"oneDNN 1t", [&] { p.onednn(); }});
#endif
#ifdef FLOWLET_BENCH_HAVE_TORCH
  peers.push_back({"libtorch", [&] { p.torch(); }});
#endif
  (void)all_peers;
  auto flowlet = [&] { p.flowlet_matmul(); };
  const double flops = p.flops();
  auto sample = [&](const std::function<void()>& f, int n, int products_per_call) {
    const auto s = Clock::now();
    for (int i = 0; i < n; ++i) {
      f();
      bench::clobber_memory();
    }
    return flops * n * products_per_call / (us_since(s, Clock::now()) * 1e3);  // GFLOP/s
  };
  for (int i = 0; i < 20; ++i) flowlet();
  fmt::print("\n-- burst {}x{}x{}: GFLOP/s, medians of {} samples of {} calls (loop: {} calls)\n", g.m, g.k, g.n, trials,
             calls, 50 * calls);
  auto line = [&](const std::string& label, const std::function<void()>& before, const std::function<void()>& f,
                  int products_per_call = 1) {
    std::vector<double> rates;
    for (int t = 0; t < trials; ++t) {
      before();
      f();  // one untimed call, as bench_gemm_shapes makes
      rates.push_back(sample(f, calls, products_per_call));
    }
    fmt::print("   {:<40} {:>8.1f}\n", label, median(rates));
    std::fflush(stdout);
  };
  line("flowlet, steady loop", [] {}, [&] {
    for (int i = 0; i < 50; ++i) flowlet();
  }, 50);
  line("flowlet, back to back samples", [] {}, flowlet);
  for (int idle_us : {100, 1000, 10000, 100000}) {
    line(fmt::format("flowlet after idle {} us", idle_us),
         [=] { std::this_thread::sleep_for(std::chrono::microseconds(idle_us)); }, flowlet);
  }
  for (const Peer& p : peers) {
    line(fmt::format("{} alone", p.name), [] {}, p.call);
    line(fmt::format("flowlet after 2 ms of {}", p.name), [&] {
      const auto s = Clock::now();
      do p.call();
      while (us_since(s, Clock::now()) < 2000);
    }, flowlet);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int trials = 15, calls = 4;
  double chunk_us = 1000;
  std::vector<Gemm> shapes;
  bool wake = true, burst = true, calls_trace = false, verbose_threads = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--trials" && i + 1 < argc) trials = std::atoi(argv[++i]);
    else if (arg == "--calls" && i + 1 < argc) calls = std::atoi(argv[++i]);
    else if (arg == "--no-wake") wake = false;
    else if (arg == "--no-burst") burst = false;
    else if (arg == "--calls-trace") calls_trace = true;
    else if (arg == "--threads") verbose_threads = true;
    else if (arg == "--chunk-us" && i + 1 < argc) chunk_us = std::atof(argv[++i]);
    else if (arg == "--shape" && i + 3 < argc) {
      shapes.push_back({std::atoll(argv[i + 1]), std::atoll(argv[i + 2]), std::atoll(argv[i + 3])});
      i += 3;
    } else {
      fmt::print(stderr, "usage: bench_gemm_burst [--trials N] [--calls N] [--no-wake] [--no-burst] [--calls-trace [--threads]] [--chunk-us US] [--shape m k n]...\n");
      return 2;
    }
  }
  if (shapes.empty()) shapes = {{128, 784, 256}, {512, 512, 512}};
  const int budget = fl::detail::thread_budget();
  bench::print_header("bench_gemm_burst");
  fmt::print("   budget {} threads\n", budget);
  openblas_set_num_threads(1);
#ifdef FLOWLET_BENCH_HAVE_TORCH
  at::set_num_threads(budget);
  at::NoGradGuard no_grad;
#endif
  // The wake probe's peers: a 128x784x256 product each.
  Product p(128, 784, 256, false, false);
  std::vector<Peer> peers;
  peers.push_back({"flowlet 128x784x256", [&] { p.flowlet_matmul(); }});
#ifdef FLOWLET_BENCH_HAVE_TORCH
  peers.push_back({"libtorch 128x784x256", [&] { p.torch(); }});
#endif
  // Threaded OpenBLAS last: its threads spin for ~0.11 s after a call, into whatever follows.
  peers.push_back({fmt::format("OpenBLAS {}t 128x784x256", budget), [&] { p.openblas(budget); }});
  fmt::print("\n-- threads: process {} before any peer\n", process_threads());
  for (const Peer& p : peers) {
    p.call();
    fmt::print("   after {}: {}\n", p.name, process_threads());
  }
  if (wake) run_wake(peers, trials, chunk_us);
  if (burst) for (const Gemm& g : shapes) run_burst(g, peers, trials, calls, budget);
  if (calls_trace) for (const Gemm& g : shapes) run_calls(g, trials, verbose_threads);
  return 0;
}
