// The exception hierarchy every public entry point throws: one base, one subclass per kind of misuse.
#pragma once

#include <stdexcept>
#include <string>

namespace flowlet {

// Base of every flowlet exception. Messages read `<op>: <what is wrong>; got <values>`.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
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

}  // namespace flowlet
