// DLPack exchange (dlpack.h, Debian's libdlpack-dev): hand a tensor to another framework (libtorch's
// at::fromDLPack, CuPy, JAX, NumPy) and take one from it, without copying, on the CPU and CUDA.
#pragma once

#include "flowlet/core/tensor.hpp"

struct DLManagedTensor;  // dlpack.h; include it to read the struct

namespace flowlet {

// A DLManagedTensor that shares t's storage (strides and offset as they are) and keeps it alive
// until the consumer calls its deleter, exactly once. CUDA: the device's compute stream is synced
// first, so the memory is ready on any stream. The data pointer is the first element's address and
// byte_offset is 0 (libtorch 1.13 ignores byte_offset). Every dtype maps: b8 as kDLUInt 8 bits
// (DLPack 0.6, Debian's, has no bool code; with dlpack.h >= 0.8 as kDLBool). CPU devices (also
// logical cpu:N) export as kDLCPU 0: they share one host memory.
DLManagedTensor* to_dlpack(const Tensor& t);

// A Tensor over the memory of `managed`, which it now owns: its deleter runs when the last tensor
// sharing that memory goes away (also when this throws). kDLCPU, kDLCUDA and kDLCUDAHost; strides
// in elements (null: row-major), byte_offset honoured, zero strides kept; kDLUInt 8 comes in as u8.
// InvalidArgument for a dtype, device type, negative stride or misaligned start flowlet does not
// take, naming it and what is supported; DeviceError for a CUDA device this process lacks.
Tensor from_dlpack(DLManagedTensor* managed);

}  // namespace flowlet
