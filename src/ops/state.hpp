// Graph ops over variables: what Variable::value() and assign*() record while a trace is active.
#pragma once

#include <memory>

#include "core/variable_state.hpp"
#include "flowlet/op.hpp"

namespace flowlet::detail {

struct VariableAttrs {
  std::shared_ptr<VariableState> state;
  AssignMode mode = AssignMode::assign;
  std::string describe() const;
};

extern Op read_variable_op;    // () -> the variable's value when the node runs
extern Op assign_variable_op;  // (update) -> nothing; assign, assign_add or assign_sub

// Records a read of `state` in the active trace, ordered after its last recorded update.
Tensor record_variable_read(const std::shared_ptr<VariableState>& state);
// Records an update (checked now against the variable's shape, dtype and device).
void record_variable_update(const std::shared_ptr<VariableState>& state, AssignMode mode, const Tensor& t);

}  // namespace flowlet::detail
