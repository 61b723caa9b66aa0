// CPU caching allocator. Blocks are rounded up to size classes (four per power of two, at least
// 64 bytes). Small classes are cached per thread without locks; large ones in one shared pool
// under a mutex (their cost dwarfs the lock). The shared pool keeps at most kMaxCachedBytes.
#include "core/allocator.hpp"

#include <bit>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

namespace flowlet::detail {

// The power of two below a request, split into four steps.
int size_class(size_t bytes) {
  if (bytes <= kMinBlock) return 0;
  const int log2 = std::bit_width(bytes - 1) - 1;  // bytes-1 in [2^log2, 2^(log2+1))
  const size_t step = (size_t{1} << log2) / 4;
  const int quarter = static_cast<int>((bytes - 1 - (size_t{1} << log2)) / step);
  return (log2 - 6) * 4 + quarter + 1;
}
size_t class_bytes(int cls) {
  if (cls == 0) return kMinBlock;
  const int log2 = (cls - 1) / 4 + 6;
  const int quarter = (cls - 1) % 4;
  return (size_t{1} << log2) + (size_t{1} << log2) / 4 * static_cast<size_t>(quarter + 1);
}

namespace {

constexpr size_t kAlignment = 64;
constexpr size_t kLargestThreadCached = 256 * 1024;   // larger blocks go to the shared pool
constexpr size_t kMaxBlocksPerThreadClass = 64;
constexpr size_t kMaxCachedBytes = size_t{2} << 30;   // shared pool cap

void* system_allocate(size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, kAlignment, bytes) != 0) throw std::bad_alloc();
  return p;
}

struct SharedPool {
  std::mutex mutex;
  std::vector<void*> free_blocks[kNumClasses];
  size_t cached_bytes = 0;

  void* take(int cls) {
    std::lock_guard lock(mutex);
    auto& list = free_blocks[cls];
    if (list.empty()) return nullptr;
    void* p = list.back();
    list.pop_back();
    cached_bytes -= class_bytes(cls);
    return p;
  }
  void give(void* p, int cls) {
    const size_t bytes = class_bytes(cls);
    {
      std::lock_guard lock(mutex);
      if (cached_bytes + bytes <= kMaxCachedBytes) {
        free_blocks[cls].push_back(p);
        cached_bytes += bytes;
        return;
      }
    }
    std::free(p);
  }
};

// Never destroyed: tensors released during static destruction still find it.
SharedPool& shared_pool() {
  static SharedPool* pool = new SharedPool;
  return *pool;
}

struct ThreadCache {
  std::vector<void*> free_blocks[kNumClasses];
};

// The fast path reads a plain pointer (initial-exec TLS: one instruction, no wrapper call). A
// separate object with a destructor, touched once per thread, hands the blocks back at exit.
[[gnu::tls_model("initial-exec")]] thread_local ThreadCache* thread_cache = nullptr;
[[gnu::tls_model("initial-exec")]] thread_local bool thread_cache_gone = false;

struct ThreadCacheReaper {
  ~ThreadCacheReaper() {
    thread_cache_gone = true;
    ThreadCache* cache = std::exchange(thread_cache, nullptr);
    if (!cache) return;
    for (int cls = 0; cls < kNumClasses; ++cls) {
      for (void* p : cache->free_blocks[cls]) shared_pool().give(p, cls);
    }
    delete cache;
  }
};

// This thread's cache, or nullptr once the thread is exiting.
ThreadCache* local_cache() {
  if (thread_cache) return thread_cache;
  if (thread_cache_gone) return nullptr;
  static thread_local ThreadCacheReaper reaper;
  (void)reaper;
  thread_cache = new ThreadCache;
  return thread_cache;
}

}  // namespace

DeviceMemoryCounters cpu_memory_counters[kMaxLogicalCpuDevices];
DeviceMemoryCounters cuda_memory_counters[kMaxCudaDevices];

void* cpu_allocate(size_t bytes) {
  if (bytes > (size_t{1} << 52)) throw std::bad_alloc();  // beyond any machine; keeps classes in range
  const int cls = size_class(bytes);
  const size_t rounded = class_bytes(cls);
  ThreadCache* cache = rounded <= kLargestThreadCached ? local_cache() : nullptr;
  if (cache) {
    auto& list = cache->free_blocks[cls];
    if (!list.empty()) {
      void* p = list.back();
      list.pop_back();
      return p;
    }
  }
  if (void* p = shared_pool().take(cls)) return p;
  return system_allocate(rounded);
}

void cpu_deallocate(void* pointer, size_t bytes) {
  const int cls = size_class(bytes);
  ThreadCache* cache = class_bytes(cls) <= kLargestThreadCached ? local_cache() : nullptr;
  if (cache) {
    auto& list = cache->free_blocks[cls];
    if (list.size() < kMaxBlocksPerThreadClass) {
      list.push_back(pointer);
      return;
    }
  }
  shared_pool().give(pointer, cls);
}

}  // namespace flowlet::detail
