// The MLP training step that bench_training and bench_trace both time: 784-256-10, ReLU, mean
// softmax cross-entropy, plain SGD lr 0.01 (forward, backward and update), on x = randn([B, 784],
// seed 42) and labels 0, 1, ..., 9, 0, 1, ... Here: flowlet's model and step, and (when the build
// found libtorch) the same model as ATen tensors with requires_grad, starting from flowlet's weights.
//
//   namespace mlp = flowlet_bench::mlp;
//   mlp::FlowletMlp ours;
//   flowlet::optim::SGD sgd(mlp::learning_rate);
//   mlp::Batch data(64);
//   flowlet::Tensor loss = ours.train_step(sgd, data.x, data.labels);
//   mlp::TorchMlp peer(ours);                      // FLOWLET_BENCH_HAVE_TORCH only
//   at::Tensor tloss = peer.train_step(tx, tlabels);
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <flowlet/flowlet.hpp>

#include "torch_peer.hpp"

namespace flowlet_bench::mlp {

inline constexpr int64_t in_features = 784;
inline constexpr int64_t hidden_features = 256;
inline constexpr int64_t classes = 10;
inline constexpr double learning_rate = 0.01;

// Labels 0, 1, ..., 9, 0, 1, ... (arange(n) % 10).
inline std::vector<int64_t> label_values(int64_t n) {
  std::vector<int64_t> labels(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) labels[static_cast<size_t>(i)] = i % classes;
  return labels;
}

inline double max_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(a[i] - b[i])));
  return worst;
}

// The input of every step: x [batch, 784] standard normal (seed 42) and the labels above.
struct Batch {
  flowlet::Tensor x;
  flowlet::Tensor labels;

  explicit Batch(int64_t batch)
      : x(flowlet::randn(flowlet::Shape{batch, in_features}, /*seed=*/42)),
        labels(flowlet::tensor(label_values(batch), flowlet::Shape{batch})) {}
};

// flowlet's model: Sequential(Linear 784-256, relu, Linear 256-10), Glorot-initialised with seeds
// 1 and 2, so two FlowletMlp start from identical weights.
struct FlowletMlp {
  flowlet::nn::Sequential model;
  flowlet::nn::Linear* hidden = nullptr;
  flowlet::nn::Linear* logits = nullptr;
  std::vector<flowlet::Variable> params;

  FlowletMlp() {
    hidden = &model.add<flowlet::nn::Linear>(in_features, hidden_features, /*seed=*/1, "hidden");
    model.add([](const flowlet::Tensor& x) { return flowlet::relu(x); });
    logits = &model.add<flowlet::nn::Linear>(hidden_features, classes, /*seed=*/2, "logits");
    params = {hidden->weight, hidden->bias, logits->weight, logits->bias};
  }
  FlowletMlp(const FlowletMlp&) = delete;  // a copy would share the variables
  FlowletMlp& operator=(const FlowletMlp&) = delete;

  flowlet::Tensor loss(const flowlet::Tensor& x, const flowlet::Tensor& labels) {
    return flowlet::mean(flowlet::softmax_cross_entropy(model(x), labels));
  }

  // One step: forward, backward, SGD update. Returns the loss before the update.
  flowlet::Tensor train_step(flowlet::optim::SGD& sgd, const flowlet::Tensor& x, const flowlet::Tensor& labels) {
    flowlet::GradientTape tape;
    flowlet::Tensor l = loss(x, labels);
    sgd.apply(tape.gradient(l, params), params);
    return l;
  }
};

#ifdef FLOWLET_BENCH_HAVE_TORCH
inline at::Tensor to_torch(const flowlet::Tensor& t) {
  std::vector<int64_t> sizes;
  for (int64_t extent : t.shape()) sizes.push_back(extent);
  if (t.dtype() == flowlet::i64) {
    std::vector<int64_t> values = t.to_vector<int64_t>();
    return at::from_blob(values.data(), sizes, at::kLong).clone();
  }
  std::vector<float> values = t.to_vector<float>();
  return at::from_blob(values.data(), sizes, at::kFloat).clone();
}

inline std::vector<float> to_host(const at::Tensor& t) {
  at::Tensor c = t.detach().contiguous();
  const float* data = c.data_ptr<float>();
  return std::vector<float>(data, data + c.numel());
}

// The same model built from ATen tensors with requires_grad, starting from flowlet's weights.
struct TorchMlp {
  at::Tensor w1, b1, w2, b2;

  explicit TorchMlp(const FlowletMlp& ours)
      : w1(to_torch(ours.hidden->weight.value()).requires_grad_()),
        b1(to_torch(ours.hidden->bias.value()).requires_grad_()),
        w2(to_torch(ours.logits->weight.value()).requires_grad_()),
        b2(to_torch(ours.logits->bias.value()).requires_grad_()) {}

  at::Tensor loss(const at::Tensor& x, const at::Tensor& labels) const {
    at::Tensor h = at::relu(at::addmm(b1, x, w1));  // what torch.nn.Linear does: addmm
    return at::cross_entropy_loss(at::addmm(b2, h, w2), labels);  // mean over the batch
  }

  // What torch.optim.SGD does without momentum: w += -lr * grad, then the gradients are zeroed.
  void update() {
    at::NoGradGuard no_grad;
    for (at::Tensor* w : {&w1, &b1, &w2, &b2}) {
      w->add_(w->grad(), -learning_rate);
      w->mutable_grad().zero_();
    }
  }

  // One step as a PyTorch user writes it: loss, backward(), update. Returns the loss.
  at::Tensor train_step(const at::Tensor& x, const at::Tensor& labels) {
    at::Tensor l = loss(x, labels);
    l.backward();
    update();
    return l;
  }
};
#endif

}  // namespace flowlet_bench::mlp
