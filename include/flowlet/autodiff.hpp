// GradientTape: records the ops run on this thread while it lives and differentiates through them.
#pragma once

#include <initializer_list>
#include <memory>
#include <span>
#include <vector>

#include "flowlet/core/tensor.hpp"
#include "flowlet/op.hpp"
#include "flowlet/variable.hpp"

namespace flowlet {

namespace detail {
struct TapeState;
}

// Example:
//   Variable w(randn({3, 1}, 1), "w");
//   GradientTape tape;                       // records on this thread until it is destroyed
//   Tensor loss = mean(square(matmul(x, w) - y));
//   std::vector<Tensor> g = tape.gradient(loss, {w});
//
// Variables read while a tape lives are watched automatically; plain tensors need watch().
// Nested tapes give higher-order gradients: an outer tape records the ops an inner tape's
// gradient() runs. A target that is not a scalar is summed first (its gradient seeds are ones).
// Unconnected rule: a source the target does not depend on (or an integer source) gets a
// gradient of zeros of its shape and dtype, never an empty tensor.
class GradientTape {
 public:
  // A persistent tape allows several gradient() calls; otherwise the first one releases it.
  explicit GradientTape(bool persistent = false);
  ~GradientTape();
  GradientTape(const GradientTape&) = delete;
  GradientTape& operator=(const GradientTape&) = delete;

  // Tracks a tensor so gradients with respect to it can be asked for. Integer tensors are ignored.
  void watch(const Tensor& t);
  void watch(const Variable& v);

  std::vector<Tensor> gradient(const Tensor& target, const std::vector<Tensor>& sources);
  std::vector<Tensor> gradient(const Tensor& target, const std::vector<Variable>& sources);
  // Braced lists ({w, b}) pick the variable or tensor form without ambiguity (a Variable also
  // converts to a Tensor).
  std::vector<Tensor> gradient(const Tensor& target, std::initializer_list<Variable> sources) {
    return gradient(target, std::vector<Variable>(sources));
  }
  std::vector<Tensor> gradient(const Tensor& target, std::initializer_list<Tensor> sources) {
    return gradient(target, std::vector<Tensor>(sources));
  }

 private:
  std::unique_ptr<detail::TapeState> state_;
};

namespace detail {
// Called by dispatch after a kernel ran: records the op on every recording tape of this thread
// that tracks one of its inputs. Cheap when no tape is active.
void record_on_tapes(const Op& op, std::span<const Tensor> inputs, const void* attributes,
                     std::span<const Tensor> outputs);
bool any_tape_active();
// Called when a variable is read, so active tapes watch the value read.
void note_variable_read(const void* variable, const Tensor& value);
}  // namespace detail

}  // namespace flowlet
