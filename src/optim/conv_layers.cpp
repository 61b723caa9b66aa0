// batch_norm() (batch normalization that keeps running statistics in Variables) and the layers
// beside Linear: BatchNorm2d, LayerNorm, Dropout, Embedding and Flatten (flowlet/layers.hpp).
// Module, Linear and Sequential are in layers.cpp, Conv2d in conv2d_layer.cpp.
#include <cmath>

#include "core/check.hpp"
#include "flowlet/layers.hpp"
#include "flowlet/ops/creation.hpp"
#include "flowlet/ops/elementwise.hpp"
#include "flowlet/ops/normalization.hpp"
#include "flowlet/ops/shape.hpp"
#include "flowlet/random.hpp"

namespace flowlet {

Tensor batch_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, Variable& running_mean,
                  Variable& running_var, Mode mode, double momentum, double eps) {
  if (!running_mean.defined() || !running_var.defined()) {
    detail::fail<InvalidArgument>("batch_norm: running_mean and running_var must be variables; got an empty Variable handle");
  }
  if (!(momentum >= 0.0 && momentum <= 1.0)) {
    detail::fail<InvalidArgument>("batch_norm: momentum must be in [0, 1]; got {}", momentum);
  }
  if (!x.defined()) detail::fail<InvalidArgument>("batch_norm: x is an empty Tensor handle");
  if (x.rank() < 2) detail::fail<ShapeError>("batch_norm: x must be [N, C, ...] (rank >= 2); got x {}", x.shape());
  const Shape channels{x.shape()[1]};
  for (const Variable* v : {&running_mean, &running_var}) {
    if (!(v->shape() == channels)) {
      detail::fail<ShapeError>("batch_norm: running statistics must be [C] = {} for x {}; got '{}' {}", channels,
                               x.shape(), v->name(), v->shape());
    }
  }
  if (mode == Mode::inference) {
    return batch_norm_inference(x, gamma, beta, cast(running_mean.value(), x.dtype()),
                                cast(running_var.value(), x.dtype()), eps);
  }
  const int64_t count = x.numel() / x.shape()[1];
  if (count < 2) {
    detail::fail<InvalidArgument>(
        "batch_norm: training needs more than one value per channel (the running variance is unbiased); got x {}",
        x.shape());
  }
  const BatchNormOutput out = batch_norm_training(x, gamma, beta, eps);
  // running = (1 - momentum) * running + momentum * batch; the variance unbiased (count / (count - 1)).
  const double unbias = static_cast<double>(count) / static_cast<double>(count - 1);
  const Tensor mean = cast(out.mean, running_mean.dtype()), var = cast(out.var, running_var.dtype());
  running_mean.assign(running_mean.value() * (1.0 - momentum) + mean * momentum);
  running_var.assign(running_var.value() * (1.0 - momentum) + var * (momentum * unbias));
  return out.y;
}

}  // namespace flowlet

namespace flowlet::nn {
namespace {

void check_positive(const char* layer, const char* what, int64_t value) {
  if (value <= 0) detail::fail<InvalidArgument>("{}: {} must be > 0; got {}", layer, what, value);
}

}  // namespace

BatchNorm2d::BatchNorm2d(int64_t channels, double momentum_in, double eps_in, std::string name, DType dtype)
    : momentum(momentum_in), eps(eps_in) {
  check_positive("BatchNorm2d", "channels", channels);
  if (!(momentum >= 0.0 && momentum <= 1.0)) detail::fail<InvalidArgument>("BatchNorm2d: momentum must be in [0, 1]; got {}", momentum);
  if (!(eps >= 0.0) || !std::isfinite(eps)) detail::fail<InvalidArgument>("BatchNorm2d: eps must be finite and >= 0; got {}", eps);
  gamma = Variable(ones({channels}, dtype), name + "/gamma");
  beta = Variable(zeros({channels}, dtype), name + "/beta");
  running_mean = Variable(zeros({channels}, dtype), name + "/running_mean");
  running_var = Variable(ones({channels}, dtype), name + "/running_var");
}

Tensor BatchNorm2d::forward(const Tensor& x) {
  if (!x.defined()) detail::fail<InvalidArgument>("BatchNorm2d: input is an empty Tensor handle");
  if (x.rank() != 4 && x.rank() != 2) {
    detail::fail<ShapeError>("BatchNorm2d: expects an [N, C, H, W] or [N, C] input; got {}", x.shape());
  }
  return batch_norm(x, gamma, beta, running_mean, running_var, mode(), momentum, eps);
}

LayerNorm::LayerNorm(Shape normalized_shape_in, double eps_in, std::string name, DType dtype)
    : normalized_shape(std::move(normalized_shape_in)), eps(eps_in) {
  if (normalized_shape.size() == 0) detail::fail<InvalidArgument>("LayerNorm: normalized_shape must have at least one axis; got []");
  for (int64_t d : normalized_shape) {
    if (d <= 0) detail::fail<InvalidArgument>("LayerNorm: normalized_shape must be positive; got {}", normalized_shape);
  }
  if (!(eps >= 0.0) || !std::isfinite(eps)) detail::fail<InvalidArgument>("LayerNorm: eps must be finite and >= 0; got {}", eps);
  gamma = Variable(ones(normalized_shape, dtype), name + "/gamma");
  beta = Variable(zeros(normalized_shape, dtype), name + "/beta");
}

Tensor LayerNorm::forward(const Tensor& x) {
  if (!x.defined()) detail::fail<InvalidArgument>("LayerNorm: input is an empty Tensor handle");
  const size_t nd = normalized_shape.size();
  bool fits = x.rank() >= static_cast<int64_t>(nd);
  for (size_t i = 0; fits && i < nd; ++i) fits = x.shape()[x.shape().size() - nd + i] == normalized_shape[i];
  if (!fits) {
    detail::fail<ShapeError>("LayerNorm: the input's last axes must be the normalized shape {}; got {}", normalized_shape,
                             x.shape());
  }
  return layer_norm(x, gamma, beta, static_cast<int64_t>(nd), eps);
}

Dropout::Dropout(double rate_in) : rate(rate_in) {
  if (!(rate >= 0.0 && rate < 1.0)) detail::fail<InvalidArgument>("Dropout: rate must be in [0, 1); got {}", rate);
}

Tensor Dropout::forward(const Tensor& x) { return mode() == Mode::training ? dropout(x, rate) : x; }

Embedding::Embedding(int64_t num_embeddings, int64_t dim, uint64_t seed, std::string name, DType dtype) {
  check_positive("Embedding", "num_embeddings", num_embeddings);
  check_positive("Embedding", "dim", dim);
  weight = Variable(randn({num_embeddings, dim}, seed, dtype), name + "/weight");
}

Tensor Embedding::forward(const Tensor& indices) {
  if (!indices.defined()) detail::fail<InvalidArgument>("Embedding: indices is an empty Tensor handle");
  if (indices.dtype() != i32 && indices.dtype() != i64) {
    detail::fail<DTypeError>("Embedding: indices must be i32 or i64; got {}", indices.dtype());
  }
  // gather takes the rows of a table for indices of any shape: [indices..., dim].
  return gather(weight, indices);
}

Tensor Flatten::forward(const Tensor& x) {
  if (!x.defined()) detail::fail<InvalidArgument>("Flatten: input is an empty Tensor handle");
  if (x.rank() < 1) detail::fail<ShapeError>("Flatten: expects an input with a batch axis (rank >= 1); got a scalar");
  const int64_t n = x.shape()[0];
  int64_t rest = 1;
  for (size_t d = 1; d < x.shape().size(); ++d) rest *= x.shape()[d];
  return reshape(x, Shape{n, rest});
}

}  // namespace flowlet::nn
