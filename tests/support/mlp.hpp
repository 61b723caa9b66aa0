// A small MLP (16 -> 32 -> 4, relu, softmax cross-entropy) on synthetic data, trained with
// GradientTape and SGD or Adam in any floating dtype, on any device, eagerly or traced. Shared by
// tests/test_half_training.cpp (f16/bf16 against f32) and tests/test_cuda.cpp (cuda:0 against the CPU).
#pragma once

#include <memory>
#include <vector>

#include "support/reference.hpp"

namespace test {

enum class MlpOptimizer { sgd, adam };

struct MlpOptions {
  fl::DType dtype = fl::f32;
  // Initial values and inputs are drawn in f32 and rounded to this dtype before they are converted
  // to `dtype`: an f32 model started from a half model's exact initial values uses the half dtype here.
  fl::DType init_dtype = fl::f32;
  fl::Device device{"cpu"};
  int steps = 10;
  MlpOptimizer optimizer = MlpOptimizer::sgd;
  double lr = 0.5;
  bool traced = false;
  bool optimize = true;  // TraceOptions::optimize: the graph passes, update fusion among them
};

struct MlpRun {
  std::vector<double> losses;               // before each step's update
  std::vector<std::vector<double>> values;  // w1, b1, w2, b2 after the last step
  int fused_updates = 0;                    // assign_matmul nodes in the traced graph
};

// f32 values drawn from `seed`, scaled, rounded to `init` and stored as `dt` on `device`.
inline fl::Tensor mlp_value(const fl::Shape& shape, uint64_t seed, double scale, fl::DType init, fl::DType dt,
                            const fl::Device& device) {
  return fl::cast(fl::cast(fl::randn(shape, seed) * static_cast<float>(scale), init), dt).to(device);
}

// The batch: 64 inputs and labels from a fixed random teacher (argmax of x @ teacher, in f32 on the
// rounded inputs), so the task is learnable.
inline std::pair<fl::Tensor, fl::Tensor> mlp_batch(fl::DType init, fl::DType dt, const fl::Device& device) {
  const fl::Tensor x = fl::cast(fl::cast(fl::randn({64, 16}, 11), init), fl::f32);
  const fl::Tensor labels = fl::argmax(fl::matmul(x, fl::randn({16, 4}, 12)), 1);
  return {fl::cast(x, dt).to(device), labels.to(device)};
}

inline MlpRun train_mlp(const MlpOptions& o) {
  const fl::DType dt = o.dtype, init = o.init_dtype;
  std::vector<fl::Variable> vars = {fl::Variable(mlp_value({16, 32}, 1, 0.35, init, dt, o.device), "w1"),
                                    fl::Variable(mlp_value({32}, 2, 0.1, init, dt, o.device), "b1"),
                                    fl::Variable(mlp_value({32, 4}, 3, 0.35, init, dt, o.device), "w2"),
                                    fl::Variable(mlp_value({4}, 4, 0.1, init, dt, o.device), "b2")};
  std::unique_ptr<fl::optim::Optimizer> opt;
  if (o.optimizer == MlpOptimizer::sgd) opt = std::make_unique<fl::optim::SGD>(o.lr);
  else opt = std::make_unique<fl::optim::Adam>(o.lr);
  const auto [x, labels] = mlp_batch(init, dt, o.device);
  auto step = [&](fl::Tensor xb, fl::Tensor yb) {
    fl::GradientTape tape;
    const fl::Tensor h = fl::relu(fl::matmul(xb, vars[0].value()) + vars[1].value());
    const fl::Tensor logits = fl::matmul(h, vars[2].value()) + vars[3].value();
    // The loss takes f32/f64 logits: half ones are cast up, and the gradient returns through the
    // cast in the half dtype.
    const fl::Tensor loss = fl::mean(fl::softmax_cross_entropy(fl::cast(logits, fl::f32), yb));
    opt->apply(tape.gradient(loss, vars), vars);
    return loss;
  };
  fl::TraceOptions options;
  options.optimize = o.optimize;
  auto traced_step = fl::trace(step, options);
  MlpRun run;
  for (int s = 0; s < o.steps; ++s) {
    const fl::Tensor loss = o.traced ? traced_step(x, labels) : step(x, labels);
    run.losses.push_back(static_cast<double>(loss.item<float>()));
  }
  for (const fl::Variable& v : vars) run.values.push_back(values(v.value()));
  if (o.traced) {
    for (const fl::Node& n : traced_step.graph(x, labels).nodes()) {
      run.fused_updates += !n.removed && n.op != nullptr && n.op->name == "assign_matmul";
    }
  }
  return run;
}

}  // namespace test
