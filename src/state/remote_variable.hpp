// Variables whose value lives elsewhere while some threads run: the server variables of a
// ParameterServerStrategy (src/ps/). The state layer knows no server: a VariableState may carry a
// RemoteVariable, which decides per thread whether a read, a row gather or an update means the
// local value (it returns an empty Tensor / does nothing) or the remote one.
#pragma once

#include <memory>

#include "flowlet/core/tensor.hpp"

namespace flowlet::detail {

struct VariableState;

class RemoteVariable {
 public:
  virtual ~RemoteVariable() = default;
  // Variable::value() on this thread: the remote value (recorded in the active trace, noted on
  // tapes by the caller), or an empty Tensor when the thread means the local value.
  virtual Tensor read(const std::shared_ptr<VariableState>& state) = 0;
  // gather(variable, indices) on this thread (it notes its own tape reads), or an empty Tensor for
  // the local gather(value(), indices).
  virtual Tensor gather(const std::shared_ptr<VariableState>& state, const Tensor& indices) = 0;
  // Before assign / assign_add / assign_sub (`op`) on this thread: throws when the thread may not
  // update the variable (a worker inside the strategy's run()).
  virtual void check_update(const VariableState& state, const char* op) = 0;
};

// How variables made on this thread become remote: set by ParameterServerStrategy::scope().
struct RemoteCreation {
  // Called with every variable made while the creation is active (after its value is set).
  virtual void created(const std::shared_ptr<VariableState>& state) const = 0;
  virtual ~RemoteCreation() = default;
};
const RemoteCreation* remote_creation();
// Makes `creation` the thread's and returns the previous one (restored when the scope ends).
const RemoteCreation* exchange_remote_creation(const RemoteCreation* creation);

}  // namespace flowlet::detail
