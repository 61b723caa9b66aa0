// FLOWLET_CUDA_CHECK: every CUDA runtime and cuBLAS status becomes a flowlet::DeviceError naming the
// status, the device, the function and the failing call. Never an abort: a failure unwinds like
// any other flowlet error, and the caller decides.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

namespace flowlet::detail::cuda {

// Where a check sits, for the message.
struct CallSite {
  const char* function;
  const char* call;  // the call's source text
  const char* file;
  int line;
};

[[noreturn]] void fail_status(cudaError_t status, int device, const CallSite& site);
[[noreturn]] void fail_status(cublasStatus_t status, int device, const CallSite& site);

// A kernel launcher reached with an element type it was not built for (an internal error: each op's
// rule checks dtypes before its kernel runs).
[[noreturn]] void fail_element_type(const char* kernel, int element_type);

inline void check(cudaError_t status, int device, const CallSite& site) {
  if (status != cudaSuccess) [[unlikely]] fail_status(status, device, site);
}
inline void check(cublasStatus_t status, int device, const CallSite& site) {
  if (status != CUBLAS_STATUS_SUCCESS) [[unlikely]] fail_status(status, device, site);
}

}  // namespace flowlet::detail::cuda

// FLOWLET_CUDA_CHECK(device, cudaMalloc(&p, bytes)): a macro only to capture the call's text.
#define FLOWLET_CUDA_CHECK(device, call) \
  ::flowlet::detail::cuda::check((call), (device), {__func__, #call, __FILE__, __LINE__})

// After a <<<...>>> launch of the kernel for `op_name`: reports a bad launch configuration, or the
// failure of an earlier kernel on the device.
#define FLOWLET_CUDA_CHECK_LAUNCH(device, op_name) \
  ::flowlet::detail::cuda::check(cudaGetLastError(), (device), {(op_name), "kernel launch", __FILE__, __LINE__})
