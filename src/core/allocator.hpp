// The CPU caching allocator: freed blocks are kept by size class and reused, so a hot loop that
// makes new tensors neither calls malloc nor page-faults fresh memory.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "flowlet/core/device.hpp"

namespace flowlet::detail {

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

// Called by Storage for the buffers it allocates and frees (relaxed: counters, not synchronization).
inline void count_allocation(int device_index, size_t bytes) {
  DeviceMemoryCounters& c = cpu_memory_counters[device_index];
  const auto size = static_cast<int64_t>(bytes);
  const int64_t in_use = c.bytes_in_use.fetch_add(size, std::memory_order_relaxed) + size;
  c.allocations.fetch_add(1, std::memory_order_relaxed);
  int64_t peak = c.peak_bytes_in_use.load(std::memory_order_relaxed);
  while (in_use > peak && !c.peak_bytes_in_use.compare_exchange_weak(peak, in_use, std::memory_order_relaxed)) {
  }
}
inline void count_release(int device_index, size_t bytes) {
  cpu_memory_counters[device_index].bytes_in_use.fetch_sub(static_cast<int64_t>(bytes), std::memory_order_relaxed);
}

}  // namespace flowlet::detail
