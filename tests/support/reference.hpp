// Test support: tensors from doubles in any dtype, values read back as doubles, tolerant comparison,
// exception checks (type and message parts), non-contiguous copies, and naive f64 references.
//
// Every reference here is computed on the host in double from the values actually stored in the
// input tensors, so the tests compare flowlet against arithmetic it did not perform itself.
#pragma once

#include <doctest/doctest.h>
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <optional>
#include <source_location>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <vector>

#include <flowlet/flowlet.hpp>

namespace fl = flowlet;

namespace test {

// Shape text written here (not Shape::str) so that failure messages do not depend on the library.
inline std::string shape_text(const fl::Shape& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

}  // namespace test

namespace doctest {
template <>
struct StringMaker<fl::Shape> {
  static String convert(const fl::Shape& shape) { return test::shape_text(shape).c_str(); }
};
}  // namespace doctest

namespace flowlet {
// doctest prints enums as numbers unless an overload is found by argument-dependent lookup.
inline doctest::String toString(DType dtype) { return std::string(dtype_name(dtype)).c_str(); }
}  // namespace flowlet

namespace test {

inline const std::vector<fl::DType> kAllDTypes = {fl::f32, fl::f64, fl::i32, fl::i64,
                                                  fl::u8,  fl::b8,  fl::f16, fl::bf16};
inline const std::vector<fl::DType> kFloatDTypes = {fl::f32, fl::f64};
inline const std::vector<fl::DType> kIntegerDTypes = {fl::i32, fl::i64, fl::u8};
// Dtypes with arithmetic (SEMANTICS.md): f32 f64 i32 i64 u8, plus the f16/bf16 storage types
// whose elementwise math computes in f32 and stores back.
inline const std::vector<fl::DType> kNumericDTypes = {fl::f32, fl::f64, fl::i32, fl::i64, fl::u8};
inline const std::vector<fl::DType> kHalfDTypes = {fl::f16, fl::bf16};

inline bool is_float(fl::DType dt) { return dt == fl::f32 || dt == fl::f64 || dt == fl::f16 || dt == fl::bf16; }
inline bool is_signed_integer(fl::DType dt) { return dt == fl::i32 || dt == fl::i64; }

// ---------------------------------------------------------------------------------------------
// Values in and out.

// The value `v` becomes when stored in `dt` (`v` must be representable for integer dtypes).
inline double round_to(double v, fl::DType dt) {
  switch (dt) {
    case fl::DType::f32: return static_cast<double>(static_cast<float>(v));
    case fl::DType::f64: return v;
    case fl::DType::i32: return static_cast<double>(static_cast<int32_t>(v));
    case fl::DType::i64: return static_cast<double>(static_cast<int64_t>(v));
    case fl::DType::u8: return static_cast<double>(static_cast<uint8_t>(v));
    case fl::DType::b8: return v != 0 ? 1.0 : 0.0;
    case fl::DType::f16: return static_cast<double>(static_cast<float>(fl::f16_t(static_cast<float>(v))));
    case fl::DType::bf16: return static_cast<double>(static_cast<float>(fl::bf16_t(static_cast<float>(v))));
  }
  throw std::logic_error("round_to: unknown dtype");
}

template <class T>
std::vector<T> convert_values(const std::vector<double>& values) {
  std::vector<T> out;
  out.reserve(values.size());
  for (double v : values) {
    if constexpr (std::is_same_v<T, fl::f16_t> || std::is_same_v<T, fl::bf16_t>) {
      out.push_back(T(static_cast<float>(v)));
    } else {
      out.push_back(static_cast<T>(v));
    }
  }
  return out;
}

// A contiguous tensor of `dt` holding `values` (row-major) with `shape`, built from typed host
// values (no cast op involved).
inline fl::Tensor make(const std::vector<double>& values, const fl::Shape& shape, fl::DType dt = fl::f32) {
  switch (dt) {
    case fl::DType::f32: return fl::tensor(convert_values<float>(values), shape);
    case fl::DType::f64: return fl::tensor(values, shape);
    case fl::DType::i32: return fl::tensor(convert_values<int32_t>(values), shape);
    case fl::DType::i64: return fl::tensor(convert_values<int64_t>(values), shape);
    case fl::DType::u8: return fl::tensor(convert_values<uint8_t>(values), shape);
    case fl::DType::b8: {
      std::vector<bool> bits;
      for (double v : values) bits.push_back(v != 0);
      return fl::tensor(bits, shape);
    }
    case fl::DType::f16: return fl::tensor(convert_values<fl::f16_t>(values), shape);
    case fl::DType::bf16: return fl::tensor(convert_values<fl::bf16_t>(values), shape);
  }
  throw std::logic_error("make: unknown dtype");
}

// A rank-1 tensor.
inline fl::Tensor make(const std::vector<double>& values, fl::DType dt = fl::f32) {
  return make(values, fl::Shape{static_cast<int64_t>(values.size())}, dt);
}

template <class T>
std::vector<double> widen(const std::vector<T>& values) {
  std::vector<double> out;
  out.reserve(values.size());
  for (const T& v : values) out.push_back(static_cast<double>(static_cast<float>(v)));
  return out;
}
template <class T>
  requires std::is_arithmetic_v<T>
std::vector<double> widen(const std::vector<T>& values) {
  return std::vector<double>(values.begin(), values.end());
}

// Every element of `t` (row-major, any dtype, any layout) as doubles, read with the matching
// to_vector<T> (no cast op involved).
inline std::vector<double> values(const fl::Tensor& t) {
  switch (t.dtype()) {
    case fl::DType::f32: return widen(t.to_vector<float>());
    case fl::DType::f64: return t.to_vector<double>();
    case fl::DType::i32: return widen(t.to_vector<int32_t>());
    case fl::DType::i64: return widen(t.to_vector<int64_t>());
    case fl::DType::u8: return widen(t.to_vector<uint8_t>());
    case fl::DType::b8: {
      std::vector<bool> bits = t.to_vector<bool>();
      return std::vector<double>(bits.begin(), bits.end());
    }
    case fl::DType::f16: return widen(t.to_vector<fl::f16_t>());
    case fl::DType::bf16: return widen(t.to_vector<fl::bf16_t>());
  }
  throw std::logic_error("values: unknown dtype");
}

// ---------------------------------------------------------------------------------------------
// Comparison.

struct Tolerance {
  double rel = 0;
  double abs = 0;
};

// Integers and booleans compare exactly; floats within a few units of their precision.
inline Tolerance default_tolerance(fl::DType dt) {
  switch (dt) {
    case fl::DType::f64: return {1e-12, 1e-12};
    case fl::DType::f32: return {2e-5, 1e-6};
    case fl::DType::f16: return {2e-3, 1e-4};   // half ulp is 2^-11 relative
    case fl::DType::bf16: return {1.6e-2, 1e-3};  // half ulp is 2^-8 relative
    default: return {0, 0};
  }
}

inline bool same_value(double got, double want, Tolerance tol) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  if (!std::isfinite(got)) return false;
  return std::abs(got - want) <= tol.abs + tol.rel * std::abs(want);
}

// Checks every value; on failure reports how many differ and the first few, at the caller's line.
inline bool check_values(const std::vector<double>& got, const std::vector<double>& want, Tolerance tol,
                         std::source_location loc = std::source_location::current()) {
  if (got.size() != want.size()) {
    ADD_FAIL_CHECK_AT(loc.file_name(), static_cast<int>(loc.line()),
                      fmt::format("got {} values, expected {}", got.size(), want.size()));
    return false;
  }
  size_t bad = 0;
  std::string detail;
  for (size_t i = 0; i < got.size(); ++i) {
    if (same_value(got[i], want[i], tol)) continue;
    if (bad < 6) detail += fmt::format(" [{}] got {} want {};", i, got[i], want[i]);
    ++bad;
  }
  if (bad > 0) {
    ADD_FAIL_CHECK_AT(loc.file_name(), static_cast<int>(loc.line()),
                      fmt::format("{} of {} values differ (rel {}, abs {}):{}", bad, got.size(), tol.rel,
                                  tol.abs, detail));
    return false;
  }
  CHECK(true);  // counts the comparison as a passed assertion
  return true;
}

// Checks shape, dtype and values of `got`.
inline bool check_tensor(const fl::Tensor& got, const std::vector<double>& want, const fl::Shape& shape,
                         fl::DType dtype, std::optional<Tolerance> tol = std::nullopt,
                         std::source_location loc = std::source_location::current()) {
  const char* file = loc.file_name();
  const int line = static_cast<int>(loc.line());
  if (!got.defined()) {
    ADD_FAIL_CHECK_AT(file, line, "result is an empty Tensor handle");
    return false;
  }
  bool ok = true;
  if (!(got.shape() == shape)) {
    ADD_FAIL_CHECK_AT(file, line, fmt::format("shape {} expected {}", shape_text(got.shape()), shape_text(shape)));
    ok = false;
  }
  if (got.dtype() != dtype) {
    ADD_FAIL_CHECK_AT(file, line, fmt::format("dtype {} expected {}", fl::dtype_name(got.dtype()), fl::dtype_name(dtype)));
    ok = false;
  }
  if (!ok) return false;
  if (static_cast<size_t>(shape.numel()) != want.size()) {
    ADD_FAIL_CHECK_AT(file, line, fmt::format("test bug: {} expected values for shape {}", want.size(), shape_text(shape)));
    return false;
  }
  return check_values(values(got), want, tol.value_or(default_tolerance(dtype)), loc);
}

// ---------------------------------------------------------------------------------------------
// Errors.

inline std::string error_kind(const std::exception& e) {
  if (dynamic_cast<const fl::ShapeError*>(&e)) return "ShapeError";
  if (dynamic_cast<const fl::DTypeError*>(&e)) return "DTypeError";
  if (dynamic_cast<const fl::DeviceError*>(&e)) return "DeviceError";
  if (dynamic_cast<const fl::InvalidArgument*>(&e)) return "InvalidArgument";
  if (dynamic_cast<const fl::OutOfRange*>(&e)) return "OutOfRange";
  if (dynamic_cast<const fl::Cancelled*>(&e)) return "Cancelled";
  if (dynamic_cast<const fl::Error*>(&e)) return "flowlet::Error";
  return std::string("non-flowlet exception ") + typeid(e).name();
}

template <class E>
std::string expected_kind() {
  if constexpr (std::is_same_v<E, fl::ShapeError>) return "ShapeError";
  else if constexpr (std::is_same_v<E, fl::DTypeError>) return "DTypeError";
  else if constexpr (std::is_same_v<E, fl::DeviceError>) return "DeviceError";
  else if constexpr (std::is_same_v<E, fl::InvalidArgument>) return "InvalidArgument";
  else if constexpr (std::is_same_v<E, fl::OutOfRange>) return "OutOfRange";
  else if constexpr (std::is_same_v<E, fl::Cancelled>) return "Cancelled";
  else if constexpr (std::is_same_v<E, fl::Error>) return "flowlet::Error";
  else return typeid(E).name();
}

// Calls fn; passes when it throws E whose what() starts with `prefix` and contains every part.
template <class E>
bool check_throws_impl(const std::function<void()>& fn, const std::string& prefix,
                       const std::vector<std::string>& parts, std::source_location loc) {
  const char* file = loc.file_name();
  const int line = static_cast<int>(loc.line());
  try {
    fn();
  } catch (const E& e) {
    const std::string what = e.what();
    bool ok = true;
    if (!prefix.empty() && what.rfind(prefix, 0) != 0) {
      ADD_FAIL_CHECK_AT(file, line, fmt::format("message \"{}\" does not start with \"{}\"", what, prefix));
      ok = false;
    }
    for (const std::string& part : parts) {
      if (what.find(part) == std::string::npos) {
        ADD_FAIL_CHECK_AT(file, line, fmt::format("message \"{}\" lacks \"{}\"", what, part));
        ok = false;
      }
    }
    if (ok) CHECK(true);  // counts the check as a passed assertion
    return ok;
  } catch (const std::exception& e) {
    ADD_FAIL_CHECK_AT(file, line,
                      fmt::format("expected {}, got {}: \"{}\"", expected_kind<E>(), error_kind(e), e.what()));
    return false;
  } catch (...) {
    ADD_FAIL_CHECK_AT(file, line, fmt::format("expected {}, got an unknown exception", expected_kind<E>()));
    return false;
  }
  ADD_FAIL_CHECK_AT(file, line, fmt::format("expected {}, nothing was thrown", expected_kind<E>()));
  return false;
}

// check_throws<fl::ShapeError>([&] { add(a, b); }, {"add", "[2, 3]"}): the type and message parts.
template <class E>
bool check_throws(const std::function<void()>& fn, const std::vector<std::string>& parts = {},
                  std::source_location loc = std::source_location::current()) {
  return check_throws_impl<E>(fn, "", parts, loc);
}

// The same, and the message must start with "<op>:" (the library's error format).
template <class E>
bool check_op_throws(const std::string& op, const std::function<void()>& fn,
                     const std::vector<std::string>& parts = {},
                     std::source_location loc = std::source_location::current()) {
  return check_throws_impl<E>(fn, op + ":", parts, loc);
}

// ---------------------------------------------------------------------------------------------
// Index arithmetic.

inline std::vector<int64_t> unravel(int64_t flat, const fl::Shape& shape) {
  std::vector<int64_t> index(shape.size(), 0);
  for (size_t k = shape.size(); k-- > 0;) {
    index[k] = flat % shape[k];
    flat /= shape[k];
  }
  return index;
}

inline int64_t ravel(const std::vector<int64_t>& index, const fl::Shape& shape) {
  int64_t flat = 0;
  for (size_t k = 0; k < shape.size(); ++k) flat = flat * shape[k] + index[k];
  return flat;
}

inline fl::Shape shape_of(const std::vector<int64_t>& dims) { return fl::Shape(dims); }

// ---------------------------------------------------------------------------------------------
// Non-contiguous inputs with the same shape and values.

// A permute view of a contiguous tensor that holds the values with the dimensions reversed.
// Rank >= 2 (for lower ranks the result is an equal contiguous tensor).
inline fl::Tensor permuted_view(const fl::Tensor& t) {
  const fl::Shape shape = t.shape();
  const size_t rank = shape.size();
  if (rank < 2) return make(values(t), shape, t.dtype());
  const std::vector<double> v = values(t);
  fl::Shape reversed;
  for (size_t k = rank; k-- > 0;) reversed.push_back(shape[k]);
  std::vector<double> u(v.size());
  for (int64_t flat = 0; flat < static_cast<int64_t>(v.size()); ++flat) {
    std::vector<int64_t> index = unravel(flat, shape);
    std::reverse(index.begin(), index.end());
    u[static_cast<size_t>(ravel(index, reversed))] = v[static_cast<size_t>(flat)];
  }
  std::vector<int64_t> perm;
  for (size_t k = rank; k-- > 0;) perm.push_back(static_cast<int64_t>(k));
  return fl::permute(make(u, reversed, t.dtype()), perm);
}

// A view with every stride doubled and offset 1 inside a buffer whose other elements hold
// `sentinel`: a kernel that ignores strides or the offset reads sentinels. Any rank.
inline fl::Tensor strided_view(const fl::Tensor& t, double sentinel = 77) {
  const std::vector<double> v = values(t);
  const int64_t n = static_cast<int64_t>(v.size());
  std::vector<double> buffer(static_cast<size_t>(2 * n + 1), sentinel);
  for (int64_t i = 0; i < n; ++i) buffer[static_cast<size_t>(1 + 2 * i)] = v[static_cast<size_t>(i)];
  fl::Tensor base = make(buffer, fl::Shape{2 * n + 1}, t.dtype());
  fl::Strides strides = fl::contiguous_strides(t.shape());
  for (auto& s : strides) s *= 2;
  return fl::Tensor::view(base.storage(), t.shape(), strides, n > 0 ? 1 : 0, t.dtype());
}

// The usual non-contiguous stand-in: a permuted view for rank >= 2, else a strided view.
inline fl::Tensor noncontiguous(const fl::Tensor& t) {
  return t.rank() >= 2 ? permuted_view(t) : strided_view(t);
}

// ---------------------------------------------------------------------------------------------
// Seeded host random values (splitmix64), already rounded to the target dtype.

struct Rng {
  uint64_t state;
  explicit Rng(uint64_t seed) : state(seed * 0x9e3779b97f4a7c15ull + 12345) {}
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  int64_t integer(int64_t lo, int64_t hi) {  // inclusive
    return lo + static_cast<int64_t>(next() % static_cast<uint64_t>(hi - lo + 1));
  }
  double normal() {
    const double u1 = 1.0 - uniform();
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

enum class Domain {
  normal,      // floats ~N(0, 1) clipped to [-4, 4]; signed ints [-5, 5]; u8 [0, 10]; b8 0/1
  positive,    // floats [0.1, 3.1); ints [1, 5]
  nonzero,     // floats +-[0.5, 3); signed ints +-[1, 5]; u8 [1, 10]
  small_ints,  // integers [-2, 2] in every dtype (u8 [0, 3]): equal values are common
  castable,    // k + {0, .25, .5, .75} for k in 0..9 (0 exactly when k is 0); ints [0, 10]
  big,         // floats [10, 20); ints [10, 20]
};

inline double random_value(Rng& rng, fl::DType dt, Domain domain) {
  const bool floating = is_float(dt);
  const bool is_u8 = dt == fl::u8;
  if (dt == fl::b8) return static_cast<double>(rng.integer(0, 1));
  switch (domain) {
    case Domain::normal:
      if (floating) return std::clamp(rng.normal(), -4.0, 4.0);
      return static_cast<double>(is_u8 ? rng.integer(0, 10) : rng.integer(-5, 5));
    case Domain::positive:
      return floating ? rng.uniform(0.1, 3.1) : static_cast<double>(rng.integer(1, 5));
    case Domain::nonzero: {
      if (is_u8) return static_cast<double>(rng.integer(1, 10));
      const double sign = rng.integer(0, 1) == 0 ? -1.0 : 1.0;
      return sign * (floating ? rng.uniform(0.5, 3.0) : static_cast<double>(rng.integer(1, 5)));
    }
    case Domain::small_ints:
      return static_cast<double>(is_u8 ? rng.integer(0, 3) : rng.integer(-2, 2));
    case Domain::castable: {
      if (!floating) return static_cast<double>(rng.integer(0, 10));
      const int64_t k = rng.integer(0, 9);
      return k == 0 ? 0.0 : static_cast<double>(k) + 0.25 * static_cast<double>(rng.integer(0, 3));
    }
    case Domain::big:
      return floating ? rng.uniform(10.0, 20.0) : static_cast<double>(rng.integer(10, 20));
  }
  return 0;
}

inline std::vector<double> random_values(int64_t count, uint64_t seed, fl::DType dt, Domain domain = Domain::normal) {
  Rng rng(seed);
  std::vector<double> out(static_cast<size_t>(count));
  for (double& v : out) v = round_to(random_value(rng, dt, domain), dt);
  return out;
}

inline fl::Tensor random_tensor(const fl::Shape& shape, uint64_t seed, fl::DType dt = fl::f32,
                                Domain domain = Domain::normal) {
  return make(random_values(shape.numel(), seed, dt, domain), shape, dt);
}

// ---------------------------------------------------------------------------------------------
// Naive f64 references.

// Values with their shape, on the host.
struct Host {
  std::vector<double> values;
  fl::Shape shape;
};

inline Host host(const fl::Tensor& t) { return {values(t), t.shape()}; }

// NumPy broadcasting of any number of shapes; nullopt when they do not broadcast.
inline std::optional<fl::Shape> broadcast_shape(const std::vector<fl::Shape>& shapes) {
  size_t rank = 0;
  for (const auto& s : shapes) rank = std::max(rank, s.size());
  std::vector<int64_t> out(rank, 1);
  for (const auto& s : shapes) {
    for (size_t k = 0; k < s.size(); ++k) {
      int64_t& o = out[rank - s.size() + k];
      const int64_t d = s[k];
      if (d == o || d == 1) continue;
      if (o == 1) {
        o = d;
        continue;
      }
      return std::nullopt;
    }
  }
  return fl::Shape(out);
}

// Applies f(args) at every position of the broadcast shape; args[j] is input j's element there.
inline Host broadcast_map(const std::vector<Host>& inputs, const std::function<double(const std::vector<double>&)>& f) {
  std::vector<fl::Shape> shapes;
  for (const auto& in : inputs) shapes.push_back(in.shape);
  const std::optional<fl::Shape> out_shape = broadcast_shape(shapes);
  if (!out_shape) throw std::logic_error("broadcast_map: shapes do not broadcast");
  Host out{std::vector<double>(static_cast<size_t>(out_shape->numel())), *out_shape};
  std::vector<double> args(inputs.size());
  for (int64_t flat = 0; flat < out_shape->numel(); ++flat) {
    const std::vector<int64_t> index = unravel(flat, *out_shape);
    for (size_t j = 0; j < inputs.size(); ++j) {
      const fl::Shape& s = inputs[j].shape;
      const size_t lead = out_shape->size() - s.size();
      int64_t in_flat = 0;
      for (size_t k = 0; k < s.size(); ++k) in_flat = in_flat * s[k] + (s[k] == 1 ? 0 : index[lead + k]);
      args[j] = inputs[j].values[static_cast<size_t>(in_flat)];
    }
    out.values[static_cast<size_t>(flat)] = f(args);
  }
  return out;
}

inline Host binary_ref(const Host& a, const Host& b, const std::function<double(double, double)>& f) {
  return broadcast_map({a, b}, [&](const std::vector<double>& x) { return f(x[0], x[1]); });
}

inline Host unary_ref(const Host& a, const std::function<double(double)>& f) {
  Host out{a.values, a.shape};
  for (double& v : out.values) v = f(v);
  return out;
}

// Axes normalized to [0, rank), sorted; throws std::logic_error on a test bug (bad axis).
inline std::vector<int64_t> normalize_axes(std::vector<int64_t> axes, size_t rank) {
  for (auto& a : axes) {
    if (a < 0) a += static_cast<int64_t>(rank);
    if (a < 0 || a >= static_cast<int64_t>(rank)) throw std::logic_error("normalize_axes: axis out of range");
  }
  std::sort(axes.begin(), axes.end());
  return axes;
}

inline std::vector<int64_t> all_axes(size_t rank) {
  std::vector<int64_t> axes(rank);
  for (size_t k = 0; k < rank; ++k) axes[k] = static_cast<int64_t>(k);
  return axes;
}

// Reduces `axes` of x: every output starts at `init` and folds in its elements with `combine`.
inline Host reduce_ref(const Host& x, const std::vector<int64_t>& axes_in, bool keepdims, double init,
                       const std::function<double(double, double)>& combine) {
  const std::vector<int64_t> axes = normalize_axes(axes_in, x.shape.size());
  auto reduced = [&](size_t k) { return std::find(axes.begin(), axes.end(), static_cast<int64_t>(k)) != axes.end(); };
  fl::Shape kept;  // keepdims shape
  fl::Shape out_shape;
  for (size_t k = 0; k < x.shape.size(); ++k) {
    kept.push_back(reduced(k) ? 1 : x.shape[k]);
    if (!reduced(k)) out_shape.push_back(x.shape[k]);
    else if (keepdims) out_shape.push_back(1);
  }
  Host out{std::vector<double>(static_cast<size_t>(kept.numel()), init), out_shape};
  for (int64_t flat = 0; flat < x.shape.numel(); ++flat) {
    std::vector<int64_t> index = unravel(flat, x.shape);
    for (size_t k = 0; k < index.size(); ++k)
      if (reduced(k)) index[k] = 0;
    double& slot = out.values[static_cast<size_t>(ravel(index, kept))];
    slot = combine(slot, x.values[static_cast<size_t>(flat)]);
  }
  return out;
}

inline Host sum_ref(const Host& x, const std::vector<int64_t>& axes, bool keepdims = false) {
  return reduce_ref(x, axes, keepdims, 0.0, [](double a, double b) { return a + b; });
}

// NaN-propagating max.
inline Host max_ref(const Host& x, const std::vector<int64_t>& axes, bool keepdims = false) {
  return reduce_ref(x, axes, keepdims, -std::numeric_limits<double>::infinity(), [](double a, double b) {
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
    return std::max(a, b);
  });
}

// Index of the first maximum along `axis` (a NaN counts as the maximum).
inline Host argmax_ref(const Host& x, int64_t axis) {
  const size_t rank = x.shape.size();
  if (axis < 0) axis += static_cast<int64_t>(rank);
  const auto ax = static_cast<size_t>(axis);
  fl::Shape out_shape;
  for (size_t k = 0; k < rank; ++k)
    if (k != ax) out_shape.push_back(x.shape[k]);
  Host out{std::vector<double>(static_cast<size_t>(out_shape.numel())), out_shape};
  for (int64_t o = 0; o < out_shape.numel(); ++o) {
    const std::vector<int64_t> oi = unravel(o, out_shape);
    std::vector<int64_t> index;
    for (size_t k = 0, j = 0; k < rank; ++k) index.push_back(k == ax ? 0 : oi[j++]);
    double best = 0;
    int64_t best_i = -1;
    for (int64_t i = 0; i < x.shape[ax]; ++i) {
      index[ax] = i;
      const double v = x.values[static_cast<size_t>(ravel(index, x.shape))];
      if (best_i >= 0 && std::isnan(best)) break;
      if (best_i < 0 || std::isnan(v) || v > best) {
        best = v;
        best_i = i;
      }
    }
    out.values[static_cast<size_t>(o)] = static_cast<double>(best_i);
  }
  return out;
}

// [.., m, k] x [.., k, n] with a rank-2 operand shared across the batch.
inline Host matmul_ref(const Host& a, const Host& b) {
  const bool a3 = a.shape.size() == 3;
  const bool b3 = b.shape.size() == 3;
  const int64_t batch = a3 ? a.shape[0] : (b3 ? b.shape[0] : 1);
  const int64_t m = a.shape[a.shape.size() - 2];
  const int64_t k = a.shape[a.shape.size() - 1];
  const int64_t n = b.shape[b.shape.size() - 1];
  Host out;
  out.shape = (a3 || b3) ? fl::Shape{batch, m, n} : fl::Shape{m, n};
  out.values.assign(static_cast<size_t>(batch * m * n), 0.0);
  for (int64_t p = 0; p < batch; ++p) {
    const double* ap = a.values.data() + (a3 ? p * m * k : 0);
    const double* bp = b.values.data() + (b3 ? p * k * n : 0);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t q = 0; q < k; ++q) acc += ap[i * k + q] * bp[q * n + j];
        out.values[static_cast<size_t>((p * m + i) * n + j)] = acc;
      }
  }
  return out;
}

// Dimension i of the result is dimension perm[i] of x.
inline Host permute_ref(const Host& x, const std::vector<int64_t>& perm) {
  fl::Shape out_shape;
  for (int64_t p : perm) out_shape.push_back(x.shape[static_cast<size_t>(p)]);
  Host out{std::vector<double>(x.values.size()), out_shape};
  for (int64_t flat = 0; flat < out_shape.numel(); ++flat) {
    const std::vector<int64_t> oi = unravel(flat, out_shape);
    std::vector<int64_t> index(perm.size());
    for (size_t k = 0; k < perm.size(); ++k) index[static_cast<size_t>(perm[k])] = oi[k];
    out.values[static_cast<size_t>(flat)] = x.values[static_cast<size_t>(ravel(index, x.shape))];
  }
  return out;
}

inline Host concat_ref(const std::vector<Host>& xs, int64_t axis) {
  const size_t rank = xs.at(0).shape.size();
  if (axis < 0) axis += static_cast<int64_t>(rank);
  const auto ax = static_cast<size_t>(axis);
  fl::Shape out_shape = xs[0].shape;
  out_shape[ax] = 0;
  for (const auto& x : xs) out_shape[ax] += x.shape[ax];
  Host out{std::vector<double>(static_cast<size_t>(out_shape.numel())), out_shape};
  int64_t start = 0;
  for (const auto& x : xs) {
    for (int64_t flat = 0; flat < x.shape.numel(); ++flat) {
      std::vector<int64_t> index = unravel(flat, x.shape);
      index[ax] += start;
      out.values[static_cast<size_t>(ravel(index, out_shape))] = x.values[static_cast<size_t>(flat)];
    }
    start += x.shape[ax];
  }
  return out;
}

// Rows of params along axis 0 picked by indices: shape indices.shape + params.shape[1:].
inline Host gather_ref(const Host& params, const Host& indices) {
  fl::Shape out_shape = indices.shape;
  int64_t row = 1;
  for (size_t k = 1; k < params.shape.size(); ++k) {
    out_shape.push_back(params.shape[k]);
    row *= params.shape[k];
  }
  Host out;
  out.shape = out_shape;
  for (double index : indices.values) {
    const auto r = static_cast<int64_t>(index);
    for (int64_t j = 0; j < row; ++j) out.values.push_back(params.values[static_cast<size_t>(r * row + j)]);
  }
  return out;
}

// log(sum(exp(x))) along `axis` computed stably, and the softmax family from it.
inline Host log_softmax_ref(const Host& x, int64_t axis) {
  const size_t rank = x.shape.size();
  if (axis < 0) axis += static_cast<int64_t>(rank);
  const Host mx = max_ref(x, {axis}, true);
  Host shifted = binary_ref(x, mx, [](double v, double m) { return v - m; });
  const Host lse = reduce_ref(shifted, {axis}, true, 0.0, [](double acc, double v) { return acc + std::exp(v); });
  return binary_ref(shifted, lse, [](double v, double s) { return v - std::log(s); });
}

inline Host softmax_ref(const Host& x, int64_t axis) {
  return unary_ref(log_softmax_ref(x, axis), [](double v) { return std::exp(v); });
}

}  // namespace test
