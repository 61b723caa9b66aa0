// Device parsing, names, the table of devices this process has (logical CPU devices) and their
// memory statistics.
#include <algorithm>
#include <atomic>
#include <charconv>

#include "core/allocator.hpp"
#include "core/backend.hpp"
#include "core/check.hpp"
#include "core/user_text.hpp"

namespace flowlet {
namespace {

// The logical CPU device count in the low bits, and kCpuDevicesUsed once a device other than
// cpu:0 has been used: from then on the count is fixed. One word, so that "check the count and
// mark it used" and "change the count unless used" cannot interleave.
constexpr uint32_t kCpuDevicesUsed = uint32_t{1} << 31;
std::atomic<uint32_t> cpu_devices{1};

int cpu_device_count(uint32_t state) { return static_cast<int>(state & ~kCpuDevicesUsed); }

}  // namespace

std::string_view device_kind_name(DeviceKind kind) { return kind == DeviceKind::cpu ? "cpu" : "cuda"; }

Device::Device(std::string_view spec) {
  const auto colon = spec.find(':');
  const std::string_view kind = spec.substr(0, colon);
  if (kind == "cpu") {
    kind_ = DeviceKind::cpu;
  } else if (kind == "cuda") {
    kind_ = DeviceKind::cuda;
  } else {
    detail::fail<DeviceError>(
        "device: unknown device '{}'; expected 'cpu', 'cpu:N', 'cuda' or 'cuda:N'", detail::excerpt(spec));
  }
  index_ = 0;
  if (colon != std::string_view::npos) {
    const std::string_view digits = spec.substr(colon + 1);
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), index_);
    if (digits.empty() || error != std::errc() || end != digits.data() + digits.size() || index_ < 0) {
      detail::fail<DeviceError>("device: bad device index in '{}'; expected a number >= 0", detail::excerpt(spec));
    }
  }
}

std::string Device::str() const { return fmt::format("{}:{}", device_kind_name(kind_), index_); }

int device_count(DeviceKind kind) {
  if (kind == DeviceKind::cpu) return cpu_device_count(cpu_devices.load(std::memory_order_acquire));
  return std::min(detail::backend(kind).device_count(), detail::kMaxCudaDevices);
}

void check_device_exists(std::string_view op, Device device) {
  if (device.kind() == DeviceKind::cpu && device.index() == 0) return;  // the hot path
  int count = 0;
  if (device.kind() == DeviceKind::cpu) {
    // Marks the count as used, but only if it is still the count this check passed against.
    uint32_t state = cpu_devices.load(std::memory_order_acquire);
    while (device.index() >= 0 && device.index() < cpu_device_count(state) && (state & kCpuDevicesUsed) == 0 &&
           !cpu_devices.compare_exchange_weak(state, state | kCpuDevicesUsed, std::memory_order_acq_rel)) {
    }
    count = cpu_device_count(state);
  } else {
    count = device_count(device.kind());
  }
  if (device.index() < 0 || device.index() >= count) {
    if (count == 0) {
      detail::fail<DeviceError>("{}: device {} does not exist; this process has no {} devices ({})", op, device,
                                device_kind_name(device.kind()), detail::backend(device.kind()).why_no_devices());
    }
    detail::fail<DeviceError>("{}: device {} does not exist; available: {}:0 .. {}:{}", op, device,
                              device_kind_name(device.kind()), device_kind_name(device.kind()), count - 1);
  }
}

void set_logical_cpu_devices(int n) {
  if (n < 1 || n > kMaxLogicalCpuDevices) {
    detail::fail<InvalidArgument>("set_logical_cpu_devices: need 1 <= n <= {}; got {}", kMaxLogicalCpuDevices, n);
  }
  uint32_t state = cpu_devices.load(std::memory_order_acquire);
  for (;;) {
    if (cpu_device_count(state) == n) return;
    if ((state & kCpuDevicesUsed) != 0) {
      detail::fail<InvalidArgument>(
          "set_logical_cpu_devices: must be called before first use of a logical CPU device; got n = {} while "
          "cpu:0 .. cpu:{} are in use; call it once, at the start of the program",
          n, cpu_device_count(state) - 1);
    }
    if (cpu_devices.compare_exchange_weak(state, static_cast<uint32_t>(n), std::memory_order_acq_rel)) return;
  }
}

DeviceMemoryStats memory_stats(Device device) {
  check_device_exists("memory_stats", device);
  const detail::DeviceMemoryCounters& c = detail::memory_counters(device);
  const int64_t cached = device.kind() == DeviceKind::cpu ? detail::cpu_cached_bytes()
                                                          : detail::backend(device.kind()).cached_bytes(device.index());
  return {c.bytes_in_use.load(std::memory_order_relaxed), c.peak_bytes_in_use.load(std::memory_order_relaxed),
          c.allocations.load(std::memory_order_relaxed), cached};
}

void release_cached_memory() {
  detail::cpu_release_cached();
  const detail::DeviceBackend& cuda = detail::backend(DeviceKind::cuda);
  for (int index = 0; index < cuda.device_count(); ++index) {
    if (cuda.cached_bytes(index) > 0) cuda.release_cached(index);  // leaves devices never used untouched
  }
}

void reset_peak_memory_stats(Device device) {
  check_device_exists("reset_peak_memory_stats", device);
  detail::DeviceMemoryCounters& c = detail::memory_counters(device);
  c.peak_bytes_in_use.store(c.bytes_in_use.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

void synchronize(Device device) {
  check_device_exists("synchronize", device);
  if (device.kind() != DeviceKind::cpu) detail::backend(device.kind()).synchronize(device.index());
}

}  // namespace flowlet
