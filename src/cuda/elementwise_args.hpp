// Host side of the elementwise kernels: operands (output first) described for a launch.
#pragma once

#include <array>
#include <string_view>

#include "cuda/kernels/launch.hpp"
#include "flowlet/core/tensor.hpp"

namespace flowlet::detail::cuda {

// The operands broadcast to out's shape with dimensions merged (merge_dimensions). ShapeError
// naming `op` when more than kMaxDims dimensions remain (a view that steps through memory in more
// than eight independent ways; make it contiguous first).
template <size_t N>
ElementwiseArgs elementwise_args(std::string_view op, const Tensor& out, const std::array<const Tensor*, N - 1>& inputs);

}  // namespace flowlet::detail::cuda
