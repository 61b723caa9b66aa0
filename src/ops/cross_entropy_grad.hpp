// softmax_cross_entropy_grad: the gradient of softmax_cross_entropy with respect to its logits in
// one node, made by the fuse_cross_entropy_grad pass (src/trace/passes/cross_entropy_grad_fusion.cpp)
// from what the loss's gradient rule records, g * (softmax(logits) - cast(one_hot(labels, C))); eager
// code keeps its ops. Internal, not in the public op table.
#pragma once

#include "flowlet/op.hpp"

namespace flowlet::detail {

// Inputs logits [N, C] (f32 or f64, any strides), labels [N] (i32 or i64, each in [0, C)) and,
// optionally, the loss's incoming gradient g [N, 1] in the logits' dtype (absent: 1, where the
// pass found no mul). Output dx [N, C] = g * (softmax(logits) - one_hot(labels, C)): one node and one pass where eager runs one_hot, (cast), softmax, sub and
// mul, each a pass over [N, C]. The softmax is the softmax op's own arithmetic
// (src/ops/softmax_line.hpp: f32 rows with the vectorized exp, f64 lines with libm), so the result
// equals eager's bit for bit. A label outside [0, C) throws OutOfRange naming the op. No gradient: the
// pass runs after gradients were recorded.
extern Op cross_entropy_grad_op;

}  // namespace flowlet::detail
