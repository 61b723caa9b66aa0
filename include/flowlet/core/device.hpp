// Device: where a tensor lives and an op runs ("cpu", "cpu:1", "cuda:0").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace flowlet {

enum class DeviceKind : uint8_t { cpu, cuda };
inline constexpr int kNumDeviceKinds = 2;

// Device("cpu"), Device("cpu:1"), Device("cuda:0"). Parsing checks the syntax and throws DeviceError
// on anything else; whether the device exists is checked when it is used.
class Device {
 public:
  Device() = default;  // cpu:0
  Device(DeviceKind kind, int index) : kind_(kind), index_(index) {}
  explicit Device(std::string_view spec);
  Device(const char* spec) : Device(std::string_view(spec)) {}  // NOLINT: "cpu" reads naturally

  DeviceKind kind() const { return kind_; }
  int index() const { return index_; }
  std::string str() const;  // "cpu:0"

  friend bool operator==(Device a, Device b) { return a.kind_ == b.kind_ && a.index_ == b.index_; }

 private:
  DeviceKind kind_ = DeviceKind::cpu;
  int index_ = 0;
};

std::string_view device_kind_name(DeviceKind kind);

// How many devices of a kind this process has (CPU: 1 until logical devices are configured; CUDA:
// the GPUs visible, 0 without a GPU, a driver, or a build with CUDA).
int device_count(DeviceKind kind);

// Throws DeviceError naming `op` unless `device` exists in this process.
void check_device_exists(std::string_view op, Device device);

// The most logical CPU devices a process may configure.
inline constexpr int kMaxLogicalCpuDevices = 64;

// Splits the CPU into n logical devices cpu:0 .. cpu:n-1 (one memory and one thread pool, but
// separate devices for placement, accounting and copies), so that multi-device code runs and is
// tested without GPUs:
//   set_logical_cpu_devices(4);                  // first thing in main()
//   Tensor a = ones({8}).to(Device("cpu:3"));
// InvalidArgument unless 1 <= n <= kMaxLogicalCpuDevices, and when n differs from the current
// count after a device other than cpu:0 was used (a tensor allocated or an op run there). The
// same n again is a no-op. Thread-safe.
void set_logical_cpu_devices(int n);

// Memory that tensors hold on one device, counted at the bytes each storage asked for. Storage
// owned by someone else (an adopted xtensor array) is not counted.
struct DeviceMemoryStats {
  int64_t bytes_in_use = 0;       // held by live storages now
  int64_t peak_bytes_in_use = 0;  // the most ever held at once (since the last reset)
  int64_t allocations = 0;        // storages allocated so far
  // Freed blocks the device's caching allocator keeps for reuse: memory the process holds beyond
  // bytes_in_use until release_cached_memory() returns it. Every logical CPU device shares one
  // allocator, so each reports the same figure.
  int64_t bytes_cached = 0;
};

// DeviceError unless `device` exists. Reading never blocks allocation (relaxed counters).
DeviceMemoryStats memory_stats(Device device);
// Sets the peak to the bytes in use now.
void reset_peak_memory_stats(Device device);

// Returns the freed blocks that the caching allocators keep for reuse to the system, on every
// device: after the last tensor is gone, memory_stats(d).bytes_cached drops to what other threads
// still cache (each thread's cache of small blocks is released at that thread's next allocation).
// Allocators also do this by themselves, and retry, before they report ResourceExhausted.
//   release_cached_memory();
// Thread-safe. Waits for the work queued on CUDA devices whose caches hold blocks.
void release_cached_memory();

// Waits until every op already issued on `device` has finished. Ops on a CUDA device return as soon
// as their kernels are queued (reading a result, item() or to(cpu), waits by itself); timing code
// calls this before reading the clock. Returns at once for CPU devices. DeviceError when the device
// does not exist or a queued kernel failed.
void synchronize(Device device);

}  // namespace flowlet
