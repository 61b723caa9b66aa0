// What the normalization ops' two files share (src/ops/normalization.cpp: shapes, kernels, the
// Op values and public functions; src/ops/normalization_grads.cpp: the gradient rules): the views of
// x they work in, the backward ops the rules call, and the rules the Op values name.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "core/check.hpp"
#include "core/dtype_visit.hpp"
#include "flowlet/op.hpp"

namespace flowlet::detail {

// x [N, C, ...] seen as [N, C, S].
struct ChannelView {
  int64_t n = 0, c = 0, s = 1;
  int64_t count() const { return n * s; }  // values per channel
};

inline ChannelView channel_view(const Shape& shape) {
  ChannelView v{shape[0], shape[1], 1};
  for (size_t d = 2; d < shape.size(); ++d) v.s *= shape[d];
  return v;
}

// [1, C, 1, ...] with x's rank: a per-channel [C] tensor reshaped so it broadcasts against x.
inline Shape channel_broadcast_shape(const Shape& x) {
  Shape shape;
  for (size_t d = 0; d < x.size(); ++d) shape.push_back(d == 1 ? x[1] : 1);
  return shape;
}

// Every axis but the channel axis 1.
inline std::vector<int64_t> non_channel_axes(size_t rank) {
  std::vector<int64_t> axes;
  for (size_t d = 0; d < rank; ++d)
    if (d != 1) axes.push_back(static_cast<int64_t>(d));
  return axes;
}

// x [..., normalized axes]; the trailing axes, their product D and the leading axes.
struct RowView {
  Shape lead, trailing;
  int64_t rows = 1, d = 1;
};

inline RowView row_view(std::string_view op, const Shape& x, int64_t normalized_dims) {
  if (normalized_dims < 1 || normalized_dims > static_cast<int64_t>(x.size())) {
    fail<InvalidArgument>("{}: normalized_dims must be in [1, rank of x = {}]; got {} for x {}", op, x.size(),
                          normalized_dims, x);
  }
  RowView v;
  const size_t split = x.size() - static_cast<size_t>(normalized_dims);
  for (size_t i = 0; i < x.size(); ++i) {
    if (i < split) {
      v.lead.push_back(x[i]);
      v.rows *= x[i];
    } else {
      v.trailing.push_back(x[i]);
      v.d *= x[i];
    }
  }
  return v;
}

// Element i of a host array as a double (f16/bf16 through float).
template <class T>
inline double load(const T* p, int64_t i) {
  return convert<double>(p[i]);
}

// The backward ops (the rules of batch_norm_training and layer_norm call them) and every rule.
extern Op batch_norm_backward_op;
extern Op layer_norm_backward_op;
void bn_training_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> grads);
void bn_backward_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> grads);
void bn_inference_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> grads);
void ln_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> grads);
void ln_backward_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> grads);

}  // namespace flowlet::detail
