// The Op values that passes recognise by identity (their address), never by name: a pass that
// rewrites a pattern of particular ops declares what it needs here.
#pragma once

#include "flowlet/op.hpp"

namespace flowlet::detail {

extern Op matmul_op;   // src/ops/linalg.cpp (fuse_variable_updates absorbs it into assign_matmul)
extern Op reshape_op;  // src/ops/shape.cpp (simplify_algebra merges and drops reshapes)
extern Op permute_op;  // src/ops/shape.cpp (simplify_algebra cancels inverse permutations)
extern Op cast_op;     // src/ops/elementwise.cpp (simplify_algebra drops casts to the same dtype)
// The elementwise ops (add, mul, neg, ...) are elementwise_op(ElementwiseOp::add) etc.: ops/elementwise_ops.hpp.

}  // namespace flowlet::detail
