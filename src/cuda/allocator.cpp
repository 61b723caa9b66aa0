// The per-device caching allocator (see allocator.hpp for why it is safe to reuse blocks at once).
#include "cuda/allocator.hpp"
#include "cuda/capture_pool.hpp"

#include <array>
#include <mutex>
#include <vector>

#include "core/allocator.hpp"
#include "core/check.hpp"
#include "cuda/check.hpp"
#include "cuda/runtime.hpp"

namespace flowlet::detail::cuda {
namespace {

// cudaMalloc aligns to 256 bytes at least; smaller requests share the smallest class anyway.
constexpr size_t kMinDeviceBlock = 512;

struct DeviceCache {
  std::mutex mutex;
  std::vector<void*> free_blocks[kNumClasses];
  int64_t cached = 0;
};

// Never destroyed: storages freed during static destruction still find their cache.
DeviceCache& cache(int device) {
  static auto* caches = new std::array<DeviceCache, kMaxCudaDevices>;
  return (*caches)[static_cast<size_t>(device)];
}

int device_class(size_t bytes) { return size_class(std::max(bytes, kMinDeviceBlock)); }

}  // namespace

size_t block_bytes(size_t bytes) { return class_bytes(device_class(bytes)); }

void* allocate(int device, size_t bytes) {
  if (void* block = capture_pool_allocate(device, bytes)) return block;  // a CUDA Graph's recording
  return allocate_block(device, bytes);
}

void deallocate(int device, void* data, size_t bytes) noexcept {
  if (capture_pool_take(device, data, bytes)) return;  // a CUDA Graph's block
  free_block(device, data, bytes);
}

void* allocate_block(int device, size_t bytes) {
  const int cls = device_class(bytes);
  DeviceCache& c = cache(device);
  {
    std::lock_guard lock(c.mutex);
    auto& list = c.free_blocks[cls];
    if (!list.empty()) {
      void* block = list.back();
      list.pop_back();
      c.cached -= static_cast<int64_t>(class_bytes(cls));
      return block;
    }
  }
  const size_t rounded = class_bytes(cls);
  use_device(device);
  void* block = nullptr;
  cudaError_t status = cudaMalloc(&block, rounded);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    const int64_t released = cached_bytes(device);
    release_cached(device);
    status = cudaMalloc(&block, rounded);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      size_t free_bytes = 0, total_bytes = 0;
      cudaMemGetInfo(&free_bytes, &total_bytes);
      fail<DeviceError>(
          "storage: out of memory on cuda:{}; got a request for {} bytes (rounded to {}) with {} of {} bytes free "
          "after releasing {} cached bytes; free tensors you no longer need or use smaller batches",
          device, bytes, rounded, free_bytes, total_bytes, released);
    }
  }
  FLOWLET_CUDA_CHECK(device, status);
  return block;
}

void free_block(int device, void* data, size_t bytes) noexcept {
  const int cls = device_class(bytes);
  DeviceCache& c = cache(device);
  std::lock_guard lock(c.mutex);
  c.free_blocks[cls].push_back(data);
  c.cached += static_cast<int64_t>(class_bytes(cls));
}

void release_cached(int device) {
  synchronize(device);  // cudaFree would wait anyway; this makes the wait explicit and checked
  DeviceCache& c = cache(device);
  std::lock_guard lock(c.mutex);
  for (auto& list : c.free_blocks) {
    for (void* block : list) FLOWLET_CUDA_CHECK(device, cudaFree(block));
    list.clear();
  }
  c.cached = 0;
}

int64_t cached_bytes(int device) {
  DeviceCache& c = cache(device);
  std::lock_guard lock(c.mutex);
  return c.cached;
}

}  // namespace flowlet::detail::cuda
