// Normalization ops (src/ops/conv_attrs.hpp lists them): batch_norm_training, batch_norm_backward,
// batch_norm_inference, layer_norm and layer_norm_backward; their shape rules, CPU kernels, Op
// values and the public functions of flowlet/ops/normalization.hpp.
//
// Batch norm sees x as [N, C, S] (S: the product of the axes after 1); layer norm sees x as
// [rows, D] (D: the product of the last normalized_dims axes). f32 inputs (batch norm's with
// S >= kMinF32Row) go to the f32 kernels of normalization_f32.cpp: blocked f32 lanes, f64 between
// blocks, stated and tested bounds. The generic kernels here (f64, f16/bf16 read as float, and
// batch norm's short rows) work per channel, in parallel over channels, or per row, and accumulate
// every element in f64: batch norm in one pass over x shifted by one of its values, layer norm
// (rows that stay in cache) in two (mean, then the squared deviations), so a large mean does not
// cancel the variance. layer_norm's mean and rstd outputs have x's leading (unnormalized) axes.
//
// The gradient rules are in normalization_grads.cpp.
#include "flowlet/ops/normalization.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.hpp"
#include "core/dtype_visit.hpp"
#include "flowlet/dispatch.hpp"
#include "ops/conv_attrs.hpp"
#include "ops/normalization_internal.hpp"
#include "ops/registry.hpp"
#include "runtime/thread_pool.hpp"

namespace flowlet {
namespace detail {
namespace {

// ---------------------------------------------------------------------------------------------
// Argument checks (the views of x: normalization_internal.hpp)

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


// f64 sums in kLanes independent lanes (element i adds into lane i % kLanes): a single running sum
// is a chain of dependent adds the compiler may not reorder, while the lanes vectorize. total()
// adds the lanes in a fixed order, so results do not depend on threads.
constexpr int kLanes = 8;
struct LaneSum {
  double lane[kLanes] = {};
  double total() const {
    double t = 0;
    for (double v : lane) t += v;
    return t;
  }
};

// Calls f(i, i % kLanes) for i in [0, n), kLanes at a time.
template <class F>
inline void for_lanes(int64_t n, F&& f) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) f(i + j, j);
  for (int j = 0; i < n; ++i, ++j) f(i, j);
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
    if constexpr (std::is_same_v<T, float>) {
      if (v.s >= kMinF32Row) return bn_training_f32(xs, g, b, v, eps, y, mean_out, var_out);
    }
    const double count = static_cast<double>(v.count());
    parallel_for(v.c, channel_grain(v.count()), [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        // One pass: sums of d = x - shift and of d^2, shift = the channel's first value. Shifting
        // by a value of the data keeps E[d^2] - E[d]^2 from cancelling (its f64 error is at most
        // about count * 1e-16 of the variance), and a channel bigger than the cache is read once
        // instead of twice.
        const double shift = load(xs, c * v.s);
        LaneSum sums, squares;
        for (int64_t n = 0; n < v.n; ++n) {
          const T* row = xs + (n * v.c + c) * v.s;
          for_lanes(v.s, [&](int64_t s, int j) {
            const double d = load(row, s) - shift;
            sums.lane[j] += d;
            squares.lane[j] += d * d;
          });
        }
        const double mean_d = sums.total() / count;
        const double mean = shift + mean_d;
        const double var = std::max(0.0, squares.total() / count - mean_d * mean_d);
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
    if constexpr (std::is_same_v<T, float>) {
      if (v.s >= kMinF32Row) return bn_backward_f32(xs, g, m, vr, dys, v, eps, dx, dgamma, dbeta);
    }
    const double count = static_cast<double>(v.count());
    parallel_for(v.c, channel_grain(v.count()), [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        const double mu = load(m, c);
        const double rstd = 1.0 / std::sqrt(load(vr, c) + eps);
        LaneSum lanes_dy, lanes_dy_xc;
        for (int64_t n = 0; n < v.n; ++n) {
          const T* dy_row = dys + (n * v.c + c) * v.s;
          const T* x_row = xs + (n * v.c + c) * v.s;
          for_lanes(v.s, [&](int64_t s, int j) {
            const double d = load(dy_row, s);
            lanes_dy.lane[j] += d;
            lanes_dy_xc.lane[j] += d * (load(x_row, s) - mu);
          });
        }
        const double sum_dy = lanes_dy.total(), sum_dy_xc = lanes_dy_xc.total();
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
    // y = (x - center) * scale + shift with center the mean rounded to C and shift = beta -
    // (mean - center) * scale: subtracting first keeps a large mean from cancelling digits, as
    // x * scale + (beta - mean * scale) would.
    std::vector<C> center(static_cast<size_t>(v.c)), scale(static_cast<size_t>(v.c)), shift(static_cast<size_t>(v.c));
    const T* g = static_cast<const T*>(gamma.raw_data());
    const T* b = static_cast<const T*>(beta.raw_data());
    const T* m = static_cast<const T*>(mean.raw_data());
    const T* vr = static_cast<const T*>(var.raw_data());
    for (int64_t c = 0; c < v.c; ++c) {
      const auto k = static_cast<size_t>(c);
      const double sc = load(g, c) / std::sqrt(load(vr, c) + eps);
      center[k] = static_cast<C>(load(m, c));
      scale[k] = static_cast<C>(sc);
      shift[k] = static_cast<C>(load(b, c) - (load(m, c) - static_cast<double>(center[k])) * sc);
    }
    const T* xs = static_cast<const T*>(x.raw_data());
    T* y = static_cast<T*>(out[0].raw_data());
    // Rows of S values, each of one channel.
    parallel_for(v.n * v.c, channel_grain(v.s), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const auto c = static_cast<size_t>(r % v.c);
        const C ct = center[c], sc = scale[c], sh = shift[c];
        for (int64_t s = 0; s < v.s; ++s) {
          y[r * v.s + s] = convert<T>(static_cast<C>((convert<C>(xs[r * v.s + s]) - ct) * sc + sh));
        }
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
    if constexpr (std::is_same_v<T, float>) return ln_forward_f32(xs, g, b, view.rows, d, attrs.eps, y, mean_out, rstd_out);
    parallel_for(view.rows, channel_grain(d), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T* row = xs + r * d;
        LaneSum total;
        for_lanes(d, [&](int64_t j, int lane) { total.lane[lane] += load(row, j); });
        const double mean = total.total() / static_cast<double>(d);
        LaneSum squares;
        for_lanes(d, [&](int64_t j, int lane) {
          const double dev = load(row, j) - mean;
          squares.lane[lane] += dev * dev;
        });
        const double rstd = 1.0 / std::sqrt(squares.total() / static_cast<double>(d) + attrs.eps);
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
    using C = compute_t<T>;
    const T* xs = static_cast<const T*>(x.raw_data());
    const T* g = static_cast<const T*>(gamma.raw_data());
    const T* m = static_cast<const T*>(mean.raw_data());
    const T* rs = static_cast<const T*>(rstd.raw_data());
    const T* dys = static_cast<const T*>(dy.raw_data());
    T* dx = static_cast<T*>(out[0].raw_data());
    T* dgamma = static_cast<T*>(out[1].raw_data());
    T* dbeta = static_cast<T*>(out[2].raw_data());
    const int64_t d = view.d, rows = view.rows;
    if constexpr (std::is_same_v<T, float>) return ln_backward_f32(xs, g, m, rs, dys, rows, d, dx, dgamma, dbeta);
    // Row blocks, a count fixed by the shape (never by the thread count): each block writes dx for
    // its rows and accumulates its own partial dgamma and dbeta (in f64) in the same sweep; the
    // blocks' partial sums are then added in block order.
    LnColumnPartials partials(rows, d);
    parallel_for(partials.blocks, 1, [&](int64_t first_block, int64_t last_block) {
      for (int64_t block = first_block; block < last_block; ++block) {
        double* sum_dy = partials.sum_dy(block);
        double* sum_dy_xh = partials.sum_dy_xh(block);
        for (int64_t r = partials.first_row(block, rows); r < partials.first_row(block + 1, rows); ++r) {
          const double mu = load(m, r), rstd_r = load(rs, r);
          const int64_t at = r * d;
          LaneSum lanes_u, lanes_u_xc;
          for_lanes(d, [&](int64_t j, int lane) {
            const double u = load(dys, at + j) * load(g, j);
            lanes_u.lane[lane] += u;
            lanes_u_xc.lane[lane] += u * (load(xs, at + j) - mu);
          });
          const double mean_u = lanes_u.total() / static_cast<double>(d);
          const double mean_u_xh = lanes_u_xc.total() * rstd_r / static_cast<double>(d);
          // dx = rstd (u - mean_u - xh mean_u_xh) = a u + bx x + k, with xh expanded.
          const double bx = -rstd_r * rstd_r * mean_u_xh;
          const C a_c = static_cast<C>(rstd_r), bx_c = static_cast<C>(bx), k_c = static_cast<C>(-rstd_r * mean_u - bx * mu);
          for (int64_t j = 0; j < d; ++j) {
            const C dyv = convert<C>(dys[at + j]), xv = convert<C>(xs[at + j]);
            dx[at + j] = convert<T>(static_cast<C>(a_c * dyv * convert<C>(g[j]) + bx_c * xv + k_c));
            sum_dy[j] += static_cast<double>(dyv);
            sum_dy_xh[j] += static_cast<double>(dyv) * (static_cast<double>(xv) - mu) * rstd_r;
          }
        }
      }
    });
    partials.write(dgamma, dbeta);
  });
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The ops (their rules: normalization_grads.cpp)

namespace {
Op batch_norm_training_op{"batch_norm_training", 3, 3, kNoFlags, &bn_training_infer, {&bn_training_kernel, nullptr},
                          &bn_training_grad, &copy_attributes<NormAttrs>, &describe_attributes<NormAttrs>};
Op batch_norm_inference_op{"batch_norm_inference", 5, 5, kNoFlags, &bn_inference_infer, {&bn_inference_kernel, nullptr},
                           &bn_inference_grad, &copy_attributes<NormAttrs>, &describe_attributes<NormAttrs>};
Op layer_norm_op{"layer_norm", 3, 3, kNoFlags, &ln_infer, {&ln_kernel, nullptr}, &ln_grad, &copy_attributes<NormAttrs>,
                 &describe_attributes<NormAttrs>};
}  // namespace

// Named by the forward ops' rules (normalization_grads.cpp).
Op batch_norm_backward_op{"batch_norm_backward", 5, 5, kNoFlags, &bn_backward_infer, {&bn_backward_kernel, nullptr},
                          &bn_backward_grad, &copy_attributes<NormAttrs>, &describe_attributes<NormAttrs>};
Op layer_norm_backward_op{"layer_norm_backward", 5, 5, kNoFlags, &ln_backward_infer, {&ln_backward_kernel, nullptr},
                          &ln_backward_grad, &copy_attributes<NormAttrs>, &describe_attributes<NormAttrs>};

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
