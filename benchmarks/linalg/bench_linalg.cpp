// f32 matmul 1024 x 1024: flowlet matmul against a direct cblas_sgemm into a preallocated buffer
// (target >= 95 % of it) and libtorch at::matmul, in GFLOP/s. Runs once per OpenBLAS setting.
#include <cblas.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
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
  sgemm();
  try {
    fl::Tensor product = fl::matmul(a, b);
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
  bench::Result blas = section.run("cblas_sgemm (preallocated)", [&] {
    sgemm();
    bench::do_not_optimize(c.data());
  });
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

}  // namespace

int main() {
  print_openblas();
  return bench::run_benchmark("bench_linalg", "linalg (f32 matmul 1024)", /*torch_uses_all_threads=*/true, run_all);
}
