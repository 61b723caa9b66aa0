// Elementwise math with NumPy broadcasting, comparisons, where, casts, and the C++ operators.
#pragma once

#include <concepts>
#include <cstdint>
#include <type_traits>

#include "flowlet/core/tensor.hpp"

namespace flowlet {

// Binary ops broadcast; ShapeError if shapes cannot broadcast, DTypeError if dtypes differ.
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);  // integer division truncates; by zero: InvalidArgument
Tensor pow(const Tensor& a, const Tensor& b);  // floating dtypes
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);

// Unary ops. exp/log/sqrt/tanh/sigmoid need a floating dtype; neg/abs/square/relu take numbers.
// NaN propagates through every one of them (relu(NaN) is NaN, as maximum(x, 0)).
Tensor neg(const Tensor& t);
Tensor exp(const Tensor& t);
Tensor log(const Tensor& t);
Tensor sqrt(const Tensor& t);
Tensor tanh(const Tensor& t);
Tensor sigmoid(const Tensor& t);
Tensor relu(const Tensor& t);
Tensor abs(const Tensor& t);
Tensor square(const Tensor& t);
Tensor log1p(const Tensor& t);  // log(1 + x), accurate near 0; floating dtypes
Tensor expm1(const Tensor& t);  // exp(x) - 1, accurate near 0; floating dtypes
Tensor erf(const Tensor& t);    // the error function; floating dtypes
// Exact (erf-based) GELU: x * Phi(x), Phi the standard normal CDF; floating dtypes.
Tensor gelu(const Tensor& t);
Tensor sign(const Tensor& t);   // -1, 0 or 1 in t's dtype (NaN stays NaN); numbers
Tensor floor(const Tensor& t);  // floating dtypes
Tensor round(const Tensor& t);  // to the nearest integer, halves to even (round(2.5) = 2); floating dtypes

// min(max(x, lo), hi) elementwise, all three broadcast together and of one dtype (so lo > hi gives
// hi); NaN in x stays NaN. The scalar form converts lo and hi as scalar operands do:
//   clamp(x, 0.0, 6.0)  // relu6
Tensor clamp(const Tensor& x, const Tensor& lo, const Tensor& hi);
Tensor clamp(const Tensor& x, double lo, double hi);

// Comparisons give b8.
Tensor equal(const Tensor& a, const Tensor& b);
Tensor not_equal(const Tensor& a, const Tensor& b);
Tensor less(const Tensor& a, const Tensor& b);
Tensor less_equal(const Tensor& a, const Tensor& b);
Tensor greater(const Tensor& a, const Tensor& b);
Tensor greater_equal(const Tensor& a, const Tensor& b);

// condition (b8) ? a : b, all three broadcast together; a and b share a dtype.
Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b);

// Converts the dtype (same as t.astype(dtype)). Float to integer truncates toward zero.
Tensor cast(const Tensor& t, DType dtype);

// A rank-0 tensor of `like`'s dtype holding `value`. InvalidArgument when the value does not fit
// that dtype (2.5 for an i32 tensor, 300 for u8, 2^24 + 1 for f32, 1e39 for f32), so a scalar never
// changes a result silently; docs/SEMANTICS.md has the rule.
Tensor scalar_like(const Tensor& like, double value, const char* op);
Tensor scalar_like(const Tensor& like, int64_t value, const char* op);

template <class S>
concept ScalarValue = std::is_arithmetic_v<S> && !std::same_as<S, bool>;

namespace detail {
// InvalidArgument for an unsigned scalar above INT64_MAX, which no dtype holds exactly.
[[noreturn]] void fail_unsigned_scalar(const Tensor& like, uint64_t value, const char* op);

template <ScalarValue S>
Tensor scalar_for(const Tensor& like, S value, const char* op) {
  if constexpr (std::is_integral_v<S>) {
    if constexpr (std::is_unsigned_v<S> && sizeof(S) >= sizeof(int64_t)) {
      if (value > static_cast<S>(INT64_MAX)) fail_unsigned_scalar(like, value, op);
    }
    return scalar_like(like, static_cast<int64_t>(value), op);
  } else {
    return scalar_like(like, static_cast<double>(value), op);
  }
}
}  // namespace detail

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator-(const Tensor& a) { return neg(a); }
inline Tensor operator==(const Tensor& a, const Tensor& b) { return equal(a, b); }
inline Tensor operator!=(const Tensor& a, const Tensor& b) { return not_equal(a, b); }
inline Tensor operator<(const Tensor& a, const Tensor& b) { return less(a, b); }
inline Tensor operator<=(const Tensor& a, const Tensor& b) { return less_equal(a, b); }
inline Tensor operator>(const Tensor& a, const Tensor& b) { return greater(a, b); }
inline Tensor operator>=(const Tensor& a, const Tensor& b) { return greater_equal(a, b); }

// A scalar on either side takes the tensor's dtype.
#define FLOWLET_SCALAR_OPERATOR(symbol, function)                                           \
  template <ScalarValue S>                                                                  \
  Tensor operator symbol(const Tensor& a, S s) {                                            \
    return function(a, detail::scalar_for(a, s, #function));                               \
  }                                                                                         \
  template <ScalarValue S>                                                                  \
  Tensor operator symbol(S s, const Tensor& b) {                                            \
    return function(detail::scalar_for(b, s, #function), b);                               \
  }
FLOWLET_SCALAR_OPERATOR(+, add)
FLOWLET_SCALAR_OPERATOR(-, sub)
FLOWLET_SCALAR_OPERATOR(*, mul)
FLOWLET_SCALAR_OPERATOR(/, div)
FLOWLET_SCALAR_OPERATOR(==, equal)
FLOWLET_SCALAR_OPERATOR(!=, not_equal)
FLOWLET_SCALAR_OPERATOR(<, less)
FLOWLET_SCALAR_OPERATOR(<=, less_equal)
FLOWLET_SCALAR_OPERATOR(>, greater)
FLOWLET_SCALAR_OPERATOR(>=, greater_equal)
#undef FLOWLET_SCALAR_OPERATOR

}  // namespace flowlet
