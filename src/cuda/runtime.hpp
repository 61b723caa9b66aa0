// The CUDA runtime as the backend uses it: which GPUs exist, each device's compute stream and
// cuBLAS handle, the calling thread's current device, and error flags that kernels raise for bad
// data (an index out of range) and the host reads back.
//
// One compute stream per device carries every kernel, copy and allocation of that device, so work
// issued from any thread runs in issue order and a freed block can be reused at once (the caching
// allocator is stream-ordered). Streams are non-blocking: nothing waits on the legacy default stream.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "core/backend.hpp"
#include "cuda/kernels/launch.hpp"
#include "flowlet/core/tensor.hpp"

namespace flowlet::detail::cuda {

// GPUs visible to this process, counted once; 0 without a GPU or driver (never throws, never aborts).
int device_count() noexcept;
// Why device_count() is 0, e.g. "no CUDA driver: cudaGetDeviceCount returned cudaErrorInsufficientDriver (...)".
std::string why_no_devices();

// Makes `index` the calling thread's current device (skipped when it already is).
void use_device(int index);

// cuda:index's compute stream, created on first use. `index` must exist.
cudaStream_t stream(int index);
// cuda:index's cuBLAS handle, bound to its compute stream, created on first use.
cublasHandle_t blas(int index);
// Where kernels for tensors on `device` run: its device (made current) and compute stream.
Launch launch_on(Device device);

// Waits for everything queued on cuda:index.
void synchronize(int index);

// While the calling thread records a CUDA Graph for a device (cuda/graph_capture.cpp), stream(),
// blas() and launch_on() for that device give the recording's stream and cuBLAS handle, so each
// launch of the step is recorded into the graph (and nothing runs); other threads are unaffected.
struct RecordingStreams {
  int device = -1;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
};
void set_recording_streams(const RecordingStreams* streams);  // null when the recording ends

// A flag on the device, initialised to "no error" (UINT64_MAX), that kernels lower with atomicMin
// to the first bad position. first_bad() waits for the kernels and returns the position, or -1.
// While a CUDA Graph is recorded, the throw_* checks are deferred to after the replay
// (exec/graph_capture.hpp); the flag's reset is part of the graph.
class ErrorFlag {
 public:
  explicit ErrorFlag(Device device);
  uint64_t* data() const { return static_cast<uint64_t*>(flag_.raw_data()); }
  int64_t first_bad() const;
  // Waits, then throws OutOfRange worded as the CPU kernels word it when a position was marked:
  // "<op>: <what> out of range [0, <bound>); got <what> <value> at position <i>", the value read
  // from `indices` (i32 or i64, on the device).
  void throw_if_out_of_range(std::string_view op, std::string_view what, int64_t bound, const Tensor& indices) const;
  // Waits, then throws InvalidArgument(message) when any position was marked.
  void throw_if_marked(std::string message) const;

 private:
  Tensor flag_;
};

// graph_capture.cpp: the backend entry points of core/backend.hpp that CUDA Graphs rely on.
std::unique_ptr<RecordedGraph> start_recording(int device);
void add_scaled_in_place(const Tensor& value, const Tensor& update, double scale);
void copy_in_place(const Tensor& target, const Tensor& source);

// flowlet's dtype as the kernels name it.
inline ElementType element_type(DType dtype) { return static_cast<ElementType>(static_cast<int>(dtype)); }

}  // namespace flowlet::detail::cuda
