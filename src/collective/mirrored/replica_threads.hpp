// The persistent threads a MirroredStrategy runs its local replicas on: one per local replica,
// started with the strategy and joined when it is destroyed. Not the executor's pool: a replica
// blocks for the whole step (its graph waits for collectives), and a blocked pool worker could
// starve the very nodes the step waits for.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace flowlet::detail {

class ReplicaThreads {
 public:
  explicit ReplicaThreads(int count);
  ~ReplicaThreads();
  ReplicaThreads(const ReplicaThreads&) = delete;
  ReplicaThreads& operator=(const ReplicaThreads&) = delete;

  int size() const { return static_cast<int>(threads_.size()); }

  // Runs job(l) on thread l for every l at once and returns when all have finished, with each
  // thread's exception (null where it succeeded). One call at a time.
  std::vector<std::exception_ptr> run_all(const std::function<void(int)>& job);

 private:
  void loop(int index);

  std::mutex mutex_;
  std::condition_variable work_ready_, work_done_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t generation_ = 0;  // bumped per run_all; a thread runs each generation once
  int remaining_ = 0;
  bool stopping_ = false;
  std::vector<std::exception_ptr> errors_;
  std::vector<std::thread> threads_;
};

}  // namespace flowlet::detail
