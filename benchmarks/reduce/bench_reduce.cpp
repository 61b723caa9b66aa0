// Full reduction: sum and mean over 16M f32 (issue 18 goal 5: flowlet >= 1.0x libtorch's GB/s in
// the same run, relative error <= 1e-7). The deciding figure is the paced interleaved rounds
// (benchmarks/paced_rounds.hpp): flowlet sum and mean, libtorch at::sum and at::mean, and a plain
// C++ loop as the bandwidth floor on one thread and on the thread budget through flowlet's pool;
// before every sample the process goes quiet (libtorch's OpenMP worker spins on after its calls)
// and the contender warms up alone; per-round ratios, medians. Each contender's own section comes
// first (flowlet, hand-vectorized 1-thread loops with f32 and f64 accumulators: target >= 90 % of
// the f32 one, libtorch), then the other reductions models use (short and long rows, column
// means, batch norm's axes 0, 2, 3 of NCHW, max, argmax) beside libtorch, to catch regressions,
// and the accuracy of each answer on 0.1f values (exact: 1677721.6).
// libtorch gets flowlet's thread count (FLOWLET_NUM_THREADS); its OpenMP settings stay the user's.
//   FLOWLET_NUM_THREADS=2 bench_reduce [--rounds 24] [--warm-ms 20] [--sample-ms 30] [--rounds-only]
//                                      [--no-quiet]   (no quiet wait: what the pacing removes)
// GCC 12's AVX-512 intrinsics use a self-initialized "undefined" vector that trips -Wuninitialized
// inside the header itself (GCC PR 105593); silence it for that header only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include <flowlet/flowlet.hpp>

#include "../harness.hpp"
#include "../paced_rounds.hpp"
#include "../torch_peer.hpp"
#include "runtime/thread_pool.hpp"

namespace fl = flowlet;
namespace bench = flowlet_bench;

namespace {

constexpr int64_t count = int64_t{1} << 24;  // 16M elements, 64 MiB
constexpr double bytes_per_call = static_cast<double>(count) * sizeof(float);
constexpr double reference_sum = 1677721.6;  // 16M x 0.1 as the user means it

// Horizontal sum through memory, one loop for every vector width.
template <class Lane, class Store, class Vector>
double horizontal_sum(Store store, Vector vector) {
  constexpr int lanes = sizeof(Vector) / sizeof(Lane);
  alignas(64) Lane values[lanes];
  store(values, vector);
  double total = 0;
  for (int i = 0; i < lanes; ++i) total += values[i];
  return total;
}

// f32 accumulation in 8 independent vector registers (hides the add latency), as a user would write it.
__attribute__((target("avx512f"), noinline)) float sum_avx512(const float* p, int64_t n) {
  __m512 acc[8];
  for (auto& a : acc) a = _mm512_setzero_ps();
  const int64_t main_end = n - n % 128;
  for (int64_t i = 0; i < main_end; i += 128) {
    for (int k = 0; k < 8; ++k) acc[k] = _mm512_add_ps(acc[k], _mm512_loadu_ps(p + i + 16 * k));
  }
  __m512 total = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])),
                               _mm512_add_ps(_mm512_add_ps(acc[4], acc[5]), _mm512_add_ps(acc[6], acc[7])));
  auto store = [](float* out, __m512 v) __attribute__((target("avx512f"))) { _mm512_store_ps(out, v); };
  float result = static_cast<float>(horizontal_sum<float>(store, total));
  for (int64_t i = main_end; i < n; ++i) result += p[i];
  return result;
}

// The same with f64 accumulators: the accuracy flowlet promises, at twice the adds.
__attribute__((target("avx512f"), noinline)) double sum_avx512_f64(const float* p, int64_t n) {
  __m512d acc[8];
  for (auto& a : acc) a = _mm512_setzero_pd();
  const int64_t main_end = n - n % 64;
  for (int64_t i = 0; i < main_end; i += 64) {
    for (int k = 0; k < 8; ++k) acc[k] = _mm512_add_pd(acc[k], _mm512_cvtps_pd(_mm256_loadu_ps(p + i + 8 * k)));
  }
  __m512d total = _mm512_add_pd(_mm512_add_pd(_mm512_add_pd(acc[0], acc[1]), _mm512_add_pd(acc[2], acc[3])),
                                _mm512_add_pd(_mm512_add_pd(acc[4], acc[5]), _mm512_add_pd(acc[6], acc[7])));
  auto store = [](double* out, __m512d v) __attribute__((target("avx512f"))) { _mm512_store_pd(out, v); };
  double result = horizontal_sum<double>(store, total);
  for (int64_t i = main_end; i < n; ++i) result += p[i];
  return result;
}

__attribute__((target("avx2"), noinline)) float sum_avx2(const float* p, int64_t n) {
  __m256 acc[8];
  for (auto& a : acc) a = _mm256_setzero_ps();
  const int64_t main_end = n - n % 64;
  for (int64_t i = 0; i < main_end; i += 64) {
    for (int k = 0; k < 8; ++k) acc[k] = _mm256_add_ps(acc[k], _mm256_loadu_ps(p + i + 8 * k));
  }
  __m256 total = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])),
                               _mm256_add_ps(_mm256_add_ps(acc[4], acc[5]), _mm256_add_ps(acc[6], acc[7])));
  auto store = [](float* out, __m256 v) __attribute__((target("avx2"))) { _mm256_store_ps(out, v); };
  float result = static_cast<float>(horizontal_sum<float>(store, total));
  for (int64_t i = main_end; i < n; ++i) result += p[i];
  return result;
}

__attribute__((target("avx2"), noinline)) double sum_avx2_f64(const float* p, int64_t n) {
  __m256d acc[8];
  for (auto& a : acc) a = _mm256_setzero_pd();
  const int64_t main_end = n - n % 32;
  for (int64_t i = 0; i < main_end; i += 32) {
    for (int k = 0; k < 8; ++k) acc[k] = _mm256_add_pd(acc[k], _mm256_cvtps_pd(_mm_loadu_ps(p + i + 4 * k)));
  }
  __m256d total = _mm256_add_pd(_mm256_add_pd(_mm256_add_pd(acc[0], acc[1]), _mm256_add_pd(acc[2], acc[3])),
                                _mm256_add_pd(_mm256_add_pd(acc[4], acc[5]), _mm256_add_pd(acc[6], acc[7])));
  auto store = [](double* out, __m256d v) __attribute__((target("avx2"))) { _mm256_store_pd(out, v); };
  double result = horizontal_sum<double>(store, total);
  for (int64_t i = main_end; i < n; ++i) result += p[i];
  return result;
}

constexpr double exact_input_sum = static_cast<double>(count) * static_cast<double>(0.1f);  // 1677721.625

void print_accuracy(const std::string& name, double value, bool with_target = false) {
  const double error = std::fabs(value - reference_sum) / reference_sum;
  std::string target = with_target ? fmt::format("  (target <= 1e-7: {})", error <= 1e-7 ? "met" : "MISSED") : "";
  fmt::print("   {:<26} {:>15.4f}  relative error {:.2e} vs 1677721.6, {:.2e} vs the inputs' exact sum{}\n", name,
             value, error, std::fabs(value - exact_input_sum) / exact_input_sum, target);
}

// The bandwidth floor: a plain C++ loop of 16 independent f32 lanes (GCC -O3 vectorizes it into
// two vector registers), no intrinsics, no f64. What reading 64 MiB costs one thread here.
float plain_sum(const float* p, int64_t n) {
  float lanes[16] = {};
  const int64_t main_end = n - n % 16;
  for (int64_t i = 0; i < main_end; i += 16) {
    for (int j = 0; j < 16; ++j) lanes[j] += p[i + j];
  }
  float total = 0;
  for (float lane : lanes) total += lane;
  for (int64_t i = main_end; i < n; ++i) total += p[i];
  return total;
}

// The same loop over `pieces` equal pieces claimed through flowlet's pool (run_chunks, as sum
// does), partials added in f64: the floor for the thread budget.
double plain_sum_on_pool(const float* p, int64_t n, int64_t pieces) {
  std::vector<double> partial(static_cast<size_t>(pieces));
  auto piece = [&](int64_t k) {
    const int64_t begin = n * k / pieces, end = n * (k + 1) / pieces;
    partial[static_cast<size_t>(k)] = plain_sum(p + begin, end - begin);
  };
  fl::detail::run_chunks(pieces, fl::detail::FunctionRef<void(int64_t)>(piece));
  double total = 0;
  for (double x : partial) total += x;
  return total;
}

// PyTorch from Python (benchmarks/reduce/torch_sum.py, same thread count, paced the same way) when
// FLOWLET_TORCH_PYTHON names an interpreter with torch; a separate process after ours, so for
// information beside the interleaved figures.
void python_torch_figures(int threads) {
  const char* python = std::getenv("FLOWLET_TORCH_PYTHON");
  if (python == nullptr) {
    fmt::print("   PyTorch (Python): not run (set FLOWLET_TORCH_PYTHON to an interpreter with torch)\n");
    return;
  }
  const std::string command = fmt::format("'{}' '{}/benchmarks/reduce/torch_sum.py' --threads {} 2>&1", python,
                                          FLOWLET_BENCH_SOURCE_DIR, threads);
  std::FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    fmt::print("   PyTorch (Python): could not start {}\n", python);
    return;
  }
  char line[512];
  while (std::fgets(line, sizeof line, pipe) != nullptr) {
    char op[16] = {}, version[64] = {};
    double gbs = 0, p10 = 0, p90 = 0;
    if (std::sscanf(line, "%15s %lf %lf %lf %63s", op, &gbs, &p10, &p90, version) == 5) {
      fmt::print("   {:<30} {:>10.2f}   [{:>5.2f}, {:>5.2f}]   (PyTorch {} from Python, {} threads, own process)\n",
                 fmt::format("torch.{}", op), gbs, p10, p90, version, threads);
    } else {
      fmt::print("   PyTorch (Python): {}", line);
    }
  }
  pclose(pipe);
}

// The figure that decides issue 18 goal 5: flowlet sum and mean against libtorch's, with the floor
// loops, in paced interleaved rounds (benchmarks/paced_rounds.hpp: before every sample the process
// goes quiet, then the contender warms up on its own). Per-round ratios flowlet / libtorch, median
// and range.
void interleaved_rounds(const fl::Tensor& t, bench::Pacing pacing) {
  const float* p = t.data<float>();
  const int threads = fl::detail::intra_op_threads();
  std::vector<bench::PacedContender> all;
  all.emplace_back("flowlet sum(t)", [&] { bench::do_not_optimize(fl::sum(t)); });
  all.emplace_back("flowlet mean(t)", [&] { bench::do_not_optimize(fl::mean(t)); });
#ifdef FLOWLET_BENCH_HAVE_TORCH
  at::Tensor tt = at::from_blob(const_cast<float*>(p), {count}, at::kFloat);  // the same memory
  all.emplace_back("libtorch at::sum", [&] { bench::do_not_optimize(at::sum(tt)); });
  all.emplace_back("libtorch at::mean", [&] { bench::do_not_optimize(at::mean(tt)); });
#endif
  all.emplace_back("C++ loop, 1 thread", [&] { bench::do_not_optimize(plain_sum(p, count)); });
  if (threads > 1) {
    all.emplace_back(fmt::format("C++ loop, {} threads (pool)", threads),
                     [&] { bench::do_not_optimize(plain_sum_on_pool(p, count, 64 * threads)); });
  }
  if (pacing.rounds <= 0) {  // default: whole cycles of the balanced order, at least 20 rounds
    const int cycle = static_cast<int>(bench::round_order_cycle(all.size()));
    pacing.rounds = cycle * ((20 + cycle - 1) / cycle);
  }
  fmt::print("\n-- sum and mean of 16M f32, paced interleaved rounds (the figure for the target)\n");
  fmt::print("   {} rounds, balanced order; before each sample: {}{} ms of untimed calls; samples "
             "~{} ms; flowlet {} threads, libtorch {}; load average {}\n",
             pacing.rounds, pacing.quiet ? "process quiet, then " : "NO quiet wait (--no-quiet), ", pacing.warm_ms,
             pacing.sample_ms, threads,
#ifdef FLOWLET_BENCH_HAVE_TORCH
             at::get_num_threads(),
#else
             "n/a",
#endif
             bench::load_average());
  fmt::print("   {} (GOMP_SPINCOUNT {}, OMP_WAIT_POLICY {})\n", "peer settings as users get them",
             bench::env_or_unset("GOMP_SPINCOUNT"), bench::env_or_unset("OMP_WAIT_POLICY"));
  // How long each contender's threads go on using CPU after one call from a quiet process, and
  // (last column) the median time the process took to go quiet after its timed sample (2 ms steps):
  // what the pacing waits out.
  std::vector<double> busy_after;
  for (bench::PacedContender& c : all) {
    std::vector<double> busy;
    for (int i = 0; i < 5; ++i) busy.push_back(bench::busy_after_call_ms(c.call));
    busy_after.push_back(bench::median_of(busy));
  }
  bench::run_paced_rounds(all, pacing);
  auto gbs = [](double ns) { return ns > 0 ? bytes_per_call / ns : 0.0; };
  fmt::print("   {:<30} {:>10} {:>18} {:>14} {:>20} {:>18}\n", "contender", "GB/s", "[p10, p90]", "ms per call",
             "busy after 1 call", "after its sample");
  for (size_t i = 0; i < all.size(); ++i) {
    std::vector<double> rates;
    for (double ns : all[i].per_call_ns) rates.push_back(gbs(ns));
    std::sort(rates.begin(), rates.end());
    fmt::print("   {:<30} {:>10.2f}   [{:>5.2f}, {:>5.2f}] {:>14.3f} {:>17.1f} ms {:>15.1f} ms\n", all[i].name,
               gbs(all[i].median_ns()), bench::detail::percentile(rates, 0.1), bench::detail::percentile(rates, 0.9),
               all[i].median_ns() / 1e6, busy_after[i], bench::median_of(all[i].quiet_wait_ms));
  }
#ifdef FLOWLET_BENCH_HAVE_TORCH
  auto ratio_line = [&](const bench::PacedContender& ours, const bench::PacedContender& peer, const char* what) {
    std::vector<double> ratios;
    for (size_t r = 0; r < ours.per_call_ns.size(); ++r) ratios.push_back(peer.per_call_ns[r] / ours.per_call_ns[r]);
    const double ratio = bench::median_of(ratios);
    fmt::print("   {:<5} flowlet / libtorch GB/s: median per-round ratio {:.2f} (range {:.2f} .. {:.2f}; ratio of "
               "medians {:.2f}; target >= 1.0: {})\n",
               what, ratio, *std::min_element(ratios.begin(), ratios.end()),
               *std::max_element(ratios.begin(), ratios.end()), peer.median_ns() / ours.median_ns(),
               ratio >= 1.0 ? "met" : "MISSED");
  };
  ratio_line(all[0], all[2], "sum");
  ratio_line(all[1], all[3], "mean");
#endif
  python_torch_figures(threads);
  fmt::print("   load average after the rounds {}\n", bench::load_average());
}

// The reductions models use besides full sums, for regressions: short rows (softmax over 10
// classes), rows of a hidden layer, column means (batch norm over the batch), max and argmax.
void other_reductions() {
  struct Case {
    std::string name;
    fl::Shape shape;
    std::function<fl::Tensor(const fl::Tensor&)> op;
#ifdef FLOWLET_BENCH_HAVE_TORCH
    std::function<at::Tensor(const at::Tensor&)> torch_op;
#endif
  };
#ifdef FLOWLET_BENCH_HAVE_TORCH
#define FLOWLET_TORCH_OP(...) , __VA_ARGS__
#else
#define FLOWLET_TORCH_OP(...)
#endif
  const std::vector<Case> cases = {
      {"sum axis 1 of [65536, 10]", fl::Shape{65536, 10}, [](const fl::Tensor& x) { return fl::sum(x, {1}); }
       FLOWLET_TORCH_OP([](const at::Tensor& x) { return at::sum(x, at::IntArrayRef{1}); })},
      {"sum axis 1 of [4096, 256]", fl::Shape{4096, 256}, [](const fl::Tensor& x) { return fl::sum(x, {1}); }
       FLOWLET_TORCH_OP([](const at::Tensor& x) { return at::sum(x, at::IntArrayRef{1}); })},
      {"mean axis 0 of [1024, 256]", fl::Shape{1024, 256}, [](const fl::Tensor& x) { return fl::mean(x, {0}); }
       FLOWLET_TORCH_OP([](const at::Tensor& x) { return at::mean(x, at::IntArrayRef{0}); })},
      {"mean axes 0,2 of [64, 32, 256]", fl::Shape{64, 32, 256}, [](const fl::Tensor& x) { return fl::mean(x, {0, 2}); }
       FLOWLET_TORCH_OP([](const at::Tensor& x) { return at::mean(x, at::IntArrayRef{0, 2}); })},
      {"sum axes 0,2,3 of [128, 32, 28, 28]", fl::Shape{128, 32, 28, 28},
       [](const fl::Tensor& x) { return fl::sum(x, {0, 2, 3}); }
       FLOWLET_TORCH_OP([](const at::Tensor& x) { return at::sum(x, at::IntArrayRef{0, 2, 3}); })},
      {"max axis 1 of [4096, 256]", fl::Shape{4096, 256}, [](const fl::Tensor& x) { return fl::max(x, {1}); }
       FLOWLET_TORCH_OP([](const at::Tensor& x) { return std::get<0>(at::max(x, 1)); })},
      {"argmax axis 1 of [65536, 10]", fl::Shape{65536, 10}, [](const fl::Tensor& x) { return fl::argmax(x, 1); }
       FLOWLET_TORCH_OP([](const at::Tensor& x) { return at::argmax(x, 1); })},
  };
#undef FLOWLET_TORCH_OP
  for (const Case& c : cases) {
    const fl::Tensor x = fl::uniform(c.shape, -1.0, 1.0, /*seed=*/5);
    bench::Section section(c.name, bench::Metric::time(), "f32, time per call");
    bench::Result ours = section.run("flowlet", [&] { bench::do_not_optimize(c.op(x)); });
#ifdef FLOWLET_BENCH_HAVE_TORCH
    std::vector<int64_t> sizes(c.shape.begin(), c.shape.end());
    at::Tensor tx = at::from_blob(const_cast<float*>(x.data<float>()), sizes, at::kFloat);
    bench::Result torch = section.run("libtorch", [&] { bench::do_not_optimize(c.torch_op(tx)); });
#else
    bench::Result torch = section.skip("libtorch");
#endif
    section.compare(ours, torch, std::nullopt);
  }
}

// Which parts run: everything (the default), or only the paced rounds (--rounds-only).
struct Options {
  bench::Pacing pacing{.rounds = 0};  // 0: whole cycles of the balanced order, at least 20 rounds
  bool rounds_only = false;
};

void run_all(const Options& options) {
  fl::Tensor t = fl::full(fl::Shape{count}, 0.1, fl::f32);
  if (options.rounds_only) {
    interleaved_rounds(t, options.pacing);
    return;
  }
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const bool avx2 = __builtin_cpu_supports("avx2");
  fmt::print("   hand loops use {}\n", avx512 ? "AVX-512" : avx2 ? "AVX2" : "plain C++ (no AVX2 on this CPU)");
  const float* p = t.data<float>();
  auto hand_f32 = [&](const float* data, int64_t n) -> double {
    if (avx512) return sum_avx512(data, n);
    if (avx2) return sum_avx2(data, n);
    float total = 0;
    for (int64_t i = 0; i < n; ++i) total += data[i];
    return total;
  };
  auto hand_f64 = [&](const float* data, int64_t n) -> double {
    if (avx512) return sum_avx512_f64(data, n);
    if (avx2) return sum_avx2_f64(data, n);
    double total = 0;
    for (int64_t i = 0; i < n; ++i) total += data[i];
    return total;
  };
  const std::string isa = avx512 ? "AVX-512" : avx2 ? "AVX2" : "scalar";

  bench::Section section("sum 16M f32", bench::Metric::rate("GB/s", bytes_per_call / 1e9),
                         "sum of all elements to a scalar; GB/s counts 64 MiB read per call");
  bench::Result ours = section.run("flowlet sum(t)", [&] { bench::do_not_optimize(fl::sum(t)); });
  bench::Result loop = section.run(isa + " loop f32 acc 1-thread", [&] {
    double total = hand_f32(p, count);
    bench::do_not_optimize(total);
  });
  bench::Result loop64 = section.run(isa + " loop f64 acc 1-thread", [&] {
    double total = hand_f64(p, count);
    bench::do_not_optimize(total);
  });
#ifdef FLOWLET_BENCH_HAVE_TORCH
  at::Tensor tt = at::from_blob(const_cast<float*>(p), {count}, at::kFloat);  // the same memory
  bench::Result torch = section.run("libtorch at::sum", [&] { bench::do_not_optimize(at::sum(tt)); });
#else
  bench::Result torch = section.skip("libtorch at::sum");
#endif
  section.compare(ours, loop, bench::Target::at_least(0.90));
  section.compare(ours, loop64, std::nullopt);
  section.compare(ours, torch, std::nullopt);

  interleaved_rounds(t, options.pacing);
  other_reductions();

  fmt::print("\n-- accuracy: sum of 16M x 0.1f (exact 1677721.6; the f32 inputs 0.1f sum to exactly {:.3f})\n",
             exact_input_sum);
  try {
    print_accuracy("flowlet sum(t)", fl::sum(t).item<float>(), /*with_target=*/true);
    print_accuracy("flowlet mean(t) x 16M", static_cast<double>(fl::mean(t).item<float>()) * count, true);
  } catch (const std::exception& error) {
    fmt::print("   flowlet sum(t) failed: {}\n", error.what());
  }
  print_accuracy(isa + " loop f32 acc", hand_f32(p, count));
  print_accuracy(isa + " loop f64 acc", hand_f64(p, count));
#ifdef FLOWLET_BENCH_HAVE_TORCH
  print_accuracy("libtorch at::sum", at::sum(tt).item<float>());
  print_accuracy("libtorch at::mean x 16M", static_cast<double>(at::mean(tt).item<float>()) * count);
#else
  fmt::print("   libtorch: not available\n");
#endif
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (bench::parse_pacing_option(argc, argv, i, options.pacing)) continue;  // rounds default 20-24
    if (arg == "--rounds-only") options.rounds_only = true;
    else {
      fmt::print(stderr, "usage: bench_reduce [--rounds N] [--warm-ms MS] [--sample-ms MS] [--rounds-only] [--no-quiet]\n");
      return 2;
    }
  }
  // libtorch gets flowlet's thread count (FLOWLET_NUM_THREADS, default every hardware thread).
#ifdef FLOWLET_BENCH_HAVE_TORCH
  at::set_num_threads(fl::detail::intra_op_threads());
  at::NoGradGuard no_grad;
#endif
  return bench::run_benchmark("bench_reduce", "reduction (16M f32 sum and mean)", /*torch_uses_all_threads=*/false,
                              [&] { run_all(options); });
}
