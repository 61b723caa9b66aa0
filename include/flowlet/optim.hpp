// Optimizers: SGD (momentum, Nesterov, weight decay), Adam and AdamW. Their state (slots and the
// step counter) lives in Variables, so checkpoints save it and traced steps update it.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "flowlet/core/tensor.hpp"
#include "flowlet/variable.hpp"

namespace flowlet::detail {
struct OptimizerAccess;  // src/ps/server/optimizer_access.hpp: sparse updates on parameter servers
}  // namespace flowlet::detail

namespace flowlet::optim {

// The base of every optimizer, and the way to write a new one from public ops alone:
//
//   class SignSGD : public optim::Optimizer {
//    public:
//     explicit SignSGD(double lr) : Optimizer("sign_sgd"), lr_(lr) {}
//    protected:
//     void update(Variable& var, const Tensor& grad) override {
//       var.assign_sub(lr_ * (where(grad > 0.0, ones_like(grad), zeros_like(grad)) * 2.0 - 1.0));
//     }
//     double lr_;
//   };
//
// Not thread-safe: one thread applies updates at a time.
class Optimizer {
 public:
  explicit Optimizer(std::string name);
  virtual ~Optimizer() = default;

  // Updates vars[i] from grads[i]. An empty gradient leaves its variable alone. Checks first
  // (counts, shapes, dtypes), so a bad call changes nothing. Then increments iterations().
  //
  // Inside MirroredStrategy::run (flowlet/mirrored.hpp) the gradients are first averaged over all
  // replicas (bucketed all-reduces, weighted by each replica's rows of the batch), so every replica
  // applies the same update to its own copies; the variables must be mirrored by that strategy
  // (InvalidArgument otherwise), and their slots and the step counter are mirrored with them.
  void apply(const std::vector<Tensor>& grads, const std::vector<Variable>& vars);

  // Creates the slots of `vars` now (apply does it on first use): call it before restoring a
  // checkpoint that holds optimizer state.
  void build(const std::vector<Variable>& vars);

  // Every slot and the step counter, in creation order: save them with the model's variables.
  std::vector<Variable> variables() const;
  // The number of apply() calls so far (an i64 scalar variable). It lives on the device of the
  // first variable that build() or apply() sees, so a traced step on a GPU runs wholly there.
  const Variable& iterations() const { return iterations_; }
  const std::string& name() const { return name_; }

 protected:
  // Updates one variable from its gradient (same shape and dtype, checked by apply).
  virtual void update(Variable& var, const Tensor& grad) = 0;
  // The built-in optimizers' fast path: applies (or records, while tracing) update(var, grad) as one
  // fused op that passes over the variable and its slots once, and returns true; returns false,
  // having done nothing, where it does not apply (a subclass, a device without the fused kernel),
  // and apply() then calls update(). Not for new optimizers: they override update() only.
  virtual bool fused_update(const Variable& var, const Tensor& grad);
  // iterations() before the step being applied, read once per apply() (for fused_update).
  const Tensor& count_before_step();
  // The names of the slots each variable gets (zeros of its shape), e.g. {"m", "v"}. Slots of an
  // f16/bf16 variable are f32 (see state_dtype).
  virtual std::vector<std::string> slot_names() const { return {}; }
  // The dtype slots and update arithmetic of a `var_dtype` variable use: the variable's own, but f32
  // for f16/bf16, whose rounding would break the optimizers (Adam's beta2 = 0.999 is 1.0 in bf16,
  // and (1 - beta2) g^2 underflows f16); the update is rounded to the variable's dtype once.
  static DType state_dtype(DType var_dtype);
  // Slot `slot_name` of `var`, named "<optimizer>/<variable>/<slot>".
  Variable& slot(const Variable& var, const std::string& slot_name);
  // The step being applied (1 on the first apply), as a rank-0 tensor of `dtype`.
  Tensor step(DType dtype) const;

 private:
  friend struct detail::OptimizerAccess;
  void place_counter(const std::vector<Variable>& vars);

  std::string name_;
  Variable iterations_;
  bool counter_placed_ = false;
  Tensor count_before_step_;  // set by count_before_step() during one apply(), empty otherwise
  std::unordered_map<const void*, std::unordered_map<std::string, Variable>> slots_;
  std::vector<Variable> slot_order_;
};

// Stochastic gradient descent. With momentum m: v = m v + g; w -= lr v (Nesterov: w -= lr (g + m v)).
// weight_decay adds weight_decay * w to the gradient first (L2 regularization).
class SGD : public Optimizer {
 public:
  explicit SGD(double lr, double momentum = 0.0, bool nesterov = false, double weight_decay = 0.0);

 protected:
  void update(Variable& var, const Tensor& grad) override;
  bool fused_update(const Variable& var, const Tensor& grad) override;
  std::vector<std::string> slot_names() const override;

 private:
  double lr_, momentum_, weight_decay_;
  bool nesterov_;
};

// Adam (Kingma & Ba), in the form Keras uses: m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2,
// w -= lr sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps). weight_decay > 0 makes it AdamW
// (decoupled: w -= lr * weight_decay * w, not added to the gradient).
class Adam : public Optimizer {
 public:
  explicit Adam(double lr, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-7, double weight_decay = 0.0);

 protected:
  void update(Variable& var, const Tensor& grad) override;
  bool fused_update(const Variable& var, const Tensor& grad) override;
  std::vector<std::string> slot_names() const override { return {"m", "v"}; }

 private:
  double lr_, beta1_, beta2_, eps_, weight_decay_;
};

// AdamW: Adam with decoupled weight decay (Loshchilov & Hutter).
class AdamW : public Adam {
 public:
  explicit AdamW(double lr, double weight_decay = 0.01, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-7)
      : Adam(lr, beta1, beta2, eps, weight_decay) {}
};

}  // namespace flowlet::optim
