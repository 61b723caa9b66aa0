#include "collective/transport/reduction.hpp"

#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/dtype_visit.hpp"

namespace flowlet::detail {

namespace {

// Integer sums go through the unsigned type: wrapping is defined there, signed overflow is not.
template <class T>
T wrapping_add(T a, T b) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}

template <class T>
T combine(ReduceOp op, T a, T b) {
  if constexpr (std::is_same_v<T, bool>) {
    return (op == ReduceOp::min || op == ReduceOp::mean) ? (a && b) : (a || b);
  } else {
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::mean:
        return wrapping_add(a, b);
      case ReduceOp::max:
        if constexpr (std::is_floating_point_v<T>) {
          if (std::isnan(a) || std::isnan(b)) return std::isnan(a) ? a : b;
        }
        return a < b ? b : a;
      case ReduceOp::min:
        if constexpr (std::is_floating_point_v<T>) {
          if (std::isnan(a) || std::isnan(b)) return std::isnan(a) ? a : b;
        }
        return b < a ? b : a;
    }
    return a;
  }
}

// Wire type of a stored type: halves accumulate in float.
template <class T>
using Wire = std::conditional_t<std::is_same_v<T, f16_t> || std::is_same_v<T, bf16_t>, float, T>;

// Reduces blocks of elements so that each participant's block stays in cache while it is combined.
constexpr int64_t kBlock = 4096;

template <class T>
void accumulate_typed(ReduceOp op, const std::vector<const void*>& inputs, void* out_raw, int64_t count) {
  using W = Wire<T>;
  auto* out = static_cast<W*>(out_raw);
  for (int64_t start = 0; start < count; start += kBlock) {
    const int64_t end = std::min(count, start + kBlock);
    const auto* first = static_cast<const T*>(inputs[0]);
    if constexpr (std::is_same_v<W, T>) {
      if (out != first) std::memcpy(out + start, first + start, static_cast<size_t>(end - start) * sizeof(T));
    } else {
      for (int64_t i = start; i < end; ++i) out[i] = static_cast<W>(first[i]);
    }
    for (size_t p = 1; p < inputs.size(); ++p) {
      const auto* in = static_cast<const T*>(inputs[p]);
      for (int64_t i = start; i < end; ++i) out[i] = combine<W>(op, out[i], static_cast<W>(in[i]));
    }
  }
}

template <class T>
void finish_typed(ReduceOp op, int participants, const void* wire_raw, void* out_raw, int64_t count) {
  using W = Wire<T>;
  const auto* wire = static_cast<const W*>(wire_raw);
  auto* out = static_cast<T*>(out_raw);
  const bool divide = op == ReduceOp::mean && !std::is_same_v<T, bool>;
  if constexpr (std::is_same_v<W, T>) {
    if (!divide) {
      if (static_cast<const void*>(out) != wire_raw) std::memcpy(out, wire, static_cast<size_t>(count) * sizeof(T));
      return;
    }
  }
  for (int64_t i = 0; i < count; ++i) {
    W value = wire[i];
    if constexpr (!std::is_same_v<T, bool>) {
      if (divide) value = static_cast<W>(value / static_cast<W>(participants));
    }
    out[i] = static_cast<T>(value);
  }
}

}  // namespace

DType wire_dtype(DType dtype) { return (dtype == f16 || dtype == bf16) ? f32 : dtype; }

ReduceOp wire_op(DType dtype, ReduceOp op) {
  if (dtype == b8) return (op == ReduceOp::min || op == ReduceOp::mean) ? ReduceOp::min : ReduceOp::max;
  return op == ReduceOp::mean ? ReduceOp::sum : op;
}

void accumulate(DType dtype, ReduceOp op, const std::vector<const void*>& inputs, void* out, int64_t count) {
  if (count == 0 || inputs.empty()) return;
  visit_dtype<kAll>(dtype, [&](auto tag) {
    accumulate_typed<typename decltype(tag)::type>(op, inputs, out, count);
  }, "collective reduction");
}

void finish(DType dtype, ReduceOp op, int participants, const void* wire, void* out, int64_t count) {
  if (count == 0) return;
  visit_dtype<kAll>(dtype, [&](auto tag) {
    finish_typed<typename decltype(tag)::type>(op, participants, wire, out, count);
  }, "collective reduction");
}

}  // namespace flowlet::detail
