// The MPI transport of the parameter servers: one endpoint per process, point-to-point messages on a
// duplicate of MPI_COMM_WORLD that this transport owns.
//
// Frames. A message travels as one MPI message (one tag) of its bytes followed by an 8-byte
// trailer, the sender's and the receiver's endpoint (i32 each). A trailer rather than a prefix:
// encode() leaves kFrameSpare bytes of capacity, so appending costs no copy, and the receiver cuts
// it off with a resize. The receiver checks the trailer against the MPI source and itself; a frame
// that disagrees is a bug in flowlet (or memory corruption), so the job is aborted naming it.
//
// Buffers. A received message needs a buffer of its size, and a fresh std::vector of 4 MB costs a
// zero fill and, memory the allocator had given back to the system, a page fault per 4 KiB page. So
// the buffers of completed large sends are kept (a few, kRecycledBuffers) and a large message is
// received into one whose capacity holds it: a server receives pushes into the buffers its replies
// went out in, a worker replies into its pushes' (encode() leaves kFrameSpare bytes of capacity,
// which covers the few bytes by which their headers differ).
//
// Threads. send() calls MPI_Isend on the caller's thread (under the transport's mutex) and returns;
// the buffer stays with the transport until the progress thread's MPI_Testsome sees the send done.
// The progress thread receives (MPI_Improbe / MPI_Mrecv of the probed size) and calls the handler,
// so calls are one at a time. It spins (yielding) while a send is in flight (MPI moves a large one
// only when progressed) and for 2 ms after the last activity, then sleeps in 200 us steps, woken
// at once by send() and attach().
//
// Shutdown (destructor or exit hook; collective). First a barrier (MPI_Ibarrier), polled while
// still receiving and calling the handler, since a process that is not there yet may be waiting for
// this one's answers. Then, as completed sends do not mean delivered messages, the processes count:
// in rounds, each tells every other how many messages it has sent it (MPI_Ialltoall), receives
// until it has had that many from each, then all agree (MPI_Iallreduce) whether anyone sent more
// meanwhile (a handler answering a late request); a round in which nobody did ends it. Then the own
// sends are complete, the thread stops and the communicator is freed. Every wait has a deadline (kShutdownDeadline); past it the job is aborted,
// since a peer that never arrives would otherwise hang this process.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "collective/transport/mpi_include.hpp"
#include "collective/transport/mpi_runtime.hpp"
#include "collective/transport/owned_thread.hpp"
#include "collective/transport/process.hpp"
#include "core/check.hpp"
#include "flowlet/core/error.hpp"
#include "ps/transport/handler_threw.hpp"
#include "ps/transport/transport.hpp"

namespace flowlet::detail::ps {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kTag = 7013;
constexpr size_t kTrailerBytes = 8;
constexpr auto kSpin = std::chrono::milliseconds(2);
constexpr auto kNap = std::chrono::microseconds(200);
constexpr auto kShutdownDeadline = std::chrono::seconds(300);
constexpr auto kHandlerDeadline = std::chrono::seconds(120);
constexpr int kReceivesPerTurn = 64;  // then the sends are tested again
constexpr size_t kRecycledBuffers = 4;         // kept from completed sends, for receives
constexpr size_t kMinRecycledBytes = 64 << 10;  // smaller messages take a fresh buffer

enum class State { waiting, attached, detached };

class MpiTransport final : public Transport {
 public:
  MpiTransport(const std::vector<int>& endpoint_process, int self, int rank)
      : Transport(static_cast<int>(endpoint_process.size())),
        process_of_(endpoint_process),
        endpoint_of_(endpoint_process.size()),
        self_(self),
        rank_(rank),
        sent_to_(endpoint_process.size(), 0),
        received_from_(endpoint_process.size(), 0) {
    for (size_t e = 0; e < process_of_.size(); ++e) endpoint_of_[static_cast<size_t>(process_of_[e])] = static_cast<int>(e);
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    exit_hook_ = register_exit_hook([this] { shut_down(); });
    progress_ = std::thread([this] { progress_loop(); });
  }

  ~MpiTransport() override { shut_down(); }

  bool hosts(int endpoint) const override { return endpoint == self_; }

  void attach(int endpoint, Handler handler) override {
    check_hosted(endpoint, "attach");
    if (!handler) fail<InvalidArgument>("ps MPI transport attach: an empty handler for endpoint {}", endpoint);
    std::lock_guard lock(mutex_);
    if (state_ == State::attached) fail<InvalidArgument>("ps MPI transport attach: endpoint {} is already attached", endpoint);
    state_ = State::attached;
    handler_ = std::make_shared<Handler>(std::move(handler));
    wake_.notify_all();
  }

  void detach(int endpoint) override {
    check_hosted(endpoint, "detach");
    std::unique_lock lock(mutex_);
    state_ = State::detached;
    handler_.reset();
    pending_.clear();
    if (std::this_thread::get_id() == progress_id_) return;  // from inside the handler
    if (!idle_.wait_for(lock, kHandlerDeadline, [&] { return !delivering_; })) {
      fail<DeadlineExceeded>("ps MPI transport detach: the handler of endpoint {} is still running after {} s", self_,
                             kHandlerDeadline.count());
    }
  }

  void send(int from, int to, Bytes message) override {
    if (from != self_ || to < 0 || to >= endpoints()) {
      fail<InvalidArgument>(
          "ps MPI transport send: from must be this process's endpoint {} and to in [0, {}); got from {} to {}", self_,
          endpoints(), from, to);
    }
    if (message.size() > static_cast<size_t>(INT_MAX) - kTrailerBytes) {
      fail<InvalidArgument>("ps MPI transport send: a message of {} bytes is above MPI's int count", message.size());
    }
    const int64_t size = static_cast<int64_t>(message.size());
    const int32_t trailer[2] = {from, to};
    const auto* t = reinterpret_cast<const std::byte*>(trailer);
    message.insert(message.end(), t, t + kTrailerBytes);
    std::unique_lock lock(mutex_);
    // Sends while closing are fine (a handler answering a late request): the shutdown counts them.
    if (comm_ == MPI_COMM_NULL) fail<InvalidArgument>("ps MPI transport send: the transport has been shut down");
    const int dest = process_of_[static_cast<size_t>(to)];
    MPI_Request request;
    MPI_Isend(message.data(), static_cast<int>(message.size()), MPI_BYTE, dest, kTag, comm_, &request);
    sending_.push_back(request);
    send_buffers_.push_back(std::move(message));
    ++sent_to_[static_cast<size_t>(dest)];
    messages_sent_.fetch_add(1, std::memory_order_relaxed);
    bytes_sent_.fetch_add(size, std::memory_order_relaxed);
    const bool napping = napping_;
    lock.unlock();  // notified after: woken under the lock, the thread would only block on it
    if (napping) wake_.notify_all();
  }

  TransportCounters counters(int endpoint) const override {
    check_hosted(endpoint, "counters");
    return TransportCounters{messages_sent_.load(), bytes_sent_.load(), messages_received_.load(),
                             bytes_received_.load()};
  }

  void reset_counters() override {
    messages_sent_ = 0;
    bytes_sent_ = 0;
    messages_received_ = 0;
    bytes_received_ = 0;
  }

  std::string describe() const override {
    return fmt::format("MPI transport ({} endpoints, one per process; process {} hosts endpoint {})", endpoints(), rank_,
                       self_);
  }

 private:
  void check_hosted(int endpoint, const char* op) const {
    if (endpoint != self_) {
      fail<InvalidArgument>("ps MPI transport {}: endpoint {} is not hosted by process {} (it hosts endpoint {})", op,
                            endpoint, rank_, self_);
    }
  }

  // Once, from the destructor or the exit hook (whichever comes first).
  void shut_down() {
    if (shut_down_.exchange(true)) return;
    unregister_exit_hook(exit_hook_);
    {
      std::lock_guard lock(mutex_);
      closing_ = true;
      wake_.notify_all();
    }
    if (std::this_thread::get_id() == progress_id_) {
      // Destroyed from inside its own handler: the protocol runs here, then the thread lets go.
      finish();
      join_or_release(progress_);
    } else {
      if (progress_.joinable()) progress_.join();
    }
  }

  // ---- the progress thread ----

  void progress_loop() {
    progress_id_ = std::this_thread::get_id();
    Clock::time_point last_activity = Clock::now();
    for (;;) {
      {
        std::lock_guard lock(mutex_);
        if (closing_) break;
      }
      bool active = false;
      if (!deliver_pending(active)) return;
      if (!receive_available(active)) return;
      active |= test_sends();
      // A send in flight is activity too: a large one moves only as far as the progress calls
      // push it (fragment by fragment), so napping would stretch it to many naps.
      if (active || sends_in_flight()) {
        last_activity = Clock::now();
      } else if (Clock::now() - last_activity < kSpin) {
        std::this_thread::yield();
      } else {
        std::unique_lock lock(mutex_);
        if (closing_) break;
        napping_ = true;
        wake_.wait_for(lock, kNap);
        napping_ = false;
      }
    }
    finish();
  }

  // The collective end (see the top of the file), then the communicator is freed.
  void finish() {
    if (!mpi_usable()) return;  // a program that owns MPI finalized it already: nothing to free
    const Clock::time_point deadline = Clock::now() + kShutdownDeadline;
    const size_t n = process_of_.size();
    // Until every process is here, the others may still wait for this one's handler (a server
    // answering a worker that has not finished): serve while waiting.
    MPI_Request arrived;
    MPI_Ibarrier(comm_, &arrived);
    for (;;) {
      int done = 0;
      MPI_Test(&arrived, &done, MPI_STATUS_IGNORE);
      if (done) break;
      bool active = false;
      if (!deliver_pending(active) || !receive_available(active)) return;
      active |= test_sends();
      if (Clock::now() > deadline) {
        abort_job(fmt::format("ps MPI transport shutdown: not every process destroyed its transport within {} s",
                              kShutdownDeadline.count()));
      }
      if (!active) std::this_thread::yield();
    }
    // Everyone is here: only handlers still send. Count until nothing is on its way. (The count
    // collectives do not receive, so that every send a handler makes happens in a receive stage,
    // before its process reports whether it sent more.)
    for (int round = 0;; ++round) {
      std::vector<int64_t> snapshot, expected(n, 0);
      {
        std::lock_guard lock(mutex_);
        snapshot = sent_to_;
      }
      MPI_Request request;
      MPI_Ialltoall(snapshot.data(), 1, MPI_INT64_T, expected.data(), 1, MPI_INT64_T, comm_, &request);
      wait_collective(request, deadline, "the message counts");
      for (;;) {
        bool all = true;
        for (size_t p = 0; p < n; ++p) all = all && received_from_[p] >= expected[p];
        if (all) break;
        bool active = false;
        if (!receive_available(active) || !deliver_pending(active)) return;
        test_sends();
        if (Clock::now() > deadline) {
          abort_job(fmt::format("ps MPI transport shutdown: messages sent to process {} did not arrive within {} s",
                                rank_, kShutdownDeadline.count()));
        }
        if (!active) std::this_thread::yield();
      }
      int sent_more = 0;
      {
        std::lock_guard lock(mutex_);
        sent_more = sent_to_ != snapshot ? 1 : 0;
      }
      int anyone = 0;
      MPI_Iallreduce(&sent_more, &anyone, 1, MPI_INT, MPI_LOR, comm_, &request);
      wait_collective(request, deadline, "whether anyone sent more");
      if (!anyone) break;
    }
    while (!all_sends_done()) {
      if (Clock::now() > deadline) {
        abort_job(fmt::format("ps MPI transport shutdown: process {}'s sends did not complete within {} s", rank_,
                              kShutdownDeadline.count()));
      }
      std::this_thread::yield();
    }
    std::lock_guard lock(mutex_);
    recycled_.clear();
    recycled_.shrink_to_fit();
    MPI_Comm_free(&comm_);  // sets comm_ to MPI_COMM_NULL: later sends are refused
  }

  void wait_collective(MPI_Request& request, Clock::time_point deadline, const char* what) {
    for (;;) {
      int done = 0;
      MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      if (done) return;
      test_sends();
      if (Clock::now() > deadline) {
        abort_job(fmt::format("ps MPI transport shutdown: the exchange of {} did not complete within {} s (a process "
                              "did not destroy its transport)",
                              what, kShutdownDeadline.count()));
      }
      std::this_thread::yield();
    }
  }

  bool sends_in_flight() {
    std::lock_guard lock(mutex_);
    return !sending_.empty();
  }

  bool all_sends_done() {
    test_sends();
    std::lock_guard lock(mutex_);
    return sending_.empty();
  }

  // Frees the buffers of completed sends; true when any completed.
  bool test_sends() {
    std::lock_guard lock(mutex_);
    if (sending_.empty()) return false;
    int count = 0;
    done_indices_.resize(sending_.size());
    MPI_Testsome(static_cast<int>(sending_.size()), sending_.data(), &count, done_indices_.data(), MPI_STATUSES_IGNORE);
    if (count <= 0) return false;  // 0, or MPI_UNDEFINED when none is active
    size_t kept = 0;
    for (size_t i = 0; i < sending_.size(); ++i) {
      if (sending_[i] == MPI_REQUEST_NULL) {  // completed: Testsome set it to null
        recycle(std::move(send_buffers_[i]));
        continue;
      }
      if (kept != i) {  // (a vector moved onto itself is left empty: its buffer would be freed)
        sending_[kept] = sending_[i];
        send_buffers_[kept] = std::move(send_buffers_[i]);
      }
      ++kept;
    }
    sending_.resize(kept);
    send_buffers_.resize(kept);
    return true;
  }

  // Keeps a completed send's buffer for a later receive (under mutex_).
  void recycle(Bytes buffer) {
    if (buffer.capacity() < kMinRecycledBytes) return;
    if (recycled_.size() == kRecycledBuffers) {
      // The smallest goes: the kept ones should hold the largest messages.
      auto smallest = std::min_element(recycled_.begin(), recycled_.end(), [](const Bytes& a, const Bytes& b) {
        return a.capacity() < b.capacity();
      });
      if (smallest->capacity() >= buffer.capacity()) return;
      *smallest = std::move(buffer);
      return;
    }
    recycled_.push_back(std::move(buffer));
  }

  // A buffer of `count` bytes for a receive: a kept one that holds it without reallocating (the
  // smallest such), else a new one.
  Bytes receive_buffer(size_t count) {
    if (count >= kMinRecycledBytes) {
      std::lock_guard lock(mutex_);
      auto best = recycled_.end();
      for (auto it = recycled_.begin(); it != recycled_.end(); ++it) {
        if (it->capacity() >= count && (best == recycled_.end() || it->capacity() < best->capacity())) best = it;
      }
      if (best != recycled_.end()) {
        Bytes buffer = std::move(*best);
        recycled_.erase(best);
        buffer.resize(count);  // within its capacity: at most kFrameSpare bytes are filled
        return buffer;
      }
    }
    return Bytes(count);
  }

  // Receives what has arrived (at most kReceivesPerTurn); false when the transport was destroyed
  // from inside the handler (the thread must then return at once).
  bool receive_available(bool& active) {
    for (int i = 0; i < kReceivesPerTurn; ++i) {
      int flag = 0;
      MPI_Message message;
      MPI_Status status;
      MPI_Improbe(MPI_ANY_SOURCE, kTag, comm_, &flag, &message, &status);
      if (!flag) return true;
      active = true;
      int count = 0;
      MPI_Get_count(&status, MPI_BYTE, &count);
      const int source = status.MPI_SOURCE;
      if (count < static_cast<int>(kTrailerBytes)) {
        abort_job(fmt::format("ps MPI transport: a frame of {} bytes from process {} (too short for its endpoints)",
                              count, source));
      }
      Bytes bytes = receive_buffer(static_cast<size_t>(count));
      MPI_Mrecv(bytes.data(), count, MPI_BYTE, &message, MPI_STATUS_IGNORE);
      int32_t trailer[2];
      std::memcpy(trailer, bytes.data() + bytes.size() - kTrailerBytes, kTrailerBytes);
      if (trailer[0] != endpoint_of_[static_cast<size_t>(source)] || trailer[1] != self_) {
        abort_job(fmt::format("ps MPI transport: a frame from process {} says it goes from endpoint {} to {}; process {} "
                              "hosts endpoint {} and this one {}",
                              source, trailer[0], trailer[1], source, endpoint_of_[static_cast<size_t>(source)], self_));
      }
      bytes.resize(bytes.size() - kTrailerBytes);
      ++received_from_[static_cast<size_t>(source)];
      messages_received_.fetch_add(1, std::memory_order_relaxed);
      bytes_received_.fetch_add(static_cast<int64_t>(bytes.size()), std::memory_order_relaxed);
      if (!deliver(trailer[0], std::move(bytes))) return false;
    }
    return true;
  }

  // Hands one received message to the handler, or keeps it (not attached yet), or drops it
  // (detached). False when the handler destroyed the transport.
  bool deliver(int from, Bytes bytes) {
    std::unique_lock lock(mutex_);
    if (state_ == State::detached) return true;
    if (state_ == State::waiting || !pending_.empty()) {
      pending_.emplace_back(from, std::move(bytes));
      return true;
    }
    return call(from, bytes, lock);
  }

  bool deliver_pending(bool& active) {
    std::unique_lock lock(mutex_);
    while (state_ == State::attached && !pending_.empty()) {
      auto [from, bytes] = std::move(pending_.front());
      pending_.pop_front();
      active = true;
      if (!call(from, bytes, lock)) return false;
    }
    return true;
  }

  // Calls the handler with `lock` released; false when the handler destroyed the transport.
  bool call(int from, Bytes& bytes, std::unique_lock<std::mutex>& lock) {
    std::shared_ptr<Handler> handler = handler_;
    delivering_ = true;
    lock.unlock();
    try {
      (*handler)(from, std::move(bytes));
    } catch (...) {
      handler_threw("MPI", self_, from);
    }
    handler.reset();
    if (object_released_here()) return false;
    lock.lock();
    delivering_ = false;
    idle_.notify_all();
    return true;
  }

  const std::vector<int> process_of_;  // endpoint -> process
  std::vector<int> endpoint_of_;       // process -> endpoint
  const int self_;
  const int rank_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int exit_hook_ = -1;

  std::mutex mutex_;
  std::condition_variable wake_;  // the progress thread's naps
  std::condition_variable idle_;  // a handler call ended (detach waits for it)
  bool napping_ = false;
  bool closing_ = false;
  std::atomic<bool> shut_down_{false};
  State state_ = State::waiting;
  std::shared_ptr<Handler> handler_;
  std::deque<std::pair<int, Bytes>> pending_;
  bool delivering_ = false;
  std::vector<MPI_Request> sending_;  // in flight, with their buffers
  std::vector<Bytes> send_buffers_;
  std::vector<int> done_indices_;
  std::vector<Bytes> recycled_;  // buffers of completed sends, for receives
  std::vector<int64_t> sent_to_;  // messages sent per process (for the shutdown count)

  // Progress thread only.
  std::vector<int64_t> received_from_;
  std::atomic<std::thread::id> progress_id_{};

  std::atomic<int64_t> messages_sent_{0}, bytes_sent_{0}, messages_received_{0}, bytes_received_{0};

  std::thread progress_;  // last: started when everything above is ready
};

}  // namespace

std::unique_ptr<Transport> make_mpi_transport(const std::vector<int>& endpoint_process) {
  const ProcessPlacement& placement = process_placement();
  const int count = placement.count;
  if (static_cast<int>(endpoint_process.size()) != count) {
    fail<InvalidArgument>("make_mpi_transport: one endpoint per process; got {} endpoints for {} processes",
                          endpoint_process.size(), count);
  }
  std::vector<int> seen(static_cast<size_t>(count), -1);
  int self = -1;
  for (size_t e = 0; e < endpoint_process.size(); ++e) {
    const int p = endpoint_process[e];
    if (p < 0 || p >= count) {
      fail<InvalidArgument>("make_mpi_transport: endpoint {} is placed on process {}, outside [0, {})", e, p, count);
    }
    if (seen[static_cast<size_t>(p)] >= 0) {
      fail<InvalidArgument>("make_mpi_transport: process {} would host endpoints {} and {}; one per process", p,
                            seen[static_cast<size_t>(p)], e);
    }
    seen[static_cast<size_t>(p)] = static_cast<int>(e);
    if (p == placement.index) self = static_cast<int>(e);
  }
  ensure_mpi_started();
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != placement.index) {
    fail<InvalidArgument>("make_mpi_transport: the launcher ({}) says this is process {}, MPI_COMM_WORLD says {}",
                          placement.source, placement.index, rank);
  }
  return std::make_unique<MpiTransport>(endpoint_process, self, rank);
}

}  // namespace flowlet::detail::ps
