// FLOWLET_HOST_DEVICE: marks a function that both g++ and nvcc compile, for the host and for CUDA
// kernels, so that one definition serves every backend.
#pragma once

#if defined(__CUDACC__)
#define FLOWLET_HOST_DEVICE __host__ __device__
#else
#define FLOWLET_HOST_DEVICE
#endif
