// Neural-network building blocks: one_hot, softmax, log_softmax, fused softmax cross-entropy.
#pragma once

#include <cstdint>

#include "flowlet/core/tensor.hpp"

namespace flowlet {

// f32 [indices.shape..., depth]; an index outside [0, depth) throws OutOfRange.
Tensor one_hot(const Tensor& indices, int64_t depth);

// Numerically stable (the maximum is subtracted first). f32 or f64: cast f16/bf16 up first,
// e.g. softmax(cast(x, f32)); the gradient returns through the cast in the half dtype.
Tensor softmax(const Tensor& t, int64_t axis = -1);
Tensor log_softmax(const Tensor& t, int64_t axis = -1);

// Per-example loss -log_softmax(logits)[i, labels[i]]: logits [N, C] f32 or f64 (half logits: pass
// cast(logits, f32)), labels [N] i64 (or i32) in [0, C) (OutOfRange otherwise). Returns [N] in the
// logits' dtype.
Tensor softmax_cross_entropy(const Tensor& logits, const Tensor& labels);

}  // namespace flowlet
