// The pinned host staging cache (see staging.hpp).
#include "cuda/staging.hpp"

#include <algorithm>
#include <mutex>
#include <vector>

#include "core/allocator.hpp"
#include "cuda/runtime.hpp"

namespace flowlet::detail::cuda {
namespace {

struct PendingPinned {
  PinnedBlock block;
  int device;
  cudaEvent_t event;
};

struct PinnedCache {
  std::mutex mutex;
  std::vector<void*> free_blocks[kNumClasses];
  std::vector<PendingPinned> pending;  // given back, waiting for the copy that touches them
  size_t cached = 0;                   // bytes in free blocks
};

// Never destroyed, like the device caches: tensors freed during static destruction may land here.
PinnedCache& pinned_cache() {
  static auto* cache = new PinnedCache;
  return *cache;
}

// Page-sized at least: small transfers (item(), a scalar) share one class.
int pinned_class(size_t bytes) { return size_class(std::max<size_t>(bytes, 4096)); }

// Keeps a block no copy touches, or hands it back to the system over the cap. With the mutex held.
void keep_or_free(PinnedCache& c, const PinnedBlock& block) noexcept {
  const size_t size = class_bytes(block.cls);
  if (c.cached + size <= kMaxCachedPinnedBytes) {
    try {
      c.free_blocks[block.cls].push_back(block.data);
      c.cached += size;
      return;
    } catch (...) {  // no memory to remember it: free it instead
    }
  }
  cudaFreeHost(block.data);
}

// Keeps the blocks whose copies completed. A failing query (the device is in an error state) leaves
// its block pending for good: never reused while a copy might still touch it. With the mutex held.
void poll_pending(PinnedCache& c) noexcept {
  for (size_t i = 0; i < c.pending.size();) {
    const PendingPinned p = c.pending[i];
    const cudaError_t status = cudaEventQuery(p.event);
    if (status != cudaSuccess) {
      if (status == cudaErrorNotReady) cudaGetLastError();  // not an error: leave nothing for a later launch check
      ++i;
      continue;
    }
    give_event(p.device, p.event);
    keep_or_free(c, p.block);
    c.pending[i] = c.pending.back();
    c.pending.pop_back();
  }
}

}  // namespace

PinnedBlock take_pinned(int device, size_t bytes) {
  const int cls = pinned_class(bytes);
  PinnedCache& c = pinned_cache();
  {
    std::lock_guard lock(c.mutex);
    if (!c.pending.empty()) poll_pending(c);
    auto& list = c.free_blocks[cls];
    if (!list.empty()) {
      PinnedBlock block{list.back(), cls};
      list.pop_back();
      c.cached -= class_bytes(cls);
      return block;
    }
  }
  use_device(device);
  void* data = nullptr;
  if (cudaHostAlloc(&data, class_bytes(cls), cudaHostAllocPortable) != cudaSuccess) {
    cudaGetLastError();  // out of pinnable memory: the caller copies from pageable memory
    return {};
  }
  return PinnedBlock{data, cls};
}

void give_pinned_after(PinnedBlock block, int device, cudaEvent_t event) noexcept {
  PinnedCache& c = pinned_cache();
  std::lock_guard lock(c.mutex);
  try {
    c.pending.push_back(PendingPinned{block, device, event});
    return;
  } catch (...) {  // no memory for the list: wait for the copy here instead
  }
  const cudaError_t status = cudaEventSynchronize(event);
  give_event(device, event);
  if (status == cudaSuccess) {
    keep_or_free(c, block);
  } else {
    cudaGetLastError();  // the device failed; the block is dropped, not reused
  }
}

void give_pinned(PinnedBlock block) noexcept {
  PinnedCache& c = pinned_cache();
  std::lock_guard lock(c.mutex);
  keep_or_free(c, block);
}

}  // namespace flowlet::detail::cuda
