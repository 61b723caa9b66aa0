// Variables: a shared slot holding the current value; updates check first, then swap the value.
// While a trace is active, reads and updates become stateful graph nodes instead (state/variable_ops.cpp).
#include "flowlet/variable.hpp"

#include <cblas.h>

#include <cmath>

#include "core/backend.hpp"
#include "core/check.hpp"
#include "core/device_scope_state.hpp"
#include "flowlet/autodiff.hpp"
#include "flowlet/device_scope.hpp"
#include "flowlet/eager_scope.hpp"
#include "flowlet/ops/elementwise.hpp"
#include "flowlet/ops/shape.hpp"
#include "kernels/blas_threads.hpp"
#include "runtime/thread_pool.hpp"
#include "state/mirrored_variable.hpp"
#include "state/remote_variable.hpp"
#include "state/variable_ops.hpp"
#include "state/variable_state.hpp"
#include "trace/tracer.hpp"

namespace flowlet {

Variable::Variable(Tensor initial, std::string name) {
  if (!initial.defined()) {
    detail::fail<InvalidArgument>("Variable: initial value is an empty Tensor handle; got Tensor() for '{}'", name);
  }
  if (initial.is_symbolic()) {
    detail::fail<InvalidArgument>(
        "Variable: initial value of '{}' is a symbolic tensor computed inside a traced function; got {} {}. Create "
        "variables outside the traced function, or inside a flowlet::EagerScope from values that do not depend "
        "on its arguments",
        name, initial.shape(), initial.dtype());
  }
  state_ = std::make_shared<detail::VariableState>();
  state_->name = std::move(name);
  EagerScope eager;  // the private copy below is made now, even inside a trace
  detail::NoDeviceScope here;  // a variable lives where its initial value is
  state_->value = cast(initial, initial.dtype());  // a private contiguous copy of the caller's tensor
  // Inside a MirroredStrategy::scope(): one copy per replica, all equal to global replica 0's value.
  if (const detail::MirrorPolicy* policy = detail::mirrored_creation()) [[unlikely]] {
    detail::make_mirrored(state_, *policy);
  }
  // Inside a ParameterServerStrategy::scope(): a server variable (state/remote_variable.hpp).
  if (const detail::RemoteCreation* remote = detail::remote_creation()) [[unlikely]] remote->created(state_);
}

detail::VariableState& Variable::state() const {
  if (!state_) throw InvalidArgument("Variable: this is an empty Variable handle (default-constructed)");
  return *state_;
}

Tensor Variable::value() const {
  if (state().remote) [[unlikely]] {
    // A server variable read by a worker inside the strategy's run() pulls from the servers.
    if (Tensor pulled = state_->remote->read(state_); pulled.defined()) {
      if (detail::any_tape_active()) detail::note_variable_read(state_.get(), pulled);
      return pulled;
    }
  }
  // A mirrored variable reads the copy the thread means (state/mirrored_variable.hpp).
  const std::shared_ptr<detail::VariableState>& copy = state().mirrors ? detail::resolve_copy(state_) : state_;
  Tensor current;
  if (detail::active_trace()) {
    current = detail::record_variable_read(copy);
  } else {
    std::lock_guard lock(copy->mutex);
    current = copy->value;
  }
  if (detail::any_tape_active()) detail::note_variable_read(copy.get(), current);  // auto-watch
  return current;
}

const void* Variable::identity() const {
  if (state_ && state_->mirrors) [[unlikely]] return detail::resolve_copy(state_).get();
  return state_.get();
}

const std::string& Variable::name() const { return state().name; }

namespace {
Tensor peek(const detail::VariableState& s) {
  std::lock_guard lock(s.mutex);
  return s.value;
}
}  // namespace

ColocateWith::ColocateWith(const Variable& variable) {
  if (!variable.defined()) throw InvalidArgument("ColocateWith: variable is an empty Variable handle");
  frame_.device = variable.device();
  frame_.colocate_with = variable.identity();
  detail::push_scope(frame_);
}

Shape Variable::shape() const { return peek(state()).shape(); }  // equal on every copy
DType Variable::dtype() const { return peek(state()).dtype(); }
Device Variable::device() const {
  const detail::VariableState& s = state();
  return s.mirrors ? peek(*detail::resolve_copy(state_)).device() : peek(s).device();
}

namespace detail {

void check_variable_update(const char* op, const VariableState& s, const Tensor& t, bool check_device) {
  if (!t.defined()) fail<InvalidArgument>("{}: update is an empty Tensor handle; got Tensor() for '{}'", op, s.name);
  if (t.dtype() != s.value.dtype()) {
    fail<DTypeError>("{}: dtype differs from variable '{}'; got {} for a {} variable", op, s.name, t.dtype(),
                     s.value.dtype());
  }
  if (!(t.shape() == s.value.shape())) {
    fail<ShapeError>("{}: shape differs from variable '{}'; got {} for a {} variable", op, s.name, t.shape(),
                     s.value.shape());
  }
  if (check_device && t.device() != s.value.device()) {
    fail<DeviceError>("{}: device differs from variable '{}'; got {} for a variable on {}", op, s.name, t.device(),
                      s.value.device());
  }
}

bool exclusively_owned(const Tensor& value) {
  const Storage& storage = *value.storage();
  return value.impl_ptr()->use_count() == 1 && storage.use_count() == 1 && value.is_contiguous() &&
         value.offset() == 0;
}

namespace {

// value += scale * t in place (value exclusively owned, same shape and dtype as t).
bool update_in_place(Tensor& value, const Tensor& t, double scale) {
  use_pool_threads_only();  // the chunks below are the parallelism
  const Tensor update = t.contiguous();
  const auto n = static_cast<blasint>(value.numel());
  if (value.numel() != static_cast<int64_t>(n)) return false;
  if (value.dtype() == f32) {
    float* w = static_cast<float*>(value.raw_data());
    const float* g = static_cast<const float*>(update.raw_data());
    parallel_for(value.numel(), kParallelGrain, [&](int64_t begin, int64_t end) {
      cblas_saxpy(static_cast<blasint>(end - begin), static_cast<float>(scale), g + begin, 1, w + begin, 1);
    });
    return true;
  }
  if (value.dtype() == f64) {
    double* w = static_cast<double*>(value.raw_data());
    const double* g = static_cast<const double*>(update.raw_data());
    parallel_for(value.numel(), kParallelGrain, [&](int64_t begin, int64_t end) {
      cblas_daxpy(static_cast<blasint>(end - begin), scale, g + begin, 1, w + begin, 1);
    });
    return true;
  }
  return false;
}

}  // namespace

void apply_variable_update(VariableState& s, AssignMode mode, const Tensor& t, bool adopt, double scale,
                           bool recording_graph) {
  NoDeviceScope here;  // the arithmetic below runs on the variable's device, whatever scope is active
  std::lock_guard lock(s.mutex);
  check_variable_update(assign_mode_name(mode), s, t);
  const bool on_gpu = s.value.device().kind() != DeviceKind::cpu;
  // A CUDA Graph being recorded writes into the variable's buffer at every replay, so the buffer
  // must stay (exec/graph_capture.hpp); an update that cannot do that ends the recording instead.
  const bool recording = on_gpu && recording_graph;
  const bool owned = exclusively_owned(s.value);
  if (recording && !owned) {
    fail<DeviceError>("{}: variable '{}' on {} is shared with another tensor, so a CUDA Graph cannot update it in "
                      "place; the function runs uncaptured",
                      assign_mode_name(mode), s.name, s.value.device());
  }
  if (mode == AssignMode::assign) {
    if (recording) return backend(s.value.device().kind()).copy_in_place(s.value, t);
    // A private copy, unless t is a fresh result: later changes to t's storage must not leak in.
    s.value = adopt && t.is_contiguous() ? t : cast(t, t.dtype());
    return;
  }
  const double signed_scale = mode == AssignMode::add ? scale : -scale;
  if (owned) {
    // Nobody else sees the value: write into it (on a GPU, queued behind the work that read it).
    if (!on_gpu && update_in_place(s.value, t, signed_scale)) return;
    const DType dt = s.value.dtype();
    if (on_gpu && dt != b8 && (is_floating(dt) || signed_scale == std::trunc(signed_scale))) {
      return backend(s.value.device().kind()).add_scaled_in_place(s.value, t.contiguous(), signed_scale);
    }
  }
  if (recording) {
    fail<DeviceError>("{}: variable '{}' ({}) cannot be updated in place, so a CUDA Graph cannot record the update; "
                      "the function runs uncaptured",
                      assign_mode_name(mode), s.name, s.value.dtype());
  }
  if (scale == 1.0) {
    s.value = mode == AssignMode::add ? s.value + t : s.value - t;
  } else {
    s.value = s.value + t * signed_scale;
  }
}

}  // namespace detail

namespace {
void update_copy(const std::shared_ptr<detail::VariableState>& state, detail::AssignMode mode, const Tensor& t,
                 double scale);

// A mirrored variable outside its strategy's run() updates every local copy: each gets `t`
// (checked against the first copy before anything changes, so a bad update changes none).
void update_every_copy(const std::shared_ptr<detail::VariableState>& primary, detail::AssignMode mode, const Tensor& t,
                       double scale) {
  {
    std::lock_guard lock(primary->mutex);
    detail::check_variable_update(detail::assign_mode_name(mode), *primary, t, /*check_device=*/false);
  }
  for (const auto& copy : detail::all_copies(primary)) {
    const Device device = peek(*copy).device();
    const bool move = !detail::active_trace() && !t.is_symbolic() && t.device() != device;
    update_copy(copy, mode, move ? t.to(device) : t, scale);
  }
}

void update(const std::shared_ptr<detail::VariableState>& state, detail::AssignMode mode, const Tensor& t,
            double scale = 1.0) {
  if (!state) throw InvalidArgument("Variable: this is an empty Variable handle (default-constructed)");
  if (!std::isfinite(scale)) {
    detail::fail<InvalidArgument>("{}: scale must be finite; got {} for '{}'",
                                  detail::assign_mode_name(mode), scale, state->name);
  }
  if (state->remote) [[unlikely]] state->remote->check_update(*state, detail::assign_mode_name(mode));
  if (state->mirrors) [[unlikely]] {
    if (detail::in_own_replica(*state)) return update_copy(detail::resolve_copy(state), mode, t, scale);
    return update_every_copy(state, mode, t, scale);
  }
  update_copy(state, mode, t, scale);
}

void update_copy(const std::shared_ptr<detail::VariableState>& state, detail::AssignMode mode, const Tensor& t,
                 double scale) {
  if (detail::active_trace()) {
    detail::record_variable_update(state, mode, t, scale);
  } else if (detail::innermost_scope && t.defined() && !t.is_symbolic() && t.device() != peek(*state).device()) {
    // Inside a device scope the update was computed on the scope's device: it moves to the
    // variable, which never changes device (outside a scope a device mismatch is an error).
    detail::apply_variable_update(*state, mode, t.to(peek(*state).device()), /*adopt=*/false, scale);
  } else {
    detail::apply_variable_update(*state, mode, t, /*adopt=*/false, scale);
  }
}
}  // namespace

void Variable::assign(const Tensor& t) { update(state_, detail::AssignMode::assign, t); }
void Variable::assign_add(const Tensor& t) { update(state_, detail::AssignMode::add, t); }
void Variable::assign_sub(const Tensor& t) { update(state_, detail::AssignMode::sub, t); }
void Variable::assign_add(const Tensor& t, double scale) { update(state_, detail::AssignMode::add, t, scale); }
void Variable::assign_sub(const Tensor& t, double scale) { update(state_, detail::AssignMode::sub, t, scale); }

Tensor gather(const Variable& table, const Tensor& indices) {
  const auto& state = detail::VariableAccess::state(table);
  if (state && state->remote) [[unlikely]] {
    if (Tensor rows = state->remote->gather(state, indices); rows.defined()) return rows;
  }
  return gather(table.value(), indices);
}

}  // namespace flowlet
