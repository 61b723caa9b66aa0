// The gradient a synchronous step applies to one piece, from the pushes of the step that carried
// the variable.
//
//   - Every entry dense: their mean (the sum divided by the number of entries).
//   - Every entry sparse: the (rows, gradient) pairs concatenated, the gradients of a row that
//     repeats summed, the sum divided by the number of pushes in the step (a push that touched none
//     of the rows contributes zeros to the mean: each worker's gradient is zero off its rows).
//   - Dense and sparse mixed: the sparse entries made dense (zeros off their rows), then the mean
//     over the entries, as for dense ones.
#pragma once

#include <cstdint>
#include <vector>

#include "flowlet/core/shape.hpp"
#include "flowlet/core/tensor.hpp"
#include "ps/wire/messages.hpp"

namespace flowlet::detail::ps {

struct StepGradient {
  Tensor rows;  // i64 [n], sorted and unique; an empty handle for a dense gradient
  Tensor grad;  // the piece's shape, or [n, row shape...]
};

// `entries`: checked entries of one variable (request_checks.hpp), at least one; `piece_shape`: the
// piece's shape; `pushes_in_step`: how many pushes the step took (>= entries.size()).
StepGradient combine_step_gradients(const std::vector<PushEntry>& entries, const Shape& piece_shape,
                                    int64_t pushes_in_step);

}  // namespace flowlet::detail::ps
