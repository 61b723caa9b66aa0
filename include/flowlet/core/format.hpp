// fmt formatters for Shape, DType, Device and Tensor: fmt::format("{}", t).
#pragma once

#include <string>

#include <fmt/core.h>

#include "flowlet/core/device.hpp"
#include "flowlet/core/dtype.hpp"
#include "flowlet/core/shape.hpp"
#include "flowlet/core/tensor.hpp"

namespace flowlet {
// "tensor([[1, 2],\n        [3, 4]], shape=[2, 2], dtype=f32)" (one row per line); large tensors show the first and last three
// entries of each dimension around "...".
std::string to_string(const Tensor& t);
}  // namespace flowlet

namespace flowlet::detail {
// Formats any value that has a string form, ignoring format specs.
template <class T, auto to_text>
struct TextFormatter {
  constexpr auto parse(fmt::format_parse_context& ctx) { return ctx.begin(); }
  template <class Context>
  auto format(const T& value, Context& ctx) const {
    return fmt::format_to(ctx.out(), "{}", to_text(value));
  }
};
inline std::string shape_text(const Shape& s) { return s.str(); }
inline std::string_view dtype_text(DType d) { return dtype_name(d); }
inline std::string device_text(const Device& d) { return d.str(); }
inline std::string tensor_text(const Tensor& t) { return to_string(t); }
}  // namespace flowlet::detail

template <>
struct fmt::formatter<flowlet::Shape> : flowlet::detail::TextFormatter<flowlet::Shape, flowlet::detail::shape_text> {};
template <>
struct fmt::formatter<flowlet::DType> : flowlet::detail::TextFormatter<flowlet::DType, flowlet::detail::dtype_text> {};
template <>
struct fmt::formatter<flowlet::Device>
    : flowlet::detail::TextFormatter<flowlet::Device, flowlet::detail::device_text> {};
template <>
struct fmt::formatter<flowlet::Tensor>
    : flowlet::detail::TextFormatter<flowlet::Tensor, flowlet::detail::tensor_text> {};
