// Philox-4x32-10 (Salmon et al., SC'11): a counter-based generator. Output block i depends only on
// (key, i), so a kernel can produce any element independently, on any thread or device.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

// The same functions run in CUDA kernels (src/cuda/kernels/creation.cu), so that a seed gives the
// same stream on every device.
#include "core/host_device.hpp"

namespace flowlet::detail {

FLOWLET_HOST_DEVICE inline std::array<uint32_t, 4> philox4x32(uint64_t counter, uint64_t key) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  std::array<uint32_t, 4> c{static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0u, 0u};
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t{kMul0} * c[0];
    const uint64_t p1 = uint64_t{kMul1} * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k0, static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k1, static_cast<uint32_t>(p0)};
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return c;
}

// A double in [0, 1) from 53 random bits.
FLOWLET_HOST_DEVICE inline double unit_double(uint32_t hi, uint32_t lo) {
  return static_cast<double>(((uint64_t{hi} << 32) | lo) >> 11) * 0x1.0p-53;
}

// Element i of the uniform [0, 1) stream for `seed`.
FLOWLET_HOST_DEVICE inline double uniform_element(uint64_t seed, uint64_t i) {
  const auto r = philox4x32(i, seed);
  return unit_double(r[0], r[1]);
}

// Element i of the standard normal stream for `seed` (Box-Muller on one Philox block).
FLOWLET_HOST_DEVICE inline double normal_element(uint64_t seed, uint64_t i) {
  const auto r = philox4x32(i, seed);
  const double u1 = 1.0 - unit_double(r[0], r[1]);  // (0, 1]: log is finite
  const double u2 = unit_double(r[2], r[3]);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace flowlet::detail
