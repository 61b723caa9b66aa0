// What the queue graph ops (queue_ops.cpp) need from the queue core (queue.cpp): waiting without
// a thread, and the first item's signature for tracing.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "flowlet/queue.hpp"

namespace flowlet::detail {

struct QueueAccess {
  static const std::shared_ptr<QueueState>& state(const Queue& q) { return q.state_; }
};

using DequeueDone = std::function<void(std::vector<Tensor> item, std::exception_ptr error)>;
using EnqueueDone = std::function<void(std::exception_ptr error)>;

// A dequeue that parks a callback instead of a thread: `done` runs now (on this thread) when an
// item can be taken or the dequeue must fail, else later from the enqueue, close or cancel that
// settles it. Parked callbacks are served in arrival order, before threads blocked in dequeue().
// Returns the waiter's id for abandon_waiter.
int64_t dequeue_async(QueueState& s, DequeueDone done);
// The same for an enqueue of `item` (checked now: a bad item throws here, and nothing is parked).
int64_t enqueue_async(QueueState& s, std::vector<Tensor> item, EnqueueDone done);
// Fails a parked waiter with `error` (its graph step was cancelled). False when it already ran.
bool abandon_waiter(QueueState& s, int64_t id, std::exception_ptr error);
// A copy of the handles of the next item a dequeue would see, waiting until the queue holds one;
// throws like dequeue when it never will. Tracing reads the item's signature from it.
std::vector<Tensor> wait_for_first_item(QueueState& s, const char* op);

// While tracing: record the graph nodes (queue_ops.cpp).
std::vector<Tensor> record_dequeue(const std::shared_ptr<QueueState>& state, const std::string& name);
void record_enqueue(const std::shared_ptr<QueueState>& state, const std::string& name, const std::vector<Tensor>& item);

}  // namespace flowlet::detail
