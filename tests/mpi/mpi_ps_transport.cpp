// The MPI transport of the parameter servers (src/ps/transport/mpi_transport.cpp), run by mpirun with
// 2 and 3 processes (see tests/meson.build). Every process runs every test case in the same order
// (making and destroying a transport is collective). Endpoints are placed on the processes in
// reverse, so that an endpoint id differs from its process index.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <flowlet/flowlet.hpp>
#include <mutex>
#include <thread>
#include <vector>

#include "ps/transport/transport.hpp"
#include "ps/wire/messages.hpp"
#include "support/ps_transport.hpp"

namespace fl = flowlet;
namespace ps = flowlet::detail::ps;
using ps::Bytes;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

int rank() { return fl::process_index(); }
int procs() { return fl::process_count(); }

// Endpoint e lives on process procs() - 1 - e.
std::vector<int> reversed_placement() {
  std::vector<int> placement(static_cast<size_t>(procs()));
  for (int e = 0; e < procs(); ++e) placement[static_cast<size_t>(e)] = procs() - 1 - e;
  return placement;
}
int my_endpoint() { return procs() - 1 - rank(); }

std::unique_ptr<ps::Transport> make() { return ps::make_mpi_transport(reversed_placement()); }

using test::number_message;
using test::wait_until;

int64_t number_of(const Bytes& b) {
  int64_t n = -1;
  if (b.size() >= 8) std::memcpy(&n, b.data(), 8);
  return n;
}

// Per sender: the next number expected; counts what arrived and what came out of order.
struct Ledger {
  std::mutex mutex;
  std::vector<int64_t> next = std::vector<int64_t>(static_cast<size_t>(procs()), 0);
  std::atomic<int64_t> received{0}, out_of_order{0};
  ps::Transport::Handler handler() {
    return [this](int from, Bytes message) {
      {
        std::lock_guard lock(mutex);
        const int64_t n = number_of(message);
        if (from < 0 || from >= procs() || n != next[static_cast<size_t>(from)]) {
          ++out_of_order;
        } else {
          next[static_cast<size_t>(from)] = n + 1;
        }
      }
      ++received;
    };
  }
};

}  // namespace

TEST_CASE("mpi transport: describe, hosts") {
  auto transport = make();
  CHECK(transport->endpoints() == procs());
  CHECK(transport->hosts(my_endpoint()));
  CHECK(!transport->hosts((my_endpoint() + 1) % procs()));
  CHECK(transport->describe() == fmt::format("MPI transport ({} endpoints, one per process; process {} hosts endpoint {})",
                                             procs(), rank(), my_endpoint()));
}

TEST_CASE("mpi transport: every process sends 1000 numbered messages to every other, in order, exactly once") {
  constexpr int64_t kEach = 1000;
  Ledger ledger;  // before the transport: it outlives every handler call
  auto transport = make();
  transport->attach(my_endpoint(), ledger.handler());
  for (int64_t i = 0; i < kEach; ++i) {
    for (int to = 0; to < procs(); ++to) {
      if (to != my_endpoint()) transport->send(my_endpoint(), to, number_message(i, 8 + static_cast<size_t>(i % 5)));
    }
  }
  const int64_t want = kEach * (procs() - 1);
  REQUIRE(wait_until([&] { return ledger.received.load() >= want; }));
  CHECK(ledger.out_of_order.load() == 0);
  for (int from = 0; from < procs(); ++from) {
    CHECK(ledger.next[static_cast<size_t>(from)] == (from == my_endpoint() ? 0 : kEach));
  }
  // 8 + (i % 5) bytes each: over 1000 messages 8000 + 200 * (0+1+2+3+4).
  const ps::TransportCounters c = transport->counters(my_endpoint());
  CHECK(c.messages_sent == want);
  CHECK(c.bytes_sent == (procs() - 1) * (8 * kEach + 200 * 10));
  CHECK(c.messages_received == want);
  CHECK(c.bytes_received == (procs() - 1) * (8 * kEach + 200 * 10));
  transport.reset();  // collective
  CHECK(ledger.received.load() == want);  // nothing more came
}

TEST_CASE("mpi transport: an 8 MB message arrives whole") {
  constexpr size_t kBytes = size_t{8} << 20;
  std::atomic<int> whole{0}, broken{0};
  auto transport = make();
  transport->attach(my_endpoint(), [&](int from, Bytes message) {
    bool ok = message.size() == kBytes;
    for (size_t i = 0; ok && i < kBytes; i += 4099) ok = message[i] == static_cast<std::byte>((i * 7 + static_cast<size_t>(from)) & 0xff);
    ++(ok ? whole : broken);
  });
  for (int to = 0; to < procs(); ++to) {
    if (to == my_endpoint()) continue;
    Bytes big(kBytes);
    for (size_t i = 0; i < kBytes; ++i) big[i] = static_cast<std::byte>((i * 7 + static_cast<size_t>(my_endpoint())) & 0xff);
    transport->send(my_endpoint(), to, std::move(big));
  }
  REQUIRE(wait_until([&] { return whole.load() + broken.load() >= procs() - 1; }));
  CHECK(whole.load() == procs() - 1);
  CHECK(broken.load() == 0);
  CHECK(transport->counters(my_endpoint()).bytes_received == static_cast<int64_t>(kBytes) * (procs() - 1));
}

TEST_CASE("mpi transport: large messages of changing sizes, received into recycled send buffers, arrive whole") {
  // Endpoint 0 answers each large request with a large reply of another size (a few bytes more or
  // fewer, or much smaller), so its receives reuse the buffers of its completed replies and the
  // others' reuse their requests': every byte is checked, and the sizes are what was sent.
  constexpr size_t kBase = size_t{1} << 20;
  const size_t sizes[] = {kBase, kBase + 14, kBase - 14, kBase + 40, kBase / 2, 3 * kBase, kBase + 1};
  auto fill = [](size_t size, int64_t n) {
    Bytes b(size);
    for (size_t i = 0; i < size; ++i) b[i] = static_cast<std::byte>((i * 13 + static_cast<size_t>(n)) & 0xff);
    std::memcpy(b.data(), &n, 8);
    return b;
  };
  auto whole = [](const Bytes& b, int64_t n) {
    if (number_of(b) != n) return false;
    for (size_t i = 8; i < b.size(); ++i) {
      if (b[i] != static_cast<std::byte>((i * 13 + static_cast<size_t>(n)) & 0xff)) return false;
    }
    return true;
  };
  std::atomic<int64_t> answered{0}, wrong{0};
  auto transport = make();
  ps::Transport* t = transport.get();
  if (my_endpoint() == 0) {
    transport->attach(0, [&, t](int from, Bytes message) {
      const int64_t n = number_of(message);
      const size_t want = sizes[static_cast<size_t>(n) % std::size(sizes)];
      if (message.size() != want || !whole(message, n)) ++wrong;
      t->send(0, from, fill(sizes[static_cast<size_t>(n + 3) % std::size(sizes)], n + 1000));
    });
  } else {
    transport->attach(my_endpoint(), [&](int, Bytes message) {
      const int64_t n = number_of(message) - 1000;
      if (message.size() != sizes[static_cast<size_t>(n + 3) % std::size(sizes)] || !whole(message, n + 1000)) ++wrong;
      ++answered;
    });
    for (int64_t n = 0; n < 3 * static_cast<int64_t>(std::size(sizes)); ++n) {
      transport->send(my_endpoint(), 0, fill(sizes[static_cast<size_t>(n) % std::size(sizes)], n));
      REQUIRE(wait_until([&] { return answered.load() > n; }));  // one at a time: a round trip
    }
  }
  transport.reset();  // collective: endpoint 0 has answered everything by now
  CHECK(wrong.load() == 0);
  if (my_endpoint() != 0) CHECK(answered.load() == 3 * static_cast<int64_t>(std::size(sizes)));
}

TEST_CASE("mpi transport: an encoded push travels and decodes") {
  std::mutex mutex;
  std::vector<ps::Message> got;
  auto transport = make();
  transport->attach(my_endpoint(), [&](int, Bytes message) {
    std::lock_guard lock(mutex);
    got.push_back(ps::decode(message));
  });
  const int to = (my_endpoint() + 1) % procs();
  const fl::Tensor grad = fl::full({256, 64}, 0.25 * (my_endpoint() + 1), fl::f32);
  transport->send(my_endpoint(), to, ps::encode(ps::Push{my_endpoint(), 3, 2, {{1, fl::Tensor(), grad}}}));
  REQUIRE(wait_until([&] {
    std::lock_guard lock(mutex);
    return got.size() == 1;
  }));
  std::lock_guard lock(mutex);
  const auto& push = std::get<ps::Push>(got[0]);
  const int from = (my_endpoint() + procs() - 1) % procs();
  CHECK(push.worker == from);
  CHECK(push.clock == 3);
  REQUIRE(push.entries.size() == 1);
  CHECK(push.entries[0].grad.shape() == fl::Shape{256, 64});
  CHECK(push.entries[0].grad.to_vector<float>()[100] == 0.25f * static_cast<float>(from + 1));
}

TEST_CASE("mpi transport: request/response through a handler that replies") {
  // Endpoint 0 serves: it answers request n with n * 10 + its own number. The others ask 200 times.
  constexpr int64_t kRequests = 200;
  std::atomic<int64_t> answered{0}, wrong{0}, next{0};
  auto transport = make();
  ps::Transport* t = transport.get();
  if (my_endpoint() == 0) {
    transport->attach(0, [t](int from, Bytes message) { t->send(0, from, number_message(number_of(message) * 10)); });
  } else {
    transport->attach(my_endpoint(), [&](int from, Bytes message) {
      if (from != 0 || number_of(message) != next.load() * 10) ++wrong;
      ++next;
      ++answered;
    });
    for (int64_t n = 0; n < kRequests; ++n) {
      const int64_t before = answered.load();
      transport->send(my_endpoint(), 0, number_message(n));
      REQUIRE(wait_until([&] { return answered.load() > before; }));  // one at a time: a round trip
    }
    CHECK(answered.load() == kRequests);
    CHECK(wrong.load() == 0);
  }
  transport.reset();
  if (my_endpoint() != 0) CHECK(answered.load() == kRequests);
}

TEST_CASE("mpi transport: destroyed right after the traffic: nothing is lost, also replies sent while closing") {
  // Every process sends 300 messages to every other and destroys its transport at once; endpoint 0
  // also answers each message (so its handler sends while the others are already closing).
  constexpr int64_t kEach = 300;
  std::atomic<int64_t> received{0}, replies{0};
  {
    auto transport = make();
    ps::Transport* t = transport.get();
    const int me = my_endpoint();
    transport->attach(me, [&, t, me](int from, Bytes message) {
      if (number_of(message) < 0) {  // a reply (negative numbers)
        ++replies;
        return;
      }
      ++received;
      if (me == 0) t->send(0, from, number_message(-1 - number_of(message)));
    });
    for (int64_t i = 0; i < kEach; ++i) {
      for (int to = 0; to < procs(); ++to) {
        if (to != me) transport->send(me, to, number_message(i));
      }
    }
  }  // collective destruction
  CHECK(received.load() == kEach * (procs() - 1));
  CHECK(replies.load() == (my_endpoint() == 0 ? 0 : kEach));
}

TEST_CASE("mpi transport: messages that arrive before attach are kept, in order") {
  Ledger ledger;
  auto transport = make();
  const int to = (my_endpoint() + 1) % procs();
  for (int64_t i = 0; i < 20; ++i) transport->send(my_endpoint(), to, number_message(i));
  fl::barrier();  // everyone has sent
  std::this_thread::sleep_for(50ms);  // and the messages had time to arrive
  transport->attach(my_endpoint(), ledger.handler());
  REQUIRE(wait_until([&] { return ledger.received.load() >= 20; }));
  CHECK(ledger.out_of_order.load() == 0);
  CHECK(transport->counters(my_endpoint()).messages_received == 20);
  transport->detach(my_endpoint());
  fl::barrier();  // everyone detached
  // Detached: later messages are counted and dropped.
  transport->send(my_endpoint(), to, number_message(20));
  REQUIRE(wait_until([&] { return transport->counters(my_endpoint()).messages_received == 21; }));
  CHECK(ledger.received.load() == 20);
}

TEST_CASE("mpi transport: bad arguments are InvalidArgument (on every process alike)") {
  const std::vector<int> short_placement(static_cast<size_t>(procs() - 1), 0);
  CHECK_THROWS_WITH_AS(ps::make_mpi_transport(short_placement),
                       doctest::Contains("one endpoint per process"), fl::InvalidArgument);
  std::vector<int> twice(static_cast<size_t>(procs()), 0);
  CHECK_THROWS_WITH_AS(ps::make_mpi_transport(twice), doctest::Contains("would host endpoints 0 and 1"),
                       fl::InvalidArgument);
  std::vector<int> outside = reversed_placement();
  outside[0] = procs();
  CHECK_THROWS_WITH_AS(ps::make_mpi_transport(outside), doctest::Contains("outside [0,"), fl::InvalidArgument);

  auto transport = make();
  const int other = (my_endpoint() + 1) % procs();
  CHECK_THROWS_WITH_AS(transport->send(other, my_endpoint(), Bytes(1)),
                       doctest::Contains("from must be this process's endpoint"), fl::InvalidArgument);
  CHECK_THROWS_AS(transport->send(my_endpoint(), procs(), Bytes(1)), fl::InvalidArgument);
  CHECK_THROWS_WITH_AS(transport->attach(other, [](int, Bytes) {}), doctest::Contains("is not hosted by process"),
                       fl::InvalidArgument);
  CHECK_THROWS_AS(transport->counters(other), fl::InvalidArgument);
  CHECK_THROWS_AS(transport->attach(my_endpoint(), nullptr), fl::InvalidArgument);
  transport->attach(my_endpoint(), [](int, Bytes) {});
  CHECK_THROWS_WITH_AS(transport->attach(my_endpoint(), [](int, Bytes) {}), doctest::Contains("already attached"),
                       fl::InvalidArgument);
  CHECK(transport->counters(my_endpoint()).messages_sent == 0);
}

// Made before main(), so destroyed after the exit handler that finalizes MPI.
std::unique_ptr<ps::Transport> alive_at_exit;

TEST_CASE("mpi transport: a transport alive at exit is shut down by the exit handler") {
  // The exit hook must end it collectively before MPI_Finalize; its destructor, after, finds it
  // shut down (no crash, no hang: the job's exit status says so).
  alive_at_exit = make();
  alive_at_exit->attach(my_endpoint(), [](int, Bytes) {});
  alive_at_exit->send(my_endpoint(), (my_endpoint() + 1) % procs(), number_message(1));
}
