// Normalization ops on tensors: batch normalization (training: batch statistics; inference:
// given statistics) and layer normalization. The running statistics a model keeps live in
// Variables; flowlet/layers.hpp has batch_norm(...) and nn::BatchNorm2d, which update them.
#pragma once

#include <cstdint>

#include "flowlet/core/tensor.hpp"

namespace flowlet {

// Training mode. x [N, C, ...] (channels on axis 1: [N, C] or [N, C, H, W]), gamma and beta [C].
// y = (x - mean) / sqrt(var + eps) * gamma + beta, with the mean and the biased variance of each
// channel over every axis but 1. Returns y and those statistics (each [C]); the gradient flows
// through the statistics too.
struct BatchNormOutput {
  Tensor y;
  Tensor mean;
  Tensor var;  // biased (divided by the count); running averages use var * count / (count - 1)
};
BatchNormOutput batch_norm_training(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps = 1e-5);

// Inference mode: the same with given statistics mean and var ([C] each).
Tensor batch_norm_inference(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& mean,
                            const Tensor& var, double eps = 1e-5);

// Normalizes over the last `normalized_dims` axes of x: y = (x - mean) / sqrt(var + eps) * gamma +
// beta, gamma and beta shaped like those trailing axes.
Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, int64_t normalized_dims = 1,
                  double eps = 1e-5);

}  // namespace flowlet
