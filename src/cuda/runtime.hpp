// The CUDA runtime as the backend uses it: which GPUs exist, each device's streams, pooled events
// and cuBLAS handle, the calling thread's current device, and error flags that kernels raise for bad
// data (an index out of range) and the host reads back.
//
// Each device has one compute stream and two copy streams (host-to-device and device-to-host), all
// non-blocking: nothing waits on the legacy default stream. Every kernel, allocation and GPU-to-GPU
// copy of a device is queued on its compute stream, so work issued from any thread runs in issue
// order and a block freed after compute-only use can be reused at once (the caching allocator is
// stream-ordered on the compute stream). Host transfers run on the copy streams so they overlap
// compute; copy.cpp orders them against the compute stream with events, and allocator.hpp says how a
// block used on a copy stream is kept from being reused too early.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "core/backend.hpp"
#include "cuda/kernels/launch.hpp"
#include "flowlet/core/tensor.hpp"
#include "flowlet/op.hpp"
#include "runtime/step_context.hpp"

namespace flowlet::detail::cuda {

// GPUs visible to this process, counted once; 0 without a GPU or driver (never throws, never aborts).
int device_count() noexcept;
// Why device_count() is 0, e.g. "no CUDA driver: cudaGetDeviceCount returned cudaErrorInsufficientDriver (...)".
std::string why_no_devices();

// Makes `index` the calling thread's current device (skipped when it already is).
void use_device(int index);

// cuda:index's compute stream, created on first use. `index` must exist.
cudaStream_t stream(int index);

// The streams each device owns. `compute` is the stream stream(index) returns.
enum class StreamKind { compute, host_to_device, device_to_host };
inline constexpr int kStreamKinds = 3;
// One of cuda:index's own streams, created (non-blocking) on first use.
cudaStream_t device_stream(int index, StreamKind kind);

// Events without timing, from a per-device pool. take_event creates one on cuda:index when the pool
// is empty (the thread's current device is left as it was); give_event returns one. An event may be
// given back as soon as nothing will query it or wait on it *later*: a cudaStreamWaitEvent already
// issued keeps waiting on the record it saw, whatever happens to the event afterwards.
cudaEvent_t take_event(int index);
void give_event(int index, cudaEvent_t event) noexcept;
// A pooled event of cuda:index recorded on `on`, one of cuda:index's streams.
cudaEvent_t record_event(int index, cudaStream_t on);
// cuda:index's cuBLAS handle, bound to its compute stream, created on first use.
cublasHandle_t blas(int index);
// Where kernels for tensors on `device` run: its device (made current) and compute stream.
Launch launch_on(Device device);

// Waits for everything queued on cuda:index: its compute stream and its copy streams.
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
// While the kernel's step is recorded into a CUDA Graph (StepContext::recording), the throw_*
// checks are deferred to after the replay; the flag's reset is part of the graph.
class ErrorFlag {
 public:
  ErrorFlag(const OpCall& call, Device device);
  uint64_t* data() const { return static_cast<uint64_t*>(flag_.raw_data()); }
  int64_t first_bad() const;
  // Waits, then throws OutOfRange worded as the CPU kernels word it when a position was marked:
  // "<op>: <what> out of range [0, <bound>); got <what> <value> at position <i>", the value read
  // from `indices` (i32 or i64, on the device).
  void throw_if_out_of_range(std::string_view op, std::string_view what, int64_t bound, const Tensor& indices) const;
  // Waits, then throws InvalidArgument(message) when any position was marked.
  void throw_if_marked(std::string message) const;

 private:
  ErrorFlag after_replay() const;

  Tensor flag_;
  StepRecording* recording_ = nullptr;
};

// The backend entry points of core/backend.hpp that CUDA Graphs rely on: graph_capture.cpp's
// recording and axpy, and copy.cpp's element copy into an existing tensor (any source layout).
std::unique_ptr<RecordedGraph> start_recording(int device);
void add_scaled_in_place(const Tensor& value, const Tensor& update, double scale);
void copy_in_place(const Tensor& target, const Tensor& source);

// flowlet's dtype as the kernels name it.
inline ElementType element_type(DType dtype) { return static_cast<ElementType>(static_cast<int>(dtype)); }

}  // namespace flowlet::detail::cuda
