// The per-device caching allocator (see allocator.hpp for when a block may be reused, and why).
#include "cuda/allocator.hpp"
#include "cuda/capture_pool.hpp"

#include <array>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/allocator.hpp"
#include "core/check.hpp"
#include "cuda/check.hpp"
#include "cuda/runtime.hpp"

namespace flowlet::detail::cuda {
namespace {

// cudaMalloc aligns to 256 bytes at least; smaller requests share the smallest class anyway.
constexpr size_t kMinDeviceBlock = 512;

// A stream other than the block's compute stream that used a marked block, and how many uses are open.
struct StreamUse {
  cudaStream_t stream;
  int device;  // the stream's device, whose event pool serves it
  int count;
};

// A freed block whose fences have not all completed yet.
struct PendingBlock {
  void* block;
  int cls;
  std::vector<std::pair<int, cudaEvent_t>> fences;  // (event's device, event), removed as they complete
};

struct DeviceCache {
  std::mutex mutex;
  std::vector<void*> free_blocks[kNumClasses];  // compute-ordered
  std::vector<void*> idle_blocks[kNumClasses];  // no queued work uses them
  std::unordered_map<void*, std::vector<StreamUse>> marked;  // live blocks used on other streams
  std::vector<PendingBlock> pending;
  int64_t cached = 0;  // bytes in free, idle and pending blocks
};

// Never destroyed: storages freed during static destruction still find their cache.
DeviceCache& cache(int device) {
  static auto* caches = new std::array<DeviceCache, kMaxCudaDevices>;
  return (*caches)[static_cast<size_t>(device)];
}

int device_class(size_t bytes) { return size_class(std::max(bytes, kMinDeviceBlock)); }

// Moves the pending blocks whose fences all completed to the idle lists. Throws nothing but
// bad_alloc: a fence whose query fails (the device is in an error state) keeps its block pending,
// that is, never reused.
void poll_pending(DeviceCache& c) {
  for (size_t i = 0; i < c.pending.size();) {
    PendingBlock& p = c.pending[i];
    while (!p.fences.empty()) {
      const auto [device, event] = p.fences.back();
      const cudaError_t status = cudaEventQuery(event);
      if (status != cudaSuccess) {
        if (status == cudaErrorNotReady) cudaGetLastError();  // not an error: leave nothing for a later launch check
        break;
      }
      give_event(device, event);
      p.fences.pop_back();
    }
    if (!p.fences.empty()) {
      ++i;
      continue;
    }
    c.idle_blocks[p.cls].push_back(p.block);  // may throw bad_alloc: the block stays pending then
    if (&p != &c.pending.back()) p = std::move(c.pending.back());
    c.pending.pop_back();
  }
}

// An idle block of class `cls`, or nullptr. Called with c.mutex held.
void* take_idle(DeviceCache& c, int cls) {
  if (!c.pending.empty()) poll_pending(c);
  auto& list = c.idle_blocks[cls];
  if (list.empty()) return nullptr;
  void* block = list.back();
  list.pop_back();
  c.cached -= static_cast<int64_t>(class_bytes(cls));
  return block;
}

// A fresh block from the driver; on running out, releases the cache and tries once more.
void* malloc_block(int device, size_t bytes, int cls) {
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
      throw OutOfMemory(kUnnamedAllocation, Device(DeviceKind::cuda, device), bytes,
                        fmt::format(" (rounded to {}) with {} of {} bytes free after releasing {} cached bytes",
                                    rounded, free_bytes, total_bytes, released));
    }
  }
  FLOWLET_CUDA_CHECK(device, status);
  return block;
}

// Frees a marked block: records a fence on the compute stream and on every stream that used it,
// and parks the block until they completed. The compute fence is what lets the block become idle
// (usable by any stream without waiting): it covers the kernels queued before the free, which may
// still read the block. Called with c.mutex held; never throws. When a fence cannot be recorded the
// device is in an error state, and the block is dropped (not reused, not freed) rather than risk
// handing out memory that queued work may still touch.
void fence_and_park(int device, DeviceCache& c, void* block, int cls, const std::vector<StreamUse>& uses) noexcept {
  PendingBlock parked{block, cls, {}};
  try {
    parked.fences.reserve(uses.size() + 1);
    parked.fences.emplace_back(device, record_event(device, device_stream(device, StreamKind::compute)));
    for (const StreamUse& use : uses) {
      if (use.stream == device_stream(device, StreamKind::compute)) continue;  // fenced above
      parked.fences.emplace_back(use.device, record_event(use.device, use.stream));
    }
    c.pending.push_back(std::move(parked));
    c.cached += static_cast<int64_t>(class_bytes(cls));
  } catch (...) {
    for (const auto& [event_device, event] : parked.fences) give_event(event_device, event);
  }
}

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
    if (void* block = take_idle(c, cls)) return block;
  }
  return malloc_block(device, bytes, cls);
}

void free_block(int device, void* data, size_t bytes) noexcept {
  const int cls = device_class(bytes);
  DeviceCache& c = cache(device);
  std::lock_guard lock(c.mutex);
  if (!c.marked.empty()) [[unlikely]] {
    const auto it = c.marked.find(data);
    if (it != c.marked.end()) {
      const std::vector<StreamUse> uses = std::move(it->second);
      c.marked.erase(it);
      fence_and_park(device, c, data, cls, uses);
      return;
    }
  }
  c.free_blocks[cls].push_back(data);
  c.cached += static_cast<int64_t>(class_bytes(cls));
}

void* allocate_idle(int device, size_t bytes) {
  const int cls = device_class(bytes);
  DeviceCache& c = cache(device);
  const cudaStream_t compute = device_stream(device, StreamKind::compute);
  void* block = nullptr;
  {
    std::lock_guard lock(c.mutex);
    block = take_idle(c, cls);
  }
  // Not from free_blocks: a compute-ordered block may still be read by queued kernels, and a copy
  // stream writing it would race them.
  if (block == nullptr) block = malloc_block(device, bytes, cls);
  std::lock_guard lock(c.mutex);
  try {
    c.marked[block] = {StreamUse{compute, device, 1}};
  } catch (...) {  // no memory for the mark: the block is idle, so the driver may have it back
    cudaFree(block);
    throw;
  }
  return block;
}

void record_use(int device, void* block, cudaStream_t on, int on_device) {
  DeviceCache& c = cache(device);
  std::lock_guard lock(c.mutex);
  std::vector<StreamUse>& uses = c.marked[block];
  for (StreamUse& use : uses) {
    if (use.stream == on) {
      ++use.count;
      return;
    }
  }
  uses.push_back(StreamUse{on, on_device, 1});
}

void forget_use(int device, void* block, cudaStream_t on) noexcept {
  DeviceCache& c = cache(device);
  std::lock_guard lock(c.mutex);
  const auto it = c.marked.find(block);
  if (it == c.marked.end()) return;
  std::vector<StreamUse>& uses = it->second;
  for (size_t i = 0; i < uses.size(); ++i) {
    if (uses[i].stream != on) continue;
    if (--uses[i].count == 0) uses.erase(uses.begin() + static_cast<std::ptrdiff_t>(i));
    break;
  }
  if (uses.empty()) c.marked.erase(it);
}

void release_cached(int device) {
  synchronize(device);  // cudaFree would wait anyway; this makes the wait explicit and checked
  DeviceCache& c = cache(device);
  std::lock_guard lock(c.mutex);
  poll_pending(c);  // after the wait every fence on this device's streams has completed
  for (auto* lists : {&c.free_blocks, &c.idle_blocks}) {
    for (int cls = 0; cls < kNumClasses; ++cls) {
      auto& list = (*lists)[cls];
      while (!list.empty()) {  // popped first: a failing cudaFree drops the block, never frees it twice
        void* block = list.back();
        list.pop_back();
        c.cached -= static_cast<int64_t>(class_bytes(cls));
        FLOWLET_CUDA_CHECK(device, cudaFree(block));
      }
    }
  }
}

int64_t cached_bytes(int device) {
  DeviceCache& c = cache(device);
  std::lock_guard lock(c.mutex);
  return c.cached;
}

}  // namespace flowlet::detail::cuda
