// Input pipelines: a background thread that builds batches ahead of the trainer into a bounded queue.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "flowlet/data/fashion_mnist.hpp"
#include "flowlet/queue.hpp"

namespace flowlet::data {

// The next batch, or nullopt when there are no more. Called on the prefetcher's thread only; it
// should return promptly, since the prefetcher's destructor waits for the call in progress.
using BatchSource = std::function<std::optional<Dataset>()>;

struct PrefetchOptions {
  int64_t depth = 4;              // batches built ahead of the trainer: the queue's capacity, >= 1
  std::optional<int64_t> epochs = std::nullopt;  // with Batches: how many epochs (>= 0); nullopt: forever
  uint64_t first_epoch = 0;       // with Batches: the first epoch's shuffle, to resume a run
  std::string name = "prefetch";  // the queue's name, in messages
};

// Runs a producer thread that builds batches and enqueues each as {images, labels} into a
// FIFOQueue of capacity `depth`, while the trainer dequeues the ready ones: building the next
// batches overlaps the training step. When the trainer is slower, the queue fills and the producer
// blocks (backpressure), so at most `depth` batches (plus the one being built) are held.
//   Batches batches(train, /*batch_size=*/64, /*seed=*/1);
//   Prefetcher prefetch(batches, {.epochs = 10});  // epoch e uses batches.reshuffle(e)
//   while (std::optional<Dataset> batch = prefetch.next()) step(batch->images, batch->labels);
//
// A failure in the producer (the source throws, or yields an empty Tensor handle) closes the queue
// with that error: the batches built before it are still delivered, then next() (and a dequeue
// on queue()) rethrows it. The destructor cancels the queue, which wakes a blocked producer, and
// joins the thread. next() and queue() may be used from several threads.
class Prefetcher {
 public:
  // Yields the batches of `batches` (a private copy) in order, for options.epochs epochs starting at
  // options.first_epoch. InvalidArgument if depth < 1, epochs < 0, or an epoch holds no batch.
  explicit Prefetcher(Batches batches, PrefetchOptions options = {});
  // Yields what `source` returns until it returns nullopt. InvalidArgument if depth < 1 or epochs
  // or first_epoch is set (they apply to Batches).
  explicit Prefetcher(BatchSource source, PrefetchOptions options = {});
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // The next batch, blocking until the producer has built it; nullopt once every batch was taken.
  std::optional<Dataset> next();
  // A handle to the queue of {images, labels} items (for a traced step that dequeues in the graph).
  FIFOQueue queue() const { return queue_; }

 private:
  FIFOQueue queue_;
  std::atomic<bool> producer_failed_{false};  // the queue was closed with the producer's error
  std::thread producer_;                      // last: starts after the members it uses exist
};

}  // namespace flowlet::data
