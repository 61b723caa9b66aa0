// The CUDA backend of a build without CUDA (nvcc was not found, or -Dcuda=disabled): no devices,
// and every attempt to use one says why.
#include "core/backend.hpp"
#include "core/check.hpp"

namespace flowlet::detail {
namespace {

int no_devices() { return 0; }
std::string built_without_cuda() {
  return "flowlet was built without CUDA (configure with nvcc on PATH and -Dcuda=enabled)";
}
void* cannot_allocate(int index, size_t bytes) {
  fail<DeviceError>("storage: cannot allocate {} bytes on cuda:{}; {}", bytes, index, built_without_cuda());
}
void nothing_to_free(int, void*, size_t) noexcept {}
void nothing_to_wait_for(int) {}

const DeviceBackend no_cuda{&no_devices, &built_without_cuda, &cannot_allocate, &nothing_to_free,
                            &nothing_to_wait_for};

}  // namespace

const DeviceBackend& cuda_backend() { return no_cuda; }

void add_cuda_kernels(const std::vector<Op*>&) {}

}  // namespace flowlet::detail
