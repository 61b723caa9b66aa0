// Queues of tensor tuples shared between threads: FIFOQueue and RandomShuffleQueue, one blocking core.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "flowlet/core/tensor.hpp"

namespace flowlet {

namespace detail {
struct QueueState;
struct QueueAccess;  // the graph ops' way to the state (src/queue/queue_internal.hpp)
}

// What a queue checks about each item. from_first: the first item enqueued fixes the number of
// tensors and each one's dtype, and later items must match (as TensorFlow's queues fix their
// component types); any: no check beyond defined, concrete tensors.
enum class ItemSignature { from_first, any };

// The operations every queue shares. An item is a std::vector<Tensor> (an empty vector is allowed).
// Copies of a queue are handles to one queue, so a lambda or another thread can capture it by value;
// every method is thread-safe, and any number of producers and consumers may call at once.
//
// Lifecycle: open -> closed (close(): no more items enter, what is held can still be dequeued) or
// cancelled (cancel(): everything fails with Cancelled, held items are dropped).
//   - enqueue blocks while the queue is full (backpressure: a fast producer waits for its consumers).
//   - dequeue blocks until an item is available; once the queue is closed and drained it throws
//     OutOfRange ("dequeue: queue 'q' is closed and empty"), or the error given to close_with_error.
//   - enqueue on a closed queue throws Cancelled ("enqueue: queue 'q' is closed"); close() also wakes
//     producers blocked in enqueue with that error (TensorFlow's close(cancel_pending_enqueues=True)),
//     so after close() returns no item enters.
//   - cancel() wakes every blocked caller, producer or consumer, with Cancelled; so do later calls.
// An item that fails the checks (an empty Tensor handle or a symbolic tensor: InvalidArgument; a
// signature mismatch: InvalidArgument for the count, DTypeError for a dtype) leaves the queue unchanged.
//
// Inside a traced function, enqueue and dequeue record stateful graph nodes that run at every call,
// in program order with the function's other uses of the queue:
//   auto step = trace([&] { std::vector<Tensor> batch = q.dequeue(); return train(batch[0], batch[1]); });
// A node waiting on the queue (empty for a dequeue, full for an enqueue) holds no executor thread,
// and a failing step wakes it with Cancelled. Tracing learns the item's shapes, dtypes and device
// from the first item: a dequeue while tracing waits until the queue holds one (without taking it),
// and every later item must match them (InvalidArgument otherwise). A graph item holds at most 4
// tensors. try_enqueue, try_dequeue and try_dequeue_for cannot be traced (InvalidArgument); size(),
// close() and the rest run at trace time only, like any C++ in the function.
class Queue {
 public:
  // Adds `item`, blocking while the queue is full.
  void enqueue(std::vector<Tensor> item);
  // Adds a copy of `item` (tensor handles, cheap) if there is room now and returns true; returns
  // false when full. Throws like enqueue when closed, cancelled or given a bad item.
  bool try_enqueue(const std::vector<Tensor>& item);

  // Removes an item, blocking until one is available.
  std::vector<Tensor> dequeue();
  // An item if one is available now, else nullopt; throws like dequeue once closed and drained.
  std::optional<std::vector<Tensor>> try_dequeue();
  // Waits at most `timeout` for an item; nullopt when none came. Throws like dequeue.
  std::optional<std::vector<Tensor>> try_dequeue_for(std::chrono::milliseconds timeout);

  // Lets consumers drain what is held, then fail with OutOfRange. Idempotent.
  void close();
  // Like close(), but consumers that find the queue drained get `error` rethrown instead of
  // OutOfRange (a producer thread hands its failure to the consumers this way).
  void close_with_error(std::exception_ptr error);
  // Fails every blocked and later enqueue and dequeue with Cancelled and drops the held items.
  void cancel();

  int64_t size() const;      // items held now
  int64_t capacity() const;  // the most items held at once
  bool is_closed() const;    // after close(), close_with_error() or cancel()
  bool is_cancelled() const;
  const std::string& name() const;

  // Copying makes another handle; there is no move, so no handle is ever left empty.
  Queue(const Queue&) = default;
  Queue& operator=(const Queue&) = default;
  ~Queue() = default;

  // Two handles to one queue compare equal.
  friend bool same_queue(const Queue& a, const Queue& b) { return a.state_ == b.state_; }
  friend struct detail::QueueAccess;

 protected:
  explicit Queue(std::shared_ptr<detail::QueueState> state) : state_(std::move(state)) {}
  std::shared_ptr<detail::QueueState> state_;
};

// First in, first out. The API.md contract:
//   FIFOQueue q(/*capacity=*/4, "batches");
//   std::thread producer([q]() mutable {
//     for (int i = 0; i < 100; ++i) q.enqueue({scalar(i)});  // blocks while 4 items wait
//     q.close();
//   });
//   try {
//     for (;;) consume(q.dequeue()[0]);
//   } catch (const OutOfRange&) {}  // closed and drained
//   producer.join();
class FIFOQueue : public Queue {
 public:
  // InvalidArgument unless capacity >= 1.
  explicit FIFOQueue(int64_t capacity, std::string name = "queue",
                     ItemSignature signature = ItemSignature::from_first);
};

// Dequeues a uniformly random item among those held, and only while more than min_after_dequeue
// items are held, so consecutive dequeues come from a pool of at least min_after_dequeue + 1
// items; after close() it drains everything in random order. The choices come from
// std::mt19937_64 seeded with `seed`: one producer and one consumer see the same order on every run
// and platform (with several threads, the order depends on how their calls interleave).
//   RandomShuffleQueue q(/*capacity=*/1000, /*min_after_dequeue=*/500, /*seed=*/7);
class RandomShuffleQueue : public Queue {
 public:
  // InvalidArgument unless capacity >= 1 and 0 <= min_after_dequeue < capacity.
  RandomShuffleQueue(int64_t capacity, int64_t min_after_dequeue, uint64_t seed,
                     std::string name = "shuffle_queue", ItemSignature signature = ItemSignature::from_first);
  int64_t min_after_dequeue() const;
};

}  // namespace flowlet
