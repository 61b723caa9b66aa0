// Batch norm (training: forward, and forward + backward), layer norm (forward + backward) and
// dropout on CNN-sized f32 tensors: flowlet's kernels against libtorch's (at::native_batch_norm and
// its backward, at::native_layer_norm and its backward, at::dropout), both on every hardware thread,
// measured in one run. Forward + backward twice for flowlet: the forward op then its backward op
// (batch_norm_backward, layer_norm_backward), like for like with libtorch's kernels; and through a
// GradientTape of sum(y * dy), as a training step runs it (its extra passes: the product, the sum's
// gradient, the statistics outputs' zero gradients), for information.
// With FLOWLET_NUM_THREADS=1 libtorch gets one thread too: on a busy machine one thread each is the
// steadier comparison.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <flowlet/flowlet.hpp>

#include "../harness.hpp"
#include "../torch_peer.hpp"

namespace fl = flowlet;
namespace bench = flowlet_bench;

namespace {

// The attribute struct of the normalization ops (src/ops/conv_attrs.hpp NormAttrs: eps, normalized_dims).
struct NormAttrs {
  double eps = 1e-5;
  int64_t normalized_dims = 1;
};

// Forward op, then its backward op with the forward's statistics: dx, dgamma, dbeta.
std::vector<fl::Tensor> forward_backward(const char* forward, const char* backward, const fl::Tensor& x,
                                         const fl::Tensor& gamma, const fl::Tensor& beta, const fl::Tensor& dy) {
  static const NormAttrs attrs;
  const std::vector<fl::Tensor> f = fl::dispatch_all(*fl::find_op(forward), std::vector<fl::Tensor>{x, gamma, beta}, &attrs);
  return fl::dispatch_all(*fl::find_op(backward), std::vector<fl::Tensor>{x, gamma, f[1], f[2], dy}, &attrs);
}

#ifdef FLOWLET_BENCH_HAVE_TORCH
at::Tensor as_torch(const fl::Tensor& t) {
  std::vector<int64_t> sizes(t.shape().begin(), t.shape().end());
  return at::from_blob(const_cast<void*>(t.raw_data()), sizes, at::kFloat);
}
#endif

void batch_norm_sections(const fl::Shape& shape) {
  const fl::Tensor x = fl::randn(shape, 1), dy = fl::randn(shape, 2);
  const fl::Tensor gamma = fl::ones({shape[1]}), beta = fl::zeros({shape[1]});
  const double mb = static_cast<double>(x.numel()) * 4 / 1e6;
  const std::string name = fmt::format("batch_norm training {}", shape);
  {
    bench::Section section(name + " forward", bench::Metric::time(), fmt::format("{:.1f} MB of x", mb));
    bench::Result ours = section.run("flowlet batch_norm_training", [&] {
      bench::do_not_optimize(fl::batch_norm_training(x, gamma, beta));
    });
#ifdef FLOWLET_BENCH_HAVE_TORCH
    at::NoGradGuard no_grad;
    const at::Tensor tx = as_torch(x), tg = as_torch(gamma), tb = as_torch(beta);
    bench::Result peer = section.run("libtorch native_batch_norm", [&] {
      bench::do_not_optimize(at::native_batch_norm(tx, tg, tb, {}, {}, true, 0.1, 1e-5));
    });
#else
    bench::Result peer = section.skip("libtorch native_batch_norm");
#endif
    section.compare(ours, peer, std::nullopt);
  }
  {
    bench::Section section(name + " forward + backward", bench::Metric::time(), "dx, dgamma, dbeta for a given dy");
    bench::Result ops = section.run("flowlet ops", [&] {
      bench::do_not_optimize(forward_backward("batch_norm_training", "batch_norm_backward", x, gamma, beta, dy));
    });
    bench::Result ours = section.run("flowlet tape", [&] {
      fl::GradientTape tape;
      for (const fl::Tensor& t : {x, gamma, beta}) tape.watch(t);
      const fl::Tensor y = fl::batch_norm_training(x, gamma, beta).y;
      bench::do_not_optimize(tape.gradient(fl::sum(y * dy), {x, gamma, beta}));
    });
#ifdef FLOWLET_BENCH_HAVE_TORCH
    at::NoGradGuard no_grad;
    const at::Tensor tx = as_torch(x), tg = as_torch(gamma), tb = as_torch(beta), tdy = as_torch(dy);
    bench::Result peer = section.run("libtorch forward + backward", [&] {
      auto [y, mean, invstd] = at::native_batch_norm(tx, tg, tb, {}, {}, true, 0.1, 1e-5);
      bench::do_not_optimize(at::native_batch_norm_backward(tdy, tx, tg, {}, {}, mean, invstd, true, 1e-5,
                                                            {true, true, true}));
    });
#else
    bench::Result peer = section.skip("libtorch forward + backward");
#endif
    section.compare(ops, peer, std::nullopt);
    section.compare(ours, peer, std::nullopt);
  }
}

void layer_norm_section(const fl::Shape& shape) {
  const fl::Tensor x = fl::randn(shape, 3), dy = fl::randn(shape, 4);
  const int64_t d = shape[shape.size() - 1];
  const fl::Tensor gamma = fl::ones({d}), beta = fl::zeros({d});
  bench::Section section(fmt::format("layer_norm {} forward + backward", shape), bench::Metric::time());
  bench::Result ops = section.run("flowlet ops", [&] {
    bench::do_not_optimize(forward_backward("layer_norm", "layer_norm_backward", x, gamma, beta, dy));
  });
  bench::Result ours = section.run("flowlet tape", [&] {
    fl::GradientTape tape;
    for (const fl::Tensor& t : {x, gamma, beta}) tape.watch(t);
    const fl::Tensor y = fl::layer_norm(x, gamma, beta);
    bench::do_not_optimize(tape.gradient(fl::sum(y * dy), {x, gamma, beta}));
  });
#ifdef FLOWLET_BENCH_HAVE_TORCH
  at::NoGradGuard no_grad;
  const at::Tensor tx = as_torch(x), tg = as_torch(gamma), tb = as_torch(beta), tdy = as_torch(dy);
  bench::Result peer = section.run("libtorch forward + backward", [&] {
    auto [y, mean, rstd] = at::native_layer_norm(tx, {d}, tg, tb, 1e-5);
    bench::do_not_optimize(at::native_layer_norm_backward(tdy, tx, {d}, mean, rstd, tg, tb, {true, true, true}));
  });
#else
  bench::Result peer = section.skip("libtorch forward + backward");
#endif
  section.compare(ops, peer, std::nullopt);
  section.compare(ours, peer, std::nullopt);
}

void dropout_section(const fl::Shape& shape) {
  const fl::Tensor x = fl::randn(shape, 5);
  fl::Generator generator(1);
  const double bytes = static_cast<double>(x.numel()) * 8;
  bench::Section section(fmt::format("dropout 0.5 {}", shape), bench::Metric::rate("GB/s", bytes / 1e9),
                         "GB/s counts x read and y written");
  bench::Result ours = section.run("flowlet dropout", [&] { bench::do_not_optimize(fl::dropout(x, 0.5, generator)); });
#ifdef FLOWLET_BENCH_HAVE_TORCH
  at::NoGradGuard no_grad;
  const at::Tensor tx = as_torch(x);
  bench::Result peer = section.run("libtorch at::dropout", [&] { bench::do_not_optimize(at::dropout(tx, 0.5, true)); });
#else
  bench::Result peer = section.skip("libtorch at::dropout");
#endif
  section.compare(ours, peer, std::nullopt);
}

void run_all() {
  batch_norm_sections({128, 32, 28, 28});
  batch_norm_sections({128, 64, 14, 14});
  layer_norm_section({4096, 1024});
  dropout_section({128, 64 * 14 * 14});
}

}  // namespace

int main() {
  const char* threads = std::getenv("FLOWLET_NUM_THREADS");
  const bool one_thread = threads != nullptr && std::string(threads) == "1";
#ifdef FLOWLET_BENCH_HAVE_TORCH
  if (one_thread) at::set_num_threads(1);
#endif
  return bench::run_benchmark("bench_norm", "normalization and dropout (f32, CNN-sized)",
                              /*torch_uses_all_threads=*/!one_thread, run_all);
}
