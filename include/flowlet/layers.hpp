// A small module toolkit: Linear, Conv2d, BatchNorm2d, LayerNorm, Dropout, Embedding and Flatten
// layers, and Sequential composition of layers and plain lambdas. Models are ordinary C++ objects
// holding Variables. Also batch_norm(), the functional form that keeps running statistics in
// Variables.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "flowlet/core/tensor.hpp"
#include "flowlet/ops/conv.hpp"
#include "flowlet/random.hpp"
#include "flowlet/variable.hpp"

namespace flowlet {

// Whether a layer trains (batch statistics, dropout masks) or infers (running statistics, no
// dropout). Explicit everywhere: nothing guesses it from a tape being active.
enum class Mode { training, inference };

// Batch normalization with running statistics in variables. Training: normalizes with the batch's
// statistics and updates running = (1 - momentum) * running + momentum * batch (the variance
// unbiased, as PyTorch keeps it). Inference: normalizes with the running statistics and changes
// nothing. x [N, C, ...]; gamma, beta, running_mean and running_var [C]. Inside a traced function
// the updates are graph nodes, so every call of the traced step updates them.
Tensor batch_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, Variable& running_mean,
                  Variable& running_var, Mode mode, double momentum = 0.1, double eps = 1e-5);

}  // namespace flowlet

namespace flowlet::nn {

// A layer: a forward function, the variables it trains, and the state it keeps without training it.
class Module {
 public:
  virtual ~Module() = default;
  virtual Tensor forward(const Tensor& x) = 0;
  virtual std::vector<Variable> parameters() const { return {}; }
  // Variables that are state but not trained (BatchNorm2d's running statistics): checkpoint them
  // with the parameters.
  virtual std::vector<Variable> buffers() const { return {}; }
  std::vector<Variable> variables() const;  // parameters(), then buffers()
  Tensor operator()(const Tensor& x) { return forward(x); }

  // Training by default. A traced function sees the mode it was traced in: trace the training step
  // and the evaluation function separately and call each in its own mode.
  virtual void set_mode(Mode mode) { mode_ = mode; }
  Mode mode() const { return mode_; }
  void train() { set_mode(Mode::training); }
  void eval() { set_mode(Mode::inference); }

 private:
  Mode mode_ = Mode::training;
};

// y = x W + b, with W [in, out] drawn from Glorot's uniform (limit sqrt(6 / (in + out))) using
// `seed`, and b zeros. Variables are named "<name>/weight" and "<name>/bias".
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, uint64_t seed, std::string name = "linear", DType dtype = f32);
  Tensor forward(const Tensor& x) override;
  std::vector<Variable> parameters() const override { return {weight, bias}; }

  Variable weight;
  Variable bias;
};

// conv2d(x, weight, bias, options): weight [out, in / groups, kH, kW] and bias [out] drawn from
// uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in = in / groups * kH * kW (PyTorch's
// default), using `seed`. Variables "<name>/weight" and "<name>/bias" (no bias: has_bias false).
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel, uint64_t seed, Conv2dOptions options = {},
         std::string name = "conv", bool has_bias = true, DType dtype = f32);
  Tensor forward(const Tensor& x) override;
  std::vector<Variable> parameters() const override;

  Conv2dOptions options;
  Variable weight;
  Variable bias;  // empty when has_bias is false
};

// batch_norm over channels of [N, C, H, W] (or [N, C]): "<name>/gamma" (ones) and "<name>/beta"
// (zeros) are parameters, "<name>/running_mean" (zeros) and "<name>/running_var" (ones) buffers.
class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t channels, double momentum = 0.1, double eps = 1e-5, std::string name = "batch_norm",
                       DType dtype = f32);
  Tensor forward(const Tensor& x) override;
  std::vector<Variable> parameters() const override { return {gamma, beta}; }
  std::vector<Variable> buffers() const override { return {running_mean, running_var}; }

  double momentum, eps;
  Variable gamma, beta, running_mean, running_var;
};

// layer_norm over the trailing axes `normalized_shape`: "<name>/gamma" (ones), "<name>/beta" (zeros).
class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, std::string name = "layer_norm", DType dtype = f32);
  Tensor forward(const Tensor& x) override;
  std::vector<Variable> parameters() const override { return {gamma, beta}; }

  Shape normalized_shape;
  double eps;
  Variable gamma, beta;
};

// dropout(x, rate) in training mode (from default_generator(), or the given one); x in inference.
class Dropout : public Module {
 public:
  explicit Dropout(double rate);
  Dropout(double rate, Generator generator);  // draws from `generator` (a handle: copies share its stream)
  Tensor forward(const Tensor& x) override;

  double rate;
  std::optional<Generator> generator;  // empty: default_generator()
};

// Rows of "<name>/weight" [num_embeddings, dim] (drawn from N(0, 1) with `seed`) for i32/i64
// indices of any shape: [indices..., dim].
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t dim, uint64_t seed, std::string name = "embedding", DType dtype = f32);
  Tensor forward(const Tensor& indices) override;
  std::vector<Variable> parameters() const override { return {weight}; }

  Variable weight;
};

// [N, d1, d2, ...] -> [N, d1 * d2 * ...].
class Flatten : public Module {
 public:
  Tensor forward(const Tensor& x) override;
};

// Runs its parts in order. Parts are modules or plain functions (activations):
//   nn::Sequential model;
//   model.add<nn::Linear>(784, 256, /*seed=*/1, "hidden");
//   model.add([](const Tensor& x) { return relu(x); });
//   model.add<nn::Linear>(256, 10, /*seed=*/2, "logits");
class Sequential : public Module {
 public:
  template <class M, class... Args>
  M& add(Args&&... args) {
    auto module = std::make_shared<M>(std::forward<Args>(args)...);
    add(module);
    return *module;
  }
  void add(std::shared_ptr<Module> module);
  void add(std::function<Tensor(const Tensor&)> function);

  Tensor forward(const Tensor& x) override;
  std::vector<Variable> parameters() const override;
  std::vector<Variable> buffers() const override;
  void set_mode(Mode mode) override;  // every part's too

 private:
  std::vector<std::shared_ptr<Module>> parts_;
};

}  // namespace flowlet::nn
