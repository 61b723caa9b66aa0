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
std::unique_ptr<RecordedGraph> cannot_record(int index) {
  fail<DeviceError>("CUDA Graph: cannot record for cuda:{}; {}", index, built_without_cuda());
}
void cannot_update(const Tensor& value, const Tensor&, double) {
  fail<DeviceError>("assign_add: cannot update a tensor on {}; {}", value.device(), built_without_cuda());
}
void cannot_copy(const Tensor& target, const Tensor&) {
  fail<DeviceError>("copy: cannot write a tensor on {}; {}", target.device(), built_without_cuda());
}
void nothing_cached(int) {}
int64_t no_cached_bytes(int) { return 0; }

const DeviceBackend no_cuda{&no_devices,    &built_without_cuda, &cannot_allocate, &nothing_to_free,
                            &nothing_to_wait_for, &cannot_record, &cannot_update, &cannot_copy,
                            &nothing_cached, &no_cached_bytes};

}  // namespace

const DeviceBackend& cuda_backend() { return no_cuda; }

void add_cuda_kernels(const std::vector<Op*>&) {}

}  // namespace flowlet::detail
