// The replica a thread is running: set by MirroredStrategy::run around each replica's step (and
// its tracing), read by the collective ops (which communicator and participant a call belongs to)
// and by mirrored variables (which copy a read or an update means).
#pragma once

#include <memory>

namespace flowlet::detail {

class Communicator;

struct ReplicaContext {
  std::shared_ptr<Communicator> communicator;  // spans every replica of the strategy
  int local = 0;                               // this replica's local participant index
  const void* strategy = nullptr;              // the strategy's state (identity only)
};

// The running replica of this thread, or null outside MirroredStrategy::run.
const ReplicaContext* current_replica();

// Makes `context` the thread's running replica until destroyed (nests; restores the previous one).
class ReplicaScope {
 public:
  explicit ReplicaScope(const ReplicaContext* context);
  ~ReplicaScope();
  ReplicaScope(const ReplicaScope&) = delete;
  ReplicaScope& operator=(const ReplicaScope&) = delete;

 private:
  const ReplicaContext* previous_;
};

}  // namespace flowlet::detail
