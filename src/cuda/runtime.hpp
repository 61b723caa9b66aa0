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

// A flag on the device, initialised to "no error" (UINT64_MAX), that kernels lower with atomicMin
// to the first bad position. first_bad() waits for the kernels and returns the position, or -1.
class ErrorFlag {
 public:
  explicit ErrorFlag(Device device);
  uint64_t* data() const { return static_cast<uint64_t*>(flag_.raw_data()); }
  int64_t first_bad() const;
  // Waits, then throws OutOfRange worded as the CPU kernels word it when a position was marked:
  // "<op>: <what> out of range [0, <bound>); got <what> <value> at position <i>", the value read
  // from `indices` (i32 or i64, on the device).
  void throw_if_out_of_range(std::string_view op, std::string_view what, int64_t bound, const Tensor& indices) const;

 private:
  Tensor flag_;
};

// flowlet's dtype as the kernels name it.
inline ElementType element_type(DType dtype) { return static_cast<ElementType>(static_cast<int>(dtype)); }

}  // namespace flowlet::detail::cuda
