// The CUDA backend as core sees it (core/backend.hpp, backend(DeviceKind::cuda)): devices, memory,
// synchronization, and the registration of every CUDA kernel into the op table.
#include "core/backend.hpp"

#include "core/check.hpp"
#include "cuda/allocator.hpp"
#include "cuda/register.hpp"
#include "cuda/runtime.hpp"

namespace flowlet::detail {
namespace {

void add_kernels(const std::vector<Op*>& ops) {
  cuda::add_copy_kernels(ops);
  cuda::add_elementwise_kernels(ops);
  cuda::add_creation_kernels(ops);
  cuda::add_reduce_kernels(ops);
  cuda::add_linalg_kernels(ops);
  cuda::add_nn_kernels(ops);
  cuda::add_shape_kernels(ops);
  cuda::add_conv_kernels(ops);
  cuda::add_normalization_kernels(ops);
}

// Kernels are read from the Op values (dispatch, placement), so the backend registers them before
// it reports a device: every use of a GPU asks for the device count first. (all_ops() calls
// add_kernels above once; asking it again is a load.)
int device_count() {
  (void)all_ops();
  return cuda::device_count();
}

const DeviceBackend cuda_device_backend{.built = true,
                                        .device_count = &device_count,
                                        .why_no_devices = &cuda::why_no_devices,
                                        .allocate = &cuda::allocate,
                                        .deallocate = &cuda::deallocate,
                                        .synchronize = &cuda::synchronize,
                                        .start_recording = &cuda::start_recording,
                                        .add_scaled_in_place = &cuda::add_scaled_in_place,
                                        .copy_in_place = &cuda::copy_in_place,
                                        .add_kernels = &add_kernels,
                                        .release_cached = &cuda::release_cached,
                                        .cached_bytes = &cuda::cached_bytes};

}  // namespace

const DeviceBackend& backend(DeviceKind kind) {
  if (kind != DeviceKind::cuda) fail<InvalidArgument>("internal: backend(): the CPU has no backend seam");
  return cuda_device_backend;
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
