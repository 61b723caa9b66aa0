// The dropout op (src/ops/conv_attrs.hpp: x and the i64 [2] state (seed, offset) -> y) for
// src/state/random.cpp, which owns the public dropout() and the Generator whose state it reads.
#pragma once

#include "flowlet/core/tensor.hpp"

namespace flowlet::detail {

// y = x * mask / (1 - rate), the mask drawn from `state` = (seed, offset) as
// src/kernels/dropout_mask.hpp maps it. Checks x (floating), state (i64 [2], x's device) and rate
// (0 <= rate < 1) and throws InvalidArgument / DTypeError / ShapeError naming "dropout".
Tensor dropout_with_state(const Tensor& x, const Tensor& state, double rate);

// InvalidArgument unless 0 <= rate < 1 (NaN included): the check dropout() makes before anything else.
void check_dropout_rate(double rate);

}  // namespace flowlet::detail
