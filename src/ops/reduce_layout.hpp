// How a reduction sees its input, shared by the CPU kernels (src/ops/reduce.cpp) and the CUDA ones:
// the checked axes, the output shape, and the input as a contiguous [outer, reduced, inner] block.
#pragma once

#include <string_view>
#include <vector>

#include "flowlet/core/tensor.hpp"
#include "ops/attributes.hpp"

namespace flowlet::detail {

// The reduced axes, sorted and checked (InvalidArgument on out-of-range or repeated axes).
std::vector<int64_t> reduced_axes(std::string_view op, const Tensor& t, const ReduceAttrs& a);

// t's shape without the reduced axes (or with them as 1 when keepdims).
Shape reduced_shape(const Tensor& t, const std::vector<int64_t>& axes, bool keepdims);

// The input as a contiguous [outer, reduced, inner] block: no copy when the reduced axes are
// adjacent and t is contiguous, else one copy (with public ops, so it runs on t's device).
struct Blocked {
  Tensor data;
  int64_t outer = 1, reduced = 1, inner = 1;
};
Blocked block_input(const Tensor& t, const std::vector<int64_t>& axes);

}  // namespace flowlet::detail
