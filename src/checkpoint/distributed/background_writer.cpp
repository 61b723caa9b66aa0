// BackgroundWriter: one save job at a time on its own thread (background_writer.hpp).
#include "checkpoint/distributed/background_writer.hpp"

#include <cstdio>
#include <exception>

namespace flowlet::detail::ckpt {

BackgroundWriter::~BackgroundWriter() {
  try {
    wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "DistributedCheckpointManager: the last save failed and nobody waited for it: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "DistributedCheckpointManager: the last save failed with an unknown exception\n");
  }
}

void BackgroundWriter::start(std::function<void()> job) {
  wait();
  thread_ = std::thread([this, job = std::move(job)] {
    try {
      job();
    } catch (...) {
      error_ = std::current_exception();
    }
  });
}

void BackgroundWriter::wait() {
  if (thread_.joinable()) thread_.join();
  if (error_) {
    std::exception_ptr error = error_;
    error_ = nullptr;
    std::rethrow_exception(error);
  }
}

}  // namespace flowlet::detail::ckpt
