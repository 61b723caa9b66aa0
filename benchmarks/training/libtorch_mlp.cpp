// The demo's MLP trained by libtorch (Debian's libtorch-dev, ATen with autograd): the C++ peer of
// benchmarks/training/time_to_accuracy.sh. Same model, data order policy and hyperparameters as
// benchmarks/peers/torch_mlp.py (784-256-10 ReLU, Glorot-uniform weights, zero biases, mean
// cross-entropy, Adam lr 1e-3 in Keras's form with eps 1e-7 as flowlet's default, batch 128 with
// a smaller last batch, at::randperm every epoch, batches gathered by index, the loss read back
// every step, the test set evaluated after every epoch). Adam is written as torch.optim.Adam's
// single-tensor loop does it (in-place mul_/add_/addcmul_/addcdiv_ under NoGradGuard), because
// only ATen's headers are used (torch/csrc/api is not needed for four tensors).
//
//   libtorch_mlp [--epochs 8] [--threads 2] [--batch-size 128] [--lr 1e-3] [--seed 1] [--data DIR]
//
// Prints progress on stderr and ONE JSON line on stdout with the keys of torch_mlp.py. Without
// libtorch it prints {"system": "libtorch", "error": "not available"} and exits 1.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <set>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <flowlet/data/fashion_mnist.hpp>

#ifdef FLOWLET_BENCH_HAVE_TORCH
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include "../torch_peer.hpp"  // torch_version()
#endif

namespace {

struct Options {
  int epochs = 8;
  int threads = 2;
  int64_t batch_size = 128;
  double lr = 1e-3;
  uint64_t seed = 1;
  std::string data = "/usr/share/datasets/fashion-mnist";
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i], value = argv[i + 1];
    if (arg == "--epochs") o.epochs = std::stoi(value);
    else if (arg == "--threads") o.threads = std::stoi(value);
    else if (arg == "--batch-size") o.batch_size = std::stoll(value);
    else if (arg == "--lr") o.lr = std::stod(value);
    else if (arg == "--seed") o.seed = std::stoull(value);
    else if (arg == "--data") o.data = value;
    else throw std::invalid_argument("libtorch_mlp: unknown option " + arg);
  }
  if (argc % 2 == 0) throw std::invalid_argument("libtorch_mlp: an option lacks its value");
  return o;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

#ifdef FLOWLET_BENCH_HAVE_TORCH
at::Tensor to_torch(const flowlet::Tensor& t) {
  std::vector<int64_t> sizes(t.shape().begin(), t.shape().end());
  if (t.dtype() == flowlet::i64) return at::from_blob(const_cast<int64_t*>(t.data<int64_t>()), sizes, at::kLong).clone();
  return at::from_blob(const_cast<float*>(t.data<float>()), sizes, at::kFloat).clone();
}

std::string run(const Options& o) {
  at::set_num_threads(o.threads);
  at::manual_seed(o.seed);
  const flowlet::data::Dataset train_set = flowlet::data::load_fashion_mnist("train", o.data);
  const flowlet::data::Dataset test_set = flowlet::data::load_fashion_mnist("test", o.data);
  const at::Tensor x_train = to_torch(train_set.images), y_train = to_torch(train_set.labels);
  const at::Tensor x_test = to_torch(test_set.images), y_test = to_torch(test_set.labels);

  auto glorot = [](int64_t in, int64_t out) {
    const double limit = std::sqrt(6.0 / static_cast<double>(in + out));
    return at::empty({in, out}, at::kFloat).uniform_(-limit, limit).set_requires_grad(true);
  };
  std::vector<at::Tensor> params{glorot(784, 256), at::zeros({256}).set_requires_grad(true), glorot(256, 10),
                                 at::zeros({10}).set_requires_grad(true)};
  std::vector<at::Tensor> m, v;
  for (const at::Tensor& p : params) {
    m.push_back(at::zeros_like(p));
    v.push_back(at::zeros_like(p));
  }
  const double b1 = 0.9, b2 = 0.999, eps = 1e-7;
  int64_t t = 0;
  auto logits_of = [&](const at::Tensor& x) {
    return at::addmm(params[3], at::relu(at::addmm(params[1], x, params[0])), params[2]);
  };
  auto step = [&](const at::Tensor& x, const at::Tensor& y) {
    at::Tensor loss = at::cross_entropy_loss(logits_of(x), y);
    for (at::Tensor& p : params) p.mutable_grad().reset();  // zero_grad(set_to_none=True)
    loss.backward();
    at::NoGradGuard no_grad;
    ++t;
    const double scale = o.lr * std::sqrt(1.0 - std::pow(b2, t)) / (1.0 - std::pow(b1, t));
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& g = params[i].grad();
      m[i].mul_(b1).add_(g, 1.0 - b1);
      v[i].mul_(b2).addcmul_(g, g, 1.0 - b2);
      params[i].addcdiv_(m[i], v[i].sqrt().add_(eps), -scale);
    }
    return loss.item<float>();
  };

  const int64_t n = x_train.size(0);
  std::set<int64_t> seen_shapes;
  double train_s = 0, first_steps_s = 0, eval_s = 0, accuracy = 0;
  std::vector<double> epoch_train_s;
  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    const at::Tensor order = at::randperm(n, at::kLong);
    double loss_sum = 0, first_in_epoch = 0;
    const auto epoch_start = std::chrono::steady_clock::now();
    for (int64_t first = 0; first < n; first += o.batch_size) {
      const int64_t size = std::min(o.batch_size, n - first);
      const bool timed_apart = seen_shapes.insert(size).second || first == 0;  // as torch_mlp.py
      const auto begin = std::chrono::steady_clock::now();
      const at::Tensor index = order.slice(0, first, first + size);
      loss_sum += step(x_train.index_select(0, index), y_train.index_select(0, index)) * static_cast<double>(size);
      if (timed_apart) first_in_epoch += seconds_since(begin);
    }
    const double seconds = seconds_since(epoch_start) - first_in_epoch;
    train_s += seconds;
    first_steps_s += first_in_epoch;
    epoch_train_s.push_back(seconds);
    const auto begin = std::chrono::steady_clock::now();
    {
      at::NoGradGuard no_grad;
      accuracy = static_cast<double>(logits_of(x_test).argmax(1).eq(y_test).sum().item<int64_t>()) /
                 static_cast<double>(x_test.size(0));
    }
    eval_s += seconds_since(begin);
    std::fprintf(stderr, "  libtorch epoch %d: loss %.4f  test accuracy %.4f  (%.2f s)\n", epoch,
                 loss_sum / static_cast<double>(n), accuracy, seconds);
  }
  return fmt::format(
      R"({{"system": "libtorch", "version": "{}", "threads": {}, "epochs": {}, "train_s": {:.4f}, )"
      R"("first_steps_s": {:.4f}, "eval_s": {:.4f}, "accuracy": {}, "epoch_train_s": [{:.4f}]}})",
      flowlet_bench::torch_version(), at::get_num_threads(), o.epochs, train_s, first_steps_s, eval_s, accuracy,
      fmt::join(epoch_train_s, ", "));
}
#endif

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
#ifdef FLOWLET_BENCH_HAVE_TORCH
    std::printf("%s\n", run(o).c_str());
    return 0;
#else
    (void)o;
    std::printf("{\"system\": \"libtorch\", \"error\": \"not available\"}\n");
    return 1;
#endif
  } catch (const std::exception& e) {
    std::printf("{\"system\": \"libtorch\", \"error\": \"%s\"}\n", e.what());
    return 1;
  }
}
