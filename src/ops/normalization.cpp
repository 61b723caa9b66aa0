// Normalization ops (src/ops/conv_attrs.hpp lists them): batch_norm_training, batch_norm_backward,
// batch_norm_inference, layer_norm and layer_norm_backward; their CPU kernels, gradient rules and
// the public functions of flowlet/ops/normalization.hpp.
//
// Batch norm sees x as [N, C, S] (S: the product of the axes after 1) and works per channel, in
// parallel over channels; layer norm sees x as [rows, D] (D: the product of the last
// normalized_dims axes) and works per row. Statistics accumulate in f64 in two passes (mean, then
// the sum of squared deviations), so a large mean does not cancel the variance; f16/bf16 values
// are read as float. layer_norm's mean and rstd outputs have x's leading (unnormalized) axes.
//
// Gradients. batch_norm_training's rule calls batch_norm_backward for y's gradient and adds the
// terms of the mean and var outputs' gradients (zeros unless a caller uses the statistics, or a
// second-order gradient flows into them), so the gradient is right whichever outputs are used.
// layer_norm's rule does the same for its mean and rstd outputs. The backward ops have rules of
// their own, written with public ops, so gradients of gradients work too.
#include "flowlet/ops/normalization.hpp"

#include <cmath>
#include <vector>

#include "core/check.hpp"
#include "core/dtype_visit.hpp"
#include "flowlet/dispatch.hpp"
#include "flowlet/ops/elementwise.hpp"
#include "flowlet/ops/reduce.hpp"
#include "flowlet/ops/shape.hpp"
#include "ops/conv_attrs.hpp"
#include "ops/registry.hpp"
#include "runtime/thread_pool.hpp"

namespace flowlet {
namespace detail {
namespace {

// ---------------------------------------------------------------------------------------------
// Shapes

// x [N, C, ...] seen as [N, C, S].
struct ChannelView {
  int64_t n = 0, c = 0, s = 1;
  int64_t count() const { return n * s; }  // values per channel
};

ChannelView channel_view(const Shape& shape) {
  ChannelView v{shape[0], shape[1], 1};
  for (size_t d = 2; d < shape.size(); ++d) v.s *= shape[d];
  return v;
}

// [1, C, 1, ...] with x's rank: a per-channel [C] tensor reshaped so it broadcasts against x.
Shape channel_broadcast_shape(const Shape& x) {
  Shape shape;
  for (size_t d = 0; d < x.size(); ++d) shape.push_back(d == 1 ? x[1] : 1);
  return shape;
}

// Every axis but the channel axis 1.
std::vector<int64_t> non_channel_axes(size_t rank) {
  std::vector<int64_t> axes;
  for (size_t d = 0; d < rank; ++d)
    if (d != 1) axes.push_back(static_cast<int64_t>(d));
  return axes;
}

void check_floating(std::string_view op, std::string_view what, DType dt) {
  if ((kFloating & bit(dt)) == 0) {
    fail<DTypeError>("{}: {} must be floating (f32, f64, f16, bf16); got {}", op, what, dt);
  }
}

void check_same_dtype(std::string_view op, std::string_view what, const Tensor& t, DType dt) {
  if (t.dtype() != dt) fail<DTypeError>("{}: {} must have x's dtype {}; got {}", op, what, dt, t.dtype());
}

// x [N, C, ...] with N * S > 0; each per-channel input [C] and of x's dtype.
void check_batch_norm_inputs(std::string_view op, const Tensor& x, std::span<const Tensor> per_channel,
                             std::span<const char* const> names, const NormAttrs& attrs) {
  check_floating(op, "x", x.dtype());
  if (x.rank() < 2) fail<ShapeError>("{}: x must be [N, C, ...] (rank >= 2); got x {}", op, x.shape());
  const Shape channel{x.shape()[1]};
  for (size_t i = 0; i < per_channel.size(); ++i) {
    if (!(per_channel[i].shape() == channel)) {
      fail<ShapeError>("{}: {} must be [C] = {} for x {}; got {} {}", op, names[i], channel, x.shape(), names[i],
                       per_channel[i].shape());
    }
    check_same_dtype(op, names[i], per_channel[i], x.dtype());
  }
  if (!(attrs.eps >= 0) || !std::isfinite(attrs.eps)) fail<InvalidArgument>("{}: eps must be finite and >= 0; got {}", op, attrs.eps);
}

// x [..., normalized axes]; the trailing axes, their product D and the leading axes.
struct RowView {
  Shape lead, trailing;
  int64_t rows = 1, d = 1;
};

RowView row_view(std::string_view op, const Shape& x, int64_t normalized_dims) {
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

void check_layer_norm_inputs(std::string_view op, const Tensor& x, const Tensor& gamma, const Tensor* beta,
                             const NormAttrs& attrs, RowView& view) {
  check_floating(op, "x", x.dtype());
  view = row_view(op, x.shape(), attrs.normalized_dims);
  if (view.d == 0) fail<ShapeError>("{}: the normalized axes of x hold no values; got x {}", op, x.shape());
  if (!(gamma.shape() == view.trailing)) {
    fail<ShapeError>("{}: gamma must have x's last {} axes {}; got x {} and gamma {}", op, attrs.normalized_dims,
                     view.trailing, x.shape(), gamma.shape());
  }
  check_same_dtype(op, "gamma", gamma, x.dtype());
  if (beta) {
    if (!(beta->shape() == view.trailing)) {
      fail<ShapeError>("{}: beta must have x's last {} axes {}; got x {} and beta {}", op, attrs.normalized_dims,
                       view.trailing, x.shape(), beta->shape());
    }
    check_same_dtype(op, "beta", *beta, x.dtype());
  }
  if (!(attrs.eps >= 0) || !std::isfinite(attrs.eps)) fail<InvalidArgument>("{}: eps must be finite and >= 0; got {}", op, attrs.eps);
}

template <class T>
inline double load(const T* p, int64_t i) {
  return convert<double>(p[i]);
}

// Channels per parallel chunk: enough values to pay for a thread.
int64_t channel_grain(int64_t values_per_channel) {
  return std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(values_per_channel, 1));
}

// ---------------------------------------------------------------------------------------------
// batch_norm_training: x, gamma, beta -> y, mean, var (biased)

void bn_training_infer(const OpCall& call, OutputSpec& spec) {
  const Tensor& x = call.inputs[0];
  static constexpr const char* names[] = {"gamma", "beta"};
  check_batch_norm_inputs(call.op.name, x, call.inputs.subspan(1, 2), names, call.attrs<NormAttrs>());
  const ChannelView v = channel_view(x.shape());
  if (v.count() == 0) {
    fail<ShapeError>("{}: batch statistics need at least one value per channel; got x {}", call.op.name, x.shape());
  }
  spec.count = 3;
  spec.outputs[0] = {x.shape(), x.dtype()};
  spec.outputs[1] = {Shape{v.c}, x.dtype()};
  spec.outputs[2] = {Shape{v.c}, x.dtype()};
}

void bn_training_kernel(const OpCall& call, std::span<Tensor> out) {
  const Tensor x = call.inputs[0].contiguous();
  const Tensor gamma = call.inputs[1].contiguous(), beta = call.inputs[2].contiguous();
  const double eps = call.attrs<NormAttrs>().eps;
  const ChannelView v = channel_view(x.shape());
  visit_dtype<kFloating>(x.dtype(), [&]<class T>(TypeTag<T>) {
    using C = compute_t<T>;
    const T* xs = static_cast<const T*>(x.raw_data());
    const T* g = static_cast<const T*>(gamma.raw_data());
    const T* b = static_cast<const T*>(beta.raw_data());
    T* y = static_cast<T*>(out[0].raw_data());
    T* mean_out = static_cast<T*>(out[1].raw_data());
    T* var_out = static_cast<T*>(out[2].raw_data());
    const double count = static_cast<double>(v.count());
    parallel_for(v.c, channel_grain(v.count()), [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        double total = 0;
        for (int64_t n = 0; n < v.n; ++n) {
          const T* row = xs + (n * v.c + c) * v.s;
          for (int64_t s = 0; s < v.s; ++s) total += load(row, s);
        }
        const double mean = total / count;
        double squares = 0;
        for (int64_t n = 0; n < v.n; ++n) {
          const T* row = xs + (n * v.c + c) * v.s;
          for (int64_t s = 0; s < v.s; ++s) {
            const double d = load(row, s) - mean;
            squares += d * d;
          }
        }
        const double var = squares / count;
        const double scale = load(g, c) / std::sqrt(var + eps);
        const C scale_c = static_cast<C>(scale), shift_c = static_cast<C>(load(b, c) - mean * scale);
        for (int64_t n = 0; n < v.n; ++n) {
          const int64_t at = (n * v.c + c) * v.s;
          for (int64_t s = 0; s < v.s; ++s) {
            y[at + s] = convert<T>(static_cast<C>(convert<C>(xs[at + s]) * scale_c + shift_c));
          }
        }
        mean_out[c] = convert<T>(mean);
        var_out[c] = convert<T>(var);
      }
    });
  });
}

// ---------------------------------------------------------------------------------------------
// batch_norm_backward: x, gamma, mean, var, dy -> dx, dgamma, dbeta
//   xh = (x - mean) * rstd, dbeta = sum(dy), dgamma = sum(dy * xh),
//   dx = gamma * rstd * (dy - dbeta / M - xh * dgamma / M)   (per channel, M values each)

void bn_backward_infer(const OpCall& call, OutputSpec& spec) {
  const Tensor& x = call.inputs[0];
  static constexpr const char* names[] = {"gamma", "mean", "var"};
  check_batch_norm_inputs(call.op.name, x, call.inputs.subspan(1, 3), names, call.attrs<NormAttrs>());
  const Tensor& dy = call.inputs[4];
  if (!(dy.shape() == x.shape())) fail<ShapeError>("{}: dy must have x's shape; got x {} and dy {}", call.op.name, x.shape(), dy.shape());
  check_same_dtype(call.op.name, "dy", dy, x.dtype());
  if (channel_view(x.shape()).count() == 0) {
    fail<ShapeError>("{}: batch statistics need at least one value per channel; got x {}", call.op.name, x.shape());
  }
  spec.count = 3;
  spec.outputs[0] = {x.shape(), x.dtype()};
  spec.outputs[1] = {Shape{x.shape()[1]}, x.dtype()};
  spec.outputs[2] = {Shape{x.shape()[1]}, x.dtype()};
}

void bn_backward_kernel(const OpCall& call, std::span<Tensor> out) {
  const Tensor x = call.inputs[0].contiguous();
  const Tensor gamma = call.inputs[1].contiguous(), mean = call.inputs[2].contiguous(),
               var = call.inputs[3].contiguous(), dy = call.inputs[4].contiguous();
  const double eps = call.attrs<NormAttrs>().eps;
  const ChannelView v = channel_view(x.shape());
  visit_dtype<kFloating>(x.dtype(), [&]<class T>(TypeTag<T>) {
    using C = compute_t<T>;
    const T* xs = static_cast<const T*>(x.raw_data());
    const T* g = static_cast<const T*>(gamma.raw_data());
    const T* m = static_cast<const T*>(mean.raw_data());
    const T* vr = static_cast<const T*>(var.raw_data());
    const T* dys = static_cast<const T*>(dy.raw_data());
    T* dx = static_cast<T*>(out[0].raw_data());
    T* dgamma = static_cast<T*>(out[1].raw_data());
    T* dbeta = static_cast<T*>(out[2].raw_data());
    const double count = static_cast<double>(v.count());
    parallel_for(v.c, channel_grain(v.count()), [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        const double mu = load(m, c);
        const double rstd = 1.0 / std::sqrt(load(vr, c) + eps);
        double sum_dy = 0, sum_dy_xc = 0;
        for (int64_t n = 0; n < v.n; ++n) {
          const int64_t at = (n * v.c + c) * v.s;
          for (int64_t s = 0; s < v.s; ++s) {
            const double d = load(dys, at + s);
            sum_dy += d;
            sum_dy_xc += d * (load(xs, at + s) - mu);
          }
        }
        const double dg = sum_dy_xc * rstd;
        const double a = load(g, c) * rstd;
        // dx = a * dy + bx * x + k: the formula above with xh expanded.
        const double bx = -a * dg * rstd / count;
        const double k = -a * sum_dy / count - bx * mu;
        const C a_c = static_cast<C>(a), bx_c = static_cast<C>(bx), k_c = static_cast<C>(k);
        for (int64_t n = 0; n < v.n; ++n) {
          const int64_t at = (n * v.c + c) * v.s;
          for (int64_t s = 0; s < v.s; ++s) {
            dx[at + s] = convert<T>(static_cast<C>(a_c * convert<C>(dys[at + s]) + bx_c * convert<C>(xs[at + s]) + k_c));
          }
        }
        dgamma[c] = convert<T>(dg);
        dbeta[c] = convert<T>(sum_dy);
      }
    });
  });
}

// ---------------------------------------------------------------------------------------------
// batch_norm_inference: x, gamma, beta, mean, var -> y

void bn_inference_infer(const OpCall& call, OutputSpec& spec) {
  const Tensor& x = call.inputs[0];
  static constexpr const char* names[] = {"gamma", "beta", "mean", "var"};
  check_batch_norm_inputs(call.op.name, x, call.inputs.subspan(1, 4), names, call.attrs<NormAttrs>());
  spec.outputs[0] = {x.shape(), x.dtype()};
}

void bn_inference_kernel(const OpCall& call, std::span<Tensor> out) {
  const Tensor x = call.inputs[0].contiguous();
  const Tensor gamma = call.inputs[1].contiguous(), beta = call.inputs[2].contiguous(),
               mean = call.inputs[3].contiguous(), var = call.inputs[4].contiguous();
  const double eps = call.attrs<NormAttrs>().eps;
  const ChannelView v = channel_view(x.shape());
  visit_dtype<kFloating>(x.dtype(), [&]<class T>(TypeTag<T>) {
    using C = compute_t<T>;
    std::vector<C> scale(static_cast<size_t>(v.c)), shift(static_cast<size_t>(v.c));
    const T* g = static_cast<const T*>(gamma.raw_data());
    const T* b = static_cast<const T*>(beta.raw_data());
    const T* m = static_cast<const T*>(mean.raw_data());
    const T* vr = static_cast<const T*>(var.raw_data());
    for (int64_t c = 0; c < v.c; ++c) {
      const double sc = load(g, c) / std::sqrt(load(vr, c) + eps);
      scale[static_cast<size_t>(c)] = static_cast<C>(sc);
      shift[static_cast<size_t>(c)] = static_cast<C>(load(b, c) - load(m, c) * sc);
    }
    const T* xs = static_cast<const T*>(x.raw_data());
    T* y = static_cast<T*>(out[0].raw_data());
    // Rows of S values, each of one channel.
    parallel_for(v.n * v.c, channel_grain(v.s), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const auto c = static_cast<size_t>(r % v.c);
        const C sc = scale[c], sh = shift[c];
        for (int64_t s = 0; s < v.s; ++s) y[r * v.s + s] = convert<T>(static_cast<C>(convert<C>(xs[r * v.s + s]) * sc + sh));
      }
    });
  });
}

// ---------------------------------------------------------------------------------------------
// layer_norm: x, gamma, beta -> y, mean [lead], rstd [lead]

void ln_infer(const OpCall& call, OutputSpec& spec) {
  const Tensor& x = call.inputs[0];
  RowView view;
  check_layer_norm_inputs(call.op.name, x, call.inputs[1], &call.inputs[2], call.attrs<NormAttrs>(), view);
  spec.count = 3;
  spec.outputs[0] = {x.shape(), x.dtype()};
  spec.outputs[1] = {view.lead, x.dtype()};
  spec.outputs[2] = {view.lead, x.dtype()};
}

void ln_kernel(const OpCall& call, std::span<Tensor> out) {
  const Tensor x = call.inputs[0].contiguous();
  const Tensor gamma = call.inputs[1].contiguous(), beta = call.inputs[2].contiguous();
  const NormAttrs& attrs = call.attrs<NormAttrs>();
  const RowView view = row_view(call.op.name, x.shape(), attrs.normalized_dims);
  visit_dtype<kFloating>(x.dtype(), [&]<class T>(TypeTag<T>) {
    using C = compute_t<T>;
    const T* xs = static_cast<const T*>(x.raw_data());
    const T* g = static_cast<const T*>(gamma.raw_data());
    const T* b = static_cast<const T*>(beta.raw_data());
    T* y = static_cast<T*>(out[0].raw_data());
    T* mean_out = static_cast<T*>(out[1].raw_data());
    T* rstd_out = static_cast<T*>(out[2].raw_data());
    const int64_t d = view.d;
    parallel_for(view.rows, channel_grain(d), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T* row = xs + r * d;
        double total = 0;
        for (int64_t j = 0; j < d; ++j) total += load(row, j);
        const double mean = total / static_cast<double>(d);
        double squares = 0;
        for (int64_t j = 0; j < d; ++j) {
          const double dev = load(row, j) - mean;
          squares += dev * dev;
        }
        const double rstd = 1.0 / std::sqrt(squares / static_cast<double>(d) + attrs.eps);
        const C mean_c = static_cast<C>(mean), rstd_c = static_cast<C>(rstd);
        for (int64_t j = 0; j < d; ++j) {
          y[r * d + j] = convert<T>(static_cast<C>((convert<C>(row[j]) - mean_c) * rstd_c * convert<C>(g[j]) + convert<C>(b[j])));
        }
        mean_out[r] = convert<T>(mean);
        rstd_out[r] = convert<T>(rstd);
      }
    });
  });
}

// ---------------------------------------------------------------------------------------------
// layer_norm_backward: x, gamma, mean, rstd, dy -> dx, dgamma, dbeta
//   xh = (x - mean) * rstd, u = dy * gamma, per row:
//   dx = rstd * (u - sum(u) / D - xh * sum(u * xh) / D);  dgamma = sum over rows of dy * xh, dbeta of dy.

void ln_backward_infer(const OpCall& call, OutputSpec& spec) {
  const Tensor& x = call.inputs[0];
  RowView view;
  check_layer_norm_inputs(call.op.name, x, call.inputs[1], nullptr, call.attrs<NormAttrs>(), view);
  for (int i : {2, 3}) {
    const Tensor& stat = call.inputs[static_cast<size_t>(i)];
    const char* what = i == 2 ? "mean" : "rstd";
    if (!(stat.shape() == view.lead)) {
      fail<ShapeError>("{}: {} must have x's leading axes {}; got x {} and {} {}", call.op.name, what, view.lead,
                       x.shape(), what, stat.shape());
    }
    check_same_dtype(call.op.name, what, stat, x.dtype());
  }
  const Tensor& dy = call.inputs[4];
  if (!(dy.shape() == x.shape())) fail<ShapeError>("{}: dy must have x's shape; got x {} and dy {}", call.op.name, x.shape(), dy.shape());
  check_same_dtype(call.op.name, "dy", dy, x.dtype());
  spec.count = 3;
  spec.outputs[0] = {x.shape(), x.dtype()};
  spec.outputs[1] = {view.trailing, x.dtype()};
  spec.outputs[2] = {view.trailing, x.dtype()};
}

void ln_backward_kernel(const OpCall& call, std::span<Tensor> out) {
  const Tensor x = call.inputs[0].contiguous();
  const Tensor gamma = call.inputs[1].contiguous(), mean = call.inputs[2].contiguous(),
               rstd = call.inputs[3].contiguous(), dy = call.inputs[4].contiguous();
  const RowView view = row_view(call.op.name, x.shape(), call.attrs<NormAttrs>().normalized_dims);
  visit_dtype<kFloating>(x.dtype(), [&]<class T>(TypeTag<T>) {
    const T* xs = static_cast<const T*>(x.raw_data());
    const T* g = static_cast<const T*>(gamma.raw_data());
    const T* m = static_cast<const T*>(mean.raw_data());
    const T* rs = static_cast<const T*>(rstd.raw_data());
    const T* dys = static_cast<const T*>(dy.raw_data());
    T* dx = static_cast<T*>(out[0].raw_data());
    T* dgamma = static_cast<T*>(out[1].raw_data());
    T* dbeta = static_cast<T*>(out[2].raw_data());
    const int64_t d = view.d, rows = view.rows;
    parallel_for(rows, channel_grain(d), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const double mu = load(m, r), rstd_r = load(rs, r);
        const int64_t at = r * d;
        double sum_u = 0, sum_u_xh = 0;
        for (int64_t j = 0; j < d; ++j) {
          const double u = load(dys, at + j) * load(g, j);
          sum_u += u;
          sum_u_xh += u * (load(xs, at + j) - mu) * rstd_r;
        }
        const double mean_u = sum_u / static_cast<double>(d), mean_u_xh = sum_u_xh / static_cast<double>(d);
        for (int64_t j = 0; j < d; ++j) {
          const double u = load(dys, at + j) * load(g, j);
          const double xh = (load(xs, at + j) - mu) * rstd_r;
          dx[at + j] = convert<T>(rstd_r * (u - mean_u - xh * mean_u_xh));
        }
      }
    });
    // dgamma and dbeta sum over rows: in parallel over the normalized positions instead.
    parallel_for(d, channel_grain(rows), [&](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; ++j) {
        double sum_dy = 0, sum_dy_xh = 0;
        for (int64_t r = 0; r < rows; ++r) {
          const double dyv = load(dys, r * d + j);
          sum_dy += dyv;
          sum_dy_xh += dyv * (load(xs, r * d + j) - load(m, r)) * load(rs, r);
        }
        dgamma[j] = convert<T>(sum_dy_xh);
        dbeta[j] = convert<T>(sum_dy);
      }
    });
  });
}

// ---------------------------------------------------------------------------------------------
// Gradient rules (public ops only)

void bn_training_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> grads);
void bn_backward_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> grads);
void bn_inference_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> grads);
void ln_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> grads);
void ln_backward_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> grads);

Op batch_norm_training_op{"batch_norm_training", 3, 3, kNoFlags, &bn_training_infer, {&bn_training_kernel, nullptr},
                          &bn_training_grad, &copy_attributes<NormAttrs>, &describe_attributes<NormAttrs>};
Op batch_norm_backward_op{"batch_norm_backward", 5, 5, kNoFlags, &bn_backward_infer, {&bn_backward_kernel, nullptr},
                          &bn_backward_grad, &copy_attributes<NormAttrs>, &describe_attributes<NormAttrs>};
Op batch_norm_inference_op{"batch_norm_inference", 5, 5, kNoFlags, &bn_inference_infer, {&bn_inference_kernel, nullptr},
                           &bn_inference_grad, &copy_attributes<NormAttrs>, &describe_attributes<NormAttrs>};
Op layer_norm_op{"layer_norm", 3, 3, kNoFlags, &ln_infer, {&ln_kernel, nullptr}, &ln_grad, &copy_attributes<NormAttrs>,
                 &describe_attributes<NormAttrs>};
Op layer_norm_backward_op{"layer_norm_backward", 5, 5, kNoFlags, &ln_backward_infer, {&ln_backward_kernel, nullptr},
                          &ln_backward_grad, &copy_attributes<NormAttrs>, &describe_attributes<NormAttrs>};

// y, mean, var = batch_norm_training(x, gamma, beta). y's gradient goes through
// batch_norm_backward; mean = sum(x) / M and var = sum((x - mean)^2) / M add
// g_mean / M + g_var * 2 (x - mean) / M to dx.
void bn_training_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> grads) {
  const Tensor& x = c.inputs[0];
  const Tensor& mean = c.outputs[1];
  const NormAttrs& attrs = c.attrs<NormAttrs>();
  const Tensor backward_inputs[] = {x, c.inputs[1], mean, c.outputs[2], g[0]};
  std::vector<Tensor> r = dispatch_all(batch_norm_backward_op, backward_inputs, &attrs);
  const Shape bshape = channel_broadcast_shape(x.shape());
  const double inv_count = 1.0 / static_cast<double>(channel_view(x.shape()).count());
  grads[0] = r[0] + reshape(g[1], bshape) * inv_count + reshape(g[2], bshape) * (x - reshape(mean, bshape)) * (2.0 * inv_count);
  grads[1] = r[1];
  grads[2] = r[2];
}

// The gradients of batch_norm_backward's outputs (dx, dgamma, dbeta) with respect to all of its
// inputs, from its formula; A, Bg and Bb are the incoming gradients of dx, dgamma and dbeta:
//   a = gamma * r, r = (var + eps)^-1/2, S1 = sum(dy), S2 = sum(dy * xh), SA = sum(A), SAxh = sum(A * xh)
//   d/ddy    = a * (A - SA / M - xh * SAxh / M) + Bg * xh + Bb
//   d/dxh    = dy * (Bg - a * SAxh / M) - A * a * S2 / M         (xh = (x - mean) * r)
//   d/da     = sum(A * dy) - S1 * SA / M - S2 * SAxh / M
//   dx = d/dxh * r, dmean = -r * sum(d/dxh), dgamma = d/da * r,
//   dr = sum(d/dxh * (x - mean)) + d/da * gamma, dvar = -r^3 / 2 * dr.
void bn_backward_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> grads) {
  const Tensor &x = c.inputs[0], &gamma = c.inputs[1], &mean = c.inputs[2], &var = c.inputs[3], &dy = c.inputs[4];
  const Tensor &A = g[0], &Bg = g[1], &Bb = g[2];
  const double eps = c.attrs<NormAttrs>().eps;
  const Shape bs = channel_broadcast_shape(x.shape());
  const std::vector<int64_t> axes = non_channel_axes(x.rank());
  const double inv_m = 1.0 / static_cast<double>(channel_view(x.shape()).count());
  const Tensor r = 1.0 / sqrt(var + eps);
  const Tensor rb = reshape(r, bs);
  const Tensor xc = x - reshape(mean, bs);
  const Tensor xh = xc * rb;
  const Tensor a = gamma * r;
  const Tensor S1 = sum(dy, axes), S2 = sum(dy * xh, axes);
  const Tensor SA = sum(A, axes), SAxh = sum(A * xh, axes), SAdy = sum(A * dy, axes);
  grads[4] = reshape(a, bs) * (A - reshape(SA * inv_m, bs) - xh * reshape(SAxh * inv_m, bs)) + reshape(Bg, bs) * xh +
             reshape(Bb, bs);
  const Tensor g_xh = dy * reshape(Bg - a * SAxh * inv_m, bs) - A * reshape(a * S2 * inv_m, bs);
  const Tensor g_a = SAdy - S1 * SA * inv_m - S2 * SAxh * inv_m;
  grads[0] = g_xh * rb;
  grads[2] = -r * sum(g_xh, axes);
  grads[1] = g_a * r;
  const Tensor g_r = sum(g_xh * xc, axes) + g_a * gamma;
  grads[3] = g_r * r * r * r * (-0.5);
}

// y = (x - mean) * r * gamma + beta with given mean and var, r = (var + eps)^-1/2.
void bn_inference_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> grads) {
  const Tensor &x = c.inputs[0], &gamma = c.inputs[1], &mean = c.inputs[3], &var = c.inputs[4];
  const double eps = c.attrs<NormAttrs>().eps;
  const Shape bs = channel_broadcast_shape(x.shape());
  const std::vector<int64_t> axes = non_channel_axes(x.rank());
  const Tensor r = 1.0 / sqrt(var + eps);
  const Tensor xc = x - reshape(mean, bs);
  const Tensor sum_g = sum(g[0], axes), sum_g_xc = sum(g[0] * xc, axes);
  grads[0] = g[0] * reshape(gamma * r, bs);
  grads[1] = sum_g_xc * r;
  grads[2] = sum_g;
  grads[3] = -sum_g * gamma * r;
  grads[4] = sum_g_xc * gamma * r * r * r * (-0.5);
}

// [lead..., 1, ...]: a per-row tensor shaped to broadcast against x.
Shape row_broadcast_shape(const RowView& view, size_t rank) {
  Shape shape = view.lead;
  while (shape.size() < rank) shape.push_back(1);
  return shape;
}

std::vector<int64_t> trailing_axes(size_t lead, size_t rank) {
  std::vector<int64_t> axes;
  for (size_t d = lead; d < rank; ++d) axes.push_back(static_cast<int64_t>(d));
  return axes;
}

// y, mean, rstd = layer_norm(x, gamma, beta). y's gradient goes through layer_norm_backward;
// mean = sum(x) / D and rstd = (sum((x - mean)^2) / D + eps)^-1/2 add
// g_mean / D - g_rstd * rstd^3 * (x - mean) / D to dx.
void ln_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> grads) {
  const Tensor& x = c.inputs[0];
  const NormAttrs& attrs = c.attrs<NormAttrs>();
  const Tensor &mean = c.outputs[1], &rstd = c.outputs[2];
  const Tensor backward_inputs[] = {x, c.inputs[1], mean, rstd, g[0]};
  std::vector<Tensor> r = dispatch_all(layer_norm_backward_op, backward_inputs, &attrs);
  const RowView view = row_view("layer_norm", x.shape(), attrs.normalized_dims);
  const Shape ks = row_broadcast_shape(view, x.rank());
  const double inv_d = 1.0 / static_cast<double>(view.d);
  const Tensor rb = reshape(rstd, ks);
  grads[0] = r[0] + reshape(g[1], ks) * inv_d - reshape(g[2], ks) * rb * rb * rb * (x - reshape(mean, ks)) * inv_d;
  grads[1] = r[1];
  grads[2] = r[2];
}

// The gradients of layer_norm_backward's outputs with respect to all of its inputs (per row, D
// values; A, Bg, Bb the incoming gradients of dx, dgamma, dbeta; u = dy * gamma):
//   T1 = sum(u), T2 = sum(u * xh), SA = sum(A), SAxh = sum(A * xh), SAu = sum(A * u)
//   d/du  = r * (A - SA / D - xh * SAxh / D)
//   ddy   = d/du * gamma + Bg * xh + Bb;  dgamma = sum over rows of d/du * dy
//   d/dxh = -r * (SAxh / D * u + T2 / D * A) + Bg * dy
//   dr    = SAu - T1 * SA / D - T2 * SAxh / D + sum(d/dxh * (x - mean))
//   dx = d/dxh * r, dmean = -r * sum(d/dxh).
void ln_backward_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> grads) {
  const Tensor &x = c.inputs[0], &gamma = c.inputs[1], &mean = c.inputs[2], &rstd = c.inputs[3], &dy = c.inputs[4];
  const Tensor &A = g[0], &Bg = g[1], &Bb = g[2];
  const RowView view = row_view("layer_norm_backward", x.shape(), c.attrs<NormAttrs>().normalized_dims);
  const size_t rank = x.rank();
  const Shape ks = row_broadcast_shape(view, rank);
  const std::vector<int64_t> row_axes = trailing_axes(view.lead.size(), rank);
  std::vector<int64_t> lead_axes;
  for (size_t d = 0; d < view.lead.size(); ++d) lead_axes.push_back(static_cast<int64_t>(d));
  const double inv_d = 1.0 / static_cast<double>(view.d);
  auto row_sum = [&](const Tensor& t) { return sum(t, row_axes, /*keepdims=*/true); };
  const Tensor rb = reshape(rstd, ks);
  const Tensor xc = x - reshape(mean, ks);
  const Tensor xh = xc * rb;
  const Tensor u = dy * gamma;
  const Tensor T1 = row_sum(u), T2 = row_sum(u * xh);
  const Tensor SA = row_sum(A), SAxh = row_sum(A * xh), SAu = row_sum(A * u);
  const Tensor g_u = rb * (A - SA * inv_d - xh * (SAxh * inv_d));
  grads[4] = g_u * gamma + Bg * xh + Bb;
  grads[1] = lead_axes.empty() ? g_u * dy : sum(g_u * dy, lead_axes);
  const Tensor g_xh = -rb * (SAxh * inv_d * u + T2 * inv_d * A) + Bg * dy;
  const Tensor g_r = SAu - T1 * SA * inv_d - T2 * SAxh * inv_d + row_sum(g_xh * xc);
  grads[0] = g_xh * rb;
  grads[2] = reshape(-rb * row_sum(g_xh), view.lead);
  grads[3] = reshape(g_r, view.lead);
}

}  // namespace

void add_normalization_ops(std::vector<Op*>& ops) {
  ops.insert(ops.end(), {&batch_norm_training_op, &batch_norm_backward_op, &batch_norm_inference_op, &layer_norm_op,
                         &layer_norm_backward_op});
}

}  // namespace detail

BatchNormOutput batch_norm_training(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps) {
  const detail::NormAttrs attrs{eps, 1};
  const Tensor inputs[] = {x, gamma, beta};
  std::vector<Tensor> out = dispatch_all(detail::batch_norm_training_op, inputs, &attrs);
  return {out[0], out[1], out[2]};
}

Tensor batch_norm_inference(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& mean,
                            const Tensor& var, double eps) {
  return dispatch(detail::batch_norm_inference_op, {x, gamma, beta, mean, var}, detail::NormAttrs{eps, 1});
}

Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, int64_t normalized_dims, double eps) {
  const detail::NormAttrs attrs{eps, normalized_dims};
  const Tensor inputs[] = {x, gamma, beta};
  return dispatch_all(detail::layer_norm_op, inputs, &attrs)[0];
}

}  // namespace flowlet
