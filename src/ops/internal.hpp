// Library-internal entry points that back Tensor's methods (contiguous, to).
#pragma once

#include <cstring>

#include "flowlet/core/half.hpp"
#include "flowlet/core/tensor.hpp"

namespace flowlet::detail {

Tensor copy_to_contiguous(const Tensor& t);
Tensor copy_to_device(const Tensor& t, Device device);

// Address of element `index` (row-major order) of a host tensor, which may be a strided view.
const char* element_address(const Tensor& t, int64_t index);

// f(value) for element `index` of a host tensor, the value as its C++ type (bool for b8, float
// for f16 and bf16), for code that inspects a few elements (graph dumps, the algebraic pass).
template <class F>
auto visit_element(const Tensor& t, int64_t index, F f) {
  const char* at = element_address(t, index);
  auto read = [at]<class T>(T) {
    T value;
    std::memcpy(&value, at, sizeof(T));
    return value;
  };
  switch (t.dtype()) {
    case DType::f32: return f(read(float{}));
    case DType::f64: return f(read(double{}));
    case DType::i32: return f(read(int32_t{}));
    case DType::i64: return f(read(int64_t{}));
    case DType::u8: return f(read(uint8_t{}));
    case DType::b8: return f(read(uint8_t{}) != 0);
    case DType::f16: return f(static_cast<float>(read(f16_t{})));
    case DType::bf16: return f(static_cast<float>(read(bf16_t{})));
  }
  return f(false);  // unreachable: every dtype is listed
}

}  // namespace flowlet::detail
