#include "collective/mirrored/replica_threads.hpp"

namespace flowlet::detail {

ReplicaThreads::ReplicaThreads(int count) {
  threads_.reserve(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) threads_.emplace_back([this, i] { loop(i); });
}

ReplicaThreads::~ReplicaThreads() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (std::thread& t : threads_) t.join();
}

std::vector<std::exception_ptr> ReplicaThreads::run_all(const std::function<void(int)>& job) {
  std::unique_lock lock(mutex_);
  job_ = &job;
  errors_.assign(threads_.size(), nullptr);
  remaining_ = size();
  ++generation_;
  work_ready_.notify_all();
  // No limit here: each job ends by itself (a replica waiting for its peers fails by the collective
  // timeout), and returning earlier would leave threads running on the caller's arguments.
  work_done_.wait(lock, [&] { return remaining_ == 0; });
  job_ = nullptr;
  return std::move(errors_);
}

void ReplicaThreads::loop(int index) {
  uint64_t seen = 0;
  std::unique_lock lock(mutex_);
  for (;;) {
    work_ready_.wait(lock, [&] { return stopping_ || generation_ != seen; });
    if (stopping_) return;
    seen = generation_;
    const std::function<void(int)>& job = *job_;
    lock.unlock();
    std::exception_ptr error;
    try {
      job(index);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    errors_[static_cast<size_t>(index)] = error;
    if (--remaining_ == 0) work_done_.notify_all();
  }
}

}  // namespace flowlet::detail
