// Internal helpers for argument checks: throw an Error subclass with a formatted message.
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>

#include <fmt/format.h>

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

// Maps a possibly negative axis into [0, rank); InvalidArgument when out of range.
int64_t normalize_axis(std::string_view op, int64_t axis, int64_t rank);

}  // namespace flowlet::detail
