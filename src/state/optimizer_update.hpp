// optimizer_update: one built-in optimizer step on one variable (Adam/AdamW, or SGD with momentum,
// Nesterov or weight decay) as a single op that reads the gradient and reads and writes the
// variable and its slots once, instead of ~10 elementwise ops, each a pass over memory.
// optim::Optimizer::apply emits it for the built-in optimizers on CPU variables (eagerly it runs at
// once; while tracing it becomes one graph node ordered on the variable and on each slot).
// Devices without its kernel (CUDA) keep the per-op update (optim/optimizers.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "flowlet/op.hpp"
#include "state/variable_state.hpp"

namespace flowlet::detail {

enum class UpdateRule : uint8_t { sgd, adam };

struct OptimizerUpdateAttrs {
  UpdateRule rule = UpdateRule::sgd;
  std::shared_ptr<VariableState> var;
  // adam: m and v; sgd: the velocity in slot0 (null without momentum). Slots are f32 for an
  // f16/bf16 variable, else of the variable's dtype; the arithmetic runs in the slots' dtype.
  std::shared_ptr<VariableState> slot0, slot1;
  double lr = 0.0;
  double beta1 = 0.0;  // sgd: the momentum
  double beta2 = 0.0;
  double eps = 0.0;
  double weight_decay = 0.0;  // sgd: added to the gradient (L2); adam: decoupled (AdamW)
  bool nesterov = false;
  std::string describe() const;
};

// (grad) for sgd, (grad, count) for adam, where count is the optimizer's i64 step counter before
// this step (the bias correction uses t = count + 1) -> nothing.
//   sgd:  g = grad + wd w;  u = m u + g;  w -= lr (nesterov ? g + m u : u)   (no momentum: w -= lr g)
//   adam: m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  w -= lr wd w;
//         w -= lr sqrt(1 - b2^t) / (1 - b1^t) m / (sqrt(v) + eps)
// A half variable is rounded once, after both of its updates.
extern Op optimizer_update_op;

// True when optimizer_update has a kernel where `var` lives and its state allows it (a plain
// variable: not mirrored, not a parameter server's).
bool optimizer_update_applies(const VariableState& var);

// Runs the update now, or records it as one node while a trace is active (ordered after earlier
// uses of the variable and of both slots). `count`: the step counter's value (adam only).
void optimizer_update(const OptimizerUpdateAttrs& attrs, const Tensor& grad, const Tensor& count);

}  // namespace flowlet::detail
