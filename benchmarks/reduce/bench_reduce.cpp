// Full reduction: sum over 16M f32. flowlet sum(t) against a hand-vectorized single-thread loop
// (AVX-512, or AVX2 where the CPU lacks it; target >= 90 % of it) and libtorch at::sum (issue 18:
// >= 1.0x its GB/s, measured also in interleaved rounds), plus the accuracy of each answer on 0.1f
// values (exact: 1677721.6; target relative error <= 1e-7). Then the other reductions models use
// (short and long rows, column means, batch norm's axes 0, 2, 3 of NCHW, max, argmax) beside
// libtorch, to catch regressions. FLOWLET_NUM_THREADS=1 gives libtorch one thread too.
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
#include <cstdlib>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include <flowlet/flowlet.hpp>

#include "../harness.hpp"
#include "../torch_peer.hpp"

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

#ifdef FLOWLET_BENCH_HAVE_TORCH
// flowlet sum and at::sum in alternating rounds (which one goes first alternates too), each round
// one batch of calls per contender: on a shared machine a load change then hits both alike, and
// the median of the per-round ratios is the figure to compare with the target (>= 1.0).
void interleaved_against_torch(const fl::Tensor& t, const at::Tensor& tt) {
  constexpr int kRounds = 15, kCalls = 4;
  auto batch_seconds = [&](auto&& body) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kCalls; ++i) body();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / kCalls;
  };
  auto ours = [&] { bench::do_not_optimize(fl::sum(t)); };
  auto torch = [&] { bench::do_not_optimize(at::sum(tt)); };
  ours();
  torch();
  std::vector<double> ours_gbs, torch_gbs, ratios;
  for (int round = 0; round < kRounds; ++round) {
    double a = 0, b = 0;
    if (round % 2 == 0) {
      a = batch_seconds(ours);
      b = batch_seconds(torch);
    } else {
      b = batch_seconds(torch);
      a = batch_seconds(ours);
    }
    ours_gbs.push_back(bytes_per_call / a / 1e9);
    torch_gbs.push_back(bytes_per_call / b / 1e9);
    ratios.push_back(b / a);  // flowlet GB/s over libtorch GB/s
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  fmt::print("\n-- sum 16M f32, interleaved: {} rounds of {} calls each, alternating which goes first\n", kRounds, kCalls);
  fmt::print("   flowlet sum(t) median {:.2f} GB/s, libtorch at::sum median {:.2f} GB/s\n", median(ours_gbs),
             median(torch_gbs));
  const double ratio = median(ratios);
  fmt::print("   median per-round ratio flowlet / libtorch {:.2f} (range {:.2f} .. {:.2f}; target >= 1.0: {})\n", ratio,
             *std::min_element(ratios.begin(), ratios.end()), *std::max_element(ratios.begin(), ratios.end()),
             ratio >= 1.0 ? "met" : "MISSED");
}
#endif

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

void run_all() {
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const bool avx2 = __builtin_cpu_supports("avx2");
  fmt::print("   hand loops use {}\n", avx512 ? "AVX-512" : avx2 ? "AVX2" : "plain C++ (no AVX2 on this CPU)");

  fl::Tensor t = fl::full(fl::Shape{count}, 0.1, fl::f32);
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
  at::NoGradGuard no_grad;
  at::Tensor tt = at::from_blob(const_cast<float*>(p), {count}, at::kFloat);  // the same memory
  bench::Result torch = section.run("libtorch at::sum", [&] { bench::do_not_optimize(at::sum(tt)); });
#else
  bench::Result torch = section.skip("libtorch at::sum");
#endif
  section.compare(ours, loop, bench::Target::at_least(0.90));
  section.compare(ours, loop64, std::nullopt);
  section.compare(ours, torch, std::nullopt);

#ifdef FLOWLET_BENCH_HAVE_TORCH
  interleaved_against_torch(t, tt);
#endif
  other_reductions();

  fmt::print("\n-- accuracy: sum of 16M x 0.1f (exact 1677721.6; the f32 inputs 0.1f sum to exactly {:.3f})\n",
             exact_input_sum);
  try {
    print_accuracy("flowlet sum(t)", fl::sum(t).item<float>(), /*with_target=*/true);
  } catch (const std::exception& error) {
    fmt::print("   flowlet sum(t) failed: {}\n", error.what());
  }
  print_accuracy(isa + " loop f32 acc", hand_f32(p, count));
  print_accuracy(isa + " loop f64 acc", hand_f64(p, count));
#ifdef FLOWLET_BENCH_HAVE_TORCH
  print_accuracy("libtorch at::sum", at::sum(tt).item<float>());
#else
  fmt::print("   libtorch: not available\n");
#endif
}

}  // namespace

int main() {
  // With FLOWLET_NUM_THREADS=1 libtorch gets one thread too: on a busy machine (libtorch's OpenMP
  // threads spin under load) one thread each is the steadier comparison.
  const char* threads = std::getenv("FLOWLET_NUM_THREADS");
  const bool one_thread = threads != nullptr && std::string(threads) == "1";
#ifdef FLOWLET_BENCH_HAVE_TORCH
  if (one_thread) at::set_num_threads(1);
#endif
  return bench::run_benchmark("bench_reduce", "reduction (16M f32 sum)", /*torch_uses_all_threads=*/!one_thread, run_all);
}
