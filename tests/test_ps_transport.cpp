// The in-process transport of the parameter servers (src/ps/transport/in_memory_transport.cpp):
// order per sender and exactly-once delivery under concurrent senders, with and without a delay;
// messages kept until attach; detach; the measured delay; handlers that send (to another endpoint,
// to each other, to themselves); counters; and the argument errors. Every wait has a deadline.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <flowlet/flowlet.hpp>
#include <mutex>
#include <thread>
#include <vector>

#include "ps/transport/transport.hpp"
#include "support/ps_transport.hpp"

namespace fl = flowlet;
namespace ps = flowlet::detail::ps;
using ps::Bytes;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

using test::number_message;
using test::wait_until;

int64_t number_of(const Bytes& b) {
  int64_t n = 0;
  REQUIRE(b.size() >= 8);
  std::memcpy(&n, b.data(), 8);
  return n;
}

// What one receiving endpoint saw: per sender the numbers in arrival order, checked as they come.
struct Receiver {
  explicit Receiver(int senders) : next(static_cast<size_t>(senders), 0) {}
  std::mutex mutex;
  std::vector<int64_t> next;  // the number each sender's next message must carry
  std::atomic<int64_t> received{0};
  std::atomic<int64_t> out_of_order{0};
  std::atomic<bool> inside{false};
  std::atomic<int64_t> overlapping{0};  // calls that found another call of the handler running

  ps::Transport::Handler handler() {
    return [this](int from, Bytes message) {
      if (inside.exchange(true)) ++overlapping;
      {
        std::lock_guard lock(mutex);
        if (number_of(message) != next.at(static_cast<size_t>(from))) ++out_of_order;
        next[static_cast<size_t>(from)] = number_of(message) + 1;
      }
      ++received;
      inside = false;
    };
  }
};

void concurrent_senders(std::chrono::duration<double> delay) {
  constexpr int kSenders = 4;
  constexpr int64_t kEach = 10000;
  auto transport = ps::make_in_memory_transport(kSenders + 1, delay);
  Receiver receiver(kSenders);
  transport->attach(kSenders, receiver.handler());
  std::vector<std::thread> senders;
  for (int s = 0; s < kSenders; ++s) {
    senders.emplace_back([&, s] {
      for (int64_t i = 0; i < kEach; ++i) transport->send(s, kSenders, number_message(i));
    });
  }
  for (auto& t : senders) t.join();
  REQUIRE(wait_until([&] { return receiver.received.load() >= kSenders * kEach; }));
  std::this_thread::sleep_for(10ms);  // nothing more may come
  CHECK(receiver.received.load() == kSenders * kEach);
  CHECK(receiver.out_of_order.load() == 0);
  CHECK(receiver.overlapping.load() == 0);
  for (int s = 0; s < kSenders; ++s) CHECK(receiver.next[static_cast<size_t>(s)] == kEach);
  const ps::TransportCounters c = transport->counters(kSenders);
  CHECK(c.messages_received == kSenders * kEach);
  CHECK(c.bytes_received == kSenders * kEach * 8);
  CHECK(c.messages_sent == 0);
  for (int s = 0; s < kSenders; ++s) {
    CHECK(transport->counters(s).messages_sent == kEach);
    CHECK(transport->counters(s).bytes_sent == kEach * 8);
  }
  transport->detach(kSenders);
}

}  // namespace

TEST_CASE("ps transport: 4 concurrent senders x 10k messages arrive in order, exactly once") {
  SUBCASE("delivered on the senders' threads") { concurrent_senders({}); }
  SUBCASE("with a 1 ms delay (delivery thread)") { concurrent_senders(1ms); }
}

TEST_CASE("ps transport: without a delay the handler runs inside send(), on the sender's thread") {
  auto transport = ps::make_in_memory_transport(2);
  std::thread::id handler_thread;
  transport->attach(1, [&](int from, Bytes message) {
    CHECK(from == 0);
    CHECK(number_of(message) == 77);
    handler_thread = std::this_thread::get_id();
  });
  transport->send(0, 1, number_message(77));
  CHECK(handler_thread == std::this_thread::get_id());
  transport->detach(1);
}

TEST_CASE("ps transport: messages sent before attach are kept and delivered first, in order") {
  for (auto delay : {0ms, 2ms}) {
    CAPTURE(delay.count());
    auto transport = ps::make_in_memory_transport(3, delay);
    for (int64_t i = 0; i < 5; ++i) transport->send(0, 2, number_message(i));
    for (int64_t i = 0; i < 3; ++i) transport->send(1, 2, number_message(i));
    std::this_thread::sleep_for(10ms);  // past the delay: due, but nobody attached
    std::mutex mutex;
    std::vector<std::pair<int, int64_t>> got;
    transport->attach(2, [&](int from, Bytes message) {
      std::lock_guard lock(mutex);
      got.emplace_back(from, number_of(message));
    });
    transport->send(0, 2, number_message(5));
    REQUIRE(wait_until([&] {
      std::lock_guard lock(mutex);
      return got.size() == 9;
    }));
    std::lock_guard lock(mutex);
    std::vector<int64_t> from0, from1;
    for (auto [from, n] : got) (from == 0 ? from0 : from1).push_back(n);
    CHECK(from0 == std::vector<int64_t>{0, 1, 2, 3, 4, 5});
    CHECK(from1 == std::vector<int64_t>{0, 1, 2});
    CHECK(got.back() == std::pair<int, int64_t>{0, 5});  // the pending ones came first
    CHECK(transport->counters(2).messages_received == 9);
  }
}

TEST_CASE("ps transport: detach waits for a running handler; later messages are counted and dropped") {
  for (auto delay : {0ms, 1ms}) {
    CAPTURE(delay.count());
    auto transport = ps::make_in_memory_transport(2, delay);
    std::atomic<bool> started{false}, finished{false};
    std::atomic<int> calls{0};
    transport->attach(1, [&](int, Bytes) {
      ++calls;
      started = true;
      std::this_thread::sleep_for(50ms);
      finished = true;
    });
    std::thread sender([&] { transport->send(0, 1, number_message(1)); });
    REQUIRE(wait_until([&] { return started.load(); }));
    transport->detach(1);
    CHECK(finished.load());  // detach returned only after the handler did
    sender.join();
    transport->send(0, 1, number_message(2, 100));
    std::this_thread::sleep_for(10ms);
    CHECK(calls.load() == 1);
    CHECK(transport->counters(1).messages_received == 2);
    CHECK(transport->counters(1).bytes_received == 108);
    // Attached again: new messages reach the new handler.
    std::atomic<int> again{0};
    transport->attach(1, [&](int, Bytes) { ++again; });
    transport->send(0, 1, number_message(3));
    REQUIRE(wait_until([&] { return again.load() == 1; }));
    transport->detach(1);
  }
}

TEST_CASE("ps transport: a delayed message arrives no earlier than the delay, in order") {
  constexpr auto kDelay = 30ms;
  auto transport = ps::make_in_memory_transport(2, kDelay);
  CHECK(transport->describe() == "in-process transport (2 endpoints, 30 ms message delay)");
  std::mutex mutex;
  std::vector<std::pair<int64_t, Clock::time_point>> got;
  transport->attach(1, [&](int, Bytes message) {
    std::lock_guard lock(mutex);
    got.emplace_back(number_of(message), Clock::now());
  });
  std::vector<Clock::time_point> sent;
  for (int64_t i = 0; i < 10; ++i) {
    sent.push_back(Clock::now());
    transport->send(0, 1, number_message(i));
    std::this_thread::sleep_for(3ms);
  }
  REQUIRE(wait_until([&] {
    std::lock_guard lock(mutex);
    return got.size() == 10;
  }));
  std::lock_guard lock(mutex);
  for (size_t i = 0; i < got.size(); ++i) {
    CHECK(got[i].first == static_cast<int64_t>(i));
    CHECK(got[i].second - sent[i] >= kDelay);
  }
  transport->detach(1);
}

TEST_CASE("ps transport: handlers that send: a 1000-round ping-pong, both ways at once") {
  for (auto delay : {0ms, 1ms / 10}) {
    CAPTURE(delay.count());
    auto transport = ps::make_in_memory_transport(4, std::chrono::duration<double>(delay));
    constexpr int64_t kRounds = 1000;
    // Two games at once: 0 <-> 1 started by 0 and 1 <-> 0 started by 1, so both endpoints' handlers
    // send to each other concurrently; 2 <-> 3 on another thread besides.
    std::atomic<int64_t> finished{0};
    std::atomic<int64_t> bad{0};
    auto player = [&](int me) {
      return [&, me](int from, Bytes message) {
        const int64_t n = number_of(message);
        if (n >= kRounds) {
          ++finished;
          return;
        }
        if (from == me) ++bad;
        transport->send(me, from, number_message(n + 1));
      };
    };
    for (int e = 0; e < 4; ++e) transport->attach(e, player(e));
    std::thread a([&] { transport->send(0, 1, number_message(0)); });
    std::thread b([&] { transport->send(1, 0, number_message(0)); });
    std::thread c([&] { transport->send(2, 3, number_message(0)); });
    a.join();
    b.join();
    c.join();
    REQUIRE(wait_until([&] { return finished.load() == 3; }));
    CHECK(bad.load() == 0);
    // Each game is kRounds + 1 messages.
    int64_t sent = 0;
    for (int e = 0; e < 4; ++e) sent += transport->counters(e).messages_sent;
    CHECK(sent == 3 * (kRounds + 1));
    for (int e = 0; e < 4; ++e) transport->detach(e);
  }
}

TEST_CASE("ps transport: a handler that sends to its own endpoint gets it after it returns (no recursion)") {
  auto transport = ps::make_in_memory_transport(1);
  std::atomic<int> depth{0}, deepest{0};
  std::atomic<int64_t> last{-1};
  transport->attach(0, [&](int from, Bytes message) {
    deepest = std::max(deepest.load(), ++depth);
    const int64_t n = number_of(message);
    CHECK(from == 0);
    last = n;
    if (n < 100) transport->send(0, 0, number_message(n + 1));
    --depth;
  });
  transport->send(0, 0, number_message(0));
  CHECK(last.load() == 100);  // all delivered before send() returned, by the same loop
  CHECK(deepest.load() == 1);
  transport->detach(0);
}

TEST_CASE("ps transport: counters and reset") {
  auto transport = ps::make_in_memory_transport(3);
  transport->attach(0, [](int, Bytes) {});
  transport->attach(1, [](int, Bytes) {});
  transport->send(2, 0, Bytes(10));
  transport->send(2, 1, Bytes(20));
  transport->send(0, 1, Bytes(5));
  CHECK(transport->counters(2).messages_sent == 2);
  CHECK(transport->counters(2).bytes_sent == 30);
  CHECK(transport->counters(0).messages_received == 1);
  CHECK(transport->counters(0).bytes_received == 10);
  CHECK(transport->counters(1).messages_received == 2);
  CHECK(transport->counters(1).bytes_received == 25);
  transport->reset_counters();
  CHECK(transport->counters(1).bytes_received == 0);
  CHECK(transport->counters(2).messages_sent == 0);
  CHECK(transport->describe() == "in-process transport (3 endpoints)");
  CHECK(transport->endpoints() == 3);
  CHECK(transport->hosts(2));
  CHECK(!transport->hosts(3));
  CHECK(!transport->hosts(-1));
}

TEST_CASE("ps transport: bad arguments are InvalidArgument naming the values") {
  CHECK_THROWS_WITH_AS(ps::make_in_memory_transport(0),
                       "make_in_memory_transport: needs at least 1 endpoint; got 0", fl::InvalidArgument);
  CHECK_THROWS_WITH_AS(ps::make_in_memory_transport(2, std::chrono::duration<double>(-1)),
                       "make_in_memory_transport: the message delay must be in [0, 3600] s; got -1 s",
                       fl::InvalidArgument);
  auto transport = ps::make_in_memory_transport(2);
  CHECK_THROWS_WITH_AS(transport->attach(2, [](int, Bytes) {}), "ps transport attach: endpoint 2 out of range [0, 2)",
                       fl::InvalidArgument);
  CHECK_THROWS_WITH_AS(transport->attach(0, nullptr), "ps transport attach: an empty handler for endpoint 0",
                       fl::InvalidArgument);
  transport->attach(0, [](int, Bytes) {});
  CHECK_THROWS_WITH_AS(transport->attach(0, [](int, Bytes) {}), "ps transport attach: endpoint 0 is already attached",
                       fl::InvalidArgument);
  CHECK_THROWS_WITH_AS(transport->send(-1, 0, Bytes(1)),
                       "ps transport send: endpoints out of range; got from -1 to 0 with 2 endpoints",
                       fl::InvalidArgument);
  CHECK_THROWS_WITH_AS(transport->send(0, 9, Bytes(1)),
                       "ps transport send: endpoints out of range; got from 0 to 9 with 2 endpoints",
                       fl::InvalidArgument);
  CHECK_THROWS_AS(transport->counters(5), fl::InvalidArgument);
  CHECK_THROWS_AS(transport->detach(-3), fl::InvalidArgument);
  CHECK(transport->counters(0).messages_sent == 0);  // nothing was counted for a refused send
  transport->detach(0);
}
