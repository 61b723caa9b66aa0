// cuDNN as the CUDA backend uses it: one handle per device (created on first use, bound to the
// stream of each call), FLOWLET_CUDA_CHECK for cudnnStatus_t (a DeviceError naming the status and
// the call), RAII descriptors, and flowlet dtypes as cuDNN names them. Only src/cuda/conv.cpp
// uses it today (convolutions); the pooling and normalization ops have kernels of their own.
#pragma once

#include <cudnn.h>

#include <cstdint>
#include <mutex>

#include "cuda/check.hpp"
#include "flowlet/core/dtype.hpp"
#include "flowlet/core/shape.hpp"

namespace flowlet::detail::cuda {

[[noreturn]] void fail_status(cudnnStatus_t status, int device, const CallSite& site);
inline void check(cudnnStatus_t status, int device, const CallSite& site) {
  if (status != CUDNN_STATUS_SUCCESS) [[unlikely]] fail_status(status, device, site);
}

// cuda:device's cuDNN handle bound to `stream`, held under the device's lock for as long as the
// object lives: a handle is not safe to use from two threads at once, and its stream is per call
// (the compute stream, or a CUDA Graph recording's stream).
class CudnnHandle {
 public:
  CudnnHandle(int device, cudaStream_t stream);
  cudnnHandle_t get() const { return handle_; }

 private:
  std::unique_lock<std::mutex> lock_;
  cudnnHandle_t handle_ = nullptr;
};

// The cuDNN data type of a flowlet dtype (f32, f64, f16, bf16); others are a DTypeError naming `op`.
cudnnDataType_t cudnn_type(DType dtype, const char* op);

// Descriptors, destroyed with their owner.
class TensorDescriptor {
 public:
  // A contiguous NCHW tensor; sizes must fit cuDNN's int (a ShapeError naming `op` otherwise).
  TensorDescriptor(const Shape& nchw, DType dtype, const char* op, int device);
  ~TensorDescriptor();
  TensorDescriptor(const TensorDescriptor&) = delete;
  TensorDescriptor& operator=(const TensorDescriptor&) = delete;
  cudnnTensorDescriptor_t get() const { return desc_; }

 private:
  cudnnTensorDescriptor_t desc_ = nullptr;
};

class FilterDescriptor {
 public:
  FilterDescriptor(const Shape& ockk, DType dtype, const char* op, int device);
  ~FilterDescriptor();
  FilterDescriptor(const FilterDescriptor&) = delete;
  FilterDescriptor& operator=(const FilterDescriptor&) = delete;
  cudnnFilterDescriptor_t get() const { return desc_; }

 private:
  cudnnFilterDescriptor_t desc_ = nullptr;
};

struct ConvGeometry {  // symmetric padding only: conv.cpp pads the input itself otherwise
  int pad_h = 0, pad_w = 0, stride_h = 1, stride_w = 1, dilation_h = 1, dilation_w = 1, groups = 1;
};

class ConvolutionDescriptor {
 public:
  // Cross-correlation, accumulating in f64 for f64 and in f32 otherwise, with `math` (CUDNN_FMA_MATH
  // keeps f32 exact, CUDNN_DEFAULT_MATH lets cuDNN use TF32, CUDNN_TENSOR_OP_MATH for halves).
  ConvolutionDescriptor(const ConvGeometry& g, DType dtype, cudnnMathType_t math, int device);
  ~ConvolutionDescriptor();
  ConvolutionDescriptor(const ConvolutionDescriptor&) = delete;
  ConvolutionDescriptor& operator=(const ConvolutionDescriptor&) = delete;
  cudnnConvolutionDescriptor_t get() const { return desc_; }
  void set_math(cudnnMathType_t math, int device);

 private:
  cudnnConvolutionDescriptor_t desc_ = nullptr;
};

}  // namespace flowlet::detail::cuda
