// A small module toolkit: Linear layers with Glorot initialisation, and Sequential composition of
// layers and plain lambdas. Models are ordinary C++ objects holding Variables.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "flowlet/core/tensor.hpp"
#include "flowlet/variable.hpp"

namespace flowlet::nn {

// A layer: a forward function and the variables it trains.
class Module {
 public:
  virtual ~Module() = default;
  virtual Tensor forward(const Tensor& x) = 0;
  virtual std::vector<Variable> parameters() const { return {}; }
  Tensor operator()(const Tensor& x) { return forward(x); }
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

 private:
  std::vector<std::shared_ptr<Module>> parts_;
};

}  // namespace flowlet::nn
