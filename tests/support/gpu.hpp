// Test support for GPU cases: whether a CUDA device is visible, and the skip every GPU case starts
// with (CI and the development machines have the CUDA toolkit but no GPU).
#pragma once

#include <doctest/doctest.h>

#include <string>

#include <flowlet/flowlet.hpp>

namespace test {

inline bool have_gpu() { return flowlet::device_count(flowlet::DeviceKind::cuda) > 0; }

// Call first in a test that needs a GPU: true (after saying why) when the test must stop.
inline bool skip_without_gpu() {
  if (have_gpu()) return false;
  std::string why;  // the library says why, in the error for a device that does not exist
  try {
    (void)flowlet::memory_stats(flowlet::Device("cuda:0"));
  } catch (const flowlet::DeviceError& e) {
    why = e.what();
  }
  MESSAGE("skipped: no CUDA device visible: " << why);
  return true;
}

}  // namespace test
