// Per-function throughput of the f32 transcendentals (exp, log, tanh, sigmoid, erf), in elements
// per ns, side by side in one run:
//   - ours: src/kernels/vector_math (the widest instruction set this CPU has), one thread, on 16K
//     elements (the fused kernel's tile, L1/L2-resident) and through the public op on 16M elements
//     (FLOWLET_NUM_THREADS threads);
//   - before: what flowlet used until issue 18: glibc libmvec's AVX2 entry points for exp, log and
//     tanh, and the scalar functor loop (libm expf / erff per element) for sigmoid and erf;
//   - libtorch's at::exp etc. on the same 16M elements, for information.
// About 30 s. Figures and how they were taken: docs/notes18/vecmath.md.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include <flowlet/flowlet.hpp>

#include "../harness.hpp"
#include "../torch_peer.hpp"
#include "kernels/vector_math.hpp"

#if defined(FLOWLET_BENCH_HAVE_MVEC) && defined(__AVX2__)
extern "C" {
__m256 _ZGVdN8v_expf(__m256);
__m256 _ZGVdN8v_logf(__m256);
__m256 _ZGVdN8v_tanhf(__m256);
}
#endif

namespace fl = flowlet;
namespace bench = flowlet_bench;

namespace {

constexpr int64_t kTile = 16384;
constexpr int64_t kLarge = int64_t{16} << 20;

using Kernel = void (*)(const float*, float*, int64_t);

#if defined(FLOWLET_BENCH_HAVE_MVEC) && defined(__AVX2__)
template <__m256 (*F)(__m256)>
void libmvec(const float* in, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, F(_mm256_loadu_ps(in + i)));
  for (; i < n; ++i) {
    alignas(32) float lane[8] = {in[i], 1, 1, 1, 1, 1, 1, 1};
    _mm256_store_ps(lane, F(_mm256_load_ps(lane)));
    out[i] = lane[0];
  }
}
#endif

// The scalar functor loops flowlet ran for sigmoid and erf before (src/kernels/elementwise_functors.hpp).
void scalar_sigmoid(const float* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float a = in[i];
    if (a >= 0) {
      out[i] = 1.0f / (1.0f + ::expf(-a));
    } else {
      const float e = ::expf(a);
      out[i] = e / (1.0f + e);
    }
  }
}
void scalar_erf(const float* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = ::erff(in[i]);
}

struct Case {
  std::string name;
  Kernel ours;
  Kernel before;
  std::string before_name;
  fl::Tensor (*op)(const fl::Tensor&);
  float lo, hi;
};

void run_all() {
  const fl::detail::VectorMathTable* table = fl::detail::vector_math_best();
  if (table == nullptr) {
    fmt::print("   this CPU has neither AVX2 + FMA nor AVX-512: flowlet uses libm; nothing to compare\n");
    return;
  }
  fmt::print("   flowlet's vector math: {}\n", table->isa);
#if defined(FLOWLET_BENCH_HAVE_MVEC) && defined(__AVX2__)
  const Kernel mvec_exp = &libmvec<_ZGVdN8v_expf>, mvec_log = &libmvec<_ZGVdN8v_logf>,
               mvec_tanh = &libmvec<_ZGVdN8v_tanhf>;
  const std::string mvec = "before: libmvec AVX2";
#else
  const Kernel mvec_exp = nullptr, mvec_log = nullptr, mvec_tanh = nullptr;
  const std::string mvec = "before: libmvec (not built)";
#endif
  const std::vector<Case> cases = {
      {"exp", table->exp, mvec_exp, mvec, [](const fl::Tensor& t) { return fl::exp(t); }, -20, 20},
      {"log", table->log, mvec_log, mvec, [](const fl::Tensor& t) { return fl::log(t); }, 1e-3f, 100},
      {"tanh", table->tanh, mvec_tanh, mvec, [](const fl::Tensor& t) { return fl::tanh(t); }, -5, 5},
      {"sigmoid", table->sigmoid, &scalar_sigmoid, "before: scalar expf loop",
       [](const fl::Tensor& t) { return fl::sigmoid(t); }, -10, 10},
      {"erf", table->erf, &scalar_erf, "before: scalar erff loop", [](const fl::Tensor& t) { return fl::erf(t); }, -3, 3},
  };
  for (const Case& c : cases) {
    const fl::Tensor x = fl::uniform(fl::Shape{kLarge}, c.lo, c.hi, /*seed=*/7);
    const float* px = x.data<float>();
    std::vector<float> out(static_cast<size_t>(kTile));

    bench::Section tile(c.name + " f32, 16K elements (one fused tile), 1 thread",
                        bench::Metric::rate("elem/ns", static_cast<double>(kTile) / 1e9),
                        "elements per ns, input and output in cache");
    bench::Result ours = tile.run(fmt::format("flowlet {}", table->isa), [&] {
      c.ours(px, out.data(), kTile);
      bench::do_not_optimize(out.data());
    });
    bench::Result before = c.before != nullptr ? tile.run(c.before_name, [&] {
      c.before(px, out.data(), kTile);
      bench::do_not_optimize(out.data());
    })
                                               : tile.skip(c.before_name);
    tile.compare(ours, before, std::nullopt);

    bench::Section large(c.name + " f32, 16M elements, a new tensor per call",
                         bench::Metric::rate("elem/ns", static_cast<double>(kLarge) / 1e9),
                         "elements per ns; flowlet and libtorch with their default thread settings");
    bench::Result op = large.run(fmt::format("flowlet {}(x)", c.name), [&] { bench::do_not_optimize(c.op(x)); });
#ifdef FLOWLET_BENCH_HAVE_TORCH
    at::NoGradGuard no_grad;
    at::Tensor tx = at::from_blob(const_cast<float*>(px), {kLarge}, at::kFloat);
    auto torch_op = [&]() -> at::Tensor {
      if (c.name == "exp") return at::exp(tx);
      if (c.name == "log") return at::log(tx);
      if (c.name == "tanh") return at::tanh(tx);
      if (c.name == "sigmoid") return at::sigmoid(tx);
      return at::erf(tx);
    };
    bench::Result torch = large.run(fmt::format("libtorch at::{}", c.name), [&] { bench::do_not_optimize(torch_op()); });
#else
    bench::Result torch = large.skip(fmt::format("libtorch at::{}", c.name));
#endif
    large.compare(op, torch, std::nullopt);
  }
}

}  // namespace

int main() {
  return bench::run_benchmark("bench_vector_math", "f32 transcendentals: elements per ns", /*torch_uses_all_threads=*/false,
                              run_all);
}
