// The MPI backend: CPU participants in several processes. Each communicator owns a duplicate of
// MPI_COMM_WORLD (made collectively, in make_communicator call order) and one progress thread that
// issues the nonblocking MPI calls in call order and polls them against the deadline, so no
// executor thread ever waits inside MPI. (A thread inside Communicator::run, which waits anyway,
// makes the calls itself when nothing is queued ahead of its call.)
//
// A call is hierarchical: the process's participants meet in a LocalExchange (which compares their
// headers on every call) and the last to arrive combines their inputs into one wire buffer
// (host_collective.hpp); the progress thread then makes one MPI call for the process and hands each
// local participant its result.
//
// check_header = true: before the data, every process sends its 64-byte header to every other
// (point-to-point, so that on a timeout it knows exactly which processes did not arrive) and every
// process fails with the same error, naming the first process that disagrees with process 0.
// check_header = false: data only. A process whose own participants failed a call (they disagreed,
// or not all arrived) sends a "failed here" header instead; on a data-only call it cannot tell the
// others: it sends nothing (they time out, or fail at once when it destroys the communicator) and
// its own later calls fail at once (never a silent wrong answer, never a hang).
//
// Timeouts: a call that does not complete within the timeout fails with DeadlineExceeded. In the
// header exchange it names the processes whose header did not come; a data-only call cannot know
// them and says so. A collective cannot be withdrawn in MPI, so the communicator is unusable after
// a timeout: later calls fail at once, and it is never freed (kept, with the buffers of a collective
// left pending, until MPI_Finalize).
//
// Leaving: a process that destroys a communicator (or ends) tells its peers how many calls it
// completed; a peer waiting for a later call fails it at once instead of waiting for its timeout.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collective/communicator.hpp"
#include "collective/transport/local_exchange.hpp"
#include "collective/transport/mpi_include.hpp"

namespace flowlet::detail {

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(std::vector<Device> devices, double timeout_seconds);  // collective over processes
  ~MpiCommunicator() override;

  int local_size() const override { return static_cast<int>(devices_.size()); }
  int processes() const override { return processes_; }
  int process_rank() const override { return rank_; }
  Device device(int local) const override;
  void start(int local, CollectiveCall call, CollectiveDone done) override;
  void abort(std::exception_ptr error) override { exchange_.abort(std::move(error)); }
  std::string describe() const override { return describe_; }

  // Stops the progress thread, tells the peers, frees the MPI communicator (once; the destructor
  // and the exit handler call it). Aborts the job when a call is still in flight.
  void shut_down();
  // shut_down() in two steps, so that the exit handler can tell the peers on every communicator
  // before it waits for theirs on any.
  void begin_shut_down();
  void end_shut_down();

 private:
  struct Job {
    uint64_t number = 0;
    std::vector<Arrival> arrivals;  // empty when the call failed in this process
    CallHeader header;
    bool check_header = true;
    bool failed_here = false;
    Tensor wire;                 // this process's combined input
    bool wire_is_input = false;  // `wire` is the one participant's input: read it, never write it
  };
  enum class Wait { done, timed_out, peer_left };
  // What the header exchange sends: the header, stamped with the communicator and the call.
  struct HeaderMessage {
    uint64_t serial = 0;
    uint64_t number = 0;
    CallHeader header;
  };

  // A call's outcome, handed to its participants once the communicator is free for the next call.
  struct Delivery {
    std::vector<Arrival> arrivals;
    std::vector<Tensor> results;
    std::exception_ptr error;
  };

  void enqueue(Job job);
  void progress();
  Delivery run_job(Job& job);
  void finish_job_locked(std::unique_lock<std::mutex>& lock);
  std::exception_ptr exchange_headers(const Job& job);
  std::exception_ptr exchange_data(const Job& job, Tensor& global);
  Wait wait_for(std::vector<MPI_Request>& requests, std::chrono::steady_clock::time_point deadline, uint64_t number);
  Wait poll_until(const std::function<bool()>& done, std::chrono::steady_clock::time_point deadline, uint64_t number);
  void poll_goodbyes();
  int peer_gone_before(uint64_t number) const;  // a peer that left before call `number`, or -1
  std::string who(int process) const;
  std::string participants_of(const std::vector<int>& processes) const;
  std::exception_ptr peer_left_error(const char* name, uint64_t number);

  const std::vector<Device> devices_;
  int processes_ = 1;
  int rank_ = 0;
  const double timeout_seconds_;
  uint64_t serial_ = 0;  // this communicator's place in make_communicator order (same on every process)
  std::string describe_;
  MPI_Comm comm_ = MPI_COMM_NULL;

  std::mutex mutex_;
  std::condition_variable wake_;
  std::map<uint64_t, Job> jobs_;  // complete local stages waiting for the progress thread
  uint64_t next_job_ = 0;
  bool busy_ = false;  // a thread (the progress thread, or a caller of run()) is making this communicator's MPI calls
  bool progress_sleeping_ = false;  // waiting on wake_: enqueue() must notify
  std::atomic<int> in_flight_{0};   // calls enqueued whose participants have not all been answered
  bool stopping_ = false;
  std::thread progress_;
  std::atomic<bool> shut_down_{false};

  // Progress-thread state.
  std::vector<MPI_Request> goodbye_requests_;
  std::vector<uint64_t> goodbye_payloads_;  // two words per peer: serial, calls completed
  std::vector<int64_t> left_after_;         // per process: calls it completed before leaving, -1 = here
  std::string broken_;                      // why the communicator cannot be used (after a timeout)
  bool collective_abandoned_ = false;       // a timed-out MPI collective still pending
  std::vector<Tensor> abandoned_buffers_;   // its buffers, which MPI may still use
  uint64_t skipped_call_ = UINT64_MAX;      // the first call this process could not take part in
  std::chrono::steady_clock::time_point next_goodbye_poll_;
  std::vector<std::unique_ptr<HeaderMessage>> abandoned_headers_;  // buffers of sends given up on a timeout
  uint64_t goodbye_[2] = {};
  std::vector<MPI_Request> goodbye_sends_;
  bool saying_goodbye_ = false;  // what shut_down() sends: serial, calls done

  LocalExchange exchange_;  // last: its callbacks use everything above
};

}  // namespace flowlet::detail
