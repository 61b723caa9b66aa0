// Shape helpers that gradient rules share, written with public ops (so they differentiate too).
#pragma once

#include <vector>

#include "flowlet/ops/creation.hpp"
#include "flowlet/ops/elementwise.hpp"
#include "flowlet/ops/reduce.hpp"
#include "flowlet/ops/shape.hpp"

namespace flowlet::detail {

// Sums g over the dimensions that broadcasting added or stretched, so it has `shape` again.
inline Tensor unbroadcast(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  std::vector<int64_t> axes;
  const size_t lead = g.shape().size() - shape.size();
  for (size_t d = 0; d < g.shape().size(); ++d) {
    if (d < lead || (shape[d - lead] == 1 && g.shape()[d] != 1)) axes.push_back(static_cast<int64_t>(d));
  }
  return reshape(axes.empty() ? g : sum(g, axes, /*keepdims=*/true), shape);
}

// g repeated to `shape` (g's shape broadcasts to it).
inline Tensor expand(const Tensor& g, const Shape& shape) {
  return g.shape() == shape ? g : g + zeros(shape, g.dtype(), g.device());
}

// A zero of g's dtype, broadcastable anywhere.
inline Tensor zero_like_scalar(const Tensor& g) { return zeros(Shape{}, g.dtype(), g.device()); }

}  // namespace flowlet::detail
