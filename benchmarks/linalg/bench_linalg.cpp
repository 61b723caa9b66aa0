// f32 matmul 1024 x 1024: flowlet matmul against a direct cblas_sgemm into a preallocated buffer
// (target >= 95 % of it) and libtorch at::matmul, in GFLOP/s. Runs once per OpenBLAS setting.
// Then two such products at once (two threads) against one after the other: flowlet shares one
// pool, so running them together must not be slower; OpenBLAS's own threads shown for contrast.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <thread>
#include <vector>

#include <flowlet/flowlet.hpp>

#include "../harness.hpp"
#include "../torch_peer.hpp"

namespace fl = flowlet;
namespace bench = flowlet_bench;

namespace {

constexpr int64_t size = 1024;
constexpr double flops_per_call = 2.0 * size * size * size;

void print_openblas() {
  // First, so that the two runs of `make bench` (environment as is, then unset) are labelled.
  fmt::print("   {}  {}\n", bench::env_or_unset("OPENBLAS_CORETYPE"), bench::env_or_unset("OPENBLAS_L2_SIZE"));
#ifdef OPENBLAS_VERSION
  fmt::print("   OpenBLAS:{}core {}, {} threads, config: {}\n", OPENBLAS_VERSION, openblas_get_corename(),
             openblas_get_num_threads(), openblas_get_config());
#endif
}

// The thread budget flowlet's pool uses (FLOWLET_NUM_THREADS, else every hardware thread).
int thread_budget() {
  const char* env = std::getenv("FLOWLET_NUM_THREADS");
  const int asked = env ? std::atoi(env) : 0;
  return asked >= 1 ? asked : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// flowlet keeps OpenBLAS at one thread and splits GEMMs over its own pool; a direct cblas peer gets
// OpenBLAS's own threads for the whole budget while it runs, so it is the threaded library at its best.
class OpenBlasThreads {
 public:
  explicit OpenBlasThreads(int threads) { openblas_set_num_threads(threads); }
  ~OpenBlasThreads() { openblas_set_num_threads(1); }
  OpenBlasThreads(const OpenBlasThreads&) = delete;
  OpenBlasThreads& operator=(const OpenBlasThreads&) = delete;
};

void run_all() {
  fl::Tensor a = fl::randn(fl::Shape{size, size}, 1);
  fl::Tensor b = fl::randn(fl::Shape{size, size}, 2);
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  std::vector<float> c(static_cast<size_t>(size * size));
  auto sgemm = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, size, size, size, 1.0f, pa, size, pb, size, 0.0f,
                c.data(), size);
  };

  // Check flowlet against the direct call once: the same BLAS should give (nearly) the same bits.
  // flowlet's first matmul sets OpenBLAS to one thread; the peer's threads are set around it below.
  try {
    fl::Tensor product = fl::matmul(a, b);
    sgemm();
    const float* pp = product.data<float>();
    double worst = 0;
    for (size_t i = 0; i < c.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(pp[i] - c[i])));
    fmt::print("   check: max |flowlet - cblas_sgemm| = {:.3g}{}\n", worst,
               worst > 1e-3 ? "  WARNING: flowlet matmul disagrees; its timing means little" : "");
  } catch (const std::exception& error) {
    fmt::print("   flowlet matmul failed its check: {}\n", error.what());
  }

  bench::Section section("matmul 1024 f32", bench::Metric::rate("GFLOP/s", flops_per_call / 1e9),
                         "[1024, 1024] x [1024, 1024], a new tensor per call; GFLOP/s counts 2 n^3 per call");
  bench::Result ours = section.run("flowlet matmul", [&] { bench::do_not_optimize(fl::matmul(a, b)); });
  bench::Result blas = [&] {
    OpenBlasThreads threaded(thread_budget());
    return section.run(fmt::format("cblas_sgemm ({} OpenBLAS threads)", thread_budget()), [&] {
      sgemm();
      bench::do_not_optimize(c.data());
    });
  }();
#ifdef FLOWLET_BENCH_HAVE_TORCH
  at::NoGradGuard no_grad;
  at::Tensor ta = at::from_blob(const_cast<float*>(pa), {size, size}, at::kFloat);  // the same memory
  at::Tensor tb = at::from_blob(const_cast<float*>(pb), {size, size}, at::kFloat);
  bench::Result torch = section.run("libtorch at::matmul", [&] { bench::do_not_optimize(at::matmul(ta, tb)); });
#else
  bench::Result torch = section.skip("libtorch at::matmul");
#endif
  section.compare(ours, blas, bench::Target::at_least(0.95));
  section.compare(ours, torch, std::nullopt);
}

// Two independent products, as an executor running two ready matmul nodes would: from the caller
// and one std::thread at once, against the same two one after the other on the caller.
void run_two_at_once() {
  fl::Tensor a = fl::randn(fl::Shape{size, size}, 1);
  fl::Tensor b = fl::randn(fl::Shape{size, size}, 2);
  fl::Tensor d = fl::randn(fl::Shape{size, size}, 3);
  auto both = [](auto&& first, auto&& second, bool at_once) {
    if (!at_once) {
      first();
      second();
      return;
    }
    std::thread other(second);
    first();
    other.join();
  };
  bench::Section section("two matmuls 1024 f32", bench::Metric::time(),
                         "a b and d b, independent; time for both; caller + 1 std::thread vs one after the other");
  auto ours = [&](bool at_once) {
    both([&] { bench::do_not_optimize(fl::matmul(a, b)); }, [&] { bench::do_not_optimize(fl::matmul(d, b)); }, at_once);
  };
  bench::Result ours_serial = section.run("flowlet, one after other", [&] { ours(false); });
  bench::Result ours_together = section.run("flowlet, two at once", [&] { ours(true); });

  // Before the shared pool: OpenBLAS's own threads for the whole budget in every call.
  std::vector<float> c1(static_cast<size_t>(size * size)), c2(c1.size());
  auto sgemm = [&](const fl::Tensor& x, std::vector<float>& out) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, size, size, size, 1.0f, x.data<float>(), size,
                b.data<float>(), size, 0.0f, out.data(), size);
    bench::do_not_optimize(out.data());
  };
  OpenBlasThreads threaded(thread_budget());
  auto theirs = [&](bool at_once) { both([&] { sgemm(a, c1); }, [&] { sgemm(d, c2); }, at_once); };
  bench::Result blas_serial = section.run("cblas threaded, one after other", [&] { theirs(false); });
  bench::Result blas_together = section.run("cblas threaded, two at once", [&] { theirs(true); });

  // Ratios of times: at once / one after the other (<= 1: running together costs nothing).
  section.compare(ours_together, ours_serial, bench::Target::at_most(1.0));
  section.compare(blas_together, blas_serial, std::nullopt);
  section.compare(ours_together, blas_together, std::nullopt);
}

}  // namespace

int main() {
  print_openblas();
  return bench::run_benchmark("bench_linalg", "linalg (f32 matmul 1024)", /*torch_uses_all_threads=*/true, [] {
    run_all();
    run_two_at_once();
  });
}
