// Elementwise ops: binary arithmetic, unary math, comparisons, where and cast. Each op is one
// Op value: its dtype set and shape rule (broadcasting) and its CPU kernel (a functor run by the
// elementwise engine). Integer arithmetic wraps (two's complement) instead of overflowing.
#include "flowlet/ops/elementwise.hpp"

#include <cmath>
#include <type_traits>

#include "flowlet/dispatch.hpp"
#include "flowlet/ops/creation.hpp"
#include "ops/grad_helpers.hpp"
#include "runtime/thread_pool.hpp"
#include "kernels/elementwise_loop.hpp"
#include "kernels/vector_math.hpp"
#include "ops/attributes.hpp"
#include "ops/registry.hpp"

namespace flowlet {
namespace detail {
namespace {

// Two's-complement wrap for integer types; plain arithmetic for floating types.
template <class T, class F>
T wrapping(T a, T b, F f) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(f(static_cast<U>(a), static_cast<U>(b)));
  } else {
    return f(a, b);
  }
}

struct Add { template <class T> T operator()(T a, T b) const { return wrapping(a, b, [](auto x, auto y) { return static_cast<decltype(x)>(x + y); }); } };
struct Sub { template <class T> T operator()(T a, T b) const { return wrapping(a, b, [](auto x, auto y) { return static_cast<decltype(x)>(x - y); }); } };
struct Mul { template <class T> T operator()(T a, T b) const { return wrapping(a, b, [](auto x, auto y) { return static_cast<decltype(x)>(x * y); }); } };
struct Div {
  template <class T>
  T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      if (b == 0) fail<InvalidArgument>("div: integer division by zero; got a zero divisor");
      if constexpr (std::is_signed_v<T>) {
        if (b == -1) return wrapping(T{0}, a, [](auto x, auto y) { return static_cast<decltype(x)>(x - y); });
      }
    }
    return a / b;
  }
};
struct Pow { template <class T> T operator()(T a, T b) const { return std::pow(a, b); } };
// NaN wins, as in NumPy's maximum/minimum.
// NaN in a propagates (a != a). `|` rather than `||`: without a branch the loop vectorizes.
struct Maximum { template <class T> T operator()(T a, T b) const { return ((a > b) | (a != a)) ? a : b; } };
struct Minimum { template <class T> T operator()(T a, T b) const { return ((a < b) | (a != a)) ? a : b; } };

struct Neg { template <class T> T operator()(T a) const { return wrapping(T{0}, a, [](auto x, auto y) { return static_cast<decltype(x)>(x - y); }); } };
struct Abs {
  template <class T>
  T operator()(T a) const {
    if constexpr (std::is_unsigned_v<T>) return a;
    else return a < T{0} ? Neg{}(a) : a;
  }
};
struct Square { template <class T> T operator()(T a) const { return Mul{}(a, a); } };
struct Relu { template <class T> T operator()(T a) const { return a > T{0} ? a : T{0}; } };
struct Exp {
  template <class T> T operator()(T a) const { return std::exp(a); }
  static VectorMathF32 vector_f32() { return vector_exp_f32(); }
};
struct Log {
  template <class T> T operator()(T a) const { return std::log(a); }
  static VectorMathF32 vector_f32() { return vector_log_f32(); }
};
struct Sqrt { template <class T> T operator()(T a) const { return std::sqrt(a); } };
struct Tanh {
  template <class T> T operator()(T a) const { return std::tanh(a); }
  static VectorMathF32 vector_f32() { return vector_tanh_f32(); }
};
struct Sigmoid {  // never exponentiates a large positive number
  template <class T>
  T operator()(T a) const {
    if (a >= T{0}) return T{1} / (T{1} + std::exp(-a));
    const T e = std::exp(a);
    return e / (T{1} + e);
  }
};

struct Equal { template <class T> bool operator()(T a, T b) const { return a == b; } };
struct NotEqual { template <class T> bool operator()(T a, T b) const { return a != b; } };
struct Less { template <class T> bool operator()(T a, T b) const { return a < b; } };
struct LessEqual { template <class T> bool operator()(T a, T b) const { return a <= b; } };
struct Greater { template <class T> bool operator()(T a, T b) const { return a > b; } };
struct GreaterEqual { template <class T> bool operator()(T a, T b) const { return a >= b; } };

void check_same_dtype(std::string_view op, const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype()) {
    fail<DTypeError>("{}: dtypes differ; got {} and {}; convert one with astype", op, a.dtype(), b.dtype());
  }
}

// dst = src converted to dst's dtype; both contiguous and of one shape.
void cast_contiguous(const Tensor& src, const Tensor& dst) {
  visit_dtype<kAll>(src.dtype(), [&]<class From>(TypeTag<From>) {
    visit_dtype<kAll>(dst.dtype(), [&]<class To>(TypeTag<To>) {
      const From* in = static_cast<const From*>(src.raw_data());
      To* out = static_cast<To*>(dst.raw_data());
      parallel_for(src.numel(), kParallelGrain, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) out[i] = convert<To>(in[i]);
      });
    });
  });
}

constexpr bool is_half(DType dt) { return dt == f16 || dt == bf16; }

// f16 and bf16 are storage types: an op on them runs its f32 kernel on upcast copies and rounds
// the result back once, so their kernels are never instantiated.
void run_upcast(const OpCall& call, std::span<Tensor> out, KernelFn kernel) {
  std::vector<Tensor> upcast;
  for (const Tensor& t : call.inputs) upcast.push_back(is_half(t.dtype()) ? cast(t, f32) : t);
  const bool store_back = is_half(out[0].dtype());
  Tensor result = store_back ? Tensor::empty(out[0].shape(), f32, out[0].device()) : out[0];
  const OpCall f32_call{call.op, upcast, call.attributes};
  kernel(f32_call, std::span<Tensor>(&result, 1));
  if (store_back) cast_contiguous(result, out[0]);
}

// Binary ops: same dtype (from `Allowed`), broadcast shapes; comparisons give b8.
template <DTypeSet Allowed, bool Comparison>
void binary_infer(const OpCall& call, OutputSpec& spec) {
  const Tensor& a = call.inputs[0];
  const Tensor& b = call.inputs[1];
  check_same_dtype(call.op.name, a, b);
  check_dtype(call.op.name, a.dtype(), Allowed);
  spec.outputs[0] = {broadcast_shapes(call.op.name, a.shape(), b.shape()), Comparison ? b8 : a.dtype()};
}

template <class F, DTypeSet Allowed, bool Comparison>
void binary_kernel(const OpCall& call, std::span<Tensor> out) {
  const Tensor& a = call.inputs[0];
  const Tensor& b = call.inputs[1];
  if (is_half(a.dtype())) return run_upcast(call, out, &binary_kernel<F, Allowed, Comparison>);
  visit_dtype<Allowed & ~kHalves>(a.dtype(), [&]<class T>(TypeTag<T>) {
    using Out = std::conditional_t<Comparison, bool, T>;
    map_elements<Out, T, T>(out[0], {&a, &b}, F{});
  });
}

template <class F, DTypeSet Allowed, bool Comparison = false>
Op binary_op(std::string_view name, GradFn grad = nullptr) {
  return Op{name, 2, 2, kElementwise, &binary_infer<Allowed, Comparison>,
            {&binary_kernel<F, Allowed, Comparison>, nullptr}, grad};
}

template <DTypeSet Allowed>
void unary_infer(const OpCall& call, OutputSpec& spec) {
  const Tensor& t = call.inputs[0];
  check_dtype(call.op.name, t.dtype(), Allowed);
  spec.outputs[0] = {t.shape(), t.dtype()};
}

template <class F, DTypeSet Allowed>
void unary_kernel(const OpCall& call, std::span<Tensor> out) {
  const Tensor& t = call.inputs[0];
  if (is_half(t.dtype())) return run_upcast(call, out, &unary_kernel<F, Allowed>);
  if constexpr (requires { F::vector_f32(); }) {
    // Transcendentals on contiguous f32: libmvec's SIMD versions (kernels/vector_math.hpp).
    const VectorMathF32 vector = F::vector_f32();
    if (vector && t.dtype() == f32 && t.is_contiguous() && out[0].is_contiguous()) {
      const float* in = static_cast<const float*>(t.raw_data());
      float* result = static_cast<float*>(out[0].raw_data());
      parallel_for(t.numel(), kParallelGrain, [&](int64_t begin, int64_t end) { vector(in + begin, result + begin, end - begin); });
      return;
    }
  }
  visit_dtype<Allowed & ~kHalves>(t.dtype(), [&]<class T>(TypeTag<T>) { map_elements<T, T>(out[0], {&t}, F{}); });
}

template <class F, DTypeSet Allowed>
Op unary_op(std::string_view name, GradFn grad) {
  return Op{name, 1, 1, kElementwise, &unary_infer<Allowed>, {&unary_kernel<F, Allowed>, nullptr}, grad};
}

void where_infer(const OpCall& call, OutputSpec& spec) {
  const Tensor& condition = call.inputs[0];
  const Tensor& a = call.inputs[1];
  const Tensor& b = call.inputs[2];
  if (condition.dtype() != b8) {
    fail<DTypeError>("where: condition must be b8; got {}; compare with a tensor (a > b) to get one",
                     condition.dtype());
  }
  check_same_dtype("where", a, b);
  const Shape ab = broadcast_shapes("where", a.shape(), b.shape());
  spec.outputs[0] = {broadcast_shapes("where", condition.shape(), ab), a.dtype()};
}

// Selection moves bits, so it runs on same-size unsigned integers whatever the dtype.
void where_kernel(const OpCall& call, std::span<Tensor> out) {
  const Tensor& condition = call.inputs[0];
  const Tensor& a = call.inputs[1];
  const Tensor& b = call.inputs[2];
  visit_bits(a.dtype(), [&]<class T>(TypeTag<T>) {
    // Branch-free: with random conditions `c ? x : y` compiles to a mispredicted branch per
    // element (40x slower); masking the bits vectorizes.
    auto select = [](uint8_t c, T x, T y) {
      const T mask = static_cast<T>(T{0} - static_cast<T>(c));
      return static_cast<T>((x & mask) | (y & static_cast<T>(~mask)));
    };
    const int64_t n = out[0].numel();
    auto flat = [&](const Tensor& t) { return t.is_contiguous() && (t.numel() == n || t.numel() == 1); };
    if (condition.numel() == n && condition.is_contiguous() && flat(a) && flat(b)) {
      // The common case (relu's gradient: where(x > 0, g, 0)) as one plain loop per chunk.
      const auto* c = static_cast<const uint8_t*>(condition.raw_data());
      const T* x = static_cast<const T*>(a.raw_data());
      const T* y = static_cast<const T*>(b.raw_data());
      T* o = static_cast<T*>(out[0].raw_data());
      const bool x_full = a.numel() == n, y_full = b.numel() == n;
      parallel_for(n, kParallelGrain, [&](int64_t begin, int64_t end) {
        if (x_full && y_full) {
          for (int64_t i = begin; i < end; ++i) o[i] = select(c[i], x[i], y[i]);
        } else if (x_full) {
          const T y0 = y[0];
          for (int64_t i = begin; i < end; ++i) o[i] = select(c[i], x[i], y0);
        } else if (y_full) {
          const T x0 = x[0];
          for (int64_t i = begin; i < end; ++i) o[i] = select(c[i], x0, y[i]);
        } else {
          const T x0 = x[0], y0 = y[0];
          for (int64_t i = begin; i < end; ++i) o[i] = select(c[i], x0, y0);
        }
      });
      return;
    }
    map_elements<T, bool, T, T>(out[0], {&condition, &a, &b},
                                [&](bool c, T x, T y) { return select(static_cast<uint8_t>(c), x, y); });
  });
}

void cast_infer(const OpCall& call, OutputSpec& spec) {
  spec.outputs[0] = {call.inputs[0].shape(), call.attrs<CastAttrs>().dtype};
}

void cast_kernel(const OpCall& call, std::span<Tensor> out) {
  cast_contiguous(call.inputs[0].contiguous(), out[0]);
}

// Gradient rules: g is the gradient of the output; binary rules sum it back to each input's shape.
using Grads = std::span<Tensor>;
using OutGrads = std::span<const Tensor>;

void add_grad(const GradCall& c, OutGrads g, Grads dx) {
  dx[0] = unbroadcast(g[0], c.inputs[0].shape());
  dx[1] = unbroadcast(g[0], c.inputs[1].shape());
}
void sub_grad(const GradCall& c, OutGrads g, Grads dx) {
  dx[0] = unbroadcast(g[0], c.inputs[0].shape());
  dx[1] = unbroadcast(-g[0], c.inputs[1].shape());
}
void mul_grad(const GradCall& c, OutGrads g, Grads dx) {
  dx[0] = unbroadcast(g[0] * c.inputs[1], c.inputs[0].shape());
  dx[1] = unbroadcast(g[0] * c.inputs[0], c.inputs[1].shape());
}
void div_grad(const GradCall& c, OutGrads g, Grads dx) {
  const Tensor& b = c.inputs[1];
  dx[0] = unbroadcast(g[0] / b, c.inputs[0].shape());
  dx[1] = unbroadcast(-(g[0] * c.outputs[0]) / b, b.shape());
}
void pow_grad(const GradCall& c, OutGrads g, Grads dx) {
  const Tensor& a = c.inputs[0];
  const Tensor& b = c.inputs[1];
  dx[0] = unbroadcast(g[0] * b * pow(a, b - 1.0), a.shape());
  // d/db a^b = a^b log a, taken as 0 where a <= 0 (where log is undefined), as TensorFlow does.
  const Tensor log_a = where(a > 0.0, log(where(a > 0.0, a, ones_like(a))), zero_like_scalar(a));
  dx[1] = unbroadcast(g[0] * c.outputs[0] * log_a, b.shape());
}
// Ties send the gradient to the first argument.
void maximum_grad(const GradCall& c, OutGrads g, Grads dx) {
  const Tensor first = c.inputs[0] >= c.inputs[1];
  const Tensor zero = zero_like_scalar(g[0]);
  dx[0] = unbroadcast(where(first, g[0], zero), c.inputs[0].shape());
  dx[1] = unbroadcast(where(first, zero, g[0]), c.inputs[1].shape());
}
void minimum_grad(const GradCall& c, OutGrads g, Grads dx) {
  const Tensor first = c.inputs[0] <= c.inputs[1];
  const Tensor zero = zero_like_scalar(g[0]);
  dx[0] = unbroadcast(where(first, g[0], zero), c.inputs[0].shape());
  dx[1] = unbroadcast(where(first, zero, g[0]), c.inputs[1].shape());
}
void neg_grad(const GradCall&, OutGrads g, Grads dx) { dx[0] = -g[0]; }
void exp_grad(const GradCall& c, OutGrads g, Grads dx) { dx[0] = g[0] * c.outputs[0]; }
void log_grad(const GradCall& c, OutGrads g, Grads dx) { dx[0] = g[0] / c.inputs[0]; }
void sqrt_grad(const GradCall& c, OutGrads g, Grads dx) { dx[0] = g[0] * 0.5 / c.outputs[0]; }
void tanh_grad(const GradCall& c, OutGrads g, Grads dx) { dx[0] = g[0] * (1.0 - square(c.outputs[0])); }
void sigmoid_grad(const GradCall& c, OutGrads g, Grads dx) {
  dx[0] = g[0] * c.outputs[0] * (1.0 - c.outputs[0]);
}
void relu_grad(const GradCall& c, OutGrads g, Grads dx) {
  dx[0] = where(c.inputs[0] > 0.0, g[0], zero_like_scalar(g[0]));
}
void abs_grad(const GradCall& c, OutGrads g, Grads dx) {
  const Tensor& a = c.inputs[0];
  const Tensor zero = zero_like_scalar(g[0]);
  dx[0] = where(a > 0.0, g[0], where(a < 0.0, -g[0], zero));
}
void square_grad(const GradCall& c, OutGrads g, Grads dx) { dx[0] = g[0] * 2.0 * c.inputs[0]; }
void where_grad(const GradCall& c, OutGrads g, Grads dx) {
  const Tensor zero = zero_like_scalar(g[0]);
  dx[1] = unbroadcast(where(c.inputs[0], g[0], zero), c.inputs[1].shape());
  dx[2] = unbroadcast(where(c.inputs[0], zero, g[0]), c.inputs[2].shape());
}
// Back to the input's dtype; integer inputs get none.
void cast_grad(const GradCall& c, OutGrads g, Grads dx) {
  if (is_floating(c.inputs[0].dtype())) dx[0] = cast(g[0], c.inputs[0].dtype());
}

constexpr DTypeSet kArithmetic = kNumbers;

Op add_op = binary_op<Add, kArithmetic>("add", &add_grad);
Op sub_op = binary_op<Sub, kArithmetic>("sub", &sub_grad);
Op mul_op = binary_op<Mul, kArithmetic>("mul", &mul_grad);
Op div_op = binary_op<Div, kArithmetic>("div", &div_grad);
Op pow_op = binary_op<Pow, kFloating>("pow", &pow_grad);
Op maximum_op = binary_op<Maximum, kArithmetic>("maximum", &maximum_grad);
Op minimum_op = binary_op<Minimum, kArithmetic>("minimum", &minimum_grad);
Op neg_op = unary_op<Neg, kArithmetic>("neg", &neg_grad);
Op exp_op = unary_op<Exp, kFloating>("exp", &exp_grad);
Op log_op = unary_op<Log, kFloating>("log", &log_grad);
Op sqrt_op = unary_op<Sqrt, kFloating>("sqrt", &sqrt_grad);
Op tanh_op = unary_op<Tanh, kFloating>("tanh", &tanh_grad);
Op sigmoid_op = unary_op<Sigmoid, kFloating>("sigmoid", &sigmoid_grad);
Op relu_op = unary_op<Relu, kArithmetic>("relu", &relu_grad);
Op abs_op = unary_op<Abs, kArithmetic>("abs", &abs_grad);
Op square_op = unary_op<Square, kArithmetic>("square", &square_grad);
Op equal_op = binary_op<Equal, kAll, true>("equal");
Op not_equal_op = binary_op<NotEqual, kAll, true>("not_equal");
Op less_op = binary_op<Less, kAll, true>("less");
Op less_equal_op = binary_op<LessEqual, kAll, true>("less_equal");
Op greater_op = binary_op<Greater, kAll, true>("greater");
Op greater_equal_op = binary_op<GreaterEqual, kAll, true>("greater_equal");
Op where_op{"where", 3, 3, kElementwise, &where_infer, {&where_kernel, nullptr}, &where_grad};
Op cast_op{"cast", 1, 1, kElementwise, &cast_infer, {&cast_kernel, nullptr}, &cast_grad,
           &copy_attributes<CastAttrs>, &describe_attributes<CastAttrs>};

}  // namespace

void add_elementwise_ops(std::vector<Op*>& ops) {
  ops.insert(ops.end(), {&add_op, &sub_op, &mul_op, &div_op, &pow_op, &maximum_op, &minimum_op, &neg_op,
                         &exp_op, &log_op, &sqrt_op, &tanh_op, &sigmoid_op, &relu_op, &abs_op, &square_op,
                         &equal_op, &not_equal_op, &less_op, &less_equal_op, &greater_op, &greater_equal_op,
                         &where_op, &cast_op});
}

}  // namespace detail

Tensor add(const Tensor& a, const Tensor& b) { return dispatch(detail::add_op, {a, b}); }
Tensor sub(const Tensor& a, const Tensor& b) { return dispatch(detail::sub_op, {a, b}); }
Tensor mul(const Tensor& a, const Tensor& b) { return dispatch(detail::mul_op, {a, b}); }
Tensor div(const Tensor& a, const Tensor& b) { return dispatch(detail::div_op, {a, b}); }
Tensor pow(const Tensor& a, const Tensor& b) { return dispatch(detail::pow_op, {a, b}); }
Tensor maximum(const Tensor& a, const Tensor& b) { return dispatch(detail::maximum_op, {a, b}); }
Tensor minimum(const Tensor& a, const Tensor& b) { return dispatch(detail::minimum_op, {a, b}); }
Tensor neg(const Tensor& t) { return dispatch(detail::neg_op, {t}); }
Tensor exp(const Tensor& t) { return dispatch(detail::exp_op, {t}); }
Tensor log(const Tensor& t) { return dispatch(detail::log_op, {t}); }
Tensor sqrt(const Tensor& t) { return dispatch(detail::sqrt_op, {t}); }
Tensor tanh(const Tensor& t) { return dispatch(detail::tanh_op, {t}); }
Tensor sigmoid(const Tensor& t) { return dispatch(detail::sigmoid_op, {t}); }
Tensor relu(const Tensor& t) { return dispatch(detail::relu_op, {t}); }
Tensor abs(const Tensor& t) { return dispatch(detail::abs_op, {t}); }
Tensor square(const Tensor& t) { return dispatch(detail::square_op, {t}); }
Tensor equal(const Tensor& a, const Tensor& b) { return dispatch(detail::equal_op, {a, b}); }
Tensor not_equal(const Tensor& a, const Tensor& b) { return dispatch(detail::not_equal_op, {a, b}); }
Tensor less(const Tensor& a, const Tensor& b) { return dispatch(detail::less_op, {a, b}); }
Tensor less_equal(const Tensor& a, const Tensor& b) { return dispatch(detail::less_equal_op, {a, b}); }
Tensor greater(const Tensor& a, const Tensor& b) { return dispatch(detail::greater_op, {a, b}); }
Tensor greater_equal(const Tensor& a, const Tensor& b) { return dispatch(detail::greater_equal_op, {a, b}); }
Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b) {
  return dispatch(detail::where_op, {condition, a, b});
}
Tensor cast(const Tensor& t, DType dtype) { return dispatch(detail::cast_op, {t}, detail::CastAttrs{dtype}); }

Tensor scalar_like(const Tensor& like, double value, const char* op) {
  const DType dt = like.dtype();
  if (is_integral(dt) || dt == b8) {
    if (value != std::trunc(value)) {
      detail::fail<InvalidArgument>("{}: scalar is not representable in the tensor's dtype; got {} for a {} tensor",
                                    op, value, dt);
    }
    // Doubles beyond int64 cannot be checked exactly below; reject them here.
    if (!(std::abs(value) < 9.2e18)) {
      detail::fail<InvalidArgument>("{}: scalar is not representable in the tensor's dtype; got {} for a {} tensor",
                                    op, value, dt);
    }
    return scalar_like(like, static_cast<int64_t>(value), op);
  }
  if (dt != f64 && std::isfinite(value) && std::abs(value) > 3.4028234663852886e38) {
    detail::fail<InvalidArgument>("{}: scalar overflows the tensor's dtype; got {} for a {} tensor", op, value, dt);
  }
  return full(Shape{}, value, dt, like.device());
}

Tensor scalar_like(const Tensor& like, int64_t value, const char* op) {
  const DType dt = like.dtype();
  auto out_of_range = [&](int64_t lo, int64_t hi) { return value < lo || value > hi; };
  const bool bad = (dt == i32 && out_of_range(INT32_MIN, INT32_MAX)) || (dt == u8 && out_of_range(0, 255)) ||
                   (dt == b8 && out_of_range(0, 1));
  if (bad) {
    detail::fail<InvalidArgument>("{}: scalar is not representable in the tensor's dtype; got {} for a {} tensor",
                                  op, value, dt);
  }
  if (dt == i64) return scalar(value).to(like.device());  // exact beyond 2^53, where a double rounds
  return full(Shape{}, static_cast<double>(value), dt, like.device());
}

}  // namespace flowlet
