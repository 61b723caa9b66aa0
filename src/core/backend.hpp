// The seam between core and the device backends other than the CPU: what Storage, device counts,
// memory statistics and the op table need from a backend, reached as backend(kind).
// src/cuda/backend.cpp defines the CUDA one in a build with CUDA, src/core/no_cuda.cpp in one
// without (Meson compiles exactly one of the two), so core has no #ifdef and a CPU-only build
// compiles what it compiled before.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "flowlet/core/device.hpp"
#include "flowlet/core/tensor.hpp"

namespace flowlet {
struct Op;  // registration hands the op table to the backend (core never looks inside an Op)
}  // namespace flowlet

namespace flowlet::detail {

// A CUDA Graph being recorded from one thread's launches, then replayed (exec/graph_capture.hpp
// drives it). From start_recording until stop(), the recording thread's allocations on the device
// come from a pool the graph keeps for its lifetime (replays write the same addresses). Between
// begin_phase() and end_phase(), every launch the thread makes for the device is recorded, not run.
// A recording may hold several phases, launched one after another on the device's compute stream.
class RecordedGraph {
 public:
  virtual ~RecordedGraph() = default;  // waits for running launches, then frees the graph and its pool
  virtual void begin_phase() = 0;
  virtual void end_phase() = 0;  // DeviceError when the phase could not be recorded
  virtual void stop() = 0;       // the thread allocates from the device's cache again
  virtual int phases() const = 0;
  virtual void launch(int phase) = 0;  // queues phase `phase` on the compute stream
};

struct DeviceBackend {
  // False for the stand-in of a backend this build lacks: it registers no kernels.
  bool built = false;
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
  // Starts recording a CUDA Graph for device `index` on the calling thread (see RecordedGraph).
  std::unique_ptr<RecordedGraph> (*start_recording)(int index);
  // value += scale * update in value's buffer (both contiguous, one floating dtype, shape and device).
  void (*add_scaled_in_place)(const Tensor& value, const Tensor& update, double scale);
  // target = source in target's buffer (same dtype, shape and device; target contiguous).
  void (*copy_in_place)(const Tensor& target, const Tensor& source);
  // Called once, while the op table is built (src/registry.cpp): sets the backend's slot in
  // `kernels` of the ops it implements. Needs no device, so placement sees which ops run on the
  // backend in every build that has it.
  void (*add_kernels)(const std::vector<Op*>& ops);
  // Returns the blocks the caching allocator of device `index` keeps for reuse to the driver.
  void (*release_cached)(int index);
  // Bytes in those blocks. Never throws.
  int64_t (*cached_bytes)(int index);
};

// The backend of device kind `kind` (not cpu: the CPU is core's own; InvalidArgument for it).
const DeviceBackend& backend(DeviceKind kind);

}  // namespace flowlet::detail
