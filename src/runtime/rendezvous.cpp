#include "runtime/rendezvous.hpp"

#include "core/check.hpp"

namespace flowlet::detail {

Rendezvous::Rendezvous(int32_t slots) : slots_(static_cast<size_t>(slots)) {}

void Rendezvous::send(int32_t slot, Tensor value, int64_t bytes) {
  Receiver receiver = nullptr;
  void* context = nullptr;
  {
    std::lock_guard lock(mutex_);
    Slot& s = slots_.at(static_cast<size_t>(slot));
    if (s.sent) fail<InvalidArgument>("rendezvous: slot {} sent twice in one step", slot);
    s.sent = true;
    bytes_.fetch_add(bytes, std::memory_order_relaxed);
    transfers_.fetch_add(1, std::memory_order_relaxed);
    if (aborted_) return;  // the receiver was (or will be) failed by abort()
    if (!s.receiver) {
      s.value = std::move(value);
      return;
    }
    receiver = std::exchange(s.receiver, nullptr);
    context = s.context;
  }
  receiver(context, std::move(value), nullptr);
}

void Rendezvous::receive(int32_t slot, Receiver receiver, void* context) {
  Tensor value;
  std::exception_ptr error;
  {
    std::lock_guard lock(mutex_);
    Slot& s = slots_.at(static_cast<size_t>(slot));
    if (aborted_) {
      error = aborted_;
    } else if (s.sent) {
      value = std::move(s.value);
    } else {
      s.receiver = receiver;
      s.context = context;
      return;
    }
  }
  receiver(context, std::move(value), std::move(error));
}

void Rendezvous::abort(std::exception_ptr error) {
  std::vector<std::pair<Receiver, void*>> parked;
  {
    std::lock_guard lock(mutex_);
    if (aborted_) return;
    aborted_ = error;
    for (Slot& s : slots_) {
      if (s.receiver) parked.emplace_back(std::exchange(s.receiver, nullptr), s.context);
      s.value = Tensor();
    }
  }
  for (auto& [receiver, context] : parked) receiver(context, Tensor(), error);
}

}  // namespace flowlet::detail
