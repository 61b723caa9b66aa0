// Tensor handles: allocation, views, host reads, and the methods that forward to ops.
#include "flowlet/core/tensor.hpp"

#include <cstring>

#include "core/allocator.hpp"
#include "core/check.hpp"
#include "flowlet/ops/elementwise.hpp"
#include "ops/internal.hpp"

namespace flowlet {

Storage::Storage(size_t bytes, Device device) : bytes_(bytes), device_(device) {
  if (device.kind() != DeviceKind::cpu) {
    detail::fail<DeviceError>("storage: no allocator for device {}", device);
  }
  data_ = detail::cpu_allocate(bytes);
}

Storage::Storage(void* data, size_t bytes, Device device, std::shared_ptr<void> owner)
    : data_(data), bytes_(bytes), device_(device), owner_(std::move(owner)) {}

Storage::~Storage() {
  if (!owner_) detail::cpu_deallocate(data_, bytes_);
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  auto impl = make_ref<detail::TensorImpl>();
  impl->strides = contiguous_strides(shape);
  impl->shape = shape;
  impl->dtype = dtype;
  impl->storage = make_ref<Storage>(static_cast<size_t>(shape.numel()) * dtype_size(dtype), device);
  return Tensor(std::move(impl));
}

Tensor Tensor::view(Ref<Storage> storage, Shape shape, Strides strides, int64_t offset, DType dtype) {
  auto impl = make_ref<detail::TensorImpl>();
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = dtype;
  impl->storage = std::move(storage);
  return Tensor(std::move(impl));
}

bool Tensor::is_contiguous() const {
  const auto& s = shape();
  const auto& st = strides();
  int64_t expected = 1;
  for (size_t i = s.size(); i-- > 0;) {
    if (s[i] == 1) continue;  // the stride of a size-1 dimension never matters
    if (s[i] == 0) return true;  // no elements: any layout is contiguous
    if (st[i] != expected) return false;
    expected *= s[i];
  }
  return true;
}

void Tensor::throw_undefined() {
  throw InvalidArgument("tensor: this is an empty Tensor handle (default-constructed); assign a tensor first");
}

void Tensor::check_element_type(DType requested, const char* op) const {
  if (requested != dtype()) {
    detail::fail<DTypeError>("{}: element type does not match the tensor; got {} requested for a {} tensor", op,
                             requested, dtype());
  }
}

void Tensor::check_single_element() const {
  if (numel() != 1) {
    detail::fail<InvalidArgument>("item: tensor must have exactly one element; got shape {} ({} elements)", shape(),
                                  numel());
  }
}

void Tensor::copy_to_host(void* destination, const char*) const {
  const Tensor host = device().kind() == DeviceKind::cpu ? contiguous() : to(Device("cpu")).contiguous();
  std::memcpy(destination, host.raw_data(), static_cast<size_t>(numel()) * dtype_size(dtype()));
}

Tensor Tensor::to(Device target) const { return detail::copy_to_device(*this, target); }

Tensor Tensor::astype(DType target) const { return cast(*this, target); }

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : detail::copy_to_contiguous(*this); }

}  // namespace flowlet
