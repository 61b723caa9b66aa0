// Module, Linear and Sequential (the other layers: conv_layers.cpp).
#include "flowlet/layers.hpp"

#include <cmath>

#include "core/check.hpp"
#include "flowlet/ops/creation.hpp"
#include "flowlet/ops/elementwise.hpp"
#include "flowlet/ops/linalg.hpp"

namespace flowlet::nn {
namespace {

Tensor glorot_uniform(int64_t in, int64_t out, uint64_t seed, DType dtype) {
  if (in <= 0 || out <= 0) detail::fail<InvalidArgument>("Linear: features must be > 0; got in {} and out {}", in, out);
  const double limit = std::sqrt(6.0 / static_cast<double>(in + out));
  return uniform({in, out}, -limit, limit, seed, dtype);
}

// Wraps a plain function as a module without parameters.
class FunctionModule : public Module {
 public:
  explicit FunctionModule(std::function<Tensor(const Tensor&)> function) : function_(std::move(function)) {}
  Tensor forward(const Tensor& x) override { return function_(x); }

 private:
  std::function<Tensor(const Tensor&)> function_;
};

// Every part's variables of one kind (parameters or buffers), in order.
std::vector<Variable> concat_parts(const std::vector<std::shared_ptr<Module>>& parts,
                                   std::vector<Variable> (Module::*of_part)() const) {
  std::vector<Variable> all;
  for (const auto& part : parts) {
    const auto own = (*part.*of_part)();
    all.insert(all.end(), own.begin(), own.end());
  }
  return all;
}

}  // namespace

Linear::Linear(int64_t in_features, int64_t out_features, uint64_t seed, std::string name, DType dtype)
    : weight(glorot_uniform(in_features, out_features, seed, dtype), name + "/weight"),
      bias(zeros({out_features}, dtype), name + "/bias") {}

Tensor Linear::forward(const Tensor& x) { return matmul(x, weight) + bias; }

std::vector<Variable> Module::variables() const {
  std::vector<Variable> all = parameters();
  const auto kept = buffers();
  all.insert(all.end(), kept.begin(), kept.end());
  return all;
}

void Sequential::add(std::shared_ptr<Module> module) {
  if (!module) throw InvalidArgument("Sequential.add: module is null");
  parts_.push_back(std::move(module));
}

void Sequential::add(std::function<Tensor(const Tensor&)> function) {
  if (!function) throw InvalidArgument("Sequential.add: function is empty");
  parts_.push_back(std::make_shared<FunctionModule>(std::move(function)));
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (const auto& part : parts_) y = part->forward(y);
  return y;
}

std::vector<Variable> Sequential::parameters() const { return concat_parts(parts_, &Module::parameters); }

std::vector<Variable> Sequential::buffers() const { return concat_parts(parts_, &Module::buffers); }

void Sequential::set_mode(Mode mode) {
  Module::set_mode(mode);
  for (const auto& part : parts_) part->set_mode(mode);
}

}  // namespace flowlet::nn
