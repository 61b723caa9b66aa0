// Device parsing, names and the table of devices this process has.
#include <charconv>

#include "core/check.hpp"

namespace flowlet {

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
        "device: unknown device '{}'; expected 'cpu', 'cpu:N', 'cuda' or 'cuda:N'", spec);
  }
  index_ = 0;
  if (colon != std::string_view::npos) {
    const std::string_view digits = spec.substr(colon + 1);
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), index_);
    if (digits.empty() || error != std::errc() || end != digits.data() + digits.size() || index_ < 0) {
      detail::fail<DeviceError>("device: bad device index in '{}'; expected a number >= 0", spec);
    }
  }
}

std::string Device::str() const { return fmt::format("{}:{}", device_kind_name(kind_), index_); }

int device_count(DeviceKind kind) { return kind == DeviceKind::cpu ? 1 : 0; }

void check_device_exists(std::string_view op, Device device) {
  if (device.kind() == DeviceKind::cpu && device.index() == 0) return;  // the hot path
  const int count = device_count(device.kind());
  if (device.index() >= count) {
    if (count == 0) {
      detail::fail<DeviceError>("{}: device {} does not exist; this process has no {} devices", op, device,
                                device_kind_name(device.kind()));
    }
    detail::fail<DeviceError>("{}: device {} does not exist; available: {}:0 .. {}:{}", op, device,
                              device_kind_name(device.kind()), device_kind_name(device.kind()), count - 1);
  }
}

}  // namespace flowlet
