// The Op of each row of kernels/elementwise_functors.hpp, and the row of an Op: how a device
// backend attaches kernels to the elementwise ops and finds the functor for an OpCall.
#pragma once

#include <optional>

#include "flowlet/op.hpp"
#include "kernels/elementwise_functors.hpp"

namespace flowlet::detail {

Op& elementwise_op(ElementwiseOp id);
// The row `op` was built from; nullopt for an op outside the list.
std::optional<ElementwiseOp> elementwise_op_id(const Op& op);

}  // namespace flowlet::detail
