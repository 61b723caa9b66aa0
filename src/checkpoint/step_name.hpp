// The step in a checkpoint's name ("<prefix>-<digits>..."), shared by CheckpointManager's files
// and the distributed checkpoints' step directories.
#pragma once

#include <cstdint>
#include <string_view>

namespace flowlet::checkpoint {

// `digits` (the part after "<prefix>-") as a step; -1 when it holds anything but decimal digits or
// is beyond int64.
inline int64_t step_of_digits(std::string_view digits) {
  uint64_t step = 0;
  for (const char c : digits) {
    if (c < '0' || c > '9') return -1;
    const auto digit = static_cast<uint64_t>(c - '0');
    if (step > (static_cast<uint64_t>(INT64_MAX) - digit) / 10) return -1;  // beyond int64
    step = step * 10 + digit;
  }
  return static_cast<int64_t>(step);
}

}  // namespace flowlet::checkpoint
