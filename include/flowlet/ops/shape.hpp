// Ops that rearrange elements: reshape, transpose, permute, concat, gather.
#pragma once

#include <cstdint>
#include <vector>

#include "flowlet/core/tensor.hpp"

namespace flowlet {

// A view when t is contiguous, else a copy. One dimension may be -1 (inferred).
Tensor reshape(const Tensor& t, const Shape& shape);
// Rank 2: swaps the two dimensions (a view).
Tensor transpose(const Tensor& t);
// Dimension i of the result is dimension perm[i] of t (a view).
Tensor permute(const Tensor& t, const std::vector<int64_t>& perm);
// Joins tensors of one dtype and rank whose dimensions agree except along `axis`.
Tensor concat(const std::vector<Tensor>& tensors, int64_t axis);
// Elements [start, start + length) along `axis` (a view). OutOfRange outside the dimension.
Tensor slice(const Tensor& t, int64_t axis, int64_t start, int64_t length);
// Rows of params along axis 0: result shape = indices.shape + params.shape[1:]. Indices are i32 or
// i64; one outside [0, params.shape[0]) throws OutOfRange.
Tensor gather(const Tensor& params, const Tensor& indices);
// The adjoint of gather: a [rows, updates.shape[indices.rank():]...] tensor of zeros with
// updates[i] added at row indices[i]; repeated indices accumulate. OutOfRange on a bad index.
Tensor scatter_add(const Tensor& indices, const Tensor& updates, int64_t rows);

}  // namespace flowlet
