// The seam between core and the device backends other than the CPU: what Storage, device counts,
// memory statistics and the op table need from a backend. src/cuda/backend.cpp defines these in a
// build with CUDA, src/core/no_cuda.cpp in one without (Meson compiles exactly one of the two), so
// core has no #ifdef and a CPU-only build compiles what it compiled before.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "flowlet/op.hpp"

namespace flowlet::detail {

struct DeviceBackend {
  // Devices visible to this process; 0 when there is no device or no driver. Never throws.
  int (*device_count)();
  // Why device_count() is 0 ("built without CUDA", "no CUDA driver: ..."), for error messages.
  std::string (*why_no_devices)();
  // A block of at least `bytes` on device `index` (which exists); DeviceError when it cannot.
  void* (*allocate)(int index, size_t bytes);
  // Gives a block back (from any thread, also during static destruction).
  void (*deallocate)(int index, void* data, size_t bytes) noexcept;
  // Waits for every op queued on device `index`.
  void (*synchronize)(int index);
};

const DeviceBackend& cuda_backend();

// Called once while the op table is built: the CUDA backend sets `kernels[cuda]` of the ops it
// implements (nothing without CUDA). Registration needs no device, so placement sees which ops
// run on CUDA in every build with the backend.
void add_cuda_kernels(const std::vector<Op*>& ops);

}  // namespace flowlet::detail
