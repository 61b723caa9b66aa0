// The CUDA Graph memory pools (see capture_pool.hpp).
#include "cuda/capture_pool.hpp"

#include <cuda_runtime_api.h>

#include <atomic>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cuda/allocator.hpp"

namespace flowlet::detail::cuda {

struct CapturePool::State {
  int device = 0;
  bool released = false;                              // guarded by the registry's mutex
  std::map<size_t, std::vector<void*>> free_blocks;  // by block size; likewise
};

namespace {

struct Owned {
  std::shared_ptr<CapturePool::State> pool;
  size_t bytes = 0;  // the request it was allocated for (free_block wants one of its size class)
};

// Which pool owns each block. Never destroyed: tensors freed during static destruction find it.
struct Registry {
  std::mutex mutex;
  std::unordered_map<void*, Owned> owner;
  std::atomic<size_t> blocks{0};  // owner.size(), read without the mutex on every deallocation
};

Registry& registry() {
  static auto* r = new Registry;
  return *r;
}

constinit thread_local CapturePool::State* recording_pool = nullptr;
// The shared_ptr of recording_pool, for blocks that the pool adopts.
thread_local std::shared_ptr<CapturePool::State> recording_pool_owner;

// Takes a block from the cache while the thread records: a global or thread-local capture would
// forbid cudaMalloc, so the thread is in relaxed mode for the call, the documented push/pop of
// cudaThreadExchangeStreamCaptureMode (a no-op for the relaxed recordings graph_capture.cpp makes).
void* block_from_cache(int device, size_t bytes) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  struct Restore {
    cudaStreamCaptureMode& mode;
    ~Restore() { cudaThreadExchangeStreamCaptureMode(&mode); }
  } restore{mode};
  return allocate_block(device, bytes);
}

}  // namespace

CapturePool::CapturePool(int device) : state_(std::make_shared<State>()) { state_->device = device; }

CapturePool::~CapturePool() {
  stop();
  release();
}

void CapturePool::start() {
  recording_pool = state_.get();
  recording_pool_owner = state_;
}

void CapturePool::stop() {
  if (recording_pool != state_.get()) return;
  recording_pool = nullptr;
  recording_pool_owner.reset();
}

void CapturePool::release() {
  std::vector<std::pair<void*, size_t>> to_cache;
  {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    if (state_->released) return;
    state_->released = true;
    for (auto& [size, blocks] : state_->free_blocks) {
      for (void* block : blocks) {
        auto it = r.owner.find(block);
        to_cache.emplace_back(block, it->second.bytes);
        r.owner.erase(it);
      }
    }
    state_->free_blocks.clear();
    r.blocks.store(r.owner.size(), std::memory_order_release);
  }
  for (const auto& [block, bytes] : to_cache) free_block(state_->device, block, bytes);
}

void* capture_pool_allocate(int device, size_t bytes) {
  CapturePool::State* pool = recording_pool;
  if (pool == nullptr || pool->device != device) return nullptr;
  const size_t size = block_bytes(bytes);
  Registry& r = registry();
  {
    std::lock_guard lock(r.mutex);
    auto it = pool->free_blocks.find(size);
    if (it != pool->free_blocks.end() && !it->second.empty()) {
      void* block = it->second.back();
      it->second.pop_back();
      r.owner[block].bytes = bytes;
      return block;
    }
  }
  void* block = block_from_cache(device, bytes);
  std::lock_guard lock(r.mutex);
  r.owner[block] = Owned{recording_pool_owner, bytes};
  r.blocks.store(r.owner.size(), std::memory_order_release);
  return block;
}

bool capture_pool_take(int device, void* data, size_t bytes) noexcept {
  CapturePool::State* recording = recording_pool;
  Registry& r = registry();
  if (recording == nullptr && r.blocks.load(std::memory_order_acquire) == 0) return false;  // the usual case
  std::lock_guard lock(r.mutex);
  auto it = r.owner.find(data);
  if (it != r.owner.end()) {
    CapturePool::State& pool = *it->second.pool;
    if (!pool.released) {
      pool.free_blocks[block_bytes(bytes)].push_back(data);
      return true;
    }
    r.owner.erase(it);  // its graph is gone: back to the cache
    r.blocks.store(r.owner.size(), std::memory_order_release);
    return false;
  }
  if (recording == nullptr || recording->device != device) return false;
  // A block from before the recording, freed inside it: recorded kernels may still read it at a
  // replay, so the pool adopts it rather than let eager work reuse it.
  r.owner[data] = Owned{recording_pool_owner, bytes};
  r.blocks.store(r.owner.size(), std::memory_order_release);
  recording->free_blocks[block_bytes(bytes)].push_back(data);
  return true;
}

}  // namespace flowlet::detail::cuda
