// Cancellation: one per graph step. A node that fails cancels the step; asynchronous kernels that
// wait on something outside the step (a dequeue on an empty queue) register a callback here that
// wakes them, so a cancelled step never leaves a node parked forever.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <unordered_map>

namespace flowlet::detail {

class Cancellation {
 public:
  using Token = int64_t;
  static constexpr Token kAlreadyCancelled = -1;

  // Calls `callback` once if the step is cancelled later. Returns a token for forget(), or
  // kAlreadyCancelled (without keeping or calling the callback) when it already was.
  Token on_cancel(std::function<void()> callback);
  // Drops a callback that is no longer needed (the wait it guarded ended). True when it was still
  // registered; false when cancel() already took it (it has run or is running).
  bool forget(Token token);
  // Runs every registered callback once, on this thread, outside the lock. Later calls do nothing.
  void cancel();
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }

 private:
  std::atomic<bool> cancelled_{false};
  std::mutex mutex_;
  Token next_ = 0;
  std::unordered_map<Token, std::function<void()>> callbacks_;
};

}  // namespace flowlet::detail
