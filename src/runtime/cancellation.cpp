#include "runtime/cancellation.hpp"

#include <vector>

namespace flowlet::detail {

Cancellation::Token Cancellation::on_cancel(std::function<void()> callback) {
  std::lock_guard lock(mutex_);
  if (cancelled_.load(std::memory_order_relaxed)) return kAlreadyCancelled;
  const Token token = next_++;
  callbacks_.emplace(token, std::move(callback));
  return token;
}

bool Cancellation::forget(Token token) {
  std::lock_guard lock(mutex_);
  return callbacks_.erase(token) == 1;
}

void Cancellation::cancel() {
  std::unordered_map<Token, std::function<void()>> callbacks;
  {
    std::lock_guard lock(mutex_);
    if (cancelled_.exchange(true, std::memory_order_acq_rel)) return;
    callbacks.swap(callbacks_);
  }
  for (auto& [token, callback] : callbacks) callback();
}

}  // namespace flowlet::detail
