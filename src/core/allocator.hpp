// The CPU caching allocator and the per-device memory counters: freed blocks are kept by size class and reused, so a hot loop that
// makes new tensors neither calls malloc nor page-faults fresh memory.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "flowlet/core/device.hpp"

namespace flowlet::detail {

// Size classes shared by the CPU and device caching allocators: at least kMinBlock bytes, then
// four classes per power of two, so a block is never more than 25% larger than asked for.
inline constexpr size_t kMinBlock = 64;
inline constexpr int kNumClasses = 4 * 48;  // covers every size up to 2^53 bytes
int size_class(size_t bytes);
size_t class_bytes(int cls);

// 64-byte aligned. Never returns nullptr (throws std::bad_alloc).
void* cpu_allocate(size_t bytes);
void cpu_deallocate(void* pointer, size_t bytes);

// Bytes that storages hold on one logical CPU device (memory_stats reads them). Every logical
// device shares the allocator above; only the accounting is per device. One cache line each, so
// threads allocating on different devices do not contend.
struct alignas(64) DeviceMemoryCounters {
  std::atomic<int64_t> bytes_in_use{0};
  std::atomic<int64_t> peak_bytes_in_use{0};
  std::atomic<int64_t> allocations{0};
};
// Entry i counts cpu:i. Constant-initialized: storages freed during static destruction still count.
extern DeviceMemoryCounters cpu_memory_counters[kMaxLogicalCpuDevices];

// The most CUDA devices a process uses (device_count(cuda) never reports more).
inline constexpr int kMaxCudaDevices = 16;
// Entry i counts cuda:i (the CUDA caching allocator lives in src/cuda).
extern DeviceMemoryCounters cuda_memory_counters[kMaxCudaDevices];

inline DeviceMemoryCounters& memory_counters(Device device) {
  return device.kind() == DeviceKind::cpu ? cpu_memory_counters[device.index()] : cuda_memory_counters[device.index()];
}

// Called by Storage for the buffers it allocates and frees (relaxed: counters, not synchronization).
inline void count_allocation(DeviceMemoryCounters& c, size_t bytes) {
  const auto size = static_cast<int64_t>(bytes);
  const int64_t in_use = c.bytes_in_use.fetch_add(size, std::memory_order_relaxed) + size;
  c.allocations.fetch_add(1, std::memory_order_relaxed);
  int64_t peak = c.peak_bytes_in_use.load(std::memory_order_relaxed);
  while (in_use > peak && !c.peak_bytes_in_use.compare_exchange_weak(peak, in_use, std::memory_order_relaxed)) {
  }
}
inline void count_release(DeviceMemoryCounters& c, size_t bytes) {
  c.bytes_in_use.fetch_sub(static_cast<int64_t>(bytes), std::memory_order_relaxed);
}
inline void count_allocation(int cpu_index, size_t bytes) { count_allocation(cpu_memory_counters[cpu_index], bytes); }
inline void count_release(int cpu_index, size_t bytes) { count_release(cpu_memory_counters[cpu_index], bytes); }

}  // namespace flowlet::detail
