// Internal helpers for argument checks: throw an Error subclass with a formatted message.
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "flowlet/core/dtype.hpp"
#include "flowlet/core/error.hpp"
#include "flowlet/core/format.hpp"

namespace flowlet::detail {

// fail<ShapeError>("{}: inner dimensions differ; got a {} and b {}", op, a, b)
template <class E, class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw E(fmt::format(format, std::forward<Args>(args)...));
}

// ShapeError unless every dimension is >= 0 and the element count fits int64.
void check_shape(std::string_view op, const Shape& shape);

// The size rule every tensor obeys: ShapeError unless every dimension is >= 0 and the product of
// the non-zero dimensions times the item size fits int64. Zero dimensions are left out so that the
// rule does not depend on where a zero sits ([0, 2^62, 4] and [2^62, 4, 0] are both rejected):
// strides and byte offsets of a shape are products of its non-zero dimensions and must stay exact.
// Under the rule numel, strides and byte counts never overflow. The dispatcher applies it to every
// inferred output, so an op's shape rule need not; Tensor::empty applies it too.
[[noreturn]] void fail_size(std::string_view op, const Shape& shape, DType dtype);
inline void check_size(std::string_view op, const Shape& shape, DType dtype) {
  int64_t bytes = static_cast<int64_t>(dtype_size(dtype));
  for (int64_t d : shape) {
    if (d <= 0) {
      if (d < 0) [[unlikely]] fail_size(op, shape, dtype);
      continue;
    }
    if (__builtin_mul_overflow(bytes, d, &bytes)) [[unlikely]] fail_size(op, shape, dtype);
  }
}

// Maps a possibly negative axis into [0, rank); InvalidArgument when out of range.
int64_t normalize_axis(std::string_view op, int64_t axis, int64_t rank);

}  // namespace flowlet::detail
