// Mirrored variables (see mirrored_variable.hpp): creation under a strategy's scope and the
// copies of optimizer state.
#include "state/mirrored_variable.hpp"

#include "core/check.hpp"
#include "flowlet/eager_scope.hpp"
#include "flowlet/ops/elementwise.hpp"

namespace flowlet::detail {

namespace {
thread_local const MirrorPolicy* creation_policy = nullptr;

std::shared_ptr<VariableState> make_copy(const std::string& name, Tensor value) {
  auto copy = std::make_shared<VariableState>();
  copy->name = name;
  copy->value = std::move(value);
  return copy;
}
}  // namespace

const MirrorPolicy* mirrored_creation() { return creation_policy; }

const MirrorPolicy* exchange_mirrored_creation(const MirrorPolicy* policy) {
  const MirrorPolicy* previous = creation_policy;
  creation_policy = policy;
  return previous;
}

void make_mirrored(const std::shared_ptr<VariableState>& primary, const MirrorPolicy& policy) {
  if (policy.devices.empty()) {
    fail<InvalidArgument>("Variable: mirrored variable '{}' has no replica devices", primary->name);
  }
  EagerScope eager;
  Tensor initial;
  {
    std::lock_guard lock(primary->mutex);
    initial = primary->value;
  }
  std::vector<Tensor> values = policy.initial_copies(initial, primary->name);
  if (values.size() != policy.devices.size()) {
    fail<InvalidArgument>("Variable: mirrored variable '{}' got {} initial copies for {} replicas", primary->name,
                          values.size(), policy.devices.size());
  }
  auto mirrors = std::make_shared<MirrorSet>();
  mirrors->strategy = policy.strategy;
  mirrors->created = policy.created;
  mirrors->copies.resize(values.size());
  for (size_t l = 1; l < values.size(); ++l) mirrors->copies[l] = make_copy(primary->name, std::move(values[l]));
  {
    std::lock_guard lock(primary->mutex);
    primary->value = std::move(values[0]);
    primary->mirrors = std::move(mirrors);
  }
  if (policy.created) policy.created(primary);
}

void mirror_like(const std::shared_ptr<VariableState>& target, const VariableState& model) {
  if (!model.mirrors) fail<InvalidArgument>("mirror_like: variable '{}' is not mirrored", model.name);
  if (target->mirrors) return;
  EagerScope eager;
  const std::vector<std::shared_ptr<VariableState>>& model_copies = model.mirrors->copies;
  Tensor value;
  {
    std::lock_guard lock(target->mutex);
    value = target->value;
  }
  Device replica0;
  {
    std::lock_guard lock(model.mutex);
    replica0 = model.value.device();
  }
  auto mirrors = std::make_shared<MirrorSet>();
  mirrors->strategy = model.mirrors->strategy;
  mirrors->created = model.mirrors->created;
  mirrors->copies.resize(model_copies.size());
  for (size_t l = 1; l < model_copies.size(); ++l) {
    Device device;
    {
      std::lock_guard lock(model_copies[l]->mutex);
      device = model_copies[l]->value.device();
    }
    // A private copy even on the same device: the copies are updated independently.
    mirrors->copies[l] =
        make_copy(target->name, device == value.device() ? cast(value, value.dtype()) : value.to(device));
  }
  {
    std::lock_guard lock(target->mutex);
    if (target->value.device() != replica0) target->value = target->value.to(replica0);
    target->mirrors = std::move(mirrors);
  }
  if (target->mirrors->created) target->mirrors->created(target);
}

std::vector<std::shared_ptr<VariableState>> all_copies(const std::shared_ptr<VariableState>& primary) {
  std::vector<std::shared_ptr<VariableState>> copies{primary};
  if (primary->mirrors) {
    copies.insert(copies.end(), primary->mirrors->copies.begin() + 1, primary->mirrors->copies.end());
  }
  return copies;
}

}  // namespace flowlet::detail
