#include "collective/mirrored/replica_step.hpp"

namespace flowlet::detail {

namespace {
thread_local const ReplicaStep* running_step = nullptr;
}

const ReplicaStep* current_replica_step() { return running_step; }

ReplicaStepScope::ReplicaStepScope(const ReplicaStep* step) : previous_(running_step) { running_step = step; }

ReplicaStepScope::~ReplicaStepScope() { running_step = previous_; }

}  // namespace flowlet::detail
