// The CUDA backend as core sees it (core/backend.hpp): devices, memory, synchronization, and the
// registration of every CUDA kernel into the op table.
#include "core/backend.hpp"

#include "core/check.hpp"
#include "cuda/allocator.hpp"
#include "cuda/register.hpp"
#include "cuda/runtime.hpp"

namespace flowlet::detail {
namespace {

const DeviceBackend cuda_device_backend{&cuda::device_count,      &cuda::why_no_devices,       &cuda::allocate,
                                        &cuda::deallocate,         &cuda::synchronize,          &cuda::start_recording,
                                        &cuda::add_scaled_in_place, &cuda::copy_in_place,
                                        &cuda::release_cached,      &cuda::cached_bytes};

}  // namespace

const DeviceBackend& cuda_backend() { return cuda_device_backend; }

void add_cuda_kernels(const std::vector<Op*>& ops) {
  cuda::add_copy_kernels(ops);
  cuda::add_elementwise_kernels(ops);
  cuda::add_creation_kernels(ops);
  cuda::add_reduce_kernels(ops);
  cuda::add_linalg_kernels(ops);
  cuda::add_nn_kernels(ops);
  cuda::add_shape_kernels(ops);
}

namespace cuda {

void set_kernel(const OpList& ops, std::string_view name, KernelFn kernel) {
  for (Op* op : ops) {
    if (op->name == name) {
      op->kernels[static_cast<size_t>(DeviceKind::cuda)] = kernel;
      return;
    }
  }
  fail<InvalidArgument>("internal: the CUDA backend has a kernel for '{}', which is not a registered op", name);
}

}  // namespace cuda
}  // namespace flowlet::detail
