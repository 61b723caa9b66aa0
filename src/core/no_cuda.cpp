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

void no_kernels(const std::vector<Op*>&) {}

const DeviceBackend no_cuda{.built = false,
                            .device_count = &no_devices,
                            .why_no_devices = &built_without_cuda,
                            .allocate = &cannot_allocate,
                            .deallocate = &nothing_to_free,
                            .synchronize = &nothing_to_wait_for,
                            .start_recording = &cannot_record,
                            .add_scaled_in_place = &cannot_update,
                            .copy_in_place = &cannot_copy,
                            .add_kernels = &no_kernels,
                            .release_cached = &nothing_cached,
                            .cached_bytes = &no_cached_bytes};

}  // namespace

const DeviceBackend& backend(DeviceKind kind) {
  if (kind != DeviceKind::cuda) fail<InvalidArgument>("internal: backend(): the CPU has no backend seam");
  return no_cuda;
}

}  // namespace flowlet::detail
