// bench_gemm_shapes: flowlet matmul at the shapes MLP training uses (forward x @ W1, h @ W2 and the
// backward products with transposed operands, batch 1 ... 1024) and at squares 512-2048, beside every
// BLAS call this machine has, within one thread budget (issue 18 goal 1: >= 0.95x of the best):
//   OpenBLAS with one thread, OpenBLAS with its own threads set to the budget, libtorch at::matmul
//   with the budget as its intra-op threads.
// Interleaved rounds (each round times every contender once, in a rotating order), medians per call.
// Before each contender's sample the process is left to go quiet (wait_until_process_idle): threaded
// OpenBLAS's idle threads spin for about 0.11 s after a call and would take the second core from
// whichever contender ran next. Then the contender runs untimed for --warm-ms (20), so that its
// threads are awake and placed. --old-pacing restores round 18's way (threaded OpenBLAS last,
// then 100 ms of sleep; one untimed call) for comparison. oneDNN's sgemm on one thread is a contender where the build has
// it (flowlet uses it for thin f32 pieces).
//   FLOWLET_NUM_THREADS=2 bench_gemm_shapes [--rounds 9] [--f64] [--train|--squares] [--batch B] [--only TEXT]
//                                           [--sample-ms 2] [--warm-ms 20] [--old-pacing]
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <flowlet/flowlet.hpp>

#ifdef FLOWLET_HAVE_DNNL
#include <dnnl.h>
#include <omp.h>
#endif

#include "../harness.hpp"
#include "../torch_peer.hpp"

namespace fl = flowlet;
namespace bench = flowlet_bench;

namespace {

using Clock = std::chrono::steady_clock;

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

// Sleeps until no thread of this process burns CPU (at most 0.3 s): threaded OpenBLAS's idle
// threads spin for 2^28 cycles (~0.11 s here) after a call, libtorch's OpenMP threads and flowlet's
// pool workers for shorter. Called before every contender's sample, so each starts on a quiet
// process whatever ran before it (docs/notes19/gemm.md: a spinning peer thread on the second core
// halved the split GEMM of whichever contender came next).
double process_cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) / 1e6;
}

void wait_until_process_idle() {
  const auto give_up = Clock::now() + std::chrono::milliseconds(300);
  for (;;) {
    const double before = process_cpu_ms();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    if (process_cpu_ms() - before < 0.2 || Clock::now() > give_up) return;
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : (v[h - 1] + v[h]) / 2;
}

template <class T>
void run_shape(const Shape& s, int rounds, double sample_ms, double warm_ms, int budget, bool old_pacing) {
  constexpr bool is_f32 = std::is_same_v<T, float>;
  const fl::DType dtype = is_f32 ? fl::f32 : fl::f64;
  const fl::Tensor a_stored = fl::randn(s.a_t ? fl::Shape{s.k, s.m} : fl::Shape{s.m, s.k}, 1).astype(dtype);
  const fl::Tensor b_stored = fl::randn(s.b_t ? fl::Shape{s.n, s.k} : fl::Shape{s.k, s.n}, 2).astype(dtype);
  const fl::Tensor a = s.a_t ? fl::transpose(a_stored) : a_stored;
  const fl::Tensor b = s.b_t ? fl::transpose(b_stored) : b_stored;
  const T* pa = a_stored.data<T>();
  const T* pb = b_stored.data<T>();
  std::vector<T> c(static_cast<size_t>(s.m * s.n));
  const int M = static_cast<int>(s.m), N = static_cast<int>(s.n), K = static_cast<int>(s.k);
  const int lda = static_cast<int>(s.a_t ? s.m : s.k), ldb = static_cast<int>(s.b_t ? s.k : s.n);
  const CBLAS_TRANSPOSE ta = s.a_t ? CblasTrans : CblasNoTrans, tb = s.b_t ? CblasTrans : CblasNoTrans;
  auto gemm = [&] {
    if constexpr (is_f32) {
      cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.0f, pa, lda, pb, ldb, 0.0f, c.data(), N);
    } else {
      cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, 1.0, pa, lda, pb, ldb, 0.0, c.data(), N);
    }
    bench::do_not_optimize(c.data());
  };

  std::vector<Contender> all;
  all.emplace_back("flowlet", [&] { bench::do_not_optimize(fl::matmul(a, b)); });
  all.emplace_back("OpenBLAS 1t", [&] {
    openblas_set_num_threads(1);
    gemm();
  });
  all.emplace_back(fmt::format("OpenBLAS {}t", budget), [&] {
    openblas_set_num_threads(budget);
    gemm();
    openblas_set_num_threads(1);
  }, true);
#ifdef FLOWLET_HAVE_DNNL
  if constexpr (is_f32) {  // one thread, as flowlet calls it for thin pieces (src/kernels/gemm_thin.hpp)
    all.emplace_back("oneDNN 1t", [&] {
      const int threads = omp_get_max_threads();
      omp_set_num_threads(1);
      dnnl_sgemm(s.a_t ? 'T' : 'N', s.b_t ? 'T' : 'N', M, N, K, 1.0f, pa, lda, pb, ldb, 0.0f, c.data(), N);
      omp_set_num_threads(threads);
      bench::do_not_optimize(c.data());
    });
  }
#endif
#ifdef FLOWLET_BENCH_HAVE_TORCH
  const auto torch_dtype = is_f32 ? at::kFloat : at::kDouble;
  at::Tensor ta_t = at::from_blob(const_cast<T*>(pa), {s.a_t ? s.k : s.m, s.a_t ? s.m : s.k}, torch_dtype);
  at::Tensor tb_t = at::from_blob(const_cast<T*>(pb), {s.b_t ? s.n : s.k, s.b_t ? s.k : s.n}, torch_dtype);
  if (s.a_t) ta_t = ta_t.t();
  if (s.b_t) tb_t = tb_t.t();
  all.emplace_back("libtorch", [=] { bench::do_not_optimize(at::matmul(ta_t, tb_t)); });
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
  const double flops = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.k) * static_cast<double>(s.n);
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
  fmt::print("{}  {:>5.2f}x of {:<12} fastest rounds {:>5.2f}x{}\n", row, ours / best, best_name, ours_fastest / best_fastest,
             ours / best < 0.95 ? "  < 0.95" : "");
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 9;
  double sample_ms = 2, warm_ms = 20;
  bool f64 = false, train = true, squares = true, old_pacing = false;
  int64_t only_batch = 0;  // --batch B: only that batch's training shapes
  std::string only_name;   // --only TEXT: only the shapes whose name contains TEXT ("square 512")
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
    else {
      fmt::print(stderr, "usage: bench_gemm_shapes [--rounds N] [--sample-ms MS] [--warm-ms MS] [--f64] [--train|--squares] [--batch B] [--only TEXT] [--old-pacing]\n");
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
  fmt::print("{:<18} {:>17}  GFLOP/s:{}   flowlet / best (medians; fastest rounds)\n", "shape", "m x k x n", columns);
  std::vector<Shape> shapes;
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
