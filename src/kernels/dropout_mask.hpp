// Dropout's keep/drop mapping from the Philox stream: which elements a dropout op keeps for a given
// state (seed, offset) and rate. The CPU kernel (src/ops/dropout.cpp) and the CUDA kernel both call
// these functions, so a seed and offset give the same mask on every device.
//
// Element i of a draw uses stream index k = offset + i: Philox block k / 4 of key `seed`, 32-bit
// word k % 4 of that block (four elements per block, a quarter of the work of one block each).
// With u = word / 2^32 in [0, 1), the element is kept when u >= rate, i.e. word >= ceil(rate * 2^32)
// (exact: both sides are integers below 2^32, rate * 2^32 is exact in a double). The mapping does not
// depend on the offset's alignment, so consecutive draws (offset advanced by each draw's size) never
// reuse a stream index.
#pragma once

#include <cstdint>

#include "core/host_device.hpp"
#include "kernels/philox.hpp"

namespace flowlet::detail {

// The smallest 32-bit word that is kept for `rate` in [0, 1): ceil(rate * 2^32).
FLOWLET_HOST_DEVICE inline uint32_t dropout_threshold(double rate) {
  const double scaled = rate * 4294967296.0;  // exact: a power-of-two scaling
  uint64_t t = static_cast<uint64_t>(scaled);
  if (static_cast<double>(t) < scaled) ++t;
  return t > 0xFFFFFFFFull ? 0xFFFFFFFFu : static_cast<uint32_t>(t);
}

// Whether stream index `index` (= offset + element) is kept.
FLOWLET_HOST_DEVICE inline bool dropout_keep(uint64_t seed, uint64_t index, uint32_t threshold) {
  const auto block = philox4x32(index >> 2, seed);
  return block[index & 3u] >= threshold;
}

// The scale applied to kept elements: 1 / (1 - rate).
FLOWLET_HOST_DEVICE inline double dropout_scale(double rate) { return 1.0 / (1.0 - rate); }

}  // namespace flowlet::detail
