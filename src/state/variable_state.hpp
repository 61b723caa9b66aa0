// The state behind every handle to one Variable, shared with the graph ops that read and update it.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "flowlet/core/tensor.hpp"

namespace flowlet::detail {

struct MirrorSet;  // state/mirrored_variable.hpp
class RemoteVariable;  // state/remote_variable.hpp

struct VariableState {
  std::string name;
  mutable std::mutex mutex;  // guards `value` between threads that share the variable
  Tensor value;
  // Set on a mirrored variable's primary state (replica 0's copy) when it is made, before any
  // other thread sees it (or, for an optimizer's step counter, before its first traced step):
  // the other replicas' copies. Null for every other variable, which is the fast path.
  std::shared_ptr<MirrorSet> mirrors;
  // Set when the variable is made under a ParameterServerStrategy::scope(): decides per thread
  // whether reads and updates mean the local value or the servers'. Null otherwise.
  std::shared_ptr<RemoteVariable> remote;
};

// assign: value = t; add: value += scale * t; sub: value -= scale * t.
enum class AssignMode : uint8_t { assign, add, sub };

// "assign", "assign_add", "assign_sub": the public method each mode stands for (error messages, node names).
inline const char* assign_mode_name(AssignMode mode) {
  static constexpr const char* names[] = {"assign", "assign_add", "assign_sub"};
  return names[static_cast<int>(mode)];
}

// ShapeError / DTypeError / DeviceError naming `op` and the variable unless `t` matches its value
// (symbolic tensors are checked by their shape and dtype alone).
// `check_device`: false while tracing, where the placer runs the update on the variable's device
// and the partitioner moves the value there.
void check_variable_update(const char* op, const VariableState& s, const Tensor& t, bool check_device = true);

// True when the variable's tensor is reachable only through the variable: no handle, view or
// recorded tape node shares it, so changing it in place is invisible to everyone else. On a GPU
// that holds too for work already queued: it runs on the device's one stream before an in-place
// update queued after it.
bool exclusively_owned(const Tensor& value);

// Applies an update now (the eager path and the graph's assign kernel share it). `adopt`: take `t`
// as the new value without copying it (it is a fresh result nobody else can change). When nothing
// but the variable holds the current value (no reader keeps it), add and sub write into it in one
// pass instead of allocating a new value; otherwise readers keep the old values as always.
// `recording_graph`: the update is a node of a step being recorded into a CUDA Graph
// (StepContext::recording), so it must write into the variable's buffer or fail.
void apply_variable_update(VariableState& s, AssignMode mode, const Tensor& t, bool adopt, double scale = 1.0,
                           bool recording_graph = false);

}  // namespace flowlet::detail
