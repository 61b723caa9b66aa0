// The traced-only cross-entropy ops the fuse_cross_entropy_grad pass inserts
// (src/trace/passes/cross_entropy_grad_fusion.cpp, cross_entropy_softmax_sharing.cpp): the gradient of
// softmax_cross_entropy with respect to its logits in one node, from what the loss's gradient rule
// records, g * (softmax(logits) - cast(one_hot(labels, C))); and, where the forward loss is in the
// same graph, the forward writing the softmax once for the gradient to read. Eager code keeps its
// ops. Internal, not in the public op table.
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

// softmax_cross_entropy_grad_from_probs: the same dx from probs = softmax(logits) [N, C] instead of
// the logits (inputs probs, labels, optional g, as above): g * (probs - one_hot(labels, C)), one
// pass without an exp. Fed by softmax_cross_entropy_with_probs's probs, it equals
// softmax_cross_entropy_grad of the same logits bit for bit.
extern Op cross_entropy_grad_from_probs_op;

// softmax_cross_entropy_with_probs: softmax_cross_entropy's loss [N] (the same kernel, the same
// bits) and, as a second output, probs [N, C] = softmax(logits) with the softmax op's bits (f32: the
// exps the loss takes anyway, normalized as softmax_rows_f32 does; f64: softmax_line). Defined in
// src/ops/nn.cpp next to softmax_cross_entropy, whose rule and kernel it shares. No gradient.
extern Op cross_entropy_probs_op;

}  // namespace flowlet::detail
