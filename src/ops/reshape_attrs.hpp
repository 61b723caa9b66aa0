// reshape_op's attribute struct (src/ops/shape.cpp), here so that a graph pass can insert a
// reshape node (the conv fusion pass reshapes a per-channel scale to [O, 1, 1, 1]).
#pragma once

#include <string>

#include <fmt/format.h>

#include "flowlet/core/format.hpp"
#include "flowlet/core/tensor.hpp"

namespace flowlet::detail {

struct ReshapeAttrs {
  Shape shape;  // may hold one -1, resolved against the element count
  std::string describe() const { return fmt::format("shape={}", shape); }
};

}  // namespace flowlet::detail
