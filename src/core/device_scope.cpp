// DeviceScope and ColocateWith: a per-thread chain of frames that dispatch and the tracer read.
// ColocateWith's constructor, which reads a Variable, is the state layer's (src/state/variable.cpp);
// default_device(), which depends on whether a trace records, is dispatch's (src/dispatch.cpp).
#include "flowlet/device_scope.hpp"

#include "core/check.hpp"
#include "core/device_scope_state.hpp"

namespace flowlet {
namespace detail {

[[gnu::tls_model("initial-exec")]] thread_local constinit const ScopeFrame* innermost_scope = nullptr;

void push_scope(ScopeFrame& frame) {
  frame.outer = innermost_scope;
  if (frame.outer) {
    if (!frame.requested) frame.requested = frame.outer->requested;
    if (!frame.colocate_with) frame.colocate_with = frame.outer->colocate_with;
  }
  innermost_scope = &frame;
}

void pop_scope(const ScopeFrame& frame) {
  for (const ScopeFrame* f = innermost_scope; f; f = f->outer) {
    if (f == &frame) {
      innermost_scope = frame.outer;
      return;
    }
  }
}

}  // namespace detail

DeviceScope::DeviceScope(Device device) {
  check_device_exists("DeviceScope", device);
  frame_.device = device;
  frame_.requested = device;
  detail::push_scope(frame_);
}

DeviceScope::~DeviceScope() { detail::pop_scope(frame_); }

ColocateWith::~ColocateWith() { detail::pop_scope(frame_); }

std::optional<Device> current_device_scope() {
  if (const detail::ScopeFrame* frame = detail::innermost_scope) return frame->device;
  return std::nullopt;
}

}  // namespace flowlet
