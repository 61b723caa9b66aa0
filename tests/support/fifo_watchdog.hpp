// Calls that must not block on a FIFO: a watchdog opens the FIFO's write end if the call is still
// running after a timeout, which releases a reader stuck in open(), so a regression fails instead of hanging.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include <doctest/doctest.h>

namespace test {

// Makes a FIFO at `path` (REQUIREd to succeed).
inline void make_fifo(const std::string& path) { REQUIRE(::mkfifo(path.c_str(), 0600) == 0); }

// Runs `fn` and returns true when it finished by itself within `timeout`; false when the watchdog
// had to open `fifo` for writing to release it (the call blocked on the FIFO).
inline bool returns_without_blocking_on(const std::string& fifo, const std::function<void()>& fn,
                                        std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  std::atomic<bool> done{false}, released{false};
  std::thread watchdog([&] {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!done.load() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    // Past the deadline: a write end with O_NONBLOCK opens only while a reader waits, so retry
    // until the blocked reader is there (or the call finished after all).
    while (!done.load()) {
      const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
      if (fd >= 0) {
        released.store(true);
        ::close(fd);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  try {
    fn();
  } catch (...) {
    done.store(true);
    watchdog.join();
    throw;
  }
  done.store(true);
  watchdog.join();
  return !released.load();
}

}  // namespace test
