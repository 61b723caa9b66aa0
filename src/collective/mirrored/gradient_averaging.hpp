// Gradient averaging for Optimizer::apply inside MirroredStrategy::run: each replica's gradients
// become their weighted sum over every replica, sum_r (rows_r / B) g_r, all-reduced in buckets
// (an all_reduce mean when every replica has B / R rows; a replica with 0 rows contributes zeros).
//
// Buckets: the gradients in reverse order (the order backward produces them: last layer first),
// flattened and concatenated until a bucket holds about MirroredOptions::bucket_bytes (a larger
// gradient is a bucket of its own; a change of dtype starts a new one), one all_reduce per bucket,
// split back into the gradients' shapes. In a traced step each bucket's all_reduce node depends only
// on its own gradients, so the executor starts it as soon as they exist, while the rest of the
// backward pass still computes.
#pragma once

#include <string>
#include <vector>

#include "flowlet/core/tensor.hpp"

namespace flowlet::detail {

// The averaged gradients (empty handles stay empty; every replica must pass gradients of the same
// shapes, dtypes and definedness, which the collectives check). Call inside a replica only.
std::vector<Tensor> average_gradients(const std::vector<Tensor>& grads);

// The same, and `completed`: an i64 scalar 1 computed from the last bucket's all-reduce result (so
// it exists only once every replica's all-reduces succeeded), or an empty handle when nothing was
// all-reduced. The optimizer adds it to its step counter: a step in which a replica failed leaves
// every replica's counter where it was, as it leaves their variables.
struct AveragedGradients {
  std::vector<Tensor> grads;
  Tensor completed;
};
AveragedGradients average_gradients_with_completion(const std::vector<Tensor>& grads);

// The buckets average_gradients forms: indices into `grads`, per bucket, in all-reduce order.
std::vector<std::vector<size_t>> gradient_buckets(const std::vector<Tensor>& grads, int64_t bucket_bytes);

}  // namespace flowlet::detail
