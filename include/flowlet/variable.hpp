// Variable: named mutable state that outlives a step (weights, optimizer slots, step counters).
#pragma once

#include <memory>
#include <string>

#include "flowlet/core/tensor.hpp"

namespace flowlet {

namespace detail {
struct VariableState;
struct VariableAccess;  // state/mirrored_variable.hpp
}

// Example:
//   Variable w(randn({784, 256}, /*seed=*/1) * 0.05f, "w");
//   Tensor y = matmul(x, w);          // a Variable converts to its current value
//   w.assign_sub(0.1f * grad);        // shape and dtype must match; on error w is unchanged
//
// Copies of a Variable are handles to the same state. An update installs a new value, so a tensor
// read before it keeps the old values. Reads and updates may come from several threads.
//
// A Variable made inside a MirroredStrategy::scope() is mirrored (flowlet/mirrored.hpp): one copy
// per replica. Inside the strategy's run() its reads, updates, device() and identity() mean the
// running replica's copy; elsewhere reads mean replica 0's copy and updates apply to every copy.
class Variable {
 public:
  Variable() = default;  // an empty handle
  explicit Variable(Tensor initial, std::string name = "");

  Tensor value() const;
  operator Tensor() const { return value(); }  // NOLINT: reads wherever a Tensor is expected

  // ShapeError / DTypeError / DeviceError (naming the variable) unless `t` matches exactly.
  void assign(const Tensor& t);
  void assign_add(const Tensor& t);
  void assign_sub(const Tensor& t);
  // v += scale * t and v -= scale * t in one pass (optimizers: w.assign_sub(grad, lr)). When no
  // one else holds the current value, these and the two above update it in place.
  void assign_add(const Tensor& t, double scale);
  void assign_sub(const Tensor& t, double scale);

  const std::string& name() const;
  // Metadata only: unlike value(), these are not reads (no graph node, no tape watch).
  Shape shape() const;
  DType dtype() const;
  Device device() const;
  bool defined() const { return static_cast<bool>(state_); }
  // The variable's identity (shared by every handle to it), for tapes and checkpoints. For a
  // mirrored variable (MirroredStrategy) inside the strategy's run(): the running replica's copy.
  const void* identity() const;
  // Identity: two handles to one variable compare equal.
  friend bool same_variable(const Variable& a, const Variable& b) { return a.state_ == b.state_; }

 private:
  friend struct detail::VariableAccess;
  detail::VariableState& state() const;
  std::shared_ptr<detail::VariableState> state_;
};

// Rows of a variable: gather(table.value(), indices), except for a server variable of a
// ParameterServerStrategy read inside its run(), which pulls only the rows of the unique indices
// from the servers that own them (flowlet/parameter_server.hpp).
Tensor gather(const Variable& table, const Tensor& indices);

}  // namespace flowlet
