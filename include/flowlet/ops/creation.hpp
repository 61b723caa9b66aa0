// Creating tensors: from host values, filled, ranges and seeded random numbers.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "flowlet/core/tensor.hpp"
#include "flowlet/device_scope.hpp"

namespace flowlet {

namespace detail {
// A contiguous tensor holding a copy of `count` host values of `dtype`, with `shape`.
Tensor tensor_from_host(const void* values, size_t count, DType dtype, const Shape& shape, Device device);
}  // namespace detail

// Every function here without a device argument, and every default device, is default_device():
// the innermost DeviceScope's device in eager code, else cpu:0.

// tensor({1.0f, 2.0f}): rank 1, dtype from T (float -> f32, double -> f64, int -> i32, bool -> b8).
template <Element T>
Tensor tensor(std::initializer_list<T> values) {
  std::vector<T> copy(values);
  return detail::tensor_from_host(copy.data(), copy.size(), dtype_of<T>,
                                  Shape{static_cast<int64_t>(copy.size())}, default_device());
}
inline Tensor tensor(std::initializer_list<bool> values) {
  std::vector<uint8_t> bytes(values.begin(), values.end());
  return detail::tensor_from_host(bytes.data(), bytes.size(), b8,
                                  Shape{static_cast<int64_t>(bytes.size())}, default_device());
}
// tensor(values, Shape{2, 3}): row-major; ShapeError unless values.size() == shape.numel().
template <Element T>
Tensor tensor(const std::vector<T>& values, const Shape& shape) {
  return detail::tensor_from_host(values.data(), values.size(), dtype_of<T>, shape, default_device());
}
inline Tensor tensor(const std::vector<bool>& values, const Shape& shape) {
  std::vector<uint8_t> bytes(values.begin(), values.end());
  return detail::tensor_from_host(bytes.data(), bytes.size(), b8, shape, default_device());
}
// A rank-0 tensor.
template <Element T>
Tensor scalar(T value) {
  return detail::tensor_from_host(&value, 1, dtype_of<T>, Shape{}, default_device());
}
inline Tensor scalar(bool value) {
  uint8_t byte = value ? 1 : 0;
  return detail::tensor_from_host(&byte, 1, b8, Shape{}, default_device());
}

Tensor zeros(const Shape& shape, DType dtype = f32, Device device = default_device());
Tensor ones(const Shape& shape, DType dtype = f32, Device device = default_device());
// InvalidArgument if `value` is not representable in an integer dtype.
Tensor full(const Shape& shape, double value, DType dtype = f32, Device device = default_device());
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);

// 0, 1, ..., n-1.
Tensor arange(int64_t n, DType dtype = i64, Device device = default_device());

// Counter-based (Philox-4x32-10): element i depends only on (seed, i), never on thread count.
Tensor randn(const Shape& shape, uint64_t seed, DType dtype = f32, Device device = default_device());
// Uniform on [lo, hi).
Tensor uniform(const Shape& shape, double lo, double hi, uint64_t seed, DType dtype = f32,
               Device device = default_device());

}  // namespace flowlet
