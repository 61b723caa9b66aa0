// The demo's small CNN for Fashion-MNIST (train_fashion_mnist --model cnn, the CNN step benchmark in
// benchmarks/training/ and, layer for layer, benchmarks/peers/torch_cnn.py), and test accuracy
// measured with a traced function in inference mode.
//
//   [N, 784] -> [N, 1, 28, 28] -> conv 5x5, 32, same -> batch norm -> relu -> max pool 2
//   -> conv 5x5, 64, same -> batch norm -> relu -> max pool 2 -> [N, 3136] -> dense 10 (logits)
//
// Batch norm makes Adam reach 0.91 in fewer epochs; the convolutions have no bias (the norm's beta
// is one). In the inference graph the conv fusion pass folds each norm into its convolution and
// the relu into it too, so evaluation runs two convolutions, two pools and a matmul. Convolutions
// start from uniform(+-1/sqrt(fan_in)) (PyTorch's default), the dense layer from Glorot's uniform
// with zero bias; the peer script draws the same way.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>

#include <flowlet/data/fashion_mnist.hpp>
#include <flowlet/flowlet.hpp>
#include <flowlet/layers.hpp>
#include <flowlet/ops/conv.hpp>

namespace examples {

inline constexpr int64_t kCnnFirstChannels = 32;
inline constexpr int64_t kCnnSecondChannels = 64;

// The CNN above, its layers seeded with seed, seed + 1 and seed + 2.
inline void build_cnn(flowlet::nn::Sequential& model, uint64_t seed) {
  namespace fl = flowlet;
  const fl::Conv2dOptions same{.padding = fl::Padding::same()};
  model.add([](const fl::Tensor& x) { return fl::reshape(x, fl::Shape{x.shape()[0], 1, 28, 28}); });
  model.add<fl::nn::Conv2d>(1, kCnnFirstChannels, fl::Size2{5}, seed, same, "conv1", /*has_bias=*/false);
  model.add<fl::nn::BatchNorm2d>(kCnnFirstChannels, 0.1, 1e-5, "norm1");
  model.add([](const fl::Tensor& x) { return fl::max_pool2d(fl::relu(x), 2); });
  model.add<fl::nn::Conv2d>(kCnnFirstChannels, kCnnSecondChannels, fl::Size2{5}, seed + 1, same, "conv2",
                            /*has_bias=*/false);
  model.add<fl::nn::BatchNorm2d>(kCnnSecondChannels, 0.1, 1e-5, "norm2");
  model.add([](const fl::Tensor& x) { return fl::max_pool2d(fl::relu(x), 2); });
  model.add<fl::nn::Flatten>();
  model.add<fl::nn::Linear>(kCnnSecondChannels * 7 * 7, 10, seed + 2, "logits");
}

// Test accuracy through one traced forward pass in inference mode, traced once (chunks of one
// size), so evaluation runs the optimized inference graph (conv fusion included) while the
// training step keeps its own graph traced in training mode. The model is back in training mode
// after every call.
class TracedAccuracy {
 public:
  static constexpr int64_t kChunk = 2000;

  explicit TracedAccuracy(flowlet::nn::Module& model)
      : model_(model),
        forward_([&model](const flowlet::Tensor& images) { return flowlet::argmax(model(images), 1); }, options()) {}

  double operator()(const flowlet::data::Dataset& set) {
    const int64_t n = set.images.shape()[0];
    int64_t correct = 0;
    model_.eval();
    try {
      for (int64_t start = 0; start < n; start += kChunk) {
        const int64_t length = std::min(kChunk, n - start);
        const flowlet::Tensor predicted = forward_(flowlet::slice(set.images, 0, start, length));
        correct += flowlet::sum(predicted == flowlet::slice(set.labels, 0, start, length)).item<int64_t>();
      }
    } catch (...) {
      model_.train();
      throw;
    }
    model_.train();
    return static_cast<double>(correct) / static_cast<double>(n);
  }

 private:
  static flowlet::TraceOptions options() {
    flowlet::TraceOptions o;
    o.name = "evaluation (inference mode)";
    return o;
  }
  flowlet::nn::Module& model_;
  flowlet::TracedFunction<std::function<flowlet::Tensor(const flowlet::Tensor&)>> forward_;
};

}  // namespace examples
