// What every participant of one collective must agree on (kind, reduction, root, dtype, shape), in
// a fixed-size form that can be compared in memory or sent over the wire as plain bytes.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "collective/communicator.hpp"

namespace flowlet::detail {

struct CallHeader {
  static constexpr int kInlineDims = 6;
  uint8_t kind = 0;
  uint8_t op = 0;
  uint8_t dtype = 0;
  uint8_t rank = 0;  // dimensions (up to 255; beyond kInlineDims only their hash is kept)
  int32_t root = 0;
  int64_t dims[kInlineDims] = {};  // the first kInlineDims dimensions
  uint64_t tail_hash = 0;          // the dimensions past kInlineDims
};
static_assert(sizeof(CallHeader) == 64, "CallHeader travels as raw bytes");

// The header of `call`: the fields the kind does not use (op for broadcast, root for all_reduce,
// everything but the kind for barrier) are zero, so that they never cause a mismatch.
CallHeader make_header(const CollectiveCall& call);

// Null when a and b agree, else the error every participant of the call gets: InvalidArgument for
// a different collective, reduction or root, DTypeError for dtypes, ShapeError for shapes, with a
// message that names the collective, both participants (`who_a`, `who_b`: "participant 0 (cpu:0)")
// and both values.
std::exception_ptr header_mismatch(const CallHeader& a, const std::string& who_a, const CallHeader& b,
                                   const std::string& who_b);

// The header kind a process sends in place of its own for a call its participants failed there
// (they disagreed, or did not all arrive), so that the other processes fail it too.
inline constexpr uint8_t kFailedHere = 0xff;

// The cross-process check of one call, from every process's header in process order: InvalidArgument
// naming the first process that failed the call itself, else header_mismatch() between process 0
// and the first that disagrees with it; null when all agree. `name`: the collective; `who(p)`:
// process p as messages name it; `describe`: the communicator.
std::exception_ptr compare_process_headers(const std::vector<CallHeader>& headers, const char* name,
                                           const std::string& describe, const std::function<std::string(int)>& who);

}  // namespace flowlet::detail
