// What the Fashion-MNIST examples share (train_fashion_mnist.cpp, the `make demo` job, and
// mirrored_fashion_mnist.cpp): the MLP (784-256-10, ReLU), its training step, the test accuracy,
// and small helpers for their option parsing and timing.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <flowlet/data/fashion_mnist.hpp>
#include <flowlet/flowlet.hpp>

namespace examples {

// The options both examples take; each example's Options adds its own.
struct TrainingOptions {
  int epochs = 8;
  int64_t batch_size = 128;
  double lr = 1e-3;
  uint64_t seed = 1;
  std::string data = "/usr/share/datasets/fashion-mnist";
};

// Reads the command line into `o`: --epochs, --batch-size, --lr, --seed and --data here, any other
// option through own(arg, value), where value() reads the option's value; `own` returns false for
// an option it does not know. Errors ("`program`: ...") are InvalidArgument.
template <class Own>
void parse_options(int argc, char** argv, const std::string& program, TrainingOptions& o, Own own) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw flowlet::InvalidArgument(program + ": " + arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--epochs") o.epochs = std::stoi(value());
    else if (arg == "--batch-size") o.batch_size = std::stoll(value());
    else if (arg == "--lr") o.lr = std::stod(value());
    else if (arg == "--seed") o.seed = std::stoull(value());
    else if (arg == "--data") o.data = value();
    else if (!own(arg, value)) throw flowlet::InvalidArgument(program + ": unknown option " + arg);
  }
}

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Fraction of correctly classified examples, evaluated in chunks.
inline double accuracy(flowlet::nn::Module& model, const flowlet::data::Dataset& set) {
  constexpr int64_t kChunk = 2000;
  const int64_t n = set.images.shape()[0];
  int64_t correct = 0;
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t length = std::min(kChunk, n - start);
    const flowlet::Tensor logits = model(flowlet::slice(set.images, 0, start, length));
    correct += flowlet::sum(flowlet::argmax(logits, 1) == flowlet::slice(set.labels, 0, start, length)).item<int64_t>();
  }
  return static_cast<double>(correct) / static_cast<double>(n);
}

// The MLP: 784 -> 256 (ReLU) -> 10 logits, its layers seeded with `seed` and `seed + 1`.
inline void build_model(flowlet::nn::Sequential& model, uint64_t seed) {
  model.add<flowlet::nn::Linear>(784, 256, seed, "hidden");
  model.add([](const flowlet::Tensor& x) { return flowlet::relu(x); });
  model.add<flowlet::nn::Linear>(256, 10, seed + 1, "logits");
}

// One training step: forward, gradients, Adam update; returns the batch's mean loss. The same
// function runs eagerly, wrapped in flowlet::trace as one graph (forward, backward and update), or
// per replica under MirroredStrategy::run (where the update averages the gradients over all replicas first).
inline auto make_step(flowlet::nn::Sequential& model, flowlet::optim::Adam& optimizer,
                      std::vector<flowlet::Variable> params) {
  return [&model, &optimizer, params](flowlet::Tensor images, flowlet::Tensor labels) {
    flowlet::GradientTape tape;
    flowlet::Tensor loss = flowlet::mean(flowlet::softmax_cross_entropy(model(images), labels));
    optimizer.apply(tape.gradient(loss, params), params);
    return loss;
  };
}

}  // namespace examples
