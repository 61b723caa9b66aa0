// Test support for the parameter servers' transport tests, in one process and under mpirun: the
// numbered messages they send and the deadline-bounded wait for what the handlers count.
// (number_of stays in each test: the in-process test REQUIREs a whole number, the MPI one counts a
// short message as out of order on the transport's thread.)
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>

#include "ps/transport/transport.hpp"

namespace test {

// A message of `size` bytes (at least 8) whose first 8 carry `n`.
inline flowlet::detail::ps::Bytes number_message(int64_t n, size_t size = 8) {
  flowlet::detail::ps::Bytes b(std::max<size_t>(size, 8));
  std::memcpy(b.data(), &n, 8);
  return b;
}

// Waits (at most `limit`) until `done()`; false on timeout.
template <class F>
bool wait_until(F done, std::chrono::milliseconds limit = std::chrono::seconds(30)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return true;
}

}  // namespace test
