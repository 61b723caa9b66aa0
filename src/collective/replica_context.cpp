#include "collective/replica_context.hpp"

namespace flowlet::detail {

namespace {
thread_local const ReplicaContext* running_replica = nullptr;
}

const ReplicaContext* current_replica() { return running_replica; }

ReplicaScope::ReplicaScope(const ReplicaContext* context) : previous_(running_replica) { running_replica = context; }

ReplicaScope::~ReplicaScope() { running_replica = previous_; }

}  // namespace flowlet::detail
