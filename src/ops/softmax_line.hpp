// One softmax (or log-softmax) line: the arithmetic that softmax, log_softmax (src/ops/nn.cpp) and
// the fused cross-entropy gradient (src/ops/cross_entropy_grad.cpp) share, so that the fused node's
// softmax is bit for bit the one eager's softmax op writes.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

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

}  // namespace flowlet::detail
