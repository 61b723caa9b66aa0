// Memory-bound elementwise: c = a + b over 16M f32 producing a new tensor. flowlet against a plain
// 2-thread loop into a preallocated buffer (the bandwidth floor; target >= 90 % of it), libtorch
// at::add, and xtensor (single thread) beside a 1-thread loop, so we know which engine is faster.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <thread>
#include <vector>

#if __has_include(<xsimd/xsimd.hpp>)
#define XTENSOR_USE_XSIMD 1  // xtensor at its best: explicit SIMD through xsimd
constexpr const char* xtensor_kind = "+xsimd";
#else
constexpr const char* xtensor_kind = "";
#endif
#include <xtensor/xadapt.hpp>
#include <xtensor/xnoalias.hpp>
#include <xtensor/xtensor.hpp>

#include <flowlet/flowlet.hpp>

#include "../harness.hpp"
#include "../torch_peer.hpp"

namespace fl = flowlet;
namespace bench = flowlet_bench;

namespace {

constexpr int64_t count = int64_t{1} << 24;  // 16M elements, 64 MiB per operand
// Bytes moved per call: read a, read b, write c.
constexpr double bytes_per_call = 3.0 * static_cast<double>(count) * sizeof(float);

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<float[], FreeDeleter>;

Buffer allocate(int64_t n) {
  auto* p = static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>(n) * sizeof(float)));
  if (!p) throw std::bad_alloc();
  return Buffer(p);
}

// The plain loop, out of line so it is compiled (and vectorized) once, as a user would write it.
__attribute__((noinline)) void add_range(const float* __restrict a, const float* __restrict b, float* __restrict c,
                                         int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) c[i] = a[i] + b[i];
}

// Splits [0, n) into `threads` contiguous parts; the calling thread takes the first.
void add_threads(const float* a, const float* b, float* c, int64_t n, int threads) {
  std::vector<std::thread> helpers;
  int64_t part = (n + threads - 1) / threads;
  for (int t = 1; t < threads; ++t) {
    int64_t begin = std::min(n, part * t), end = std::min(n, begin + part);
    helpers.emplace_back(add_range, a, b, c, begin, end);
  }
  add_range(a, b, c, 0, std::min(n, part));
  for (auto& helper : helpers) helper.join();
}

void check(const fl::Tensor& got, const float* a, const float* b) {
  const float* c = got.data<float>();
  for (int64_t i = 0; i < count; i += 4099) {
    if (c[i] != a[i] + b[i]) {
      fmt::print("   WARNING: flowlet a + b is wrong at element {} ({} != {}); its timing means little\n", i, c[i],
                 a[i] + b[i]);
      return;
    }
  }
}

void run_all() {
  const bench::Metric metric = bench::Metric::rate("GB/s", bytes_per_call / 1e9);
  fl::Tensor a = fl::uniform(fl::Shape{count}, -1.0, 1.0, 1);
  fl::Tensor b = fl::uniform(fl::Shape{count}, -1.0, 1.0, 2);
  // Every contender reads the same input memory.
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  try {
    check(a + b, pa, pb);
  } catch (const std::exception& error) {
    fmt::print("   flowlet a + b failed its check: {}\n", error.what());
  }

  bench::Section section("add 16M f32", metric,
                         "c = a + b, a new tensor per call; GB/s counts 3 x 64 MiB per call");
  bench::Result ours = section.run("flowlet", [&] { bench::do_not_optimize(a + b); });

  Buffer out = allocate(count);  // the loops write here: preallocated, touched in warm-up
  float* pc = out.get();
  bench::Result loop2 = section.run("2-thread loop (preallocated)", [&] {
    add_threads(pa, pb, pc, count, 2);
    bench::do_not_optimize(pc);
  });
  bench::Result loop1 = section.run("1-thread loop (preallocated)", [&] {
    add_range(pa, pb, pc, 0, count);
    bench::do_not_optimize(pc);
  });

#ifdef FLOWLET_BENCH_HAVE_TORCH
  at::NoGradGuard no_grad;
  // Views of the same memory; at::add allocates a new output each call, as flowlet does.
  at::Tensor ta = at::from_blob(const_cast<float*>(pa), {count}, at::kFloat);
  at::Tensor tb = at::from_blob(const_cast<float*>(pb), {count}, at::kFloat);
  bench::Result torch = section.run("libtorch at::add", [&] { bench::do_not_optimize(at::add(ta, tb)); });
#else
  bench::Result torch = section.skip("libtorch at::add");
#endif

  const std::array<size_t, 1> shape{static_cast<size_t>(count)};
  auto xa = xt::adapt(pa, static_cast<size_t>(count), xt::no_ownership(), shape);
  auto xb = xt::adapt(pb, static_cast<size_t>(count), xt::no_ownership(), shape);
  xt::xtensor<float, 1> xc = xt::xtensor<float, 1>::from_shape(shape);
  bench::Result xtensor_noalias = section.run(fmt::format("xtensor{} noalias 1-thread", xtensor_kind), [&] {
    xt::noalias(xc) = xa + xb;
    bench::do_not_optimize(xc.data());
  });
  bench::Result xtensor_plain = section.run(fmt::format("xtensor{} c = a + b 1-thread", xtensor_kind), [&] {
    xc = xa + xb;  // xtensor assigns through a temporary unless told noalias
    bench::do_not_optimize(xc.data());
  });

  section.compare(ours, loop2, bench::Target::at_least(0.90));
  section.compare(ours, torch, std::nullopt);
  section.compare(ours, xtensor_noalias, std::nullopt);
  section.compare(xtensor_noalias, loop1, std::nullopt);
  section.compare(xtensor_plain, xtensor_noalias, std::nullopt);
}

}  // namespace

int main() {
  return bench::run_benchmark("bench_elementwise", "elementwise bandwidth (16M f32 add)", /*torch_uses_all_threads=*/true, run_all);
}
