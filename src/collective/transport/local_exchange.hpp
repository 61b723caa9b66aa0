// Where the participants of one process meet: call k of every local participant forms one group,
// headers are compared on every call, and the last participant to arrive hands the complete group
// to the backend (which computes on that thread). Nobody else blocks: the early arrivals return
// from start() at once, and a watchdog thread (started on the first call left waiting) fails a
// group whose participants did not all arrive within the timeout.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collective/communicator.hpp"
#include "collective/transport/call_header.hpp"

namespace flowlet::detail {

struct Arrival {
  CollectiveCall call;
  CollectiveDone done;
};

class LocalExchange {
 public:
  // Called on the last arriving participant's thread with every participant's arrival, in local
  // order; must call every done exactly once (now or later).
  using Complete = std::function<void(uint64_t call_number, std::vector<Arrival>& arrivals)>;
  // Called once for a group that failed here (its participants disagreed, or some did not arrive),
  // after its arrived participants got `error`: a cross-process backend must still tell the other
  // processes. `header` and `check_header` are the first participant's.
  using Failed =
      std::function<void(uint64_t call_number, const CallHeader& header, bool check_header, std::exception_ptr error)>;

  // `first_rank`: the communicator-wide index of local participant 0 (for messages); `describe`:
  // the communicator's description.
  LocalExchange(std::vector<Device> devices, int first_rank, double timeout_seconds, std::string describe,
                Complete complete, Failed failed = nullptr);
  ~LocalExchange();  // fails the groups still waiting with Cancelled and stops the watchdog
  LocalExchange(const LocalExchange&) = delete;
  LocalExchange& operator=(const LocalExchange&) = delete;

  void arrive(int local, CollectiveCall call, CollectiveDone done);

  // Fails every group still waiting for participants, and every later arrival, with `error`
  // (Communicator::abort). Groups already complete are not touched.
  void abort(std::exception_ptr error);

  // For a communicator that learns its rank and description after constructing the exchange;
  // before the first call.
  void set_identity(int first_rank, std::string describe);

  // Groups that have some participants but not all (for a destructor that must know).
  bool has_waiting_groups();

 private:
  struct Group {
    std::vector<Arrival> arrivals;  // indexed by local participant; done empty until it arrives
    std::vector<bool> arrived;
    int count = 0;
    int first = -1;            // the first participant to arrive (headers are compared to it)
    CallHeader header;         // the first participant's header
    std::exception_ptr error;  // set once the group failed (mismatch, timeout)
    bool check_header = true;  // the first participant's
    std::chrono::steady_clock::time_point deadline;
  };

  std::string who(int local) const;
  void watch();
  void start_watchdog_locked();

  const std::vector<Device> devices_;
  int first_rank_;
  const double timeout_seconds_;
  const std::chrono::steady_clock::duration timeout_;
  std::string describe_;
  const Complete complete_;
  const Failed failed_;

  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<uint64_t> next_call_;  // per local participant
  std::map<uint64_t, Group> groups_;
  std::thread watchdog_;
  bool stopping_ = false;
  std::exception_ptr aborted_;  // set by abort(): every later arrival fails with it
};

// The start of a cross-process backend's job for a group (its Job has number, header, check_header
// and failed_here): for a complete group, the first participant's header, checked across processes
// when any participant asks it; for a group that failed here (LocalExchange::Failed's arguments),
// marked failed_here so that the other processes still learn of it.
template <class Job>
Job job_for_group(uint64_t number, const std::vector<Arrival>& arrivals) {
  Job job;
  job.number = number;
  job.header = make_header(arrivals.front().call);
  job.check_header = false;
  for (const Arrival& a : arrivals) job.check_header = job.check_header || a.call.check_header;
  return job;
}

template <class Job>
Job job_failed_here(uint64_t number, const CallHeader& header, bool check_header) {
  Job job;
  job.number = number;
  job.header = header;
  job.check_header = check_header;
  job.failed_here = true;
  return job;
}

// The timeout a communicator uses: `requested` when > 0, else FLOWLET_COLLECTIVE_TIMEOUT, else 300 s.
// InvalidArgument when the variable is not a positive number.
double resolve_timeout(double requested);

// The moment `seconds` from now.
inline std::chrono::steady_clock::time_point deadline_after(double seconds) {
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
}

}  // namespace flowlet::detail
