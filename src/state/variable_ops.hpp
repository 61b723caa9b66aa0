// Graph ops over variables: what Variable::value() and assign*() record while a trace is active.
#pragma once

#include <memory>

#include "flowlet/op.hpp"
#include "state/variable_state.hpp"

namespace flowlet::detail {

struct VariableAttrs {
  std::shared_ptr<VariableState> state;
  AssignMode mode = AssignMode::assign;
  double scale = 1.0;  // add and sub: value += / -= scale * update
  std::string describe() const;
};

extern Op read_variable_op;    // () -> the variable's value when the node runs
extern Op assign_variable_op;  // (update) -> nothing; assign, assign_add or assign_sub
// (a, b) -> nothing: value += / -= scale * (a @ b) as one GEMM into the variable's buffer, without
// forming a @ b (a gradient update, fused by the fuse_variable_updates pass). Rank-2 a and b.
extern Op assign_matmul_op;

// Records a read of `state` in the active trace (through dispatch), ordered after its last
// recorded update.
Tensor record_variable_read(const std::shared_ptr<VariableState>& state);
// Records an update (checked now against the variable's shape and dtype; the device is the
// placer's to choose).
void record_variable_update(const std::shared_ptr<VariableState>& state, AssignMode mode, const Tensor& t,
                            double scale = 1.0);

}  // namespace flowlet::detail
