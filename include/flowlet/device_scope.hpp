// Device scopes: where the eager ops of a block run, and what the nodes traced in it ask the placer for.
#pragma once

#include <optional>

#include "flowlet/core/device.hpp"

namespace flowlet {

class Variable;

namespace detail {
// One active DeviceScope or ColocateWith of a thread. Each frame holds the combined state of
// itself and the frames around it, so a lookup reads only the innermost one.
struct ScopeFrame {
  const ScopeFrame* outer = nullptr;
  Device device;                        // where eager ops inside run (the innermost frame's device)
  std::optional<Device> requested;      // the innermost DeviceScope's device: what traced nodes request
  const void* colocate_with = nullptr;  // the innermost ColocateWith's variable (its identity())
};
}  // namespace detail

// Runs the eager ops of a block on one device:
//   set_logical_cpu_devices(4);
//   Tensor a = ones({3});                 // cpu:0
//   {
//     DeviceScope scope(Device("cpu:2"));
//     Tensor b = zeros({3});              // cpu:2: creation ops default to the scope's device
//     Tensor c = a + b;                   // cpu:2: a is copied there first (to_device, so tapes see it)
//   }
// Outside every scope an op whose inputs are on different devices throws DeviceError; inside one,
// inputs elsewhere are copied to the scope's device and the op runs there. An explicit device
// (zeros(shape, f32, "cpu:1"), t.to(d)) wins over the scope. Scopes nest (the innermost wins) and
// belong to the thread that made them; destroy them in reverse order of construction.
//
// While a function is being traced nothing is copied: each recorded node is recorded where its
// inputs are (Node::device) and keeps the scope's device in Node::requested_device; the
// placement pass decides from there.
//
// DeviceError at construction unless the device exists.
class DeviceScope {
 public:
  explicit DeviceScope(Device device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  detail::ScopeFrame frame_;
};

// Keeps the ops of a block with a variable:
//   { ColocateWith with_w(w); Tensor m = zeros(w.shape()); ... }
// Eagerly this is a DeviceScope on w.device(). Traced nodes recorded inside carry
// Node::colocate_with = w.identity(), so the placer puts them on the variable's device.
// InvalidArgument for an empty Variable handle.
class ColocateWith {
 public:
  explicit ColocateWith(const Variable& variable);
  ~ColocateWith();
  ColocateWith(const ColocateWith&) = delete;
  ColocateWith& operator=(const ColocateWith&) = delete;

 private:
  detail::ScopeFrame frame_;
};

// The device of this thread's innermost DeviceScope or ColocateWith, if any.
std::optional<Device> current_device_scope();

// Where creation ops (zeros, ones, full, arange, randn, uniform, tensor, scalar) put their result
// when no device is given: the innermost scope's device in eager code, else cpu:0. While tracing
// it is cpu:0 (the nodes record the scope as requested_device instead).
Device default_device();

}  // namespace flowlet
