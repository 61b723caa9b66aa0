// Reductions: sum, mean, max over all or some axes, and argmax.
#pragma once

#include <cstdint>
#include <vector>

#include "flowlet/core/tensor.hpp"

namespace flowlet {

// Axes may be negative (counted from the end); repeated or out-of-range axes throw InvalidArgument.
// An empty axes list reduces nothing (a copy, like NumPy's axis=()).
// sum: floating sums accumulate in f64 (accurate to ~1e-15 relative) and keep the input dtype (f16
// and bf16 included: the result is rounded once); integer and b8 inputs sum to i64. mean: floating
// dtypes only; the mean over zero elements is NaN.
// max: NaN propagates; reducing a zero-size axis throws InvalidArgument.
Tensor sum(const Tensor& t);
Tensor sum(const Tensor& t, const std::vector<int64_t>& axes, bool keepdims = false);
Tensor mean(const Tensor& t);
Tensor mean(const Tensor& t, const std::vector<int64_t>& axes, bool keepdims = false);
Tensor max(const Tensor& t);
Tensor max(const Tensor& t, const std::vector<int64_t>& axes, bool keepdims = false);

// Index (i64) of the first maximum along `axis` (a NaN counts as the maximum).
Tensor argmax(const Tensor& t, int64_t axis);

}  // namespace flowlet
