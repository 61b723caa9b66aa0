// Sparse optimizer updates on a parameter server: any optim::Optimizer (SGD, momentum, Adam, a
// user's own written with public ops) updates only the rows of a variable that a gradient touches,
// with its slots, at a cost proportional to those rows and not to the table.
//
// The optimizers know dense updates only (update(var, grad) on whole variables). OptimizerAccess,
// a friend of optim::Optimizer, runs that same update on a small stand-in: the touched rows of the
// variable and of each of its slots, gathered into temporary Variables that the optimizer is told
// are the variable and its slots. The updated rows are then written back into the real buffers and
// the stand-ins forgotten. Rows the gradient does not name (and their slots) never change, which is
// what sparse SGD / Adagrad / Adam mean (TensorFlow's "lazy" sparse updates).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "flowlet/core/tensor.hpp"
#include "flowlet/optim.hpp"
#include "flowlet/variable.hpp"

namespace flowlet::detail {

struct OptimizerAccess {
  // Applies `grad_rows` ([n, row shape...], var's dtype) to rows `rows` (i64 [n], unique, each in
  // [0, var rows)) of `var` and of its slots, as one step of `optimizer` (its iterations() counter
  // goes up by one, as apply() does). The caller has checked the arguments (the server validates
  // pushes); a violation here is InvalidArgument naming the function. If the optimizer throws,
  // nothing of `var` or its slots has changed and the counter has not moved.
  static void apply_sparse(optim::Optimizer& optimizer, const Variable& var, const Tensor& rows,
                           const Tensor& grad_rows);

  // For checkpoints of the servers' optimizer state (src/ps/checkpoint/): the names of the slots
  // the optimizer gives every variable (its slot_names()), the dtype of a slot of a `var_dtype`
  // variable, and the slots `var` has now by slot name (none before the optimizer built them).
  static std::vector<std::string> slot_names(const optim::Optimizer& optimizer);
  static DType slot_dtype(DType var_dtype);
  static std::map<std::string, Variable> slots(const optim::Optimizer& optimizer, const Variable& var);
};

// Writes `values` ([n, row shape...], var's dtype) into rows `rows` (i64 [n], unique, in range) of
// `var`. In place (O(n) bytes) when the variable's tensor lives on a CPU device and nobody else
// holds it; otherwise the value is replaced by an updated copy (readers keep the old one).
void write_rows(const Variable& var, const Tensor& rows, const Tensor& values);

}  // namespace flowlet::detail
