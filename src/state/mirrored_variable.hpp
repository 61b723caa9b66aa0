// Mirrored variables: one Variable handle standing for one copy per local replica of a
// MirroredStrategy (src/collective/mirrored/), each copy on its replica's device.
//
// The handle's own VariableState is local replica 0's copy; `mirrors` lists the others. Which copy a
// read, an update or identity() means depends on the calling thread:
//   - inside MirroredStrategy::run (a ReplicaContext of the same strategy on the thread): the
//     running replica's copy, so a replica's trace records that copy's read and assign nodes;
//   - elsewhere: reads (and shape/dtype/device, identity) mean replica 0's copy, which equals every
//     other; updates (assign, assign_add, assign_sub) apply to every local copy.
// The state layer knows nothing of communicators: the strategy hands it a MirrorPolicy saying which
// devices to mirror on and how replica 0's initial value reaches every copy (a broadcast over the
// processes of the job).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collective/replica_context.hpp"
#include "flowlet/core/device.hpp"
#include "flowlet/core/tensor.hpp"
#include "flowlet/variable.hpp"
#include "state/variable_state.hpp"

namespace flowlet::detail {

// How variables created under a MirroredStrategy::scope() are mirrored (filled in by the strategy).
struct MirrorPolicy {
  const void* strategy = nullptr;  // matched against ReplicaContext::strategy
  std::vector<Device> devices;     // local replica l's copy lives on devices[l]
  // Global replica 0's initial value on every local replica's device, in local replica order.
  // Called once per variable, in creation order (a collective over processes when the job has
  // several: every process must create its mirrored variables in the same order).
  std::function<std::vector<Tensor>(const Tensor& initial, const std::string& name)> initial_copies;
  // Called for every mirrored variable made under the policy (the strategy's equality check lists them).
  std::function<void(const std::shared_ptr<VariableState>& primary)> created;
};

struct MirrorSet {
  const void* strategy = nullptr;
  // copies[l]: local replica l's copy for l >= 1; copies[0] is empty (the primary state is replica 0's).
  std::vector<std::shared_ptr<VariableState>> copies;
  std::function<void(const std::shared_ptr<VariableState>& primary)> created;  // the policy's, for mirror_like
};

// The policy of this thread's innermost MirroredStrategy::scope(), or null.
const MirrorPolicy* mirrored_creation();
// Makes `policy` the thread's creation policy and returns the previous one, which
// MirroredStrategy::Scope restores when it ends.
const MirrorPolicy* exchange_mirrored_creation(const MirrorPolicy* policy);


// Turns a freshly made variable into a mirrored one under `policy` (its value becomes replica 0's
// initial value on devices[0]; the other copies are made on their devices).
void make_mirrored(const std::shared_ptr<VariableState>& primary, const MirrorPolicy& policy);

// Mirrors `target` over the same replicas as the mirrored `model`: every copy starts as `target`'s
// current value moved to the copy's device, with no communication (callers pass values that are
// equal on every process, such as zeros or a step counter). Used for optimizer slots and counters.
void mirror_like(const std::shared_ptr<VariableState>& target, const VariableState& model);

// The copy the calling thread means (see the top of this file).
inline const std::shared_ptr<VariableState>& resolve_copy(const std::shared_ptr<VariableState>& primary) {
  const MirrorSet* mirrors = primary->mirrors.get();
  if (mirrors == nullptr) return primary;
  const ReplicaContext* replica = current_replica();
  if (replica == nullptr || replica->strategy != mirrors->strategy || replica->local <= 0 ||
      replica->local >= static_cast<int>(mirrors->copies.size())) {
    return primary;
  }
  return mirrors->copies[static_cast<size_t>(replica->local)];
}

// True when the calling thread runs a replica of the strategy `primary` is mirrored by.
inline bool in_own_replica(const VariableState& primary) {
  const ReplicaContext* replica = current_replica();
  return primary.mirrors && replica != nullptr && replica->strategy == primary.mirrors->strategy;
}

// The handle's own state (a mirrored variable's primary, whatever thread asks): for the optimizer,
// whose slots belong to the variable, not to one replica's copy.
struct VariableAccess {
  static const std::shared_ptr<VariableState>& state(const Variable& v) { return v.state_; }
};

// Every local copy, replica 0's (the primary) first.
std::vector<std::shared_ptr<VariableState>> all_copies(const std::shared_ptr<VariableState>& primary);

}  // namespace flowlet::detail
