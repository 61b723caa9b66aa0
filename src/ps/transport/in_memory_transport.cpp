// The in-process transport: every endpoint in this process, messages moved as they are.
//
// Each endpoint has an inbox (a FIFO under the endpoint's mutex) and at most one thread delivering
// from it at a time, which is what keeps one handler call at a time per endpoint.
//
// Without a delay the sender delivers: send() appends to the receiver's inbox and, when no thread
// is delivering there, becomes the receiver's deliverer and drains the inbox, calling the handler
// with no lock held. A sender that finds a deliverer at work leaves its message to it and returns.
// So a send never blocks on another endpoint's handler: two endpoints whose handlers send to each
// other cannot deadlock (no thread ever holds one endpoint's lock while taking another's), and a
// handler that sends to its own endpoint only queues (its message is delivered when the handler
// returns, by the same loop). Order per sender holds because the inbox is FIFO.
//
// With a delay each endpoint has a delivery thread; a message is stamped with its due time under
// the receiver's lock, so the inbox (constant delay, monotonic clock) is ordered by due time and
// by send order at once, and the thread delivers its front when due.
//
// Before the first attach() messages stay in the inbox; after detach() they are counted and dropped.
// The transport must not be destroyed from inside one of its handlers (its owner, the strategy,
// destroys it after every endpoint detached).
#include <fmt/format.h>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "core/check.hpp"
#include "flowlet/core/error.hpp"
#include "ps/transport/handler_threw.hpp"
#include "ps/transport/transport.hpp"

namespace flowlet::detail::ps {

namespace {

using Clock = std::chrono::steady_clock;

// A handler or a detach that takes this long is a bug in an endpoint, not a slow machine.
constexpr std::chrono::seconds kHandlerDeadline{120};

struct Letter {
  int from = 0;
  Bytes bytes;
  Clock::time_point due;
};

enum class State { waiting, attached, detached };  // waiting: never attached, keeps what arrives

struct Endpoint {
  std::mutex mutex;
  std::condition_variable changed;  // a delivery finished, a letter arrived, attach/detach/stop
  State state = State::waiting;
  std::shared_ptr<Transport::Handler> handler;
  std::deque<Letter> inbox;
  bool delivering = false;           // a thread is inside the delivery loop of this endpoint
  std::thread::id deliverer;         // which one (a detach from inside the handler must not wait)
  bool stopping = false;             // the transport is being destroyed (delivery thread: leave)
  std::thread delivery_thread;       // with a delay only

  std::atomic<int64_t> messages_sent{0}, bytes_sent{0}, messages_received{0}, bytes_received{0};
};

class InMemoryTransport final : public Transport {
 public:
  InMemoryTransport(int endpoints, Clock::duration delay) : Transport(endpoints), delay_(delay) {
    endpoints_.reserve(static_cast<size_t>(endpoints));
    for (int e = 0; e < endpoints; ++e) endpoints_.push_back(std::make_unique<Endpoint>());
    if (delay_ > Clock::duration::zero()) {
      for (int e = 0; e < endpoints; ++e) {
        endpoints_[static_cast<size_t>(e)]->delivery_thread = std::thread([this, e] { delivery_loop(e); });
      }
    }
  }

  ~InMemoryTransport() override {
    for (auto& ep : endpoints_) {
      std::unique_lock lock(ep->mutex);
      ep->stopping = true;
      ep->changed.notify_all();
    }
    for (auto& ep : endpoints_) {
      if (ep->delivery_thread.joinable()) ep->delivery_thread.join();
    }
    // Without a delay a deliverer is a sender's thread: let a delivery still running finish.
    for (size_t e = 0; e < endpoints_.size(); ++e) wait_idle(*endpoints_[e], static_cast<int>(e), "~Transport");
  }

  bool hosts(int endpoint) const override { return endpoint >= 0 && endpoint < endpoints(); }

  void attach(int endpoint, Handler handler) override {
    Endpoint& ep = checked(endpoint, "attach");
    if (!handler) fail<InvalidArgument>("ps transport attach: an empty handler for endpoint {}", endpoint);
    std::unique_lock lock(ep.mutex);
    if (ep.state == State::attached) fail<InvalidArgument>("ps transport attach: endpoint {} is already attached", endpoint);
    ep.state = State::attached;
    ep.handler = std::make_shared<Handler>(std::move(handler));
    if (delayed()) {
      ep.changed.notify_all();
    } else if (!ep.delivering) {
      deliver(ep, endpoint, lock);  // the pending messages, on this thread
    }
  }

  void detach(int endpoint) override {
    Endpoint& ep = checked(endpoint, "detach");
    {
      std::lock_guard lock(ep.mutex);
      ep.state = State::detached;
      ep.handler.reset();
      for (const Letter& l : ep.inbox) drop_counted(ep, l);
      ep.inbox.clear();
    }
    wait_idle(ep, endpoint, "detach");
  }

  void send(int from, int to, Bytes message) override {
    if (from < 0 || from >= endpoints() || to < 0 || to >= endpoints()) {
      fail<InvalidArgument>("ps transport send: endpoints out of range; got from {} to {} with {} endpoints", from, to,
                            endpoints());
    }
    Endpoint& sender = *endpoints_[static_cast<size_t>(from)];
    sender.messages_sent.fetch_add(1, std::memory_order_relaxed);
    sender.bytes_sent.fetch_add(static_cast<int64_t>(message.size()), std::memory_order_relaxed);
    Endpoint& ep = *endpoints_[static_cast<size_t>(to)];
    std::unique_lock lock(ep.mutex);
    if (delayed()) {
      ep.inbox.push_back(Letter{from, std::move(message), Clock::now() + delay_});
      const bool was_empty = ep.inbox.size() == 1;
      lock.unlock();  // notified after: a thread woken under the lock would only block on it again
      if (was_empty) ep.changed.notify_all();
      return;
    }
    count_received(ep, message.size());
    if (ep.state == State::detached) return;
    ep.inbox.push_back(Letter{from, std::move(message), {}});
    if (ep.state == State::attached && !ep.delivering) deliver(ep, to, lock);
  }

  TransportCounters counters(int endpoint) const override {
    const Endpoint& ep = checked(endpoint, "counters");
    return TransportCounters{ep.messages_sent.load(), ep.bytes_sent.load(), ep.messages_received.load(),
                             ep.bytes_received.load()};
  }

  void reset_counters() override {
    for (auto& ep : endpoints_) {
      ep->messages_sent = 0;
      ep->bytes_sent = 0;
      ep->messages_received = 0;
      ep->bytes_received = 0;
    }
  }

  std::string describe() const override {
    if (!delayed()) return fmt::format("in-process transport ({} endpoints)", endpoints());
    return fmt::format("in-process transport ({} endpoints, {:g} ms message delay)", endpoints(),
                       std::chrono::duration<double, std::milli>(delay_).count());
  }

 private:
  bool delayed() const { return delay_ > Clock::duration::zero(); }

  Endpoint& checked(int endpoint, const char* op) const {
    if (!hosts(endpoint)) {
      fail<InvalidArgument>("ps transport {}: endpoint {} out of range [0, {})", op, endpoint, endpoints());
    }
    return *endpoints_[static_cast<size_t>(endpoint)];
  }

  static void count_received(Endpoint& ep, size_t bytes) {
    ep.messages_received.fetch_add(1, std::memory_order_relaxed);
    ep.bytes_received.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
  }
  // Delayed letters are counted when they arrive (fall due); one dropped before that still counts.
  void drop_counted(Endpoint& ep, const Letter& l) const {
    if (delayed()) count_received(ep, l.bytes.size());
  }

  // The undelayed delivery loop, run by the thread that found the endpoint idle; `lock` holds
  // ep.mutex on entry and on return.
  static void deliver(Endpoint& ep, int endpoint, std::unique_lock<std::mutex>& lock) {
    ep.delivering = true;
    ep.deliverer = std::this_thread::get_id();
    while (ep.state == State::attached && !ep.inbox.empty()) {
      Letter letter = std::move(ep.inbox.front());
      ep.inbox.pop_front();
      call(ep, endpoint, letter, lock);
    }
    ep.delivering = false;
    ep.deliverer = {};
    ep.changed.notify_all();
  }

  // Calls the handler with no lock held.
  static void call(Endpoint& ep, int endpoint, Letter& letter, std::unique_lock<std::mutex>& lock) {
    std::shared_ptr<Handler> handler = ep.handler;
    lock.unlock();
    try {
      (*handler)(letter.from, std::move(letter.bytes));
    } catch (...) {
      handler_threw("in-process", endpoint, letter.from);
    }
    handler.reset();
    lock.lock();
  }

  // The delayed delivery thread of endpoint `endpoint`.
  void delivery_loop(int endpoint) {
    Endpoint& ep = *endpoints_[static_cast<size_t>(endpoint)];
    std::unique_lock lock(ep.mutex);
    while (!ep.stopping) {
      if (ep.inbox.empty()) {
        ep.changed.wait(lock);
        continue;
      }
      const Clock::time_point due = ep.inbox.front().due;
      if (Clock::now() < due) {
        ep.changed.wait_until(lock, due);
        continue;
      }
      if (ep.state == State::waiting) {  // due, but nobody to give it to yet: keep it
        ep.changed.wait(lock);
        continue;
      }
      Letter letter = std::move(ep.inbox.front());
      ep.inbox.pop_front();
      count_received(ep, letter.bytes.size());
      if (ep.state == State::detached) continue;
      ep.delivering = true;
      ep.deliverer = std::this_thread::get_id();
      call(ep, endpoint, letter, lock);
      ep.delivering = false;
      ep.deliverer = {};
      ep.changed.notify_all();
    }
  }

  // Waits until no thread delivers to `ep` (unless this thread is the deliverer: a handler that
  // detaches its own endpoint).
  void wait_idle(Endpoint& ep, int endpoint, const char* op) const {
    std::unique_lock lock(ep.mutex);
    if (ep.delivering && ep.deliverer == std::this_thread::get_id()) return;
    if (!ep.changed.wait_for(lock, kHandlerDeadline, [&] { return !ep.delivering; })) {
      fail<DeadlineExceeded>("ps transport {}: the handler of endpoint {} is still running after {} s", op, endpoint,
                             kHandlerDeadline.count());
    }
  }

  const Clock::duration delay_;
  std::vector<std::unique_ptr<Endpoint>> endpoints_;
};

}  // namespace

std::unique_ptr<Transport> make_in_memory_transport(int endpoints, std::chrono::duration<double> message_delay) {
  if (endpoints < 1) fail<InvalidArgument>("make_in_memory_transport: needs at least 1 endpoint; got {}", endpoints);
  const double seconds = message_delay.count();
  if (!std::isfinite(seconds) || seconds < 0 || seconds > 3600) {
    fail<InvalidArgument>("make_in_memory_transport: the message delay must be in [0, 3600] s; got {} s", seconds);
  }
  return std::make_unique<InMemoryTransport>(endpoints,
                                             std::chrono::duration_cast<Clock::duration>(message_delay));
}

}  // namespace flowlet::detail::ps
