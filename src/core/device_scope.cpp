// DeviceScope and ColocateWith: a per-thread chain of frames that dispatch and the tracer read.
#include "flowlet/device_scope.hpp"

#include "core/check.hpp"
#include "core/device_scope_state.hpp"
#include "flowlet/variable.hpp"
#include "trace/tracer.hpp"

namespace flowlet {
namespace detail {

[[gnu::tls_model("initial-exec")]] thread_local constinit const ScopeFrame* innermost_scope = nullptr;

namespace {
// Links `frame` in as the innermost scope, inheriting what it does not set from the one around it.
void push(ScopeFrame& frame) {
  frame.outer = innermost_scope;
  if (frame.outer) {
    if (!frame.requested) frame.requested = frame.outer->requested;
    if (!frame.colocate_with) frame.colocate_with = frame.outer->colocate_with;
  }
  innermost_scope = &frame;
}
// Scopes are RAII objects of one thread, so the innermost is normally this one; after a misuse
// (destroyed out of order) the frames inside it are dropped too rather than left dangling.
void pop(const ScopeFrame& frame) {
  for (const ScopeFrame* f = innermost_scope; f; f = f->outer) {
    if (f == &frame) {
      innermost_scope = frame.outer;
      return;
    }
  }
}
}  // namespace
}  // namespace detail

DeviceScope::DeviceScope(Device device) {
  check_device_exists("DeviceScope", device);
  frame_.device = device;
  frame_.requested = device;
  detail::push(frame_);
}

DeviceScope::~DeviceScope() { detail::pop(frame_); }

ColocateWith::ColocateWith(const Variable& variable) {
  if (!variable.defined()) throw InvalidArgument("ColocateWith: variable is an empty Variable handle");
  frame_.device = variable.device();
  frame_.colocate_with = variable.identity();
  detail::push(frame_);
}

ColocateWith::~ColocateWith() { detail::pop(frame_); }

std::optional<Device> current_device_scope() {
  if (const detail::ScopeFrame* frame = detail::innermost_scope) return frame->device;
  return std::nullopt;
}

Device default_device() {
  const detail::ScopeFrame* frame = detail::innermost_scope;
  if (!frame || detail::active_trace()) return Device();
  return frame->device;
}

}  // namespace flowlet
