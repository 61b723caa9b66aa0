// Generator (a Philox stream whose (seed, offset) lives in one i64 [2] Variable per device) and the
// public dropout(), which reads that state, advances it and calls the dropout op
// (src/ops/dropout.cpp). Because the state is a variable, a traced step records a read and an
// assign_add on every draw: each call of the step draws the next mask, and the tracer orders the
// read before the write. One mutex per generator guards its map of states; one process-wide mutex
// makes each draw's read-and-advance (and a reseed) atomic, so threads drawing from one generator
// eagerly never draw the same mask.
#include "flowlet/random.hpp"

#include <mutex>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/check.hpp"
#include "flowlet/eager_scope.hpp"
#include "flowlet/ops/creation.hpp"
#include "ops/dropout.hpp"

namespace flowlet {

namespace {
// Held across a draw's read and advance of a state variable, and across a reseed.
std::mutex& draw_mutex() {
  static std::mutex mutex;
  return mutex;
}
}  // namespace

struct Generator::Impl {
  std::mutex mutex;  // guards seed and states
  uint64_t seed = 0;
  std::vector<std::pair<Device, Variable>> states;

  static Tensor state_value(uint64_t seed, int64_t offset, Device device) {
    const int64_t words[2] = {static_cast<int64_t>(seed), offset};
    return detail::tensor_from_host(words, 2, i64, Shape{2}, device);
  }

  // The caller holds the mutex.
  Variable& state_locked(Device device) {
    for (auto& [where, variable] : states)
      if (where == device) return variable;
    EagerScope eager;  // made now, even when the first draw is traced
    states.emplace_back(device, Variable(state_value(seed, 0, device), fmt::format("generator_state/{}", device)));
    return states.back().second;
  }
};

Generator::Generator(uint64_t seed) : impl_(std::make_shared<Impl>()) { impl_->seed = seed; }

void Generator::manual_seed(uint64_t seed) {
  std::lock_guard draw(draw_mutex());
  std::lock_guard lock(impl_->mutex);
  impl_->seed = seed;
  EagerScope eager;  // takes effect now, not when some traced step runs
  for (auto& [device, variable] : impl_->states) variable.assign(Impl::state_value(seed, 0, device));
}

uint64_t Generator::seed() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->seed;
}

Variable Generator::state(Device device) const {
  std::lock_guard lock(impl_->mutex);
  return impl_->state_locked(device);
}

Generator& default_generator() {
  static Generator generator(0);
  return generator;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

Tensor dropout(const Tensor& x, double rate, Generator& generator) {
  detail::check_dropout_rate(rate);
  if (!x.defined()) detail::fail<InvalidArgument>("dropout: x is an empty Tensor handle");
  if (!is_floating(x.dtype())) {
    detail::fail<DTypeError>("dropout: x must be floating (f32, f64, f16, bf16); got {}", x.dtype());
  }
  if (rate == 0.0) return x;
  Variable variable = generator.state(x.device());
  Tensor state;
  {
    std::lock_guard lock(draw_mutex());
    state = variable.value();
    const int64_t advance[2] = {0, x.numel()};
    variable.assign_add(detail::tensor_from_host(advance, 2, i64, Shape{2}, x.device()));
  }
  return detail::dropout_with_state(x, state, rate);
}

Tensor dropout(const Tensor& x, double rate) { return dropout(x, rate, default_generator()); }

}  // namespace flowlet
