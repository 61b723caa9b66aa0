// The messages of FLOWLET_CUDA_CHECK: status name and text, device, function, call and place.
#include "cuda/check.hpp"

#include "core/check.hpp"

namespace flowlet::detail::cuda {
namespace {

// "src/cuda/allocator.cpp" rather than the build machine's absolute path.
const char* short_path(const char* file) {
  const std::string_view path(file);
  const size_t at = path.rfind("src/cuda/");
  return at == std::string_view::npos ? file : file + at;
}

}  // namespace

void fail_status(cudaError_t status, int device, const CallSite& site) {
  cudaGetLastError();  // clears a non-sticky error so that the next call does not report it again
  fail<DeviceError>("cuda: {} failed on cuda:{} in {} ({}:{}); got {}: {}", site.call, device, site.function,
                    short_path(site.file), site.line, cudaGetErrorName(status), cudaGetErrorString(status));
}

void fail_element_type(const char* kernel, int element_type) {
  fail<DTypeError>("{}: internal: the CUDA kernel was not built for dtype {}", kernel,
                   dtype_name(static_cast<DType>(element_type)));
}

void fail_status(cublasStatus_t status, int device, const CallSite& site) {
  fail<DeviceError>("cublas: {} failed on cuda:{} in {} ({}:{}); got {}: {}", site.call, device, site.function,
                    short_path(site.file), site.line, cublasGetStatusName(status), cublasGetStatusString(status));
}

}  // namespace flowlet::detail::cuda
