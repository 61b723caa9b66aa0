// Linear and Sequential.
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

}  // namespace

Linear::Linear(int64_t in_features, int64_t out_features, uint64_t seed, std::string name, DType dtype)
    : weight(glorot_uniform(in_features, out_features, seed, dtype), name + "/weight"),
      bias(zeros({out_features}, dtype), name + "/bias") {}

Tensor Linear::forward(const Tensor& x) { return matmul(x, weight) + bias; }

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

std::vector<Variable> Sequential::parameters() const {
  std::vector<Variable> all;
  for (const auto& part : parts_) {
    const auto own = part->parameters();
    all.insert(all.end(), own.begin(), own.end());
  }
  return all;
}

}  // namespace flowlet::nn
