// What the normalization ops' files share (src/ops/normalization.cpp: shapes, generic kernels, the
// Op values and public functions; src/ops/normalization_f32.cpp: the f32 kernels;
// src/ops/normalization_grads.cpp: the gradient rules): the views of x they work in, the f32
// kernels, the backward ops the rules call, and the rules the Op values name.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "core/check.hpp"
#include "core/dtype_visit.hpp"
#include "flowlet/op.hpp"
#include "runtime/thread_pool.hpp"

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

// Channels (or rows) per parallel chunk: enough values to pay for a thread.
inline int64_t channel_grain(int64_t values_per_channel) {
  return std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(values_per_channel, 1));
}

// layer_norm_backward's dgamma and dbeta partials, shared by the f32 kernel and the generic loop:
// row blocks, a count fixed by the shape (never by the thread count), each accumulating its own f64
// column sums of dy and dy * xh; the blocks are then added in block order, so the bits do not
// depend on which thread ran which block. (d >= 1: ln_infer rejects empty normalized axes.)
struct LnColumnPartials {
  LnColumnPartials(int64_t rows, int64_t d_)
      : d(d_),
        blocks(std::clamp<int64_t>(std::min<int64_t>(64, (int64_t{1} << 22) / (2 * d_)), 1, std::max<int64_t>(rows, 1))),
        partial(static_cast<size_t>(blocks * 2 * d_), 0.0) {}

  int64_t first_row(int64_t block, int64_t rows) const { return rows * block / blocks; }
  double* sum_dy(int64_t block) { return partial.data() + block * 2 * d; }
  double* sum_dy_xh(int64_t block) { return sum_dy(block) + d; }

  // dgamma[j] = the blocks' sum_dy_xh[j], dbeta[j] = their sum_dy[j], added in block order.
  template <class T>
  void write(T* dgamma, T* dbeta) const {
    for (int64_t j = 0; j < d; ++j) {
      double total_dy = 0, total_dy_xh = 0;
      for (int64_t b = 0; b < blocks; ++b) {
        total_dy += partial[static_cast<size_t>(b * 2 * d + j)];
        total_dy_xh += partial[static_cast<size_t>(b * 2 * d + d + j)];
      }
      dgamma[j] = convert<T>(total_dy_xh);
      dbeta[j] = convert<T>(total_dy);
    }
  }

  int64_t d, blocks;
  std::vector<double> partial;
};

// The f32 kernels (normalization_f32.cpp): blocked f32 lanes, f64 between blocks. Batch norm's
// takes rows of at least kMinF32Row values (S = H * W; shorter rows keep the generic loop, whose
// per-element f64 work costs less than a call per row there).
inline constexpr int64_t kMinF32Row = 32;
void bn_training_f32(const float* x, const float* gamma, const float* beta, const ChannelView& v, double eps, float* y,
                     float* mean_out, float* var_out);
void bn_backward_f32(const float* x, const float* gamma, const float* mean, const float* var, const float* dy,
                     const ChannelView& v, double eps, float* dx, float* dgamma, float* dbeta);
void ln_forward_f32(const float* x, const float* gamma, const float* beta, int64_t rows, int64_t d, double eps, float* y,
                    float* mean_out, float* rstd_out);
void ln_backward_f32(const float* x, const float* gamma, const float* mean, const float* rstd, const float* dy,
                     int64_t rows, int64_t d, float* dx, float* dgamma, float* dbeta);

// The backward ops (the rules of batch_norm_training and layer_norm call them) and every rule.
extern Op batch_norm_backward_op;
extern Op layer_norm_backward_op;
void bn_training_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> grads);
void bn_backward_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> grads);
void bn_inference_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> grads);
void ln_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> grads);
void ln_backward_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> grads);

}  // namespace flowlet::detail
