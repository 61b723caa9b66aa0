// Optimizers. Every update is written with public ops on Variables (update()), so a traced training
// step records the same updates, and the state lives where checkpoints see it. The built-in
// optimizers also have a fused form (fused_update: one op per variable, state/optimizer_update.hpp)
// that apply() uses where it runs; update() stays the reference, the path for other devices and
// mirrored variables, and what parameter servers run on row subsets (ps/server/optimizer_access).
#include <cmath>
#include <mutex>
#include <typeinfo>

#include "collective/mirrored/gradient_averaging.hpp"
#include "collective/replica_context.hpp"
#include "core/check.hpp"
#include "flowlet/eager_scope.hpp"
#include "flowlet/ops/creation.hpp"
#include "flowlet/ops/elementwise.hpp"
#include "flowlet/optim.hpp"
#include "state/mirrored_variable.hpp"
#include "state/optimizer_update.hpp"
#include "state/variable_state.hpp"

namespace flowlet::optim {
namespace {

void check_hyperparameter(const char* op, const char* what, double value, double lo, double hi, bool hi_open) {
  const bool ok = std::isfinite(value) && value >= lo && (hi_open ? value < hi : value <= hi);
  if (!ok) {
    detail::fail<InvalidArgument>("{}: {} must be in [{}, {}{}; got {}", op, what, lo, hi, hi_open ? ")" : "]", value);
  }
}

}  // namespace

Optimizer::Optimizer(std::string name)
    : name_(std::move(name)), iterations_(scalar(int64_t{0}), name_ + "/iterations") {}

Variable& Optimizer::slot(const Variable& var, const std::string& slot_name) {
  // Keyed by the variable, not by one replica's copy of a mirrored one (identity() inside run()).
  const std::shared_ptr<detail::VariableState>& var_state = detail::VariableAccess::state(var);
  auto& per_variable = slots_[var_state.get()];
  auto found = per_variable.find(slot_name);
  if (found == per_variable.end()) {
    // Slots are created eagerly even when the first apply() is being traced: they are state that
    // outlives the trace, and the traced graph reads and updates them like any variable.
    EagerScope eager;
    Device home;
    {
      std::lock_guard lock(var_state->mutex);
      home = var_state->value.device();  // replica 0's copy's device for a mirrored variable
    }
    Variable created(zeros(var.shape(), state_dtype(var.dtype()), home), name_ + "/" + var.name() + "/" + slot_name);
    // A mirrored variable's slots are mirrored like it: each replica updates its own copy.
    if (var_state->mirrors) detail::mirror_like(detail::VariableAccess::state(created), *var_state);
    found = per_variable.emplace(slot_name, created).first;
    slot_order_.push_back(created);
  }
  return found->second;
}

void Optimizer::place_counter(const std::vector<Variable>& vars) {
  if (counter_placed_) return;
  for (const Variable& var : vars) {
    if (!var.defined()) continue;
    counter_placed_ = true;
    const std::shared_ptr<detail::VariableState>& var_state = detail::VariableAccess::state(var);
    if (var_state->mirrors) {
      // Mirrored: a counter per replica (on replica 0's device and the others'), updated by each.
      detail::mirror_like(detail::VariableAccess::state(iterations_), *var_state);
      return;
    }
    if (var.device() == iterations_.device()) return;
    // Before the first apply nothing has read the counter on its old device: it moves with its
    // value (a restored count included).
    EagerScope eager;
    auto& state = *static_cast<detail::VariableState*>(const_cast<void*>(iterations_.identity()));
    std::lock_guard lock(state.mutex);
    state.value = state.value.to(var.device());
    return;
  }
}

void Optimizer::build(const std::vector<Variable>& vars) {
  place_counter(vars);
  for (const Variable& var : vars) {
    for (const std::string& slot_name : slot_names()) slot(var, slot_name);
  }
}

std::vector<Variable> Optimizer::variables() const {
  std::vector<Variable> all{iterations_};
  all.insert(all.end(), slot_order_.begin(), slot_order_.end());
  return all;
}

DType Optimizer::state_dtype(DType var_dtype) { return var_dtype == f16 || var_dtype == bf16 ? f32 : var_dtype; }

namespace {
// t in `dtype` (no op when it is already).
Tensor as(const Tensor& t, DType dtype) { return t.dtype() == dtype ? t : cast(t, dtype); }
}  // namespace

bool Optimizer::fused_update(const Variable&, const Tensor&) { return false; }

const Tensor& Optimizer::count_before_step() {
  if (!count_before_step_.defined()) count_before_step_ = iterations_.value();
  return count_before_step_;
}

namespace {
// Whether the fused op can update `var` from `grad`: a plain variable on a device with its kernel,
// the gradient already there (eagerly; a traced gradient is moved by the partitioner).
bool fusable(const Variable& var, const Tensor& grad) {
  const detail::VariableState& state = *detail::VariableAccess::state(var);
  if (!detail::optimizer_update_applies(state)) return false;
  return grad.is_symbolic() || grad.device() == var.device();
}
}  // namespace

Tensor Optimizer::step(DType dtype) const { return cast(iterations_.value(), dtype) + 1.0; }

void Optimizer::apply(const std::vector<Tensor>& grads, const std::vector<Variable>& vars) {
  if (grads.size() != vars.size()) {
    detail::fail<InvalidArgument>("{}.apply: one gradient per variable; got {} gradients for {} variables", name_,
                                  grads.size(), vars.size());
  }
  for (size_t i = 0; i < vars.size(); ++i) {
    if (!vars[i].defined()) detail::fail<InvalidArgument>("{}.apply: variable {} is an empty Variable handle", name_, i);
    if (!is_floating(vars[i].dtype())) {
      detail::fail<DTypeError>("{}.apply: variable '{}' must have a floating dtype; got {}", name_, vars[i].name(),
                               vars[i].dtype());
    }
    if (!grads[i].defined()) continue;
    if (grads[i].dtype() != vars[i].dtype()) {
      detail::fail<DTypeError>("{}.apply: gradient dtype differs from variable '{}'; got {} for a {} variable", name_,
                               vars[i].name(), grads[i].dtype(), vars[i].dtype());
    }
    if (!(grads[i].shape() == vars[i].shape())) {
      detail::fail<ShapeError>("{}.apply: gradient shape differs from variable '{}'; got {} for a {} variable", name_,
                               vars[i].name(), grads[i].shape(), vars[i].shape());
    }
  }
  const detail::ReplicaContext* replica = detail::current_replica();
  if (replica != nullptr) [[unlikely]] {
    // Inside MirroredStrategy::run every replica applies the same averaged update to its own copy,
    // which needs a copy per replica: a plain variable would take every replica's update.
    for (const Variable& var : vars) {
      const auto& state = detail::VariableAccess::state(var);
      if (!state->mirrors || state->mirrors->strategy != replica->strategy) {
        detail::fail<InvalidArgument>(
            "{}.apply: variable '{}' is not mirrored by the running MirroredStrategy, so every replica would update "
            "the same variable; create it inside the strategy's scope()",
            name_, var.name());
      }
    }
  }
  build(vars);
  // Inside MirroredStrategy::run: the gradients averaged over every replica (bucketed all-reduces).
  const detail::AveragedGradients averaged =
      replica != nullptr ? detail::average_gradients_with_completion(grads) : detail::AveragedGradients{};
  const std::vector<Tensor>& use = replica != nullptr ? averaged.grads : grads;
  // Outside a replica the built-in optimizers update each variable with one fused op
  // (fused_update); the counter is read at most once for all of them, before this step's increment.
  count_before_step_ = Tensor();
  for (size_t i = 0; i < vars.size(); ++i) {
    if (!use[i].defined()) continue;
    Variable var = vars[i];
    if (replica == nullptr && fused_update(var, use[i])) continue;
    update(var, use[i]);
  }
  count_before_step_ = Tensor();
  // A replica's counter counts only steps whose all-reduces succeeded on every replica.
  iterations_.assign_add(averaged.completed.defined() ? averaged.completed : ones({}, i64, iterations_.device()));
}

SGD::SGD(double lr, double momentum, bool nesterov, double weight_decay)
    : Optimizer("sgd"), lr_(lr), momentum_(momentum), weight_decay_(weight_decay), nesterov_(nesterov) {
  check_hyperparameter("SGD", "lr", lr, 0.0, 1e300, false);
  check_hyperparameter("SGD", "momentum", momentum, 0.0, 1.0, true);
  check_hyperparameter("SGD", "weight_decay", weight_decay, 0.0, 1e300, false);
  if (nesterov && momentum == 0.0) {
    detail::fail<InvalidArgument>("SGD: Nesterov needs momentum > 0; got momentum {}", momentum);
  }
}

std::vector<std::string> SGD::slot_names() const {
  if (momentum_ > 0.0) return {"momentum"};
  return {};
}

bool SGD::fused_update(const Variable& var, const Tensor& grad) {
  // Plain SGD stays one assign_sub, which fuse_variable_updates turns into one accumulating GEMM.
  if (typeid(*this) != typeid(SGD) || (momentum_ == 0.0 && weight_decay_ == 0.0) || !fusable(var, grad)) return false;
  detail::OptimizerUpdateAttrs attrs;
  attrs.rule = detail::UpdateRule::sgd;
  attrs.var = detail::VariableAccess::state(var);
  if (momentum_ > 0.0) attrs.slot0 = detail::VariableAccess::state(slot(var, "momentum"));
  attrs.lr = lr_;
  attrs.beta1 = momentum_;
  attrs.weight_decay = weight_decay_;
  attrs.nesterov = nesterov_;
  detail::optimizer_update(attrs, grad, Tensor());
  return true;
}

void SGD::update(Variable& var, const Tensor& grad) {
  Tensor g = weight_decay_ > 0.0 ? grad + weight_decay_ * var.value() : grad;
  if (momentum_ == 0.0) {
    // A half variable's update rounds once, in assign_sub (a product with lr would round lr too).
    var.assign_sub(g, lr_);
    return;
  }
  Variable& velocity = slot(var, "momentum");  // f32 for a half variable
  const Tensor g_state = as(g, velocity.dtype());
  velocity.assign(momentum_ * velocity.value() + g_state);
  const Tensor step_direction = nesterov_ ? g_state + momentum_ * velocity.value() : velocity.value();
  var.assign_sub(as(step_direction, var.dtype()), lr_);
}

Adam::Adam(double lr, double beta1, double beta2, double eps, double weight_decay)
    : Optimizer(weight_decay > 0.0 ? "adamw" : "adam"),
      lr_(lr),
      beta1_(beta1),
      beta2_(beta2),
      eps_(eps),
      weight_decay_(weight_decay) {
  check_hyperparameter("Adam", "lr", lr, 0.0, 1e300, false);
  check_hyperparameter("Adam", "beta1", beta1, 0.0, 1.0, true);
  check_hyperparameter("Adam", "beta2", beta2, 0.0, 1.0, true);
  check_hyperparameter("Adam", "weight_decay", weight_decay, 0.0, 1e300, false);
  if (!(eps > 0.0) || !std::isfinite(eps)) detail::fail<InvalidArgument>("Adam: eps must be > 0; got {}", eps);
}

bool Adam::fused_update(const Variable& var, const Tensor& grad) {
  if ((typeid(*this) != typeid(Adam) && typeid(*this) != typeid(AdamW)) || !fusable(var, grad)) return false;
  detail::OptimizerUpdateAttrs attrs;
  attrs.rule = detail::UpdateRule::adam;
  attrs.var = detail::VariableAccess::state(var);
  attrs.slot0 = detail::VariableAccess::state(slot(var, "m"));
  attrs.slot1 = detail::VariableAccess::state(slot(var, "v"));
  attrs.lr = lr_;
  attrs.beta1 = beta1_;
  attrs.beta2 = beta2_;
  attrs.eps = eps_;
  attrs.weight_decay = weight_decay_;
  detail::optimizer_update(attrs, grad, count_before_step());
  return true;
}

void Adam::update(Variable& var, const Tensor& grad) {
  Variable& m = slot(var, "m");
  Variable& v = slot(var, "v");
  const DType dt = m.dtype();  // f32 for a half variable: moments and the update computed there
  const Tensor g = as(grad, dt);
  m.assign(beta1_ * m.value() + (1.0 - beta1_) * g);
  v.assign(beta2_ * v.value() + (1.0 - beta2_) * square(g));
  // The bias correction reads the step from a variable (never a constant baked into a trace).
  // On the variable's device (the step counter may live on another logical device).
  const Tensor t = step(dt).to(var.device());
  const Tensor corrected_lr = lr_ * sqrt(1.0 - pow(full({}, beta2_, dt, var.device()), t)) /
                              (1.0 - pow(full({}, beta1_, dt, var.device()), t));
  if (weight_decay_ > 0.0) var.assign_sub(var.value(), lr_ * weight_decay_);
  var.assign_sub(as(corrected_lr * m.value() / (sqrt(v.value()) + eps_), var.dtype()));
}
}  // namespace flowlet::optim
