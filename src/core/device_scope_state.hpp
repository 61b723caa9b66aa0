// The thread's active device scopes as dispatch and the tracer read them, and a guard that hides them.
#pragma once

#include "flowlet/device_scope.hpp"

namespace flowlet::detail {

// The innermost DeviceScope or ColocateWith frame of this thread, or null (the common case).
// Initial-exec TLS without a wrapper: dispatch reads it on every op call.
[[gnu::tls_model("initial-exec")]] extern thread_local constinit const ScopeFrame* innermost_scope;

// Links `frame` in as the innermost scope, inheriting what it does not set from the one around it.
void push_scope(ScopeFrame& frame);
// Unlinks `frame`. Scopes are RAII objects of one thread, so the innermost is normally this one;
// after a misuse (destroyed out of order) the frames inside it are dropped too rather than left
// dangling.
void pop_scope(const ScopeFrame& frame);

// Runs the enclosed code as if no scope were active. Library code whose tensors must stay where
// they are uses it: the backward walk (gradients follow the forward ops' devices), variable
// updates (a variable keeps its device), graph passes and graph runs (the graph says where).
class NoDeviceScope {
 public:
  NoDeviceScope() : saved_(innermost_scope) { innermost_scope = nullptr; }
  ~NoDeviceScope() { innermost_scope = saved_; }
  NoDeviceScope(const NoDeviceScope&) = delete;
  NoDeviceScope& operator=(const NoDeviceScope&) = delete;

 private:
  const ScopeFrame* saved_;
};

}  // namespace flowlet::detail
