// Creating tensors: from host values, filled, ranges and seeded random numbers.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "flowlet/core/tensor.hpp"

namespace flowlet {

namespace detail {
// A contiguous tensor holding a copy of `count` host values of `dtype`, with `shape`.
Tensor tensor_from_host(const void* values, size_t count, DType dtype, const Shape& shape, Device device);
}  // namespace detail

// tensor({1.0f, 2.0f}): rank 1, dtype from T (float -> f32, double -> f64, int -> i32, bool -> b8).
template <Element T>
Tensor tensor(std::initializer_list<T> values) {
  std::vector<T> copy(values);
  return detail::tensor_from_host(copy.data(), copy.size(), dtype_of<T>,
                                  Shape{static_cast<int64_t>(copy.size())}, Device());
}
inline Tensor tensor(std::initializer_list<bool> values) {
  std::vector<uint8_t> bytes(values.begin(), values.end());
  return detail::tensor_from_host(bytes.data(), bytes.size(), b8,
                                  Shape{static_cast<int64_t>(bytes.size())}, Device());
}
// tensor(values, Shape{2, 3}): row-major; ShapeError unless values.size() == shape.numel().
template <Element T>
Tensor tensor(const std::vector<T>& values, const Shape& shape) {
  return detail::tensor_from_host(values.data(), values.size(), dtype_of<T>, shape, Device());
}
inline Tensor tensor(const std::vector<bool>& values, const Shape& shape) {
  std::vector<uint8_t> bytes(values.begin(), values.end());
  return detail::tensor_from_host(bytes.data(), bytes.size(), b8, shape, Device());
}
// A rank-0 tensor.
template <Element T>
Tensor scalar(T value) {
  return detail::tensor_from_host(&value, 1, dtype_of<T>, Shape{}, Device());
}
inline Tensor scalar(bool value) {
  uint8_t byte = value ? 1 : 0;
  return detail::tensor_from_host(&byte, 1, b8, Shape{}, Device());
}

Tensor zeros(const Shape& shape, DType dtype = f32, Device device = Device("cpu"));
Tensor ones(const Shape& shape, DType dtype = f32, Device device = Device("cpu"));
// InvalidArgument if `value` is not representable in an integer dtype.
Tensor full(const Shape& shape, double value, DType dtype = f32, Device device = Device("cpu"));
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);

// 0, 1, ..., n-1.
Tensor arange(int64_t n, DType dtype = i64, Device device = Device("cpu"));

// Counter-based (Philox-4x32-10): element i depends only on (seed, i), never on thread count.
Tensor randn(const Shape& shape, uint64_t seed, DType dtype = f32, Device device = Device("cpu"));
// Uniform on [lo, hi).
Tensor uniform(const Shape& shape, double lo, double hi, uint64_t seed, DType dtype = f32,
               Device device = Device("cpu"));

}  // namespace flowlet
