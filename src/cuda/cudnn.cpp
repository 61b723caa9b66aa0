// cuDNN handles (one per device, locked per use), the status check and the descriptors of
// cuda/cudnn.hpp.
#include "cuda/cudnn.hpp"

#include <array>
#include <climits>

#include "core/check.hpp"
#include "cuda/runtime.hpp"

namespace flowlet::detail::cuda {
namespace {

constexpr int kMaxDevices = 16;  // what device_count() can report

struct DeviceHandle {
  std::once_flag created;
  std::mutex in_use;
  cudnnHandle_t handle = nullptr;
};

DeviceHandle& device_handle(int device) {
  static std::array<DeviceHandle, kMaxDevices> handles;  // never destroyed before the process ends
  if (device < 0 || device >= kMaxDevices) fail<DeviceError>("cudnn: no handle for cuda:{}", device);
  return handles[static_cast<size_t>(device)];
}

int checked_int(int64_t value, const char* op, const Shape& shape) {
  if (value > INT_MAX) fail<ShapeError>("{}: cuDNN takes sizes below 2^31; got shape {}", op, shape);
  return static_cast<int>(value);
}

}  // namespace

void fail_status(cudnnStatus_t status, int device, const CallSite& site) {
  cudaGetLastError();  // a non-sticky launch error reported through cuDNN is cleared, as in check.cpp
  fail<DeviceError>("cudnn: {} failed on cuda:{} in {} ({}:{}); got {}", site.call, device, site.function,
                    site.file, site.line, cudnnGetErrorString(status));
}

CudnnHandle::CudnnHandle(int device, cudaStream_t stream) {
  DeviceHandle& slot = device_handle(device);
  std::call_once(slot.created, [&] {
    use_device(device);
    FLOWLET_CUDA_CHECK(device, cudnnCreate(&slot.handle));
  });
  lock_ = std::unique_lock(slot.in_use);
  handle_ = slot.handle;
  FLOWLET_CUDA_CHECK(device, cudnnSetStream(handle_, stream));
}

cudnnDataType_t cudnn_type(DType dtype, const char* op) {
  switch (dtype) {
    case DType::f32: return CUDNN_DATA_FLOAT;
    case DType::f64: return CUDNN_DATA_DOUBLE;
    case DType::f16: return CUDNN_DATA_HALF;
    case DType::bf16: return CUDNN_DATA_BFLOAT16;
    default: fail<DTypeError>("{}: no cuDNN convolution for dtype {}", op, dtype);
  }
}

TensorDescriptor::TensorDescriptor(const Shape& s, DType dtype, const char* op, int device) {
  const int n = checked_int(s[0], op, s), c = checked_int(s[1], op, s), h = checked_int(s[2], op, s),
            w = checked_int(s[3], op, s);
  if (s[0] * s[1] * s[2] * s[3] > INT_MAX) fail<ShapeError>("{}: cuDNN takes tensors below 2^31 elements; got {}", op, s);
  FLOWLET_CUDA_CHECK(device, cudnnCreateTensorDescriptor(&desc_));
  FLOWLET_CUDA_CHECK(device, cudnnSetTensor4dDescriptor(desc_, CUDNN_TENSOR_NCHW, cudnn_type(dtype, op), n, c, h, w));
}
TensorDescriptor::~TensorDescriptor() { cudnnDestroyTensorDescriptor(desc_); }

FilterDescriptor::FilterDescriptor(const Shape& s, DType dtype, const char* op, int device) {
  const int o = checked_int(s[0], op, s), c = checked_int(s[1], op, s), h = checked_int(s[2], op, s),
            w = checked_int(s[3], op, s);
  FLOWLET_CUDA_CHECK(device, cudnnCreateFilterDescriptor(&desc_));
  FLOWLET_CUDA_CHECK(device, cudnnSetFilter4dDescriptor(desc_, cudnn_type(dtype, op), CUDNN_TENSOR_NCHW, o, c, h, w));
}
FilterDescriptor::~FilterDescriptor() { cudnnDestroyFilterDescriptor(desc_); }

ConvolutionDescriptor::ConvolutionDescriptor(const ConvGeometry& g, DType dtype, cudnnMathType_t math, int device) {
  FLOWLET_CUDA_CHECK(device, cudnnCreateConvolutionDescriptor(&desc_));
  const cudnnDataType_t compute = dtype == DType::f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  FLOWLET_CUDA_CHECK(device, cudnnSetConvolution2dDescriptor(desc_, g.pad_h, g.pad_w, g.stride_h, g.stride_w,
                                                             g.dilation_h, g.dilation_w, CUDNN_CROSS_CORRELATION,
                                                             compute));
  FLOWLET_CUDA_CHECK(device, cudnnSetConvolutionGroupCount(desc_, g.groups));
  set_math(math, device);
}
ConvolutionDescriptor::~ConvolutionDescriptor() { cudnnDestroyConvolutionDescriptor(desc_); }
void ConvolutionDescriptor::set_math(cudnnMathType_t math, int device) {
  FLOWLET_CUDA_CHECK(device, cudnnSetConvolutionMathType(desc_, math));
}

}  // namespace flowlet::detail::cuda
