// The parameter servers' transports and wire format.
//
// Run plainly (no launcher), in one process:
//   - the in-process transport: one message from a sender to the receiving endpoint's handler,
//     64 B and 4 MB, without a delay (the handler runs inside send()) and with a 1 ns delay (a
//     delivery thread hands it over), against a plain std::mutex + std::condition_variable queue
//     whose consumer thread takes the message (the floor of a hand-off between threads). Each call
//     waits until the receiver has the message; the buffer goes back to the sender, so no
//     contender allocates or copies a message (a copy would show at 4 MB).
//   - encode and decode of a dense 4 MB push against one memcpy of 4 MB (each should cost about
//     one copy).
// Under `mpirun -np 2`: a request/response round trip (64 B and 4 MB each way) from endpoint 0 to
// endpoint 1, whose handler sends the request's bytes back, through make_mpi_transport, against a
// raw MPI_Send / MPI_Recv ping-pong of the same bytes on MPI_COMM_WORLD; prints raw / flowlet time.
#include <fmt/core.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <flowlet/flowlet.hpp>
#include <mutex>
#include <thread>
#include <vector>

#include "../harness.hpp"
#include "collective/transport/mpi_include.hpp"
#include "ps/transport/transport.hpp"
#include "ps/wire/messages.hpp"

namespace fl = flowlet;
namespace ps = flowlet::detail::ps;
namespace bench = flowlet_bench;
using ps::Bytes;
using Clock = std::chrono::steady_clock;

namespace {

std::string size_text(size_t bytes) {
  return bytes >= (size_t{1} << 20) ? fmt::format("{} MB", bytes >> 20) : fmt::format("{} B", bytes);
}

// Where a receiver puts the message back for the sender, and how many it has had. The sender
// spins for up to 50 us, then sleeps until told: on a machine with few cores a spinning waiter takes
// the core the transport's threads need to move a large message.
struct Mailbox {
  Bytes returned;
  std::atomic<int64_t> received{0};
  std::mutex mutex;
  std::condition_variable arrived;
  void take(Bytes message) {
    returned = std::move(message);
    std::lock_guard lock(mutex);
    received.fetch_add(1, std::memory_order_release);
    arrived.notify_all();
  }
  void wait_for(int64_t count) {
    const auto spin_until = Clock::now() + std::chrono::microseconds(50);
    for (int spins = 0; received.load(std::memory_order_acquire) < count; ++spins) {
      if (spins > 64) {
        if (Clock::now() > spin_until) break;
        std::this_thread::yield();
      }
    }
    std::unique_lock lock(mutex);
    if (!arrived.wait_for(lock, std::chrono::seconds(60), [&] { return received.load() >= count; })) {
      fmt::print(stderr, "bench_ps_transport: message {} did not arrive in 60 s\n", count);
      std::abort();
    }
  }
};

// The floor: a mutex + condition variable queue drained by a consumer thread.
class QueueHandOff {
 public:
  explicit QueueHandOff(Mailbox& mailbox) : mailbox_(mailbox), consumer_([this] { consume(); }) {}
  ~QueueHandOff() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    ready_.notify_one();
    consumer_.join();
  }
  void push(Bytes message) {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(message));
    }
    ready_.notify_one();
  }

 private:
  void consume() {
    std::unique_lock lock(mutex_);
    for (;;) {
      ready_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      Bytes message = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      mailbox_.take(std::move(message));
      lock.lock();
    }
  }

  Mailbox& mailbox_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Bytes> queue_;
  bool stop_ = false;
  std::thread consumer_;
};

void in_process() {
  bench::print_header("ps transports: in-process (run under `mpirun -np 2` for the MPI transport)");
  for (size_t bytes : {size_t{64}, size_t{4} << 20}) {
    bench::Section section(fmt::format("ps in-process message {}", size_text(bytes)), bench::Metric::time(),
                           "send until the receiver has it; the buffer is handed back, never copied");
    Mailbox floor_box;
    floor_box.returned = Bytes(bytes, std::byte{1});
    bench::Result floor;
    {
      QueueHandOff queue(floor_box);
      int64_t sent = 0;
      floor = section.run("mutex+cv queue to a thread (floor)", [&] {
        queue.push(std::move(floor_box.returned));
        floor_box.wait_for(++sent);
      });
    }
    auto run_transport = [&](const char* name, std::chrono::duration<double> delay) {
      auto transport = ps::make_in_memory_transport(2, delay);
      Mailbox box;
      box.returned = Bytes(bytes, std::byte{1});
      transport->attach(1, [&](int, Bytes message) { box.take(std::move(message)); });
      int64_t sent = 0;
      bench::Result result = section.run(name, [&] {
        transport->send(0, 1, std::move(box.returned));
        box.wait_for(++sent);
      });
      transport->detach(1);
      return result;
    };
    const bench::Result direct = run_transport("in-memory transport, no delay", {});
    const bench::Result threaded = run_transport("in-memory transport, 1 ns delay", std::chrono::nanoseconds(1));
    section.compare(direct, floor, std::nullopt);
    section.compare(threaded, floor, std::nullopt);
  }

  {
    const fl::Tensor grad = fl::full({1024, 1024}, 0.5, fl::f32);
    const ps::Message push = ps::Push{0, 1, 0, {{0, fl::Tensor(), grad}}};
    const Bytes encoded = ps::encode(push);
    std::vector<char> from(size_t{4} << 20, 1), to(size_t{4} << 20);
    bench::Section section("ps wire dense 4 MB push", bench::Metric::time(), "encode / decode against one memcpy");
    const bench::Result copy = section.run("memcpy 4 MB (floor)", [&] {
      std::memcpy(to.data(), from.data(), from.size());
      bench::clobber_memory();
    });
    const bench::Result encode = section.run("encode", [&] { bench::do_not_optimize(ps::encode(push)); });
    const bench::Result decode = section.run("decode", [&] { bench::do_not_optimize(ps::decode(encoded)); });
    section.compare(encode, copy, std::nullopt);
    section.compare(decode, copy, std::nullopt);
  }
}

// Seconds per round trip on process 0: the median of 7 repetitions (after one warm-up) of
// `iterations` calls of `round_trip` there, while process 1 runs `serve(iterations)` once per
// repetition.
double median_round_trip(int64_t iterations, const std::function<void()>& round_trip,
                         const std::function<void(int64_t)>& serve) {
  std::vector<double> samples;
  for (int r = 0; r < 8; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto begin = Clock::now();
    if (fl::process_index() == 0) {
      for (int64_t i = 0; i < iterations; ++i) round_trip();
    } else {
      serve(iterations);
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - begin).count();
    if (r > 0) samples.push_back(seconds / static_cast<double>(iterations));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

void across_processes() {
  const bool print = fl::process_index() == 0;
  if (print) {
    bench::print_header("ps transports: MPI transport under mpirun");
    fmt::print("request/response round trip, endpoint 0 -> 1 -> 0, same bytes each way\n");
    fmt::print("{:>8} {:>14} {:>14} {:>12}\n", "size", "raw MPI us", "flowlet us", "raw/flowlet");
  }
  auto transport = ps::make_mpi_transport({0, 1});  // starts MPI
  const int me = fl::process_index();
  Mailbox box;  // process 0: the replies
  // Process 1: requests answered, so that its main thread sleeps (instead of spinning inside an
  // MPI call, which would take the core its progress thread needs) until a repetition is served.
  std::mutex served_mutex;
  std::condition_variable served_changed;
  int64_t served = 0;
  ps::Transport* t = transport.get();
  if (me == 0) {
    transport->attach(0, [&](int, Bytes message) { box.take(std::move(message)); });
  } else {
    transport->attach(1, [&, t](int from, Bytes message) {
      t->send(1, from, std::move(message));
      std::lock_guard lock(served_mutex);
      ++served;
      served_changed.notify_all();
    });
  }
  for (size_t bytes : {size_t{64}, size_t{4} << 20}) {
    const int64_t iterations = bytes < 4096 ? 2000 : 50;
    std::vector<char> buffer(bytes, 1);
    const int count = static_cast<int>(bytes);
    const double raw = median_round_trip(
        iterations,
        [&] {
          MPI_Send(buffer.data(), count, MPI_BYTE, 1, 1, MPI_COMM_WORLD);
          MPI_Recv(buffer.data(), count, MPI_BYTE, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        },
        [&](int64_t n) {
          for (int64_t i = 0; i < n; ++i) {
            MPI_Recv(buffer.data(), count, MPI_BYTE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(buffer.data(), count, MPI_BYTE, 0, 1, MPI_COMM_WORLD);
          }
        });
    box.returned = Bytes(bytes, std::byte{1});
    int64_t replies = box.received.load();
    int64_t target = 0;
    {
      std::lock_guard lock(served_mutex);
      target = served;
    }
    const double ours = median_round_trip(
        iterations,
        [&] {
          transport->send(0, 1, std::move(box.returned));
          box.wait_for(++replies);
        },
        [&](int64_t n) {
          target += n;
          std::unique_lock lock(served_mutex);
          if (!served_changed.wait_for(lock, std::chrono::seconds(60), [&] { return served >= target; })) {
            fmt::print(stderr, "bench_ps_transport: process 1 served {} of {} requests in 60 s\n", served, target);
            std::abort();
          }
        });
    if (print) fmt::print("{:>8} {:>14.1f} {:>14.1f} {:>12.2f}\n", size_text(bytes), raw * 1e6, ours * 1e6, raw / ours);
  }
  if (me == 0) transport->detach(0);
  if (me == 1) transport->detach(1);
  transport.reset();
}

}  // namespace

int main() {
  if (fl::process_count() > 2) {
    if (fl::process_index() == 0) fmt::print(stderr, "bench_ps_transport: run plainly or under mpirun -np 2\n");
    return 2;
  }
  if (fl::process_count() > 1) {
    across_processes();
  } else {
    in_process();
  }
  return 0;
}
