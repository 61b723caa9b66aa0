// dispatch(): the one function every op call goes through. It runs the op eagerly, or records it
// into the active trace, and records it onto gradient tapes; no per-op code decides either.
#pragma once

#include <initializer_list>
#include <span>

#include "flowlet/core/small_vector.hpp"
#include "flowlet/op.hpp"

namespace flowlet {

// Validates the call (arity, defined inputs, one device), infers the outputs, allocates them and
// runs the kernel for the inputs' device (while tracing: records a node instead; a graph-only op
// called eagerly throws InvalidArgument). Returns all outputs. Inside an eager DeviceScope, inputs
// on other devices are first copied to the scope's device (flowlet/device_scope.hpp).
std::vector<Tensor> dispatch_all(const Op& op, std::span<const Tensor> inputs, const void* attributes);

// The same for ops with exactly one output (the common case, without a vector).
Tensor dispatch(const Op& op, std::span<const Tensor> inputs, const void* attributes);

template <class Attributes>
Tensor dispatch(const Op& op, std::initializer_list<Tensor> inputs, const Attributes& attributes) {
  return dispatch(op, std::span<const Tensor>(inputs.begin(), inputs.size()), &attributes);
}
inline Tensor dispatch(const Op& op, std::initializer_list<Tensor> inputs) {
  return dispatch(op, std::span<const Tensor>(inputs.begin(), inputs.size()), nullptr);
}

}  // namespace flowlet
