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

// How many devices of a kind this process has (CPU: 1 until logical devices are configured).
int device_count(DeviceKind kind);

// Throws DeviceError naming `op` unless `device` exists in this process.
void check_device_exists(std::string_view op, Device device);

}  // namespace flowlet
