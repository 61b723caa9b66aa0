// The CPU caching allocator and the per-device memory counters: freed blocks are kept by size class and reused, so a hot loop that
// makes new tensors neither calls malloc nor page-faults fresh memory.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "flowlet/core/device.hpp"
#include "flowlet/core/dtype.hpp"
#include "flowlet/core/error.hpp"
#include "flowlet/core/shape.hpp"

namespace flowlet::detail {

// Size classes shared by the CPU and device caching allocators: at least kMinBlock bytes, then
// four classes per power of two, so a block is never more than 25% larger than asked for.
inline constexpr size_t kMinBlock = 64;
inline constexpr int kNumClasses = 4 * 48;  // covers every size up to 2^53 bytes
int size_class(size_t bytes);
size_t class_bytes(int cls);

// The ResourceExhausted that allocators throw: "<op>: out of memory on <device>; got a request for
// <bytes> bytes<reason>; ...". Allocators do not know which op asked and say "storage"; the
// dispatcher re-throws it under the op's name (rethrow_naming_op).
class OutOfMemory : public ResourceExhausted {
 public:
  OutOfMemory(std::string_view op, Device device, size_t bytes, std::string_view reason);
  const std::string& op() const { return op_; }
  Device device() const { return device_; }
  size_t bytes() const { return bytes_; }
  const std::string& reason() const { return reason_; }

 private:
  std::string op_;
  Device device_;
  size_t bytes_;
  std::string reason_;
};
inline constexpr std::string_view kUnnamedAllocation = "storage";

// The text of fail_size (check.hpp) for `op`; UnnamedSizeError says the same with op "empty".
std::string size_rule_message(std::string_view op, const Shape& shape, DType dtype);

// The ShapeError Tensor::empty throws for a shape that breaks the size rule (check.hpp). It knows
// no op and says "empty"; the dispatcher re-throws it under the op's name (rethrow_naming_op), so
// an eager op's outputs are checked once, by the allocation itself.
class UnnamedSizeError : public ShapeError {
 public:
  UnnamedSizeError(const Shape& shape, DType dtype);
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }

 private:
  Shape shape_;
  DType dtype_;
};

// Called from a catch block while `op` allocates its outputs or runs its kernel on `device`:
// re-throws an OutOfMemory from an allocator or an UnnamedSizeError from Tensor::empty under the
// op's name and turns std::bad_alloc (a kernel's own scratch memory) into ResourceExhausted;
// re-throws anything else unchanged.
[[noreturn]] void rethrow_naming_op(std::string_view op, Device device);

// The largest request any allocator tries: beyond any machine, and the size classes end there.
inline constexpr size_t kLargestAllocation = size_t{1} << 52;
// OutOfMemory for a request above kLargestAllocation, which no allocator tries.
[[noreturn]] void fail_allocation_too_large(size_t bytes, Device device);

// 64-byte aligned; never nullptr. When the system has no memory left, releases every cached block
// and tries once more; OutOfMemory naming `device` when that fails too.
void* cpu_allocate(size_t bytes, Device device);
void cpu_deallocate(void* pointer, size_t bytes);
// Frees every block the CPU allocator caches: the shared pool's and the calling thread's now,
// other threads' at their next allocation or free (a thread's cache is its own, without locks).
// Returns the bytes freed now. Thread-safe.
size_t cpu_release_cached();
// Bytes in cached CPU blocks, all threads together (a relaxed sum: exact when no thread allocates).
int64_t cpu_cached_bytes();

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
