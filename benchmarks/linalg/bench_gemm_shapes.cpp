// bench_gemm_shapes: flowlet matmul at the shapes MLP training uses (forward x @ W1, h @ W2 and the
// backward products with transposed operands, batch 1 ... 1024) and at squares 512-2048, beside every
// BLAS call this machine has, within one thread budget (issue 18 goal 1: >= 0.95x of the best):
//   OpenBLAS with one thread, OpenBLAS with its own threads set to the budget, libtorch at::matmul
//   with the budget as its intra-op threads.
// Interleaved rounds (each round times every contender once, in a rotating order).
// The figure that decides (and the "< 0.95" mark) is the median over rounds of flowlet against the
// fastest other contender of the same round, printed with its lowest and highest round, then the
// per-round median against one-thread OpenBLAS (a split product should never fall below it).
// Before each contender's sample the process is left to go quiet (wait_until_process_idle): threaded
// OpenBLAS's idle threads spin for about 0.11 s after a call and would take the second core from
// whichever contender ran next. Then the contender runs untimed for --warm-ms (20), so that its
// threads are awake and placed. --old-pacing restores round 18's way (threaded OpenBLAS last,
// then 100 ms of sleep; one untimed call) for comparison. oneDNN's sgemm on one thread is a contender where the build has
// it (flowlet uses it for thin f32 pieces).
// Resolution: a round's sample is --subsamples (3) back-to-back timings of --sample-ms (2) each
// (fewer for products whose one call outlasts them), and a contender's figure for the round is the
// --estimator of them: min (default), median, mean (one sample of k x sample-ms) or first (one
// sample of sample-ms, round 21's way). The A/A control (--control, default "OB 1t") is the same
// call as that contender timed as a contender of its own, never counted as a "best other": its
// per-round ratio against the original is printed on every row ("A/A"), and the run ends with each
// estimator's A/A spread over the shapes, the noise floor a flowlet figure of that run has to clear
// (docs/notes22/exec.md: which estimator resolved best, measured).
//   FLOWLET_NUM_THREADS=2 bench_gemm_shapes [--rounds 13] [--f64] [--train|--squares] [--batch B] [--only TEXT]
//                                           [--sample-ms 2] [--subsamples 3] [--estimator min|median|mean|first]
//                                           [--control "OB 1t"|"OB 2t"|"oneDNN 1t"|none] [--warm-ms 20]
//                                           [--old-pacing]
//                                           [--shape M K N nn|tn|nt|tt]...  (only these products; t: that
//                                           operand is a transposed view, as the backward pass has it)
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include <flowlet/flowlet.hpp>

#include "gemm_contenders.hpp"

namespace fl = flowlet;
namespace bench = flowlet_bench;

namespace {

using flowlet_bench::gemm::Clock;
using flowlet_bench::gemm::median;
using flowlet_bench::gemm::wait_until_process_idle;

// op(A)[m, k] @ op(B)[k, n]; a_t: A is stored [k, m] and used transposed (likewise b_t).
struct Shape {
  std::string name;
  int64_t m, k, n;
  bool a_t, b_t;
};

std::vector<Shape> training_shapes() {
  std::vector<Shape> shapes;
  for (int64_t b : {1, 8, 64, 128, 256, 1024}) {
    shapes.push_back({fmt::format("B={:<4} x@W1", b), b, 784, 256, false, false});
    shapes.push_back({fmt::format("B={:<4} h@W2", b), b, 256, 10, false, false});
    shapes.push_back({fmt::format("B={:<4} x^T@dh", b), 784, b, 256, true, false});
    shapes.push_back({fmt::format("B={:<4} h^T@dy", b), 256, b, 10, true, false});
    shapes.push_back({fmt::format("B={:<4} dy@W2^T", b), b, 10, 256, false, true});
  }
  return shapes;
}

std::vector<Shape> square_shapes() {
  std::vector<Shape> shapes;
  for (int64_t s : {512, 1024, 2048}) shapes.push_back({fmt::format("square {}", s), s, s, s, false, false});
  return shapes;
}

int thread_budget() {
  const char* env = std::getenv("FLOWLET_NUM_THREADS");
  const int asked = env ? std::atoi(env) : 0;
  return asked >= 1 ? asked : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// How a contender's round figure is made from its k sub-samples (per-call ns each).
enum class Estimator { min, median, mean, first };
constexpr Estimator kEstimators[] = {Estimator::min, Estimator::median, Estimator::mean, Estimator::first};

const char* estimator_name(Estimator e) {
  switch (e) {
    case Estimator::min: return "min";
    case Estimator::median: return "median";
    case Estimator::mean: return "mean";
    case Estimator::first: return "first";
  }
  return "?";
}

// Every sub-sample has the same call count, so the mean of per-call times is the whole sample's.
double estimate(const std::vector<double>& sub_ns, Estimator e) {
  switch (e) {
    case Estimator::min: return *std::min_element(sub_ns.begin(), sub_ns.end());
    case Estimator::median: return median(sub_ns);
    case Estimator::mean: {
      double total = 0;
      for (double ns : sub_ns) total += ns;
      return total / static_cast<double>(sub_ns.size());
    }
    case Estimator::first: return sub_ns.front();
  }
  return sub_ns.front();
}

struct Options {
  int rounds = 13;
  double sample_ms = 2, warm_ms = 20;
  int subsamples = 3;
  Estimator estimator = Estimator::min;
  std::string control = "OB 1t";  // the contender the A/A control repeats ("none": no control)
  int budget = 1;
  bool old_pacing = false;
};

struct Contender {
  Contender(std::string n, std::function<void()> c, bool spins = false)
      : name(std::move(n)), call(std::move(c)), spins_after(spins) {}
  std::string name;
  std::function<void()> call;
  bool spins_after = false;  // threaded OpenBLAS: sleep after it
  bool control = false;      // the A/A copy: never a "best other"
  int64_t iterations = 1;
  std::vector<std::vector<double>> sub_ns;  // per round, the per-call ns of each sub-sample

  double round_ns(size_t r, Estimator e) const { return estimate(sub_ns[r], e); }
  std::vector<double> rounds_ns(Estimator e) const {
    std::vector<double> v;
    for (size_t r = 0; r < sub_ns.size(); ++r) v.push_back(round_ns(r, e));
    return v;
  }
};

double time_ns(Contender& c) {
  const auto start = Clock::now();
  for (int64_t i = 0; i < c.iterations; ++i) {
    c.call();
    bench::clobber_memory();
  }
  return std::chrono::duration<double, std::nano>(Clock::now() - start).count() / static_cast<double>(c.iterations);
}

// Per estimator, the A/A control's per-round ratio (copy / original) for each shape: its median
// over rounds, and the spread of the rounds (p25-p75), for the run's closing summary.
struct ControlSpread {
  std::vector<double> median_ratio[std::size(kEstimators)];
  std::vector<double> quartile_width[std::size(kEstimators)];
};

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

template <class T>
void run_shape(const Shape& s, const Options& o, ControlSpread& spread) {
  flowlet_bench::gemm::Product<T> p(s.m, s.k, s.n, s.a_t, s.b_t);
  std::vector<Contender> all;
  all.emplace_back("flowlet", [&] { p.flowlet_matmul(); });
  all.emplace_back("OB 1t", [&] { p.openblas(1); });
  all.emplace_back(fmt::format("OB {}t", o.budget), [&] { p.openblas(o.budget); }, true);
#ifdef FLOWLET_HAVE_DNNL
  if constexpr (std::is_same_v<T, float>) all.emplace_back("oneDNN 1t", [&] { p.onednn(); });
#endif
#ifdef FLOWLET_BENCH_HAVE_TORCH
  all.emplace_back("libtorch", [&] { p.torch(); });
#endif
  // The A/A control goes last (its own column), a copy of the named contender.
  size_t original = 0;
  for (size_t j = 1; j < all.size(); ++j) {
    if (all[j].name == o.control) original = j;
  }
  if (original != 0) {
    Contender copy = all[original];
    copy.name += " A/A";
    copy.control = true;
    all.push_back(std::move(copy));
  }

  // Calibrate each contender so that one sub-sample takes about sample_ms.
  double slowest_call_ms = 0;
  for (Contender& x : all) {
    if (!o.old_pacing) wait_until_process_idle();
    x.call();
    x.call();
    x.iterations = 1;
    double ns = time_ns(x);
    slowest_call_ms = std::max(slowest_call_ms, ns / 1e6);
    x.iterations = std::clamp<int64_t>(static_cast<int64_t>(o.sample_ms * 1e6 / std::max(ns, 1.0)), 1, 1 << 20);
    if (o.old_pacing && x.spins_after) std::this_thread::sleep_for(std::chrono::milliseconds(150));
  }
  // Products whose one call outlasts the sub-samples (the squares) take fewer, the same number for
  // every contender (a min over more sub-samples would favour whoever had more).
  const int subsamples = std::clamp(static_cast<int>(o.subsamples * o.sample_ms / std::max(slowest_call_ms, 1e-9)), 1,
                                    std::max(1, o.subsamples));
  for (int r = 0; r < o.rounds; ++r) {
    std::vector<Contender*> order;
    if (o.old_pacing) {
      // Round 18's pacing: the others in a rotating order, threaded OpenBLAS last, then 100 ms of sleep.
      for (size_t j = 0; j < all.size(); ++j) {
        Contender& x = all[(j + static_cast<size_t>(r)) % all.size()];
        if (!x.spins_after) order.push_back(&x);
      }
      for (Contender& x : all) {
        if (x.spins_after) order.push_back(&x);
      }
    } else {
      for (size_t j = 0; j < all.size(); ++j) order.push_back(&all[(j + static_cast<size_t>(r)) % all.size()]);
    }
    for (Contender* contender : order) {
      Contender& x = *contender;
      if (o.old_pacing) {
        x.call();  // one untimed call
      } else {
        // From a quiet process, untimed calls for warm_ms (at least one): every contender's threads
        // wake and the kernel places them, as in a training loop that calls the product every
        // step. A woken thread can share its caller's core for several ms before the load
        // balancer moves it (docs/notes19/gemm.md); --warm-ms 0 measures that start.
        wait_until_process_idle();
        const auto warm_until = Clock::now() + std::chrono::microseconds(static_cast<int64_t>(o.warm_ms * 1e3));
        do x.call();
        while (Clock::now() < warm_until);
      }
      std::vector<double> subs;
      for (int k = 0; k < subsamples; ++k) subs.push_back(time_ns(x));
      x.sub_ns.push_back(std::move(subs));
      if (o.old_pacing && x.spins_after) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  const double flops = p.flops();
  std::string row = fmt::format("{:<18} {:>5}x{:<5}x{:<5}", s.name, s.m, s.k, s.n);
  // The ratio of medians, and of each contender's fastest round (interference from other processes
  // only slows a round down, so the fastest rounds compare what each code can do).
  double best = 0, best_fastest = 0;
  std::string best_name;
  double ours = 0, ours_fastest = 0;
  for (size_t j = 0; j < all.size(); ++j) {
    const std::vector<double> per_round_ns = all[j].rounds_ns(o.estimator);
    const double gflops = flops / median(per_round_ns);
    const double fastest = flops / *std::min_element(per_round_ns.begin(), per_round_ns.end());
    row += fmt::format(" {:>8.2f}", gflops);
    if (j == 0) {
      ours = gflops, ours_fastest = fastest;
    } else if (!all[j].control) {
      if (gflops > best) best = gflops, best_name = all[j].name;
      best_fastest = std::max(best_fastest, fastest);
    }
  }
  // The figure that decides: per round, flowlet against the fastest other contender of that same
  // round (one process, interleaved, a few ms apart, so a slow minute slows both), the median over
  // rounds, and the lowest and highest round.
  // Beside it, per round against one-thread OpenBLAS (all[1]): a split product that falls below it
  // lost its second thread and then some (a late worker holding a piece).
  std::vector<double> per_round, per_round_1t, per_round_control;
  for (size_t r = 0; r < all[0].sub_ns.size(); ++r) {
    const double flowlet_ns = all[0].round_ns(r, o.estimator);
    double other = std::numeric_limits<double>::infinity();
    for (size_t j = 1; j < all.size(); ++j) {
      if (!all[j].control) other = std::min(other, all[j].round_ns(r, o.estimator));
    }
    per_round.push_back(other / flowlet_ns);
    per_round_1t.push_back(all[1].round_ns(r, o.estimator) / flowlet_ns);
  }
  std::string control_text;
  if (original != 0) {
    // The A/A control: the original against its copy, as flowlet against the others (> 1: the copy slower).
    for (size_t e = 0; e < std::size(kEstimators); ++e) {
      std::vector<double> ratios;
      for (size_t r = 0; r < all[0].sub_ns.size(); ++r) {
        ratios.push_back(all[original].round_ns(r, kEstimators[e]) / all.back().round_ns(r, kEstimators[e]));
      }
      spread.median_ratio[e].push_back(median(ratios));
      spread.quartile_width[e].push_back(quantile(ratios, 0.75) - quantile(ratios, 0.25));
      if (kEstimators[e] == o.estimator) per_round_control = ratios;
    }
    control_text = fmt::format("  A/A {:>5.3f} [{:.2f}-{:.2f}]", median(per_round_control),
                               *std::min_element(per_round_control.begin(), per_round_control.end()),
                               *std::max_element(per_round_control.begin(), per_round_control.end()));
  }
  const double decides = median(per_round);
  fmt::print("{}  {:>5.2f}x of {:<10} fastest rounds {:>5.2f}x  per round {:>5.2f}x [{:.2f}-{:.2f}]  vs OB 1t {:>5.2f}x{}{}\n",
             row, ours / best, best_name, ours_fastest / best_fastest, decides,
             *std::min_element(per_round.begin(), per_round.end()), *std::max_element(per_round.begin(), per_round.end()),
             median(per_round_1t), control_text, decides < 0.95 ? "  < 0.95" : "");
  std::fflush(stdout);
}

// The run's noise floor: per estimator, how far the A/A control's per-round median strayed from
// 1.00 over the shapes (median and largest |ratio - 1|) and how wide its rounds spread (median
// p25-p75 width). A flowlet figure of this run is resolved to about the largest stray.
void print_control_summary(const ControlSpread& spread, const Options& o) {
  if (spread.median_ratio[0].empty()) return;
  fmt::print("A/A control ({} against its copy), {} shapes, {} rounds; per estimator: |per-round median - 1| "
             "median / p90 / max over shapes, median p25-p75 width of the rounds:\n",
             o.control, spread.median_ratio[0].size(), o.rounds);
  for (size_t e = 0; e < std::size(kEstimators); ++e) {
    std::vector<double> stray;
    for (double m : spread.median_ratio[e]) stray.push_back(std::abs(m - 1.0));
    fmt::print("  {:<7}{} |A/A - 1| {:.3f} / {:.3f} / {:.3f}   rounds' p25-p75 {:.3f}\n", estimator_name(kEstimators[e]),
               kEstimators[e] == o.estimator ? "*" : " ", median(stray), quantile(stray, 0.9),
               *std::max_element(stray.begin(), stray.end()), median(spread.quartile_width[e]));
  }
  fmt::print("  (*: the estimator of the figures above; {} sub-samples of {} ms, fewer where one call is longer)\n",
             o.subsamples, o.sample_ms);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  bool f64 = false, train = true, squares = true;
  int64_t only_batch = 0;  // --batch B: only that batch's training shapes
  std::string only_name;   // --only TEXT: only the shapes whose name contains TEXT ("square 512")
  std::vector<Shape> given;  // --shape M K N FLAGS (nn, tn, nt, tt: which operand is a transposed view)
  bool bad = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--rounds" && i + 1 < argc) o.rounds = std::max(1, std::atoi(argv[++i]));
    else if (arg == "--sample-ms" && i + 1 < argc) o.sample_ms = std::atof(argv[++i]);
    else if (arg == "--subsamples" && i + 1 < argc) o.subsamples = std::max(1, std::atoi(argv[++i]));
    else if (arg == "--estimator" && i + 1 < argc) {
      const std::string name = argv[++i];
      bad = true;
      for (Estimator e : kEstimators) {
        if (name == estimator_name(e)) o.estimator = e, bad = false;
      }
      if (bad) break;
    }
    else if (arg == "--control" && i + 1 < argc) o.control = argv[++i];
    else if (arg == "--warm-ms" && i + 1 < argc) o.warm_ms = std::atof(argv[++i]);
    else if (arg == "--f64") f64 = true;
    else if (arg == "--old-pacing") o.old_pacing = true;
    else if (arg == "--train") squares = false;
    else if (arg == "--squares") train = false;
    else if (arg == "--batch" && i + 1 < argc) only_batch = std::atoll(argv[++i]);
    else if (arg == "--only" && i + 1 < argc) only_name = argv[++i];
    else if (arg == "--shape" && i + 4 < argc) {
      const std::string flags = argv[i + 4];
      given.push_back({fmt::format("{}x{}x{} {}", argv[i + 1], argv[i + 2], argv[i + 3], flags), std::atoll(argv[i + 1]),
                       std::atoll(argv[i + 2]), std::atoll(argv[i + 3]), flags.starts_with('t'), flags.ends_with('t')});
      i += 4;
    }
    else {
      bad = true;
      break;
    }
  }
  if (bad) {
    fmt::print(stderr, "usage: bench_gemm_shapes [--rounds N] [--sample-ms MS] [--subsamples K] [--estimator min|median|mean|first] [--control NAME|none] [--warm-ms MS] [--f64] [--train|--squares] [--batch B] [--only TEXT] [--shape M K N nn|tn|nt|tt]... [--old-pacing]\n");
    return 2;
  }
  o.budget = thread_budget();
  const int budget = o.budget;
  fmt::print("bench_gemm_shapes: {} rounds, budget {} threads, {}, samples of {} x {} ms ({} of them) after {} ms "
             "warm-up{}, A/A control: {}\n",
             o.rounds, budget, f64 ? "f64" : "f32", o.subsamples, o.sample_ms, estimator_name(o.estimator),
             o.old_pacing ? 0.0 : o.warm_ms, o.old_pacing ? " (old pacing)" : "", o.control);
  fmt::print("   {}  {}\n", bench::env_or_unset("OPENBLAS_CORETYPE"),
             bench::env_or_unset("OPENBLAS_L2_SIZE"));
#ifdef OPENBLAS_VERSION
  fmt::print("   OpenBLAS:{}core {}\n", OPENBLAS_VERSION, openblas_get_corename());
#endif
#ifdef FLOWLET_BENCH_HAVE_TORCH
  at::set_num_threads(budget);
  fmt::print("   libtorch {} intra-op threads {}\n", bench::torch_version(), at::get_num_threads());
  at::NoGradGuard no_grad;
#endif
  // Columns in the order run_shape adds its contenders.
  std::string columns = fmt::format(" {:>8} {:>8} {:>8}", "flowlet", "OB 1t", fmt::format("OB {}t", budget));
  const bool control_exists = o.control == "OB 1t" || o.control == fmt::format("OB {}t", budget) ||
                              (o.control == "oneDNN 1t" && !f64) || o.control == "libtorch";
#ifdef FLOWLET_HAVE_DNNL
  if (!f64) columns += fmt::format(" {:>8}", "oneDNN1t");
#endif
#ifdef FLOWLET_BENCH_HAVE_TORCH
  columns += fmt::format(" {:>8}", "torch");
#endif
  if (control_exists) columns += fmt::format(" {:>8}", "A/A");
  else o.control = "none";
  fmt::print("{:<18} {:>17}  GFLOP/s:{}   flowlet / best (medians; fastest rounds; per-round ratio median [min-max], decides; per-round median vs OpenBLAS 1t; A/A control per round median [min-max])\n", "shape", "m x k x n", columns);
  std::vector<Shape> shapes = given;
  if (!given.empty()) train = squares = false;
  if (train) {
    for (const Shape& s : training_shapes()) {
      if (only_batch == 0 || s.name.starts_with(fmt::format("B={} ", only_batch))) shapes.push_back(s);
    }
  }
  if (squares && only_batch == 0) for (const Shape& s : square_shapes()) shapes.push_back(s);
  ControlSpread spread;
  for (const Shape& s : shapes) {
    if (!only_name.empty() && s.name.find(only_name) == std::string::npos) continue;
    if (f64) run_shape<double>(s, o, spread);
    else run_shape<float>(s, o, spread);
  }
  print_control_summary(spread, o);
  return 0;
}
