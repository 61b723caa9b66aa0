// Storage: one device buffer shared by every tensor view of it, returned to its allocator when the last view dies.
#pragma once

#include <cstddef>
#include <memory>

#include "flowlet/core/device.hpp"
#include "flowlet/core/ref.hpp"

namespace flowlet {

class Storage final : public RefCounted {
 public:
  // Allocates `bytes` on `device` through that device's caching allocator.
  Storage(size_t bytes, Device device);
  // Memory owned by someone else (an xtensor array, a mapped file): `owner` keeps it alive and
  // is released with the last view.
  Storage(void* data, size_t bytes, Device device, std::shared_ptr<void> owner);
  ~Storage();
  static void* operator new(size_t bytes);  // pooled per thread, like TensorImpl
  static void operator delete(void* pointer);

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  static void* allocate_on_backend(size_t bytes, Device device);

  void* data_;
  size_t bytes_;
  Device device_;
  std::shared_ptr<void> owner_;
};

}  // namespace flowlet
