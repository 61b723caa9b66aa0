// max_pool2d, avg_pool2d and their backward ops (src/ops/conv_attrs.hpp), and the public pooling
// functions of flowlet/ops/conv.hpp, which resolve the kernel-sized default stride,
// Padding::same() and ceil_mode into explicit pads. The CPU kernels are plain loops, parallel
// over the N * C planes. Padding never wins a max and every window holds at least one input
// element (the rules below refuse a window that lies wholly in the padding). The common max pool
// (2x2, stride 2, no padding) has its own branch-free loops.
//
// Gradients: max_pool2d's goes to each window's first maximum in row-major order (a NaN counts as
// the maximum), through max_pool2d_backward(x, dy), which itself has no gradient rule;
// avg_pool2d's is avg_pool2d_backward(dy), whose gradient is avg_pool2d again (the two are each
// other's transpose).
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "flowlet/dispatch.hpp"
#include "flowlet/ops/conv.hpp"
#include "flowlet/ops/reduce.hpp"
#include "kernels/dtypes.hpp"
#include "ops/conv_attrs.hpp"
#include "ops/registry.hpp"
#include "runtime/thread_pool.hpp"

namespace flowlet {
namespace detail {
namespace {

void check_pool_dtype(std::string_view op, const Tensor& t) {
  const DType dt = t.dtype();
  if (t.device().kind() == DeviceKind::cpu && (bit(dt) & kHalves)) {
    fail<DTypeError>("{}: unsupported dtype on the CPU; got {}, supported: f32, f64 (cast f16/bf16 up on the CPU; CUDA "
                     "runs them)", op, dt);
  }
  check_dtype(op, dt, kFloating);
}

int64_t pool_axis(std::string_view op, int64_t in, int64_t lo, int64_t hi, int64_t kernel, int64_t stride,
                  const Shape& x) {
  if (in + lo + hi < kernel) {
    fail<ShapeError>("{}: the kernel ({}) is larger than the padded input ({} + {} + {}); got x {}", op, kernel, in, lo,
                     hi, x);
  }
  const int64_t out = (in + lo + hi - kernel) / stride + 1;
  // Every window must hold an input element: the first starts at -lo, the last at (out - 1) * stride - lo.
  if (lo >= kernel || (out - 1) * stride - lo >= in) {
    fail<InvalidArgument>("{}: padding ({} before, {} after) leaves a window of {} wholly in the padding; got x {}", op,
                          lo, hi, kernel, x);
  }
  return out;
}

// Checks x [N, C, H, W] and the attributes; returns [N, C, H', W'].
Shape pool_output_shape(std::string_view op, const Shape& x, const Pool2dAttrs& a) {
  if (x.size() != 4) fail<ShapeError>("{}: expects x [N, C, H, W]; got x {}", op, x);
  if (a.kernel_h <= 0 || a.kernel_w <= 0) fail<InvalidArgument>("{}: kernel must be positive; got [{}, {}]", op, a.kernel_h, a.kernel_w);
  if (a.stride_h <= 0 || a.stride_w <= 0) fail<InvalidArgument>("{}: stride must be positive; got [{}, {}]", op, a.stride_h, a.stride_w);
  if (a.pad_top < 0 || a.pad_bottom < 0 || a.pad_left < 0 || a.pad_right < 0)
    fail<InvalidArgument>("{}: padding must be >= 0; got [{}, {}, {}, {}] (top, bottom, left, right)", op, a.pad_top,
                          a.pad_bottom, a.pad_left, a.pad_right);
  if (a.ceil_h < 0 || a.ceil_h > a.pad_bottom || a.ceil_w < 0 || a.ceil_w > a.pad_right)
    fail<InvalidArgument>("{}: the ceil_mode rows ({}, {}) must lie within the bottom and right padding ({}, {})", op,
                          a.ceil_h, a.ceil_w, a.pad_bottom, a.pad_right);
  const int64_t oh = pool_axis(op, x[2], a.pad_top, a.pad_bottom, a.kernel_h, a.stride_h, x);
  const int64_t ow = pool_axis(op, x[3], a.pad_left, a.pad_right, a.kernel_w, a.stride_w, x);
  return Shape{x[0], x[1], oh, ow};
}

void pool_infer(const OpCall& call, OutputSpec& spec) {
  const Tensor& x = call.inputs[0];
  check_pool_dtype(call.op.name, x);
  spec.outputs[0] = {pool_output_shape(call.op.name, x.shape(), call.attrs<Pool2dAttrs>()), x.dtype()};
}

// max_pool2d_backward(x, dy): dy must be max_pool2d's output for x.
void max_backward_infer(const OpCall& call, OutputSpec& spec) {
  const Tensor& x = call.inputs[0];
  const Tensor& dy = call.inputs[1];
  check_pool_dtype("max_pool2d_backward", x);
  if (dy.dtype() != x.dtype()) fail<DTypeError>("max_pool2d_backward: x and dy must share one dtype; got {} and {}", x.dtype(), dy.dtype());
  const Shape y = pool_output_shape("max_pool2d_backward", x.shape(), call.attrs<Pool2dAttrs>());
  if (dy.shape() != y) fail<ShapeError>("max_pool2d_backward: dy must be the pooled shape {}; got x {} and dy {}", y, x.shape(), dy.shape());
  spec.outputs[0] = {x.shape(), x.dtype()};
}

// avg_pool2d_backward(dy) -> dx [N, C, input_h, input_w].
void avg_backward_infer(const OpCall& call, OutputSpec& spec) {
  const auto& a = call.attrs<Pool2dBackwardAttrs>();
  const Tensor& dy = call.inputs[0];
  check_pool_dtype("avg_pool2d_backward", dy);
  if (dy.rank() != 4) fail<ShapeError>("avg_pool2d_backward: expects dy [N, C, H', W']; got dy {}", dy.shape());
  const Shape x{dy.shape()[0], dy.shape()[1], a.input_h, a.input_w};
  check_shape("avg_pool2d_backward", x);
  const Shape y = pool_output_shape("avg_pool2d_backward", x, a.pool);
  if (dy.shape() != y) fail<ShapeError>("avg_pool2d_backward: dy must be the pooled shape {} of input {}; got dy {}", y, x, dy.shape());
  spec.outputs[0] = {x, dy.dtype()};
}

// One window of one plane: input rows [y0, y1) and columns [x0, x1), clipped to the input, and the
// divisor of the average.
struct Window {
  int64_t y0, y1, x0, x1;
  int64_t divisor;
};

struct PoolPlan {
  int64_t planes, h, w, oh, ow;
  Pool2dAttrs a;

  Window window(int64_t oy, int64_t ox) const {
    const int64_t ys = oy * a.stride_h - a.pad_top, xs = ox * a.stride_w - a.pad_left;
    Window win{std::max<int64_t>(ys, 0), std::min(ys + a.kernel_h, h), std::max<int64_t>(xs, 0),
               std::min(xs + a.kernel_w, w), 0};
    if (a.count_include_pad) {
      win.divisor = (std::min(ys + a.kernel_h, h + a.pad_bottom - a.ceil_h) - ys) *
                    (std::min(xs + a.kernel_w, w + a.pad_right - a.ceil_w) - xs);
    } else {
      win.divisor = (win.y1 - win.y0) * (win.x1 - win.x0);
    }
    return win;
  }

  // Calls body(first_plane, last_plane) over the planes on the pool.
  template <class Body>
  void for_planes(Body&& body) const {
    const int64_t per_plane = std::max<int64_t>(oh * ow * a.kernel_h * a.kernel_w, 1);
    parallel_for(planes, std::max<int64_t>(1, kParallelGrain / per_plane), body);
  }
};

PoolPlan plan(const Shape& x, const Shape& y, const Pool2dAttrs& a) { return {x[0] * x[1], x[2], x[3], y[2], y[3], a}; }

// The flat index (within its plane) of the window's first maximum; a NaN wins over any number.
template <class T>
int64_t first_max(const T* plane, int64_t w, const Window& win) {
  int64_t best = win.y0 * w + win.x0;
  for (int64_t iy = win.y0; iy < win.y1; ++iy)
    for (int64_t ix = win.x0; ix < win.x1; ++ix) {
      const T v = plane[iy * w + ix], b = plane[best];
      if (v > b || (std::isnan(v) && !std::isnan(b))) best = iy * w + ix;
    }
  return best;
}

// The common 2x2 window with stride 2 and no padding: every window lies inside the input and every
// input element is in at most one window, so the kernels below need no Window and no clipping.
bool is_plain_2x2(const PoolPlan& p) {
  const Pool2dAttrs& a = p.a;
  return a.kernel_h == 2 && a.kernel_w == 2 && a.stride_h == 2 && a.stride_w == 2 && a.pad_top == 0 &&
         a.pad_bottom == 0 && a.pad_left == 0 && a.pad_right == 0 && p.oh == p.h / 2 && p.ow == p.w / 2;
}

// Which of a window's values a, b, c, d (row-major) is its first maximum (0-3), with first_max's
// rule (a NaN wins over any number, the first NaN over later ones). Selects and bitwise logic
// only, no branches: the compiler vectorizes the loops over windows that call it (random data
// would mispredict a branch per window).
template <class T>
[[gnu::always_inline]] inline int first_max_of_4(T a, T b, T c, T d, T& best) {
  int at = 0;
  best = a;
  auto take = [&](T v, int index) {
    const bool wins = (v > best) | ((v != v) & (best == best));
    at = wins ? index : at;
    best = wins ? v : best;
  };
  take(b, 1);
  take(c, 2);
  take(d, 3);
  return at;
}

// f32 windows 8 at a time (GCC vector types): the even and odd columns of 16 inputs.
using F8 = float __attribute__((vector_size(32)));
using I8 = int __attribute__((vector_size(32)));

F8 load8(const float* p) {
  F8 v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
void store8(float* p, F8 v) { __builtin_memcpy(p, &v, sizeof v); }
void even_odd(const float* p, F8& even, F8& odd) {
  const F8 lo = load8(p), hi = load8(p + 8);
  even = __builtin_shuffle(lo, hi, I8{0, 2, 4, 6, 8, 10, 12, 14});
  odd = __builtin_shuffle(lo, hi, I8{1, 3, 5, 7, 9, 11, 13, 15});
}
// first_max_of_4 on 8 windows: the winner's index per lane, and its value.
I8 first_max_of_4(const float* r0, const float* r1, F8& best) {
  F8 a, b, c, d;
  even_odd(r0, a, b);
  even_odd(r1, c, d);
  I8 at = {};
  best = a;
  auto take = [&](F8 v, int index) {
    const I8 wins = (v > best) | ((v != v) & (best == best));
    at = wins ? I8{} + index : at;
    best = wins ? v : best;
  };
  take(b, 1);
  take(c, 2);
  take(d, 3);
  return at;
}
// Stores 8 windows' gradients (g where `at` names the position, else 0) to two rows of 16.
void scatter_2x2(I8 at, F8 g, float* d0, float* d1) {
  const F8 zero = {};
  auto interleave = [](F8 even, F8 odd, float* to) {
    store8(to, __builtin_shuffle(even, odd, I8{0, 8, 1, 9, 2, 10, 3, 11}));
    store8(to + 8, __builtin_shuffle(even, odd, I8{4, 12, 5, 13, 6, 14, 7, 15}));
  };
  interleave(at == 0 ? g : zero, at == 1 ? g : zero, d0);
  interleave(at == 2 ? g : zero, at == 3 ? g : zero, d1);
}

template <class T>
void max_pool_2x2_plane(const T* src, int64_t w, int64_t oh, int64_t ow, T* dst) {
  for (int64_t oy = 0; oy < oh; ++oy) {
    const T* r0 = src + 2 * oy * w;
    const T* r1 = r0 + w;
    T* out = dst + oy * ow;
    int64_t ox = 0;
    if constexpr (std::is_same_v<T, float>) {
      for (; ox + 8 <= ow; ox += 8) {
        F8 best;
        (void)first_max_of_4(r0 + 2 * ox, r1 + 2 * ox, best);
        store8(out + ox, best);
      }
      if (ox < ow) {  // the last windows, through copies padded to 8 (7x7 outputs have no full 8)
        const int64_t rest = ow - ox;
        float t0[16] = {}, t1[16] = {}, results[8];
        std::copy(r0 + 2 * ox, r0 + 2 * ow, t0);
        std::copy(r1 + 2 * ox, r1 + 2 * ow, t1);
        F8 best;
        (void)first_max_of_4(t0, t1, best);
        store8(results, best);
        std::copy(results, results + rest, out + ox);
        ox = ow;
      }
    }
    for (; ox < ow; ++ox) {
      T best;
      (void)first_max_of_4(r0[2 * ox], r0[2 * ox + 1], r1[2 * ox], r1[2 * ox + 1], best);
      out[ox] = best;
    }
  }
}

// dx of one plane: each window's gradient at its first maximum, zero elsewhere (rows and columns
// past the last window too). Writes every element, so dx needs no clearing first.
template <class T>
void max_pool_2x2_backward_plane(const T* src, const T* g, int64_t h, int64_t w, int64_t oh, int64_t ow, T* dst) {
  for (int64_t oy = 0; oy < oh; ++oy) {
    const T* r0 = src + 2 * oy * w;
    const T* r1 = r0 + w;
    T* d0 = dst + 2 * oy * w;
    T* d1 = d0 + w;
    const T* gs = g + oy * ow;
    int64_t ox = 0;
    if constexpr (std::is_same_v<T, float>) {
      for (; ox + 8 <= ow; ox += 8) {
        F8 best;
        scatter_2x2(first_max_of_4(r0 + 2 * ox, r1 + 2 * ox, best), load8(gs + ox), d0 + 2 * ox, d1 + 2 * ox);
      }
      if (ox < ow) {  // the last windows, through copies padded to 8
        const int64_t rest = ow - ox;
        float t0[16] = {}, t1[16] = {}, grads[8] = {}, o0[16], o1[16];
        std::copy(r0 + 2 * ox, r0 + 2 * ow, t0);
        std::copy(r1 + 2 * ox, r1 + 2 * ow, t1);
        std::copy(gs + ox, gs + ow, grads);
        F8 best;
        scatter_2x2(first_max_of_4(t0, t1, best), load8(grads), o0, o1);
        std::copy(o0, o0 + 2 * rest, d0 + 2 * ox);
        std::copy(o1, o1 + 2 * rest, d1 + 2 * ox);
        ox = ow;
      }
    }
    for (; ox < ow; ++ox) {
      T best;
      const int at = first_max_of_4(r0[2 * ox], r0[2 * ox + 1], r1[2 * ox], r1[2 * ox + 1], best);
      const T v = gs[ox];
      d0[2 * ox] = at == 0 ? v : T(0);
      d0[2 * ox + 1] = at == 1 ? v : T(0);
      d1[2 * ox] = at == 2 ? v : T(0);
      d1[2 * ox + 1] = at == 3 ? v : T(0);
    }
    for (int64_t ix = 2 * ow; ix < w; ++ix) d0[ix] = d1[ix] = T(0);
  }
  std::fill(dst + 2 * oh * w, dst + h * w, T(0));
}

void max_pool_kernel(const OpCall& call, std::span<Tensor> out) {
  const Tensor x = call.inputs[0].contiguous();
  const PoolPlan p = plan(x.shape(), out[0].shape(), call.attrs<Pool2dAttrs>());
  visit_dtype<kFloatCompute>(x.dtype(), [&]<class T>(TypeTag<T>) {
    const T* in = static_cast<const T*>(x.raw_data());
    T* y = static_cast<T*>(out[0].raw_data());
    if (is_plain_2x2(p)) {
      p.for_planes([&](int64_t begin, int64_t end) {
        for (int64_t plane = begin; plane < end; ++plane)
          max_pool_2x2_plane(in + plane * p.h * p.w, p.w, p.oh, p.ow, y + plane * p.oh * p.ow);
      });
      return;
    }
    p.for_planes([&](int64_t begin, int64_t end) {
      for (int64_t plane = begin; plane < end; ++plane) {
        const T* src = in + plane * p.h * p.w;
        T* dst = y + plane * p.oh * p.ow;
        for (int64_t oy = 0; oy < p.oh; ++oy)
          for (int64_t ox = 0; ox < p.ow; ++ox) dst[oy * p.ow + ox] = src[first_max(src, p.w, p.window(oy, ox))];
      }
    });
  }, "max_pool2d");
}

void max_backward_kernel(const OpCall& call, std::span<Tensor> out) {
  const Tensor x = call.inputs[0].contiguous();
  const Tensor dy = call.inputs[1].contiguous();
  const PoolPlan p = plan(x.shape(), dy.shape(), call.attrs<Pool2dAttrs>());
  visit_dtype<kFloatCompute>(x.dtype(), [&]<class T>(TypeTag<T>) {
    const T* in = static_cast<const T*>(x.raw_data());
    const T* g = static_cast<const T*>(dy.raw_data());
    T* dx = static_cast<T*>(out[0].raw_data());
    if (is_plain_2x2(p)) {
      p.for_planes([&](int64_t begin, int64_t end) {
        for (int64_t plane = begin; plane < end; ++plane)
          max_pool_2x2_backward_plane(in + plane * p.h * p.w, g + plane * p.oh * p.ow, p.h, p.w, p.oh, p.ow,
                                      dx + plane * p.h * p.w);
      });
      return;
    }
    p.for_planes([&](int64_t begin, int64_t end) {
      for (int64_t plane = begin; plane < end; ++plane) {
        const T* src = in + plane * p.h * p.w;
        const T* gs = g + plane * p.oh * p.ow;
        T* dst = dx + plane * p.h * p.w;
        std::fill(dst, dst + p.h * p.w, T(0));
        for (int64_t oy = 0; oy < p.oh; ++oy)
          for (int64_t ox = 0; ox < p.ow; ++ox) dst[first_max(src, p.w, p.window(oy, ox))] += gs[oy * p.ow + ox];
      }
    });
  }, "max_pool2d_backward");
}

void avg_pool_kernel(const OpCall& call, std::span<Tensor> out) {
  const Tensor x = call.inputs[0].contiguous();
  const PoolPlan p = plan(x.shape(), out[0].shape(), call.attrs<Pool2dAttrs>());
  visit_dtype<kFloatCompute>(x.dtype(), [&]<class T>(TypeTag<T>) {
    const T* in = static_cast<const T*>(x.raw_data());
    T* y = static_cast<T*>(out[0].raw_data());
    p.for_planes([&](int64_t begin, int64_t end) {
      for (int64_t plane = begin; plane < end; ++plane) {
        const T* src = in + plane * p.h * p.w;
        T* dst = y + plane * p.oh * p.ow;
        for (int64_t oy = 0; oy < p.oh; ++oy)
          for (int64_t ox = 0; ox < p.ow; ++ox) {
            const Window win = p.window(oy, ox);
            T total = 0;
            for (int64_t iy = win.y0; iy < win.y1; ++iy)
              for (int64_t ix = win.x0; ix < win.x1; ++ix) total += src[iy * p.w + ix];
            dst[oy * p.ow + ox] = total / static_cast<T>(win.divisor);
          }
      }
    });
  }, "avg_pool2d");
}

void avg_backward_kernel(const OpCall& call, std::span<Tensor> out) {
  const Tensor dy = call.inputs[0].contiguous();
  const PoolPlan p = plan(out[0].shape(), dy.shape(), call.attrs<Pool2dBackwardAttrs>().pool);
  visit_dtype<kFloatCompute>(dy.dtype(), [&]<class T>(TypeTag<T>) {
    const T* g = static_cast<const T*>(dy.raw_data());
    T* dx = static_cast<T*>(out[0].raw_data());
    p.for_planes([&](int64_t begin, int64_t end) {
      for (int64_t plane = begin; plane < end; ++plane) {
        const T* gs = g + plane * p.oh * p.ow;
        T* dst = dx + plane * p.h * p.w;
        std::fill(dst, dst + p.h * p.w, T(0));
        for (int64_t oy = 0; oy < p.oh; ++oy)
          for (int64_t ox = 0; ox < p.ow; ++ox) {
            const Window win = p.window(oy, ox);
            const T share = gs[oy * p.ow + ox] / static_cast<T>(win.divisor);
            for (int64_t iy = win.y0; iy < win.y1; ++iy)
              for (int64_t ix = win.x0; ix < win.x1; ++ix) dst[iy * p.w + ix] += share;
          }
      }
    });
  }, "avg_pool2d_backward");
}

void max_pool_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> dx);
void avg_pool_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> dx);
void avg_backward_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> dx);

}  // namespace

Op max_pool2d_op{"max_pool2d", 1, 1, kNoFlags, &pool_infer, {&max_pool_kernel, nullptr}, &max_pool_grad,
                 &copy_attributes<Pool2dAttrs>, &describe_attributes<Pool2dAttrs>};
Op max_pool2d_backward_op{"max_pool2d_backward", 2, 2, kNoFlags, &max_backward_infer, {&max_backward_kernel, nullptr},
                          nullptr, &copy_attributes<Pool2dAttrs>, &describe_attributes<Pool2dAttrs>};
Op avg_pool2d_op{"avg_pool2d", 1, 1, kNoFlags, &pool_infer, {&avg_pool_kernel, nullptr}, &avg_pool_grad,
                 &copy_attributes<Pool2dAttrs>, &describe_attributes<Pool2dAttrs>};
Op avg_pool2d_backward_op{"avg_pool2d_backward", 1, 1, kNoFlags, &avg_backward_infer, {&avg_backward_kernel, nullptr},
                          &avg_backward_grad, &copy_attributes<Pool2dBackwardAttrs>,
                          &describe_attributes<Pool2dBackwardAttrs>};

namespace {

void max_pool_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> dx) {
  dx[0] = dispatch(max_pool2d_backward_op, {c.inputs[0], g[0]}, c.attrs<Pool2dAttrs>());
}
void avg_pool_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> dx) {
  const Shape& x = c.inputs[0].shape();
  dx[0] = dispatch(avg_pool2d_backward_op, {g[0]}, Pool2dBackwardAttrs{c.attrs<Pool2dAttrs>(), x[2], x[3]});
}
void avg_backward_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> dx) {
  dx[0] = dispatch(avg_pool2d_op, {g[0]}, c.attrs<Pool2dBackwardAttrs>().pool);
}

// Resolves one axis: the stride (0 means the kernel), "same" pads and ceil_mode's extra rows.
void resolve_axis(int64_t in, int64_t kernel, int64_t& stride, int64_t& lo, int64_t& hi, int64_t& ceil, bool same,
                  bool ceil_mode) {
  if (stride == 0) stride = kernel;
  if (kernel <= 0 || stride <= 0) return;  // the op's rule reports it
  if (same) {
    const int64_t out = (in + stride - 1) / stride;
    const int64_t total = std::max<int64_t>((out - 1) * stride + kernel - in, 0);
    lo = total / 2, hi = total - total / 2;
  }
  if (!ceil_mode || lo < 0 || hi < 0 || in + lo + hi < kernel) return;
  int64_t out = (in + lo + hi - kernel + stride - 1) / stride + 1;
  if ((out - 1) * stride >= in + lo) --out;  // the last window must start inside the input or its top padding
  ceil = std::max<int64_t>((out - 1) * stride + kernel - (in + lo + hi), 0);
  hi += ceil;
}

Pool2dAttrs pool_attrs(std::string_view op, const Tensor& x, const Pool2dOptions& o) {
  Pool2dAttrs a;
  a.kernel_h = o.kernel.h, a.kernel_w = o.kernel.w;
  a.stride_h = o.stride.h, a.stride_w = o.stride.w;
  a.pad_top = o.padding.top, a.pad_bottom = o.padding.bottom, a.pad_left = o.padding.left, a.pad_right = o.padding.right;
  a.count_include_pad = o.count_include_pad;
  if (!x.defined()) return a;  // dispatch reports the missing input
  if (x.rank() != 4) fail<ShapeError>("{}: expects x [N, C, H, W]; got x {}", op, x.shape());
  resolve_axis(x.shape()[2], a.kernel_h, a.stride_h, a.pad_top, a.pad_bottom, a.ceil_h, o.padding.same_size, o.ceil_mode);
  resolve_axis(x.shape()[3], a.kernel_w, a.stride_w, a.pad_left, a.pad_right, a.ceil_w, o.padding.same_size, o.ceil_mode);
  return a;
}

}  // namespace

void add_pool_ops(std::vector<Op*>& ops) {
  ops.insert(ops.end(), {&max_pool2d_op, &max_pool2d_backward_op, &avg_pool2d_op, &avg_pool2d_backward_op});
}

}  // namespace detail

Tensor max_pool2d(const Tensor& x, int64_t kernel) { return max_pool2d(x, Pool2dOptions{.kernel = kernel}); }
Tensor max_pool2d(const Tensor& x, const Pool2dOptions& options) {
  return dispatch(detail::max_pool2d_op, {x}, detail::pool_attrs("max_pool2d", x, options));
}
Tensor avg_pool2d(const Tensor& x, int64_t kernel) { return avg_pool2d(x, Pool2dOptions{.kernel = kernel}); }
Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& options) {
  return dispatch(detail::avg_pool2d_op, {x}, detail::pool_attrs("avg_pool2d", x, options));
}
Tensor global_avg_pool2d(const Tensor& x) {
  if (x.defined()) {
    if (x.rank() != 4) detail::fail<ShapeError>("global_avg_pool2d: expects x [N, C, H, W]; got x {}", x.shape());
    detail::check_dtype("global_avg_pool2d", x.dtype(), detail::kFloating);
  }
  return mean(x, {2, 3});
}

}  // namespace flowlet
