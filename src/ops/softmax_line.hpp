// The softmax arithmetic that softmax, log_softmax (src/ops/nn.cpp) and the fused cross-entropy
// gradient (src/ops/cross_entropy_grad.cpp) share, so that the fused node's softmax is bit for bit
// the one eager's softmax op writes: one line of any stride, and f32 rows with the vectorized exp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/vector_math.hpp"

namespace flowlet::detail {

// y[i * stride] = x[i * stride] - max - log(sum(exp(x - max))) for i < extent (Log), or its exp.
// The maximum is subtracted first so every exp is at most 1 (finite for any finite x); the sum is
// taken in f64 and its log rounded once to T.
template <bool Log, class T>
void softmax_line(const T* x, T* y, int64_t extent, int64_t stride) {
  T top = -std::numeric_limits<T>::infinity();
  for (int64_t i = 0; i < extent; ++i) top = std::max(top, x[i * stride]);
  double total = 0.0;
  for (int64_t i = 0; i < extent; ++i) total += std::exp(static_cast<double>(x[i * stride] - top));
  const T log_total = static_cast<T>(std::log(total));
  for (int64_t i = 0; i < extent; ++i) {
    const T shifted = x[i * stride] - top - log_total;
    y[i * stride] = Log ? shifted : std::exp(shifted);
  }
}

// Softmax of rows [begin, end) of a contiguous f32 [rows, extent] array, the exps from `exp` (the
// vectorized exp, kernels/vector_math.hpp, <= 1 ulp): each row's x - max goes into y, one exp call
// covers the whole block (rows of 10 classes give it nothing to vectorize one at a time), then
// y = e / sum(e) with the sum in f64. Two libm exps per element (softmax_line) cost ~20 ns each;
// this is one vector exp. Each row's result depends on that row only, not on the block.
inline void softmax_rows_f32(VectorMathF32 exp, const float* x, float* y, int64_t extent, int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) {
    const float* xr = x + r * extent;
    float* yr = y + r * extent;
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < extent; ++i) top = std::max(top, xr[i]);
    for (int64_t i = 0; i < extent; ++i) yr[i] = xr[i] - top;
  }
  exp(y + begin * extent, y + begin * extent, (end - begin) * extent);
  for (int64_t r = begin; r < end; ++r) {
    float* yr = y + r * extent;
    double total = 0.0;
    for (int64_t i = 0; i < extent; ++i) total += static_cast<double>(yr[i]);
    const auto sum = static_cast<float>(total);
    for (int64_t i = 0; i < extent; ++i) yr[i] /= sum;
  }
}

}  // namespace flowlet::detail
