// Sparse optimizer updates: the optimizer's own dense update run on gathered rows, scattered back
// in place (see optimizer_access.hpp for why).
#include "ps/server/optimizer_access.hpp"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/check.hpp"
#include "flowlet/eager_scope.hpp"
#include "flowlet/ops/creation.hpp"
#include "flowlet/ops/elementwise.hpp"
#include "flowlet/ops/shape.hpp"
#include "state/mirrored_variable.hpp"
#include "state/variable_state.hpp"

namespace flowlet::detail {
namespace {

Shape rows_shape(int64_t n, const Shape& shape) {
  std::vector<int64_t> dims{n};
  dims.insert(dims.end(), shape.begin() + 1, shape.end());
  return Shape(dims);
}

// `rows` as a host i64 vector after checking it against a table of `table_rows` rows.
std::vector<int64_t> checked_rows(const char* op, const std::string& name, const Tensor& rows, int64_t table_rows) {
  if (!rows.defined() || rows.dtype() != i64 || rows.rank() != 1) {
    fail<InvalidArgument>("{}: rows of '{}' must be an i64 vector; got {}", op, name,
                          rows.defined() ? fmt::format("{} {}", rows.dtype(), rows.shape()) : std::string("Tensor()"));
  }
  std::vector<int64_t> host = rows.to_vector<int64_t>();
  for (int64_t r : host) {
    if (r < 0 || r >= table_rows) {
      fail<OutOfRange>("{}: row {} of '{}' is outside [0, {})", op, r, name, table_rows);
    }
  }
  return host;
}

void check_values(const char* op, const std::string& name, const Tensor& values, int64_t n, const Shape& table,
                  DType dtype) {
  if (!values.defined()) fail<InvalidArgument>("{}: values for '{}' are an empty Tensor handle", op, name);
  if (values.dtype() != dtype) {
    fail<DTypeError>("{}: values for '{}' must be {}; got {}", op, name, dtype, values.dtype());
  }
  if (!(values.shape() == rows_shape(n, table))) {
    fail<ShapeError>("{}: values for {} rows of '{}' {} must have shape {}; got {}", op, n, name, table,
                     rows_shape(n, table), values.shape());
  }
}

// Copies row i of `source` (contiguous, host) to row rows[i] of `target` (contiguous, host).
void copy_rows(const Tensor& target, const std::vector<int64_t>& rows, const Tensor& source) {
  const int64_t n = static_cast<int64_t>(rows.size());
  if (n == 0) return;
  const auto row_bytes = static_cast<size_t>(source.numel() / n) * dtype_size(source.dtype());
  auto* out = static_cast<std::byte*>(target.raw_data());
  const auto* in = static_cast<const std::byte*>(source.raw_data());
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(out + static_cast<size_t>(rows[static_cast<size_t>(i)]) * row_bytes,
                in + static_cast<size_t>(i) * row_bytes, row_bytes);
  }
}

}  // namespace

void write_rows(const Variable& var, const Tensor& rows, const Tensor& values) {
  constexpr const char* op = "write_rows";
  if (!var.defined()) fail<InvalidArgument>("{}: variable is an empty Variable handle", op);
  EagerScope eager;
  VariableState& state = *VariableAccess::state(var);
  std::lock_guard lock(state.mutex);
  Tensor& target = state.value;
  if (target.rank() == 0) fail<InvalidArgument>("{}: variable '{}' is a scalar and has no rows", op, state.name);
  const std::vector<int64_t> host_rows = checked_rows(op, state.name, rows, target.shape()[0]);
  check_values(op, state.name, values, static_cast<int64_t>(host_rows.size()), target.shape(), target.dtype());
  const Device host;  // cpu:0
  const Tensor source = (values.device().kind() == DeviceKind::cpu ? values : values.to(host)).contiguous();
  if (target.device().kind() == DeviceKind::cpu && exclusively_owned(target)) {
    // Nobody else can see the buffer: O(rows) bytes written, whatever the table's size.
    copy_rows(target, host_rows, source);
    return;
  }
  // Someone holds the current value (a reader, a view) or it lives on a GPU: a private host copy
  // with the rows written, installed as the new value. Readers keep the values they read.
  Tensor copy = target.device().kind() == DeviceKind::cpu ? cast(target, target.dtype()) : target.to(host);
  copy = copy.contiguous();
  copy_rows(copy, host_rows, source);
  state.value = target.device().kind() == DeviceKind::cpu ? copy : copy.to(target.device());
}

void OptimizerAccess::apply_sparse(optim::Optimizer& optimizer, const Variable& var, const Tensor& rows,
                                   const Tensor& grad_rows) {
  constexpr const char* op = "OptimizerAccess::apply_sparse";
  if (!var.defined()) fail<InvalidArgument>("{}: variable is an empty Variable handle", op);
  const Shape shape = var.shape();
  if (shape.rank() == 0) fail<InvalidArgument>("{}: variable '{}' is a scalar and has no rows", op, var.name());
  if (!is_floating(var.dtype())) {
    fail<DTypeError>("{}: variable '{}' must have a floating dtype; got {}", op, var.name(), var.dtype());
  }
  const std::vector<int64_t> host_rows = checked_rows(op, var.name(), rows, shape[0]);
  {
    std::vector<int64_t> sorted = host_rows;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
      fail<InvalidArgument>("{}: rows of '{}' repeat; sum the gradients of a repeated row first", op, var.name());
    }
  }
  check_values(op, var.name(), grad_rows, static_cast<int64_t>(host_rows.size()), shape, var.dtype());

  EagerScope eager;
  optimizer.build({var});  // the variable's slots exist from here on
  const Device home = var.device();
  const Tensor index = rows.device() == home ? rows : rows.to(home);
  const Tensor grad = grad_rows.device() == home ? grad_rows : grad_rows.to(home);

  // The stand-ins: the touched rows of the variable and of every slot it has, registered with the
  // optimizer as that variable's slots, so that update() and slot() find them.
  const Variable stand_in(gather(var.value(), index), var.name());
  const void* stand_in_key = VariableAccess::state(stand_in).get();
  // Whatever happens from here, the optimizer forgets the stand-ins (and any slot update() made
  // for them): a stale entry would hand its slots to a later variable at the same address.
  struct Forget {
    optim::Optimizer& optimizer;
    const void* key;
    ~Forget() {
      auto found = optimizer.slots_.find(key);
      if (found == optimizer.slots_.end()) return;
      auto& order = optimizer.slot_order_;
      for (const auto& entry : found->second) {
        order.erase(std::remove_if(order.begin(), order.end(),
                                   [&](const Variable& v) { return same_variable(v, entry.second); }),
                    order.end());
      }
      optimizer.slots_.erase(found);
    }
  } forget{optimizer, stand_in_key};
  const std::unordered_map<std::string, Variable> slots = optimizer.slots_[VariableAccess::state(var).get()];
  auto& stand_in_slots = optimizer.slots_[stand_in_key];
  for (const auto& [slot_name, slot] : slots) {
    stand_in_slots.emplace(slot_name, Variable(gather(slot.value(), index), slot.name()));
  }

  Variable updated = stand_in;
  optimizer.update(updated, grad);

  // Scatter the rows back: the variable's, then each slot's. A slot the update created on the
  // stand-in (an optimizer that makes slots lazily) is created on the variable too (zeros, as
  // slot() makes them) and gets its touched rows.
  const std::unordered_map<std::string, Variable> touched = optimizer.slots_[stand_in_key];
  write_rows(var, rows, stand_in.value());
  for (const auto& [slot_name, slot_rows] : touched) {
    auto found = slots.find(slot_name);
    const Variable target = found != slots.end() ? found->second : optimizer.slot(var, slot_name);
    write_rows(target, rows, slot_rows.value());
  }
  optimizer.iterations_.assign_add(ones({}, i64, optimizer.iterations_.device()));
}

std::vector<std::string> OptimizerAccess::slot_names(const optim::Optimizer& optimizer) {
  return optimizer.slot_names();
}

DType OptimizerAccess::slot_dtype(DType var_dtype) { return optim::Optimizer::state_dtype(var_dtype); }

std::map<std::string, Variable> OptimizerAccess::slots(const optim::Optimizer& optimizer, const Variable& var) {
  std::map<std::string, Variable> result;
  if (!var.defined()) return result;
  auto found = optimizer.slots_.find(VariableAccess::state(var).get());
  if (found == optimizer.slots_.end()) return result;
  for (const auto& [name, slot] : found->second) result.emplace(name, slot);
  return result;
}

}  // namespace flowlet::detail
