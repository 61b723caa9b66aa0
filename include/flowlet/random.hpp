// Random state that lives in a Variable, and dropout, which draws from it. Because the state is a
// variable, a traced step reads it and advances it on every call: each call draws a new mask, and
// a run seeded the same way draws the same masks, eagerly or traced (Philox: a mask depends only
// on the seed and the state's offset, on every device).
#pragma once

#include <cstdint>
#include <memory>

#include "flowlet/core/device.hpp"
#include "flowlet/core/tensor.hpp"
#include "flowlet/variable.hpp"

namespace flowlet {

// A Philox stream: (seed, offset) in a Variable of i64 [2] on each device that draws from it (made
// on first use there). Every draw of n numbers reads the offset and advances it by n. A Generator
// is a handle: copies share one stream.
class Generator {
 public:
  explicit Generator(uint64_t seed);
  void manual_seed(uint64_t seed);  // offset back to 0 on every device
  uint64_t seed() const;
  // The state variable for `device`, made on first use (what checkpoints save to resume a stream).
  Variable state(Device device = Device("cpu")) const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

// The process's generator: what dropout(x, rate) draws from. Seed 0 until manual_seed.
Generator& default_generator();
void manual_seed(uint64_t seed);  // default_generator().manual_seed(seed)

// Zeroes each element with probability `rate` (0 <= rate < 1) and scales the rest by 1 / (1 - rate),
// a new mask each call (traced too). rate 0 returns x. f32, f64, f16, bf16.
Tensor dropout(const Tensor& x, double rate);
Tensor dropout(const Tensor& x, double rate, Generator& generator);

}  // namespace flowlet
