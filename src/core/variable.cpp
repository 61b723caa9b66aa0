// Variables: a shared slot holding the current value; updates check first, then swap the value.
#include "flowlet/variable.hpp"

#include <mutex>

#include "core/check.hpp"
#include "flowlet/autodiff.hpp"
#include "flowlet/ops/elementwise.hpp"

namespace flowlet {
namespace detail {
struct VariableState {
  std::string name;
  mutable std::mutex mutex;  // guards `value` between threads that share the variable
  Tensor value;
};
}  // namespace detail

Variable::Variable(Tensor initial, std::string name) {
  if (!initial.defined()) {
    detail::fail<InvalidArgument>("Variable: initial value is an empty Tensor handle; got Tensor() for '{}'", name);
  }
  state_ = std::make_shared<detail::VariableState>();
  state_->name = std::move(name);
  state_->value = cast(initial, initial.dtype());  // a private contiguous copy of the caller's tensor
}

detail::VariableState& Variable::state() const {
  if (!state_) throw InvalidArgument("Variable: this is an empty Variable handle (default-constructed)");
  return *state_;
}

Tensor Variable::value() const {
  const auto& s = state();
  Tensor current;
  {
    std::lock_guard lock(s.mutex);
    current = s.value;
  }
  if (detail::any_tape_active()) detail::note_variable_read(state_.get(), current);  // auto-watch
  return current;
}

const std::string& Variable::name() const { return state().name; }

namespace {
void check_update(const char* op, const detail::VariableState& s, const Tensor& t) {
  if (!t.defined()) detail::fail<InvalidArgument>("{}: update is an empty Tensor handle; got Tensor() for '{}'", op, s.name);
  if (t.dtype() != s.value.dtype()) {
    detail::fail<DTypeError>("{}: dtype differs from variable '{}'; got {} for a {} variable", op, s.name, t.dtype(),
                             s.value.dtype());
  }
  if (!(t.shape() == s.value.shape())) {
    detail::fail<ShapeError>("{}: shape differs from variable '{}'; got {} for a {} variable", op, s.name, t.shape(),
                             s.value.shape());
  }
  if (t.device() != s.value.device()) {
    detail::fail<DeviceError>("{}: device differs from variable '{}'; got {} for a variable on {}", op, s.name,
                              t.device(), s.value.device());
  }
}
}  // namespace

void Variable::assign(const Tensor& t) {
  auto& s = state();
  std::lock_guard lock(s.mutex);
  check_update("assign", s, t);
  s.value = cast(t, t.dtype());  // a private copy: later changes to t's storage do not leak in
}

void Variable::assign_add(const Tensor& t) {
  auto& s = state();
  std::lock_guard lock(s.mutex);
  check_update("assign_add", s, t);
  s.value = s.value + t;
}

void Variable::assign_sub(const Tensor& t) {
  auto& s = state();
  std::lock_guard lock(s.mutex);
  check_update("assign_sub", s, t);
  s.value = s.value - t;
}

}  // namespace flowlet
