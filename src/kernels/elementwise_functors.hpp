// The elementwise ops' scalar functors, written once for every backend (g++ and nvcc compile this
// header; the CPU engine and the CUDA kernels call the same operator()), and the list of
// elementwise ops built from them. Adding an op: its functor and its row here, then its gradient
// and public function in src/ops/elementwise.cpp; both backends pick it up from the row.
//
// Integer arithmetic wraps (two's complement) instead of overflowing; f16 and bf16 arrive as float
// (their compute type), so the functors see f32, f64, the integers and bool. NaN propagates
// through every arithmetic functor (relu, abs, sign, clamp, maximum and minimum included).
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/dtype_visit.hpp"
#include "core/host_device.hpp"

namespace flowlet::detail {

template <class T>
inline constexpr bool kWraps = std::is_integral_v<T> && !std::is_same_v<T, bool>;

// The type integer arithmetic on T runs in: its unsigned twin, where overflow wraps.
template <class T, bool = kWraps<T>>
struct WrapType {
  using type = T;
};
template <class T>
struct WrapType<T, true> {
  using type = std::make_unsigned_t<T>;
};
template <class T>
using wrap_t = typename WrapType<T>::type;

// Records an error from inside a loop (one element is enough): the caller set *error to
// kNoElementError and throws after the loop when it changed. Threads may race to store; all
// store the same value.
inline constexpr uint64_t kNoElementError = UINT64_MAX;
FLOWLET_HOST_DEVICE inline void report_element_error(uint64_t* error) {
  if (error == nullptr) return;
#if defined(__CUDA_ARCH__)
  *error = 0;
#else
  std::atomic_ref<uint64_t>(*error).store(0, std::memory_order_relaxed);
#endif
}

struct Add {
  template <class T>
  FLOWLET_HOST_DEVICE T operator()(T a, T b) const {
    return static_cast<T>(static_cast<wrap_t<T>>(static_cast<wrap_t<T>>(a) + static_cast<wrap_t<T>>(b)));
  }
};
struct Sub {
  template <class T>
  FLOWLET_HOST_DEVICE T operator()(T a, T b) const {
    return static_cast<T>(static_cast<wrap_t<T>>(static_cast<wrap_t<T>>(a) - static_cast<wrap_t<T>>(b)));
  }
};
struct Mul {
  template <class T>
  FLOWLET_HOST_DEVICE T operator()(T a, T b) const {
    return static_cast<T>(static_cast<wrap_t<T>>(static_cast<wrap_t<T>>(a) * static_cast<wrap_t<T>>(b)));
  }
};
struct Neg {
  template <class T>
  FLOWLET_HOST_DEVICE T operator()(T a) const {
    if constexpr (kWraps<T>) return Sub{}(T{0}, a);
    else return -a;
  }
};
// Integer division truncates; by zero it reports an error (the op throws InvalidArgument) and
// gives 0; INT_MIN / -1 wraps.
struct Div {
  static constexpr const char* kIntegerError = "integer division by zero; got a zero divisor";
  uint64_t* error = nullptr;
  template <class T>
  FLOWLET_HOST_DEVICE T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      if (b == T{0}) {
        report_element_error(error);
        return T{0};
      }
      if constexpr (std::is_signed_v<T>) {
        if (b == static_cast<T>(-1)) return Neg{}(a);
      }
    }
    return a / b;
  }
};
// NaN wins, as in NumPy's maximum/minimum: a NaN in `a` is kept by `a != a`, one in `b` because
// every comparison with it is false. `|` rather than `||`: without a branch the CPU loop vectorizes.
struct Maximum {
  template <class T>
  FLOWLET_HOST_DEVICE T operator()(T a, T b) const { return ((a > b) | (a != a)) ? a : b; }
};
struct Minimum {
  template <class T>
  FLOWLET_HOST_DEVICE T operator()(T a, T b) const { return ((a < b) | (a != a)) ? a : b; }
};

struct Abs {
  template <class T>
  FLOWLET_HOST_DEVICE T operator()(T a) const {
    if constexpr (std::is_floating_point_v<T>) return a < T{0} ? -a : (a == T{0} ? T{0} : a);  // |-0| = +0; NaN stays
    else if constexpr (std::is_unsigned_v<T>) return a;
    else return a < T{0} ? Neg{}(a) : a;
  }
};
struct Square {
  template <class T>
  FLOWLET_HOST_DEVICE T operator()(T a) const { return Mul{}(a, a); }
};
// Written as "negative gives 0" so that NaN (which compares false) passes through, as in
// maximum(x, 0), NumPy and PyTorch.
struct Relu {
  template <class T>
  FLOWLET_HOST_DEVICE T operator()(T a) const {
    if constexpr (std::is_unsigned_v<T>) return a;
    else return a < T{0} ? T{0} : a;
  }
};
// -1, 0 or 1; NaN gives NaN and a signed zero keeps its sign.
struct Sign {
  template <class T>
  FLOWLET_HOST_DEVICE T operator()(T a) const {
    if constexpr (std::is_signed_v<T>) return a > T{0} ? T{1} : (a < T{0} ? static_cast<T>(-1) : a);
    else return a > T{0} ? T{1} : a;
  }
};
// min(max(x, lo), hi), so lo > hi gives hi (as NumPy and PyTorch); a NaN x stays NaN.
struct Clamp {
  template <class T>
  FLOWLET_HOST_DEVICE T operator()(T x, T lo, T hi) const {
    const T low = x < lo ? lo : x;
    return low > hi ? hi : low;
  }
};

// Floating functors calling the C library's function (`fn` for double, `fn`f for float), which the
// host and CUDA devices both provide.
#define FLOWLET_LIBM_FUNCTOR(Name, fn)                                          \
  struct Name {                                                                 \
    FLOWLET_HOST_DEVICE float operator()(float a) const { return ::fn##f(a); } \
    FLOWLET_HOST_DEVICE double operator()(double a) const { return ::fn(a); }  \
  }
FLOWLET_LIBM_FUNCTOR(Exp, exp);
FLOWLET_LIBM_FUNCTOR(Log, log);
FLOWLET_LIBM_FUNCTOR(Sqrt, sqrt);
FLOWLET_LIBM_FUNCTOR(Tanh, tanh);
FLOWLET_LIBM_FUNCTOR(Log1p, log1p);
FLOWLET_LIBM_FUNCTOR(Expm1, expm1);
FLOWLET_LIBM_FUNCTOR(Erf, erf);
FLOWLET_LIBM_FUNCTOR(Floor, floor);
FLOWLET_LIBM_FUNCTOR(Round, rint);  // in the default rounding mode: halves to even, as NumPy and PyTorch
#undef FLOWLET_LIBM_FUNCTOR

struct Pow {
  FLOWLET_HOST_DEVICE float operator()(float a, float b) const { return ::powf(a, b); }
  FLOWLET_HOST_DEVICE double operator()(double a, double b) const { return ::pow(a, b); }
};
struct Sigmoid {  // never exponentiates a large positive number
  template <class T>
  FLOWLET_HOST_DEVICE T operator()(T a) const {
    if (a >= T{0}) return T{1} / (T{1} + Exp{}(-a));
    const T e = Exp{}(a);
    return e / (T{1} + e);
  }
};
// Exact GELU, x * Phi(x), written with erfc rather than 1 + erf: for very negative x, 1 + erf
// cancels to 0, while erfc keeps the tiny result's relative precision.
struct Gelu {
  FLOWLET_HOST_DEVICE float operator()(float a) const { return 0.5f * a * ::erfcf(-a * 0.70710678118654752f); }
  FLOWLET_HOST_DEVICE double operator()(double a) const { return 0.5 * a * ::erfc(-a * 0.70710678118654752); }
};

struct Equal {
  template <class T>
  FLOWLET_HOST_DEVICE bool operator()(T a, T b) const { return a == b; }
};
struct NotEqual {
  template <class T>
  FLOWLET_HOST_DEVICE bool operator()(T a, T b) const { return a != b; }
};
struct Less {
  template <class T>
  FLOWLET_HOST_DEVICE bool operator()(T a, T b) const { return a < b; }
};
struct LessEqual {
  template <class T>
  FLOWLET_HOST_DEVICE bool operator()(T a, T b) const { return a <= b; }
};
struct Greater {
  template <class T>
  FLOWLET_HOST_DEVICE bool operator()(T a, T b) const { return a > b; }
};
struct GreaterEqual {
  template <class T>
  FLOWLET_HOST_DEVICE bool operator()(T a, T b) const { return a >= b; }
};

// How an elementwise op takes its operands: one, two of one dtype, two giving b8, or three of one
// dtype (all broadcast together).
enum class ElementwiseKind : uint8_t { unary, binary, compare, ternary };

// A functor that can fail on an element (Div on integers) says so with kIntegerError and takes
// the error slot as its first member.
template <class F>
inline constexpr bool kReportsIntegerErrors = requires { F::kIntegerError; };
template <class F>
FLOWLET_HOST_DEVICE F make_functor(uint64_t* error) {
  if constexpr (kReportsIntegerErrors<F>) return F{error};
  else return F{};
}

// The elementwise ops: kind, name (the public function's and the Op's), functor, dtypes. The order
// is the registration order; ElementwiseOp numbers the rows.
#define FLOWLET_ELEMENTWISE_OPS(X)              \
  X(binary, add, Add, kNumbers)                 \
  X(binary, sub, Sub, kNumbers)                 \
  X(binary, mul, Mul, kNumbers)                 \
  X(binary, div, Div, kNumbers)                 \
  X(binary, pow, Pow, kFloating)                \
  X(binary, maximum, Maximum, kNumbers)         \
  X(binary, minimum, Minimum, kNumbers)         \
  X(unary, neg, Neg, kNumbers)                  \
  X(unary, exp, Exp, kFloating)                 \
  X(unary, log, Log, kFloating)                 \
  X(unary, sqrt, Sqrt, kFloating)               \
  X(unary, tanh, Tanh, kFloating)               \
  X(unary, sigmoid, Sigmoid, kFloating)         \
  X(unary, relu, Relu, kNumbers)                \
  X(unary, abs, Abs, kNumbers)                  \
  X(unary, square, Square, kNumbers)            \
  X(unary, log1p, Log1p, kFloating)             \
  X(unary, expm1, Expm1, kFloating)             \
  X(unary, erf, Erf, kFloating)                 \
  X(unary, gelu, Gelu, kFloating)               \
  X(unary, sign, Sign, kNumbers)                \
  X(unary, floor, Floor, kFloating)             \
  X(unary, round, Round, kFloating)             \
  X(ternary, clamp, Clamp, kNumbers)            \
  X(compare, equal, Equal, kAll)                \
  X(compare, not_equal, NotEqual, kAll)         \
  X(compare, less, Less, kAll)                  \
  X(compare, less_equal, LessEqual, kAll)       \
  X(compare, greater, Greater, kAll)            \
  X(compare, greater_equal, GreaterEqual, kAll)

enum class ElementwiseOp : uint8_t {
#define FLOWLET_ELEMENTWISE_ID(kind, name, functor, dtypes) name,
  FLOWLET_ELEMENTWISE_OPS(FLOWLET_ELEMENTWISE_ID)
#undef FLOWLET_ELEMENTWISE_ID
};
inline constexpr size_t kElementwiseOpCount = 0
#define FLOWLET_ELEMENTWISE_COUNT(kind, name, functor, dtypes) +1
    FLOWLET_ELEMENTWISE_OPS(FLOWLET_ELEMENTWISE_COUNT);
#undef FLOWLET_ELEMENTWISE_COUNT

}  // namespace flowlet::detail
