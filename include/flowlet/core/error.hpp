// The exception hierarchy every public entry point throws: one base, one subclass per kind of misuse.
#pragma once

#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

namespace flowlet {

// Base of every flowlet exception. Messages read `<op>: <what is wrong>; got <values>`.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  Error(const Error& other) noexcept : std::runtime_error(other) { copy_location(other); }
  Error& operator=(const Error& other) noexcept {
    std::runtime_error::operator=(other);
    copy_location(other);
    return *this;
  }
  ~Error() override = default;

  const char* what() const noexcept override {
    return located_ready_.load(std::memory_order_acquire) ? located_->c_str() : std::runtime_error::what();
  }

  // Puts where the error happened in front of its message ("node 'mul_3' (traced at f.cpp:12): "),
  // keeping the exception's type, so every subclass gets it without being named anywhere. The first
  // place wins: an error object that several graph steps rethrow (a queue closed with an error)
  // keeps the node that raised it first, and no call changes a message another thread may be reading.
  void locate(std::string_view where) {
    if (located_claimed_.exchange(true, std::memory_order_acq_rel)) return;
    located_ = std::make_shared<const std::string>(std::string(where) + ": " + std::runtime_error::what());
    located_ready_.store(true, std::memory_order_release);
  }

 private:
  void copy_location(const Error& other) noexcept {
    const bool ready = other.located_ready_.load(std::memory_order_acquire);
    located_ = ready ? other.located_ : nullptr;
    located_claimed_.store(ready, std::memory_order_relaxed);
    located_ready_.store(ready, std::memory_order_release);
  }

  std::shared_ptr<const std::string> located_;  // the message with its location, once located
  std::atomic<bool> located_claimed_{false};
  std::atomic<bool> located_ready_{false};
};
// Shapes that do not fit the op (rank, broadcast, mismatched dimensions, negative sizes).
class ShapeError : public Error {
 public:
  using Error::Error;
};
// Wrong or mixed dtypes.
class DTypeError : public Error {
 public:
  using Error::Error;
};
// A device that does not exist, has no kernel for the op, or differs between inputs.
class DeviceError : public Error {
 public:
  using Error::Error;
};
// Any other bad argument (axes out of range, empty handles, bad attribute values).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};
// An index outside its valid range (gather indices, labels), or a closed, drained queue.
class OutOfRange : public Error {
 public:
  using Error::Error;
};
// Memory ran out: an allocation failed even after the caching allocator released every block it
// kept and tried again. The message names the op, the device and the bytes asked for, e.g.
// `matmul: out of memory on cpu:0; got a request for 1099511627776 bytes ...`. Nothing is
// half-done: the op that asked wrote no output.
class ResourceExhausted : public Error {
 public:
  using Error::Error;
};
// A blocking operation was cancelled.
class Cancelled : public Error {
 public:
  using Error::Error;
};
// A wait on other participants ran past its limit (a collective whose peers did not all arrive);
// the message names the operation and who did not arrive.
class DeadlineExceeded : public Error {
 public:
  using Error::Error;
};
// Bytes that cannot be what they claim to be: a truncated or malformed message between processes,
// a corrupted file. The message names the source and the first problem found.
class DataLoss : public Error {
 public:
  using Error::Error;
};

}  // namespace flowlet
