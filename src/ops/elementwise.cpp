// Elementwise ops: arithmetic, math, comparisons and clamp (one Op value per row of
// kernels/elementwise_functors.hpp, its CPU kernel running the row's functor in the elementwise
// engine), their gradients, where and cast, and scalar operands.
#include "flowlet/ops/elementwise.hpp"

#include <cmath>
#include <iterator>
#include <type_traits>

#include "flowlet/dispatch.hpp"
#include "flowlet/ops/creation.hpp"
#include "kernels/elementwise_functors.hpp"
#include "kernels/elementwise_loop.hpp"
#include "kernels/vector_math.hpp"
#include "ops/attributes.hpp"
#include "ops/elementwise_ops.hpp"
#include "ops/grad_helpers.hpp"
#include "ops/known_ops.hpp"
#include "ops/registry.hpp"
#include "runtime/thread_pool.hpp"

namespace flowlet {
namespace detail {
namespace {

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

// The operands of every kind: one dtype (from `Allowed`) broadcast together; comparisons give b8.
template <ElementwiseKind Kind, DTypeSet Allowed>
void elementwise_infer(const OpCall& call, OutputSpec& spec) {
  const std::span<const Tensor> in = call.inputs;
  // Each kind writes its output meta in one go (no Shape moved through a local): this rule runs on
  // every eager call.
  if constexpr (Kind == ElementwiseKind::unary) {
    check_dtype(call.op.name, in[0].dtype(), Allowed);
    spec.outputs[0] = {in[0].shape(), in[0].dtype()};
  } else if constexpr (Kind == ElementwiseKind::binary || Kind == ElementwiseKind::compare) {
    check_same_dtype(call.op.name, in[0], in[1]);
    check_dtype(call.op.name, in[0].dtype(), Allowed);
    spec.outputs[0] = {broadcast_shapes(call.op.name, in[0].shape(), in[1].shape()),
                       Kind == ElementwiseKind::compare ? b8 : in[0].dtype()};
  } else {
    for (size_t k = 1; k < in.size(); ++k) check_same_dtype(call.op.name, in[0], in[k]);
    check_dtype(call.op.name, in[0].dtype(), Allowed);
    const Shape shape = broadcast_shapes(call.op.name, in[0].shape(), in[1].shape());
    spec.outputs[0] = {broadcast_shapes(call.op.name, shape, in[2].shape()), in[0].dtype()};
  }
}

// The f32 SIMD versions of the transcendentals (our polynomial kernels at the CPU's vector width,
// kernels/vector_math.hpp), or null.
template <class F>
VectorMathF32 vector_f32() {
  if constexpr (std::is_same_v<F, Exp>) return vector_exp_f32();
  else if constexpr (std::is_same_v<F, Log>) return vector_log_f32();
  else if constexpr (std::is_same_v<F, Tanh>) return vector_tanh_f32();
  else if constexpr (std::is_same_v<F, Sigmoid>) return vector_sigmoid_f32();
  else if constexpr (std::is_same_v<F, Erf>) return vector_erf_f32();
  else return nullptr;
}

template <ElementwiseKind Kind, class F, DTypeSet Allowed>
void elementwise_kernel(const OpCall& call, std::span<Tensor> out) {
  const Tensor& t = call.inputs[0];
  if (is_half(t.dtype())) return run_upcast(call, out, &elementwise_kernel<Kind, F, Allowed>);
  if constexpr (Kind == ElementwiseKind::unary) {
    const VectorMathF32 vector = vector_f32<F>();
    if (vector && t.dtype() == f32 && t.is_contiguous() && out[0].is_contiguous()) {
      const float* in = static_cast<const float*>(t.raw_data());
      float* result = static_cast<float*>(out[0].raw_data());
      parallel_for(t.numel(), kParallelGrain, [&](int64_t begin, int64_t end) { vector(in + begin, result + begin, end - begin); });
      return;
    }
  }
  uint64_t error = kNoElementError;
  visit_dtype<Allowed & ~kHalves>(t.dtype(), [&]<class T>(TypeTag<T>) {
    const F f = make_functor<F>(&error);
    const std::span<const Tensor> in = call.inputs;
    if constexpr (Kind == ElementwiseKind::unary) map_elements<T, T>(out[0], {&in[0]}, f);
    else if constexpr (Kind == ElementwiseKind::binary) map_elements<T, T, T>(out[0], {&in[0], &in[1]}, f);
    else if constexpr (Kind == ElementwiseKind::compare) map_elements<bool, T, T>(out[0], {&in[0], &in[1]}, f);
    else map_elements<T, T, T, T>(out[0], {&in[0], &in[1], &in[2]}, f);
  });
  if constexpr (kReportsIntegerErrors<F>) {
    if (error != kNoElementError) fail<InvalidArgument>("{}: {}", call.op.name, F::kIntegerError);
  }
}

constexpr int arity(ElementwiseKind kind) {
  return kind == ElementwiseKind::unary ? 1 : kind == ElementwiseKind::ternary ? 3 : 2;
}

template <ElementwiseKind Kind, class F, DTypeSet Allowed>
Op elementwise_op_value(std::string_view name, GradFn grad) {
  return Op{name, arity(Kind), arity(Kind), kElementwise, &elementwise_infer<Kind, Allowed>,
            {&elementwise_kernel<Kind, F, Allowed>, nullptr}, grad};
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
void log1p_grad(const GradCall& c, OutGrads g, Grads dx) { dx[0] = g[0] / (c.inputs[0] + 1.0); }
void expm1_grad(const GradCall& c, OutGrads g, Grads dx) { dx[0] = g[0] * (c.outputs[0] + 1.0); }
constexpr double kTwoOverSqrtPi = 1.1283791670955126;
constexpr double kOneOverSqrtTwoPi = 0.3989422804014327;
constexpr double kOneOverSqrtTwo = 0.7071067811865476;
void erf_grad(const GradCall& c, OutGrads g, Grads dx) {
  dx[0] = g[0] * (exp(-square(c.inputs[0])) * kTwoOverSqrtPi);
}
// d/dx x Phi(x) = Phi(x) + x phi(x).
void gelu_grad(const GradCall& c, OutGrads g, Grads dx) {
  const Tensor& x = c.inputs[0];
  const Tensor cdf = (erf(x * kOneOverSqrtTwo) + 1.0) * 0.5;
  const Tensor pdf = exp(square(x) * -0.5) * kOneOverSqrtTwoPi;
  dx[0] = g[0] * (cdf + x * pdf);
}
// Piecewise constant: the gradient is zero wherever it exists (as in PyTorch).
void zero_grad(const GradCall& c, OutGrads, Grads dx) { dx[0] = zeros_like(c.inputs[0]); }
constexpr GradFn sign_grad = &zero_grad;
constexpr GradFn floor_grad = &zero_grad;
constexpr GradFn round_grad = &zero_grad;
// The gradient goes to the operand clamp returned: hi where max(x, lo) > hi, else x where x >= lo,
// else lo (ties to x, then to max(x, lo), as the functor picks them).
void clamp_grad(const GradCall& c, OutGrads g, Grads dx) {
  const Tensor& x = c.inputs[0];
  const Tensor& lo = c.inputs[1];
  const Tensor& hi = c.inputs[2];
  const Tensor zero = zero_like_scalar(g[0]);
  const Tensor above = maximum(x, lo) > hi;
  const Tensor to_low = where(above, zero, g[0]);
  const Tensor x_wins = x >= lo;
  dx[0] = unbroadcast(where(x_wins, to_low, zero), x.shape());
  dx[1] = unbroadcast(where(x_wins, zero, to_low), lo.shape());
  dx[2] = unbroadcast(where(above, g[0], zero), hi.shape());
}
// Comparisons are not differentiable.
constexpr GradFn equal_grad = nullptr;
constexpr GradFn not_equal_grad = nullptr;
constexpr GradFn less_grad = nullptr;
constexpr GradFn less_equal_grad = nullptr;
constexpr GradFn greater_grad = nullptr;
constexpr GradFn greater_equal_grad = nullptr;
void where_grad(const GradCall& c, OutGrads g, Grads dx) {
  const Tensor zero = zero_like_scalar(g[0]);
  dx[1] = unbroadcast(where(c.inputs[0], g[0], zero), c.inputs[1].shape());
  dx[2] = unbroadcast(where(c.inputs[0], zero, g[0]), c.inputs[2].shape());
}
// Back to the input's dtype; integer inputs get none.
void cast_grad(const GradCall& c, OutGrads g, Grads dx) {
  if (is_floating(c.inputs[0].dtype())) dx[0] = cast(g[0], c.inputs[0].dtype());
}

// One Op per row of FLOWLET_ELEMENTWISE_OPS, indexed by ElementwiseOp.
Op elementwise_ops[] = {
#define FLOWLET_ELEMENTWISE_OP_VALUE(kind, name, functor, dtypes) \
  elementwise_op_value<ElementwiseKind::kind, functor, dtypes>(#name, name##_grad),
    FLOWLET_ELEMENTWISE_OPS(FLOWLET_ELEMENTWISE_OP_VALUE)
#undef FLOWLET_ELEMENTWISE_OP_VALUE
};
static_assert(std::size(elementwise_ops) == kElementwiseOpCount);

Op& op(ElementwiseOp id) { return elementwise_ops[static_cast<size_t>(id)]; }

Op where_op{"where", 3, 3, kElementwise, &where_infer, {&where_kernel, nullptr}, &where_grad};

}  // namespace

Op cast_op{"cast", 1, 1, kElementwise, &cast_infer, {&cast_kernel, nullptr}, &cast_grad,
           &copy_attributes<CastAttrs>, &describe_attributes<CastAttrs>};

Op& elementwise_op(ElementwiseOp id) { return op(id); }

std::optional<ElementwiseOp> elementwise_op_id(const Op& candidate) {
  const Op* first = std::begin(elementwise_ops);
  if (&candidate < first || &candidate >= std::end(elementwise_ops)) return std::nullopt;
  return static_cast<ElementwiseOp>(&candidate - first);
}

void add_elementwise_ops(std::vector<Op*>& ops) {
  for (Op& o : elementwise_ops) ops.push_back(&o);
  ops.insert(ops.end(), {&where_op, &cast_op});
}

}  // namespace detail

using detail::ElementwiseOp;

Tensor add(const Tensor& a, const Tensor& b) { return dispatch(detail::op(ElementwiseOp::add), {a, b}); }
Tensor sub(const Tensor& a, const Tensor& b) { return dispatch(detail::op(ElementwiseOp::sub), {a, b}); }
Tensor mul(const Tensor& a, const Tensor& b) { return dispatch(detail::op(ElementwiseOp::mul), {a, b}); }
Tensor div(const Tensor& a, const Tensor& b) { return dispatch(detail::op(ElementwiseOp::div), {a, b}); }
Tensor pow(const Tensor& a, const Tensor& b) { return dispatch(detail::op(ElementwiseOp::pow), {a, b}); }
Tensor maximum(const Tensor& a, const Tensor& b) { return dispatch(detail::op(ElementwiseOp::maximum), {a, b}); }
Tensor minimum(const Tensor& a, const Tensor& b) { return dispatch(detail::op(ElementwiseOp::minimum), {a, b}); }
Tensor neg(const Tensor& t) { return dispatch(detail::op(ElementwiseOp::neg), {t}); }
Tensor exp(const Tensor& t) { return dispatch(detail::op(ElementwiseOp::exp), {t}); }
Tensor log(const Tensor& t) { return dispatch(detail::op(ElementwiseOp::log), {t}); }
Tensor sqrt(const Tensor& t) { return dispatch(detail::op(ElementwiseOp::sqrt), {t}); }
Tensor tanh(const Tensor& t) { return dispatch(detail::op(ElementwiseOp::tanh), {t}); }
Tensor sigmoid(const Tensor& t) { return dispatch(detail::op(ElementwiseOp::sigmoid), {t}); }
Tensor relu(const Tensor& t) { return dispatch(detail::op(ElementwiseOp::relu), {t}); }
Tensor abs(const Tensor& t) { return dispatch(detail::op(ElementwiseOp::abs), {t}); }
Tensor square(const Tensor& t) { return dispatch(detail::op(ElementwiseOp::square), {t}); }
Tensor log1p(const Tensor& t) { return dispatch(detail::op(ElementwiseOp::log1p), {t}); }
Tensor expm1(const Tensor& t) { return dispatch(detail::op(ElementwiseOp::expm1), {t}); }
Tensor erf(const Tensor& t) { return dispatch(detail::op(ElementwiseOp::erf), {t}); }
Tensor gelu(const Tensor& t) { return dispatch(detail::op(ElementwiseOp::gelu), {t}); }
Tensor sign(const Tensor& t) { return dispatch(detail::op(ElementwiseOp::sign), {t}); }
Tensor floor(const Tensor& t) { return dispatch(detail::op(ElementwiseOp::floor), {t}); }
Tensor round(const Tensor& t) { return dispatch(detail::op(ElementwiseOp::round), {t}); }
Tensor clamp(const Tensor& x, const Tensor& lo, const Tensor& hi) {
  return dispatch(detail::op(ElementwiseOp::clamp), {x, lo, hi});
}
Tensor clamp(const Tensor& x, double lo, double hi) {
  return clamp(x, scalar_like(x, lo, "clamp"), scalar_like(x, hi, "clamp"));
}
Tensor equal(const Tensor& a, const Tensor& b) { return dispatch(detail::op(ElementwiseOp::equal), {a, b}); }
Tensor not_equal(const Tensor& a, const Tensor& b) { return dispatch(detail::op(ElementwiseOp::not_equal), {a, b}); }
Tensor less(const Tensor& a, const Tensor& b) { return dispatch(detail::op(ElementwiseOp::less), {a, b}); }
Tensor less_equal(const Tensor& a, const Tensor& b) { return dispatch(detail::op(ElementwiseOp::less_equal), {a, b}); }
Tensor greater(const Tensor& a, const Tensor& b) { return dispatch(detail::op(ElementwiseOp::greater), {a, b}); }
Tensor greater_equal(const Tensor& a, const Tensor& b) {
  return dispatch(detail::op(ElementwiseOp::greater_equal), {a, b});
}
Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b) {
  return dispatch(detail::where_op, {condition, a, b});
}
Tensor cast(const Tensor& t, DType dtype) { return dispatch(detail::cast_op, {t}, detail::CastAttrs{dtype}); }

namespace {

// The largest finite value of a floating dtype.
double largest_finite(DType dt) {
  switch (dt) {
    case f16: return 65504.0;
    case bf16: return 3.3895313892515355e38;
    case f32: return 3.4028234663852886e38;
    default: return std::numeric_limits<double>::max();
  }
}

// Whether the integer `value` survives the trip to floating dtype `dt` and back unchanged.
bool exact_in_floating(int64_t value, DType dt) {
  constexpr double two_to_63 = 9223372036854775808.0;
  const double as_double = static_cast<double>(value);
  if (as_double >= two_to_63 || static_cast<int64_t>(as_double) != value) return false;  // not even in f64
  if (dt == f64) return true;
  const auto as_float = static_cast<float>(as_double);
  if (static_cast<double>(as_float) != as_double) return false;
  if (dt == f16) return std::abs(as_double) <= 65504.0 && static_cast<float>(f16_t(as_float)) == as_float;
  if (dt == bf16) return static_cast<float>(bf16_t(as_float)) == as_float;
  return true;
}

template <class Value>
[[noreturn]] void fail_unrepresentable(const char* op, Value value, DType dt) {
  detail::fail<InvalidArgument>("{}: scalar is not representable in the tensor's dtype; got {} for a {} tensor", op,
                                value, dt);
}

}  // namespace

void detail::fail_unsigned_scalar(const Tensor& like, uint64_t value, const char* op) {
  fail_unrepresentable(op, value, like.dtype());
}

Tensor scalar_like(const Tensor& like, double value, const char* op) {
  const DType dt = like.dtype();
  if (is_integral(dt) || dt == b8) {
    // NaN fails the first test; doubles beyond int64 cannot be checked exactly below.
    if (value != std::trunc(value) || !(std::abs(value) < 9.2e18)) fail_unrepresentable(op, value, dt);
    return scalar_like(like, static_cast<int64_t>(value), op);
  }
  // A floating scalar rounds to the dtype's precision, but one beyond its range would become infinity.
  if (std::isfinite(value) && std::abs(value) > largest_finite(dt)) {
    detail::fail<InvalidArgument>("{}: scalar overflows the tensor's dtype; got {} for a {} tensor", op, value, dt);
  }
  return full(Shape{}, value, dt, like.device());
}

Tensor scalar_like(const Tensor& like, int64_t value, const char* op) {
  const DType dt = like.dtype();
  auto out_of_range = [&](int64_t lo, int64_t hi) { return value < lo || value > hi; };
  const bool bad = (dt == i32 && out_of_range(INT32_MIN, INT32_MAX)) || (dt == u8 && out_of_range(0, 255)) ||
                   (dt == b8 && out_of_range(0, 1)) || (is_floating(dt) && !exact_in_floating(value, dt));
  if (bad) fail_unrepresentable(op, value, dt);
  if (dt == i64) return scalar(value).to(like.device());  // exact beyond 2^53, where a double rounds
  return full(Shape{}, static_cast<double>(value), dt, like.device());
}

}  // namespace flowlet
