// The background thread of a DistributedCheckpointManager: runs one save job at a time and keeps
// its error for the next save() / wait() to rethrow.
//
// One thread per job, joined before the next starts (saves are minutes apart; a thread costs
// microseconds), so the job's results reach the training thread through the join itself.
#pragma once

#include <exception>
#include <functional>
#include <thread>

namespace flowlet::detail::ckpt {

class BackgroundWriter {
 public:
  BackgroundWriter() = default;
  // Joins a job in flight; its error is printed to stderr (a destructor must not throw).
  ~BackgroundWriter();
  BackgroundWriter(const BackgroundWriter&) = delete;
  BackgroundWriter& operator=(const BackgroundWriter&) = delete;

  // Starts `job` on a new thread. Call wait() first: one job at a time.
  void start(std::function<void()> job);
  // Until the job in flight (if any) has finished; rethrows its error once.
  void wait();

 private:
  std::thread thread_;
  std::exception_ptr error_;  // written by the thread, read after joining it
};

}  // namespace flowlet::detail::ckpt
