// CPU caching allocator. Blocks are rounded up to size classes (four per power of two, at least
// 64 bytes). Small classes are cached per thread without locks; large ones in one shared pool
// under a mutex (their cost dwarfs the lock). The shared pool keeps at most kMaxCachedBytes. When
// the system refuses memory, every cache is released and the request tried once more.
#include "core/allocator.hpp"

#include <bit>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/check.hpp"
#include "flowlet/core/format.hpp"

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

// nullptr when the system has no memory left.
void* system_allocate(size_t bytes) {
  void* p = nullptr;
  return posix_memalign(&p, kAlignment, bytes) == 0 ? p : nullptr;
}

// Returns every block of `free_blocks` to the system (the caller accounts for the bytes).
template <size_t N>
void free_all(std::vector<void*> (&free_blocks)[N]) {
  for (auto& list : free_blocks) {
    for (void* p : list) std::free(p);
    list.clear();
  }
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
  size_t release() {
    std::lock_guard lock(mutex);
    free_all(free_blocks);
    return std::exchange(cached_bytes, 0);
  }
  size_t cached() {
    std::lock_guard lock(mutex);
    return cached_bytes;
  }
};

// Never destroyed: tensors released during static destruction still find it.
SharedPool& shared_pool() {
  static SharedPool* pool = new SharedPool;
  return *pool;
}

// Bumped by cpu_release_cached: a thread cache from an older generation frees its blocks before
// its next use.
std::atomic<uint64_t> release_generation{0};

struct ThreadCache {
  std::vector<void*> free_blocks[kNumClasses];
  // Written only by the owning thread (load + store, no locked instruction); read by
  // cpu_cached_bytes from any thread.
  std::atomic<int64_t> bytes{0};
  uint64_t generation = release_generation.load(std::memory_order_relaxed);

  void add_bytes(int64_t delta) {
    bytes.store(bytes.load(std::memory_order_relaxed) + delta, std::memory_order_relaxed);
  }
  size_t release() {
    free_all(free_blocks);
    return static_cast<size_t>(bytes.exchange(0, std::memory_order_relaxed));
  }
};

// Every live thread cache, for cpu_cached_bytes. Never destroyed, like the shared pool.
struct ThreadCacheRegistry {
  std::mutex mutex;
  std::vector<ThreadCache*> caches;
};
ThreadCacheRegistry& registry() {
  static ThreadCacheRegistry* caches = new ThreadCacheRegistry;
  return *caches;
}

// The fast path reads a plain pointer (initial-exec TLS: one instruction, no wrapper call). A
// separate object with a destructor, touched once per thread, hands the blocks back at exit.
[[gnu::tls_model("initial-exec")]] thread_local ThreadCache* thread_cache = nullptr;
[[gnu::tls_model("initial-exec")]] thread_local bool thread_cache_gone = false;

struct ThreadCacheReaper {
  ~ThreadCacheReaper() {
    thread_cache_gone = true;
    ThreadCache* cache = std::exchange(thread_cache, nullptr);
    if (!cache) return;
    {
      ThreadCacheRegistry& r = registry();
      std::lock_guard lock(r.mutex);
      std::erase(r.caches, cache);
    }
    for (int cls = 0; cls < kNumClasses; ++cls) {
      for (void* p : cache->free_blocks[cls]) shared_pool().give(p, cls);
    }
    delete cache;
  }
};

// Makes this thread's cache (first allocation on the thread), or nullptr once the thread is exiting.
[[gnu::noinline]] ThreadCache* new_local_cache() {
  if (thread_cache_gone) return nullptr;
  static thread_local ThreadCacheReaper reaper;
  (void)reaper;
  auto cache = std::make_unique<ThreadCache>();
  {
    ThreadCacheRegistry& r = registry();
    std::lock_guard lock(r.mutex);
    r.caches.push_back(cache.get());
  }
  thread_cache = cache.release();
  return thread_cache;
}

// Frees the blocks of a cache older than the last cpu_release_cached; returns the bytes freed.
[[gnu::noinline]] size_t refresh_local_cache(ThreadCache& cache) {
  cache.generation = release_generation.load(std::memory_order_relaxed);
  return cache.release();
}

// This thread's cache, or nullptr once the thread is exiting. Inline: every allocation and free
// asks, and the common case is two loads and a compare (the rest is out of line above).
inline ThreadCache* local_cache() {
  ThreadCache* cache = thread_cache;
  if (cache == nullptr) [[unlikely]] return new_local_cache();
  if (cache->generation != release_generation.load(std::memory_order_relaxed)) [[unlikely]] {
    refresh_local_cache(*cache);
  }
  return cache;
}

[[noreturn]] void fail_cpu_allocation(size_t bytes, Device device, size_t released) {
  const size_t rounded = class_bytes(size_class(bytes));
  throw OutOfMemory(kUnnamedAllocation, device, bytes,
                    fmt::format("{} after releasing {} cached bytes",
                                rounded == bytes ? std::string() : fmt::format(" (rounded to {})", rounded), released));
}

}  // namespace

// What every out-of-memory message tells the user to do.
constexpr std::string_view kOutOfMemoryAdvice =
    "free tensors you no longer need, call release_cached_memory(), or use smaller batches";

OutOfMemory::OutOfMemory(std::string_view op, Device device, size_t bytes, std::string_view reason)
    : ResourceExhausted(fmt::format("{}: out of memory on {}; got a request for {} bytes{}; {}", op, device, bytes,
                                    reason, kOutOfMemoryAdvice)),
      op_(op),
      device_(device),
      bytes_(bytes),
      reason_(reason) {}

void fail_allocation_too_large(size_t bytes, Device device) {
  throw OutOfMemory(kUnnamedAllocation, device, bytes, ", more than any machine has (2^52)");
}

UnnamedSizeError::UnnamedSizeError(const Shape& shape, DType dtype)
    : ShapeError(size_rule_message("empty", shape, dtype)), shape_(shape), dtype_(dtype) {}

void rethrow_naming_op(std::string_view op, Device device) {
  try {
    throw;
  } catch (const OutOfMemory& e) {
    if (e.op() != kUnnamedAllocation) throw;  // a nested op already named itself
    throw OutOfMemory(op, e.device(), e.bytes(), e.reason());
  } catch (const UnnamedSizeError& e) {
    fail_size(op, e.shape(), e.dtype());
  } catch (const std::bad_alloc&) {
    throw ResourceExhausted(fmt::format(
        "{}: out of memory on {}; got std::bad_alloc while the kernel allocated scratch memory; {}", op, device,
        kOutOfMemoryAdvice));
  }
}

DeviceMemoryCounters cpu_memory_counters[kMaxLogicalCpuDevices];
DeviceMemoryCounters cuda_memory_counters[kMaxCudaDevices];

void* cpu_allocate(size_t bytes, Device device) {
  if (bytes > kLargestAllocation) [[unlikely]] fail_allocation_too_large(bytes, device);
  const int cls = size_class(bytes);
  const size_t rounded = class_bytes(cls);
  ThreadCache* cache = rounded <= kLargestThreadCached ? local_cache() : nullptr;
  if (cache) {
    auto& list = cache->free_blocks[cls];
    if (!list.empty()) {
      void* p = list.back();
      list.pop_back();
      cache->add_bytes(-static_cast<int64_t>(rounded));
      return p;
    }
  }
  if (void* p = shared_pool().take(cls)) return p;
  if (void* p = system_allocate(rounded)) [[likely]] return p;
  const size_t released = cpu_release_cached();
  if (void* p = system_allocate(rounded)) return p;
  fail_cpu_allocation(bytes, device, released);
}

void cpu_deallocate(void* pointer, size_t bytes) {
  const int cls = size_class(bytes);
  ThreadCache* cache = class_bytes(cls) <= kLargestThreadCached ? local_cache() : nullptr;
  if (cache) {
    auto& list = cache->free_blocks[cls];
    if (list.size() < kMaxBlocksPerThreadClass) {
      list.push_back(pointer);
      cache->add_bytes(static_cast<int64_t>(class_bytes(cls)));
      return;
    }
  }
  shared_pool().give(pointer, cls);
}

size_t cpu_release_cached() {
  release_generation.fetch_add(1, std::memory_order_relaxed);
  size_t released = shared_pool().release();
  if (ThreadCache* cache = thread_cache) released += refresh_local_cache(*cache);
  return released;
}

int64_t cpu_cached_bytes() {
  auto total = static_cast<int64_t>(shared_pool().cached());
  ThreadCacheRegistry& r = registry();
  std::lock_guard lock(r.mutex);
  for (const ThreadCache* cache : r.caches) total += cache->bytes.load(std::memory_order_relaxed);
  return total;
}

}  // namespace flowlet::detail
