// The gradient rules of the normalization ops (src/ops/conv_attrs.hpp), written with public ops so
// they run eagerly, traced and under outer tapes (gradients of gradients).
//
// batch_norm_training's rule calls batch_norm_backward for y's gradient and adds the terms of the
// mean and var outputs' gradients, so the gradient is right whichever outputs are used;
// layer_norm's does the same for its mean and rstd outputs. The backward ops' own rules follow
// from their formulas (checked against finite differences in test_autodiff and test_normalization).
#include <cmath>
#include <vector>

#include "flowlet/dispatch.hpp"
#include "flowlet/ops/elementwise.hpp"
#include "flowlet/ops/reduce.hpp"
#include "flowlet/ops/shape.hpp"
#include "ops/conv_attrs.hpp"
#include "ops/normalization_internal.hpp"

namespace flowlet::detail {
namespace {

// True when `g` is the tape's gradient of an output nobody used: the zeros it makes for the rule
// (zeros_like in src/autodiff/tape.cpp, held only by the tape's argument list: a use count of 1).
// Rules then skip that output's terms (full passes over x: in a traced CNN step, three unfused
// elementwise passes over each batch norm's x, multiplying by folded zeros). A gradient that was
// computed, even one that is zero now, is held elsewhere too (the tape's map, an outer tape that
// tracks it): its terms are always added, so higher-order gradients through it stay right.
// Eager CPU gradients are also checked to be zeros; a symbolic one (traced: its values do not
// exist yet) is recognized by the use count alone, which only the tape's own zeros can have.
bool unused_output_gradient(const Tensor& g) {
  if (g.impl_ptr()->use_count() != 1) return false;
  if (g.is_symbolic()) return true;
  if (g.device().kind() != DeviceKind::cpu) return false;
  const Tensor packed = g.contiguous();
  return visit_dtype<kFloating>(packed.dtype(), [&]<class T>(TypeTag<T>) {
    const T* p = static_cast<const T*>(packed.raw_data());
    for (int64_t i = 0; i < packed.numel(); ++i)
      if (load(p, i) != 0.0) return false;
    return true;
  });
}

}  // namespace

// y, mean, var = batch_norm_training(x, gamma, beta). y's gradient goes through
// batch_norm_backward; mean = sum(x) / M and var = sum((x - mean)^2) / M add
// g_mean / M + g_var * 2 (x - mean) / M to dx.
void bn_training_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> grads) {
  const Tensor& x = c.inputs[0];
  const Tensor& mean = c.outputs[1];
  const NormAttrs& attrs = c.attrs<NormAttrs>();
  const Tensor backward_inputs[] = {x, c.inputs[1], mean, c.outputs[2], g[0]};
  std::vector<Tensor> r = dispatch_all(batch_norm_backward_op, backward_inputs, &attrs);
  grads[0] = r[0];
  if (!unused_output_gradient(g[1]) || !unused_output_gradient(g[2])) {
    // g_mean / M + 2 g_var (x - mean) / M = beta_c * x + alpha_c per channel: two [C] vectors, then
    // one broadcast multiply-add over x.
    const Shape bshape = channel_broadcast_shape(x.shape());
    const double inv_count = 1.0 / static_cast<double>(channel_view(x.shape()).count());
    const Tensor slope = g[2] * (2.0 * inv_count);
    const Tensor offset = g[1] * inv_count - slope * mean;
    grads[0] = grads[0] + (x * reshape(slope, bshape) + reshape(offset, bshape));
  }
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

namespace {

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

}  // namespace

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
  grads[0] = r[0];
  if (!unused_output_gradient(g[1]) || !unused_output_gradient(g[2])) {
    // Per row: slope * x + offset with slope = -g_rstd rstd^3 / D, offset = g_mean / D - slope * mean.
    const Tensor slope = -g[2] * rstd * rstd * rstd * inv_d;
    const Tensor offset = g[1] * inv_d - slope * mean;
    grads[0] = grads[0] + (x * reshape(slope, ks) + reshape(offset, ks));
  }
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


}  // namespace flowlet::detail
