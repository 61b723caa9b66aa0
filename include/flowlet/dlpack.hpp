// DLPack exchange (dlpack.h, Debian's libdlpack-dev): hand a tensor to another framework (libtorch's
// at::fromDLPack, CuPy, JAX, NumPy) and take one from it, without copying, on the CPU and CUDA.
#pragma once

#include "flowlet/core/tensor.hpp"

struct DLManagedTensor;  // dlpack.h; include it to read the struct

namespace flowlet {

// A DLManagedTensor that shares t's storage (strides and offset as they are) and keeps it alive
// until the consumer calls its deleter, exactly once. CUDA: the device's compute stream is synced
// first, so the memory is ready on any stream. Every dtype but b8 maps (b8 as DLPack bool).
DLManagedTensor* to_dlpack(const Tensor& t);

// A Tensor over the memory of `managed`, which it now owns: its deleter runs when the last tensor
// sharing that memory goes away (also when this throws). kDLCPU, kDLCUDA and kDLCUDAHost; strides
// in elements (null: row-major); InvalidArgument for a dtype, device or layout flowlet does not
// have, naming it.
Tensor from_dlpack(DLManagedTensor* managed);

}  // namespace flowlet
