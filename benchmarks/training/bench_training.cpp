// One MLP training step (784-256-10, ReLU, mean softmax cross-entropy, plain SGD lr 0.01; forward,
// backward and update) and the per-op overhead of recording on a GradientTape: flowlet against
// libtorch (ATen tensors with requires_grad, loss.backward(), then an in-place update under
// NoGradGuard), both on ONE thread. Targets: the step at batch 64 at most 0.8x libtorch's time, at
// batch 1 at most 0.3x; a recorded 1-element add at most 1/3 of libtorch's autograd add.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include <flowlet/flowlet.hpp>

#include "../harness.hpp"
#include "../mlp_step.hpp"
#include "../torch_peer.hpp"

namespace fl = flowlet;
namespace bench = flowlet_bench;

namespace {

using namespace flowlet_bench::mlp;  // the model, its data and the libtorch peer (../mlp_step.hpp)

void compare_training_step(int64_t batch, const bench::Target& target) {
  const std::string label = fmt::format("MLP train step, batch {}", batch);
  FlowletMlp ours;
  fl::optim::SGD sgd(learning_rate);
  const Batch data(batch);
  const fl::Tensor& x = data.x;
  const fl::Tensor& labels = data.labels;

  auto flowlet_step = [&] { bench::do_not_optimize(ours.train_step(sgd, x, labels)); };

#ifdef FLOWLET_BENCH_HAVE_TORCH
  // Checked once before timing, from identical weights: the loss and the first layer's weight
  // gradient (before any update).
  TorchMlp peer(ours);
  at::Tensor tx = to_torch(x);
  at::Tensor tlabels = to_torch(labels);
  try {
    fl::GradientTape tape;
    fl::Tensor loss = ours.loss(x, labels);
    std::vector<fl::Tensor> grads = tape.gradient(loss, ours.params);
    at::Tensor tloss = peer.loss(tx, tlabels);
    tloss.backward();
    double loss_diff = std::fabs(static_cast<double>(loss.to_vector<float>()[0]) - tloss.item<double>());
    double grad_diff = max_abs_difference(grads[0].to_vector<float>(), to_host(peer.w1.grad()));
    fmt::print("   check {}: loss flowlet {:.6f} libtorch {:.6f}, max |diff| {:.2e}; "
               "grad hidden/weight max |diff| {:.2e}{}\n",
               label, loss.to_vector<float>()[0], tloss.item<double>(), loss_diff, grad_diff,
               loss_diff < 1e-4 && grad_diff < 1e-4 ? "" : "  WARNING: over 1e-4, the timing below means little");
    at::NoGradGuard no_grad;
    for (at::Tensor* w : {&peer.w1, &peer.b1, &peer.w2, &peer.b2}) w->mutable_grad().zero_();
  } catch (const std::exception& error) {
    fmt::print("   check {} failed: {}\n", label, error.what());
  }
#endif

  bench::Section section(label, bench::Metric::time(),
                         "time per step (forward, backward, SGD update), 784-256-10 ReLU, 1 thread");
  bench::Result ours_result = section.run("flowlet", flowlet_step);
#ifdef FLOWLET_BENCH_HAVE_TORCH
  bench::Result peer_result = section.run("libtorch", [&] { bench::do_not_optimize(peer.train_step(tx, tlabels)); });
#else
  bench::Result peer_result = section.skip("libtorch");
#endif
  section.compare(ours_result, peer_result, target);
}

// a + b on 1-element f32 tensors, `a` watched by a live tape. A tape keeps what it records, so a
// fresh one (not persistent) replaces it every 1000 calls; its cost is part of the figure.
void compare_recorded_add() {
  constexpr int calls_per_tape = 1000;
  fl::Tensor a = fl::tensor(std::vector<float>{0.5f}, fl::Shape{1});
  fl::Tensor b = fl::tensor(std::vector<float>{-0.25f}, fl::Shape{1});
  bench::Section section("add 1-element, recording", bench::Metric::time(),
                         "time per call, `a` watched by a GradientTape (libtorch: a requires_grad)");
  bench::Result ours;
  {
    std::optional<fl::GradientTape> tape;
    int calls = 0;
    try {
      fl::GradientTape check_tape;
      check_tape.watch(a);
      fl::Tensor sum = a + b;
      std::vector<fl::Tensor> grads = check_tape.gradient(sum, std::vector<fl::Tensor>{a});
      if (std::fabs(sum.to_vector<float>()[0] - 0.25f) > 1e-6f || std::fabs(grads[0].to_vector<float>()[0] - 1.0f) > 1e-6f) {
        fmt::print("   WARNING: flowlet recorded add gave a wrong value or gradient; its timing below means little\n");
      }
    } catch (const std::exception& error) {
      fmt::print("   flowlet recorded add failed its check: {}\n", error.what());
    }
    ours = section.run("flowlet", [&] {
      if (calls++ % calls_per_tape == 0) {
        tape.reset();
        tape.emplace(/*persistent=*/false);
        tape->watch(a);
      }
      bench::do_not_optimize(a + b);
    });
  }
#ifdef FLOWLET_BENCH_HAVE_TORCH
  at::Tensor ta = at::full({1}, 0.5, at::kFloat).requires_grad_();
  at::Tensor tb = at::full({1}, -0.25, at::kFloat);
  bench::Result peer = section.run("libtorch", [&] { bench::do_not_optimize(at::add(ta, tb)); });
#else
  bench::Result peer = section.skip("libtorch");
#endif
  section.compare(ours, peer, bench::Target::at_most(0.33, "aim 0.20"));
}

void run_all() {
  const char* flowlet_threads = std::getenv("FLOWLET_NUM_THREADS");
  fmt::print("   threads: FLOWLET_NUM_THREADS={}, openblas {}\n", flowlet_threads ? flowlet_threads : "(unset)",
             openblas_get_num_threads());
  compare_training_step(64, bench::Target::at_most(0.8));
  compare_training_step(1, bench::Target::at_most(0.3));
  compare_recorded_add();
}

}  // namespace

int main() {
  // One thread for every contender, set before any flowlet call (its pool reads the variable once).
  setenv("FLOWLET_NUM_THREADS", "1", /*overwrite=*/1);
  openblas_set_num_threads(1);
#ifdef FLOWLET_BENCH_HAVE_TORCH
  at::set_num_threads(1);
#endif
  return bench::run_benchmark("bench_training", "MLP training step and recorded per-op overhead (f32, 1 thread)",
                              /*torch_uses_all_threads=*/false, run_all);
}
