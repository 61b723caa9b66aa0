// bench_gemm_shapes: flowlet matmul at the shapes MLP training uses (forward x @ W1, h @ W2 and the
// backward products with transposed operands, batch 1 ... 1024) and at squares 512-2048, beside every
// BLAS call this machine has, within one thread budget (issue 18 goal 1: >= 0.95x of the best):
//   OpenBLAS with one thread, OpenBLAS with its own threads set to the budget, libtorch at::matmul
//   with the budget as its intra-op threads.
// Interleaved rounds (each round times every contender once, in a rotating order), medians per call.
// The figure that decides (and the "< 0.95" mark) is the median over rounds of flowlet against the
// fastest other contender of the same round, printed with its lowest and highest round, then the
// per-round median against one-thread OpenBLAS (a split product should never fall below it).
// Before each contender's sample the process is left to go quiet (wait_until_process_idle): threaded
// OpenBLAS's idle threads spin for about 0.11 s after a call and would take the second core from
// whichever contender ran next. Then the contender runs untimed for --warm-ms (20), so that its
// threads are awake and placed. --old-pacing restores round 18's way (threaded OpenBLAS last,
// then 100 ms of sleep; one untimed call) for comparison. oneDNN's sgemm on one thread is a contender where the build has
// it (flowlet uses it for thin f32 pieces).
//   FLOWLET_NUM_THREADS=2 bench_gemm_shapes [--rounds 9] [--f64] [--train|--squares] [--batch B] [--only TEXT]
//                                           [--sample-ms 2] [--warm-ms 20] [--old-pacing]
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

struct Contender {
  Contender(std::string n, std::function<void()> c, bool spins = false)
      : name(std::move(n)), call(std::move(c)), spins_after(spins) {}
  std::string name;
  std::function<void()> call;
  bool spins_after = false;  // threaded OpenBLAS: sleep after it
  int64_t iterations = 1;
  std::vector<double> per_call_ns;
};

double time_ns(Contender& c) {
  const auto start = Clock::now();
  for (int64_t i = 0; i < c.iterations; ++i) {
    c.call();
    bench::clobber_memory();
  }
  return std::chrono::duration<double, std::nano>(Clock::now() - start).count() / static_cast<double>(c.iterations);
}

template <class T>
void run_shape(const Shape& s, int rounds, double sample_ms, double warm_ms, int budget, bool old_pacing) {
  flowlet_bench::gemm::Product<T> p(s.m, s.k, s.n, s.a_t, s.b_t);
  std::vector<Contender> all;
  all.emplace_back("flowlet", [&] { p.flowlet_matmul(); });
  all.emplace_back("OpenBLAS 1t", [&] { p.openblas(1); });
  all.emplace_back(fmt::format("OpenBLAS {}t", budget), [&] { p.openblas(budget); }, true);
#ifdef FLOWLET_HAVE_DNNL
  if constexpr (std::is_same_v<T, float>) all.emplace_back("oneDNN 1t", [&] { p.onednn(); });
#endif
#ifdef FLOWLET_BENCH_HAVE_TORCH
  all.emplace_back("libtorch", [&] { p.torch(); });
#endif

  // Calibrate each contender so that one sample takes about sample_ms.
  for (Contender& x : all) {
    if (!old_pacing) wait_until_process_idle();
    x.call();
    x.call();
    x.iterations = 1;
    double ns = time_ns(x);
    x.iterations = std::clamp<int64_t>(static_cast<int64_t>(sample_ms * 1e6 / std::max(ns, 1.0)), 1, 1 << 20);
    if (old_pacing && x.spins_after) std::this_thread::sleep_for(std::chrono::milliseconds(150));
  }
  for (int r = 0; r < rounds; ++r) {
    std::vector<Contender*> order;
    if (old_pacing) {
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
      if (old_pacing) {
        x.call();  // one untimed call
      } else {
        // From a quiet process, untimed calls for warm_ms (at least one): every contender's threads
        // wake and the kernel places them, as in a training loop that calls the product every
        // step. A woken thread can share its caller's core for several ms before the load
        // balancer moves it (docs/notes19/gemm.md); --warm-ms 0 measures that start.
        wait_until_process_idle();
        const auto warm_until = Clock::now() + std::chrono::microseconds(static_cast<int64_t>(warm_ms * 1e3));
        do x.call();
        while (Clock::now() < warm_until);
      }
      x.per_call_ns.push_back(time_ns(x));
      if (old_pacing && x.spins_after) std::this_thread::sleep_for(std::chrono::milliseconds(100));
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
    const double gflops = flops / median(all[j].per_call_ns);
    const double fastest = flops / *std::min_element(all[j].per_call_ns.begin(), all[j].per_call_ns.end());
    row += fmt::format(" {:>8.2f}", gflops);
    if (j == 0) {
      ours = gflops, ours_fastest = fastest;
    } else {
      if (gflops > best) best = gflops, best_name = all[j].name;
      best_fastest = std::max(best_fastest, fastest);
    }
  }
  // The figure that decides: per round, flowlet against the fastest other contender of that same
  // round (one process, interleaved, a few ms apart, so a slow minute slows both), the median over
  // rounds, and the lowest and highest round.
  // Beside it, per round against one-thread OpenBLAS (all[1]): a split product that falls below it
  // lost its second thread and then some (a late worker holding a piece).
  std::vector<double> per_round, per_round_1t;
  for (size_t r = 0; r < all[0].per_call_ns.size(); ++r) {
    double other = std::numeric_limits<double>::infinity();
    for (size_t j = 1; j < all.size(); ++j) other = std::min(other, all[j].per_call_ns[r]);
    per_round.push_back(other / all[0].per_call_ns[r]);
    per_round_1t.push_back(all[1].per_call_ns[r] / all[0].per_call_ns[r]);
  }
  const double decides = median(per_round);
  fmt::print("{}  {:>5.2f}x of {:<12} fastest rounds {:>5.2f}x  per round {:>5.2f}x [{:.2f}-{:.2f}]  vs OB 1t {:>5.2f}x{}\n", row,
             ours / best, best_name, ours_fastest / best_fastest, decides,
             *std::min_element(per_round.begin(), per_round.end()), *std::max_element(per_round.begin(), per_round.end()),
             median(per_round_1t), decides < 0.95 ? "  < 0.95" : "");
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 9;
  double sample_ms = 2, warm_ms = 20;
  bool f64 = false, train = true, squares = true, old_pacing = false;
  int64_t only_batch = 0;  // --batch B: only that batch's training shapes
  std::string only_name;   // --only TEXT: only the shapes whose name contains TEXT ("square 512")
  std::vector<Shape> given;  // --shape M K N FLAGS (nn, tn, nt, tt: which operand is a transposed view)
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--rounds" && i + 1 < argc) rounds = std::atoi(argv[++i]);
    else if (arg == "--sample-ms" && i + 1 < argc) sample_ms = std::atof(argv[++i]);
    else if (arg == "--warm-ms" && i + 1 < argc) warm_ms = std::atof(argv[++i]);
    else if (arg == "--f64") f64 = true;
    else if (arg == "--old-pacing") old_pacing = true;
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
      fmt::print(stderr, "usage: bench_gemm_shapes [--rounds N] [--sample-ms MS] [--warm-ms MS] [--f64] [--train|--squares] [--batch B] [--only TEXT] [--shape M K N nn|tn|nt|tt]... [--old-pacing]\n");
      return 2;
    }
  }
  const int budget = thread_budget();
  fmt::print("bench_gemm_shapes: {} rounds, budget {} threads, {}, samples {} ms after {} ms warm-up{}\n", rounds, budget,
             f64 ? "f64" : "f32", sample_ms, old_pacing ? 0.0 : warm_ms, old_pacing ? " (old pacing)" : "");
  fmt::print("   OPENBLAS_CORETYPE {}  OPENBLAS_L2_SIZE {}\n", bench::env_or_unset("OPENBLAS_CORETYPE"),
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
#ifdef FLOWLET_HAVE_DNNL
  if (!f64) columns += fmt::format(" {:>8}", "oneDNN1t");
#endif
#ifdef FLOWLET_BENCH_HAVE_TORCH
  columns += fmt::format(" {:>8}", "torch");
#endif
  fmt::print("{:<18} {:>17}  GFLOP/s:{}   flowlet / best (medians; fastest rounds; per-round ratio median [min-max], decides; per-round median vs OpenBLAS 1t)\n", "shape", "m x k x n", columns);
  std::vector<Shape> shapes = given;
  if (!given.empty()) train = squares = false;
  if (train) {
    for (const Shape& s : training_shapes()) {
      if (only_batch == 0 || s.name.starts_with(fmt::format("B={} ", only_batch))) shapes.push_back(s);
    }
  }
  if (squares && only_batch == 0) for (const Shape& s : square_shapes()) shapes.push_back(s);
  for (const Shape& s : shapes) {
    if (!only_name.empty() && s.name.find(only_name) == std::string::npos) continue;
    if (f64) run_shape<double>(s, rounds, sample_ms, warm_ms, budget, old_pacing);
    else run_shape<float>(s, rounds, sample_ms, warm_ms, budget, old_pacing);
  }
  return 0;
}
