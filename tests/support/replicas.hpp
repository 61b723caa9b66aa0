// Test support for the collective and mirrored tests, in one process and under mpirun: the logical
// CPU devices their participants (replicas) run on, and the training step of their test MLPs.
#pragma once

#include <vector>

#include "support/reference.hpp"

namespace test {

// Makes `n` logical CPU devices, once per process. The device count is process-wide and doctest
// does not promise an order: every case calls this (a program always with the same n).
inline void ensure_cpu_devices(int n) {
  static const bool configured = [n] {
    fl::set_logical_cpu_devices(n);
    return true;
  }();
  (void)configured;
}

// cpu:0 .. cpu:n-1.
inline std::vector<fl::Device> cpu_devices(int n) {
  std::vector<fl::Device> devices;
  for (int i = 0; i < n; ++i) devices.emplace_back(fl::DeviceKind::cpu, i);
  return devices;
}

// One training step of `model`: softmax cross-entropy on (x, y), gradients, `optimizer`'s update;
// returns the mean loss. Runs eagerly, traced, or per replica under MirroredStrategy::run.
template <class Optimizer>
auto make_step(fl::nn::Sequential& model, Optimizer& optimizer) {
  return [&model, &optimizer](fl::Tensor x, fl::Tensor y) {
    const std::vector<fl::Variable> params = model.parameters();
    fl::GradientTape tape;
    fl::Tensor loss = fl::mean(fl::softmax_cross_entropy(model(x), y));
    optimizer.apply(tape.gradient(loss, params), params);
    return loss;
  };
}

}  // namespace test
