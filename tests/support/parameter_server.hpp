// Test support for the ParameterServerStrategy tests, in one process and under mpirun: the server
// optimizer they use, server variables made under the strategy's scope, and the counter worker
// whose pushes the servers' counters account for exactly.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "flowlet/parameter_server.hpp"
#include "support/reference.hpp"

namespace test {

inline fl::ParameterServerStrategy::OptimizerFactory sgd(double lr) {
  return [lr] { return std::make_unique<fl::optim::SGD>(lr); };
}

// A server variable made under the strategy's scope.
inline fl::Variable server_variable(const fl::ParameterServerStrategy& ps, const fl::Tensor& initial,
                                    const std::string& name) {
  auto scope = ps.scope();
  return fl::Variable(initial, name);
}

// Every worker: `steps` times, read `c` (a pull) and push a gradient of ones. With SGD(lr = 1)
// each applied push lowers every element of c by exactly 1 (sync: each step by the mean, 1).
inline std::function<void(fl::ps::Worker&)> counter_worker(const fl::Variable& c, int steps,
                                                           std::chrono::milliseconds compute = {}) {
  return [c, steps, compute](fl::ps::Worker& worker) {
    for (int i = 0; i < steps; ++i) {
      const fl::Tensor value = c.value();
      if (compute.count() > 0) std::this_thread::sleep_for(compute);
      worker.apply_gradients({fl::ones_like(value)}, {c});
    }
  };
}

}  // namespace test
