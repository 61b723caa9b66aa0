// What a replica's trace needs to know about its share of the step, beyond the seam's
// ReplicaContext: set by MirroredStrategy::run while it traces a replica, read by
// Optimizer::apply (gradient averaging). Thread-local.
#pragma once

#include <cstdint>

namespace flowlet::detail {

struct ReplicaStep {
  const void* strategy = nullptr;  // the ReplicaContext::strategy this belongs to
  int64_t rows = 0;                // the replica's rows of the batch
  int64_t global_rows = 0;         // the batch's rows over all replicas
  int64_t bucket_bytes = 0;        // MirroredOptions::bucket_bytes
};

// The step of this thread's running replica, or null.
const ReplicaStep* current_replica_step();

class ReplicaStepScope {
 public:
  explicit ReplicaStepScope(const ReplicaStep* step);
  ~ReplicaStepScope();
  ReplicaStepScope(const ReplicaStepScope&) = delete;
  ReplicaStepScope& operator=(const ReplicaStepScope&) = delete;

 private:
  const ReplicaStep* previous_;
};

}  // namespace flowlet::detail
