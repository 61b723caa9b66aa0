// The one map from DType to C++ element types, shared by the CPU kernels and the CUDA launchers
// (g++ and nvcc both compile this header): dtype sets, the visitor, compute types and value
// conversions.
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include "flowlet/core/dtype.hpp"
#include "core/host_device.hpp"

namespace flowlet::detail {

using DTypeSet = uint32_t;
constexpr DTypeSet bit(DType dt) { return DTypeSet{1} << static_cast<int>(dt); }
inline constexpr DTypeSet kFloatCompute = bit(f32) | bit(f64);
inline constexpr DTypeSet kHalves = bit(f16) | bit(bf16);
inline constexpr DTypeSet kFloating = kFloatCompute | kHalves;
inline constexpr DTypeSet kIntegers = bit(i32) | bit(i64) | bit(u8);
inline constexpr DTypeSet kNumbers = kFloating | kIntegers;
inline constexpr DTypeSet kAll = kNumbers | bit(b8);

template <class T>
struct TypeTag {
  using type = T;
};

// DTypeError naming `kernel` and `dt`: a visitor reached a dtype it was not instantiated for (the
// op's dtype rule should have refused it first). Defined in elementwise_loop.cpp.
[[noreturn]] void fail_unsupported_dtype(const char* kernel, DType dt);

// Calls f(TypeTag<T>{}) for the C++ type that stores `dt` (f16_t and bf16_t for the halves, on the
// CPU and on CUDA devices alike). Only the types in `Allowed` are instantiated.
template <DTypeSet Allowed, class F>
decltype(auto) visit_dtype(DType dt, F&& f, const char* kernel = "kernel") {
  switch (dt) {
#define FLOWLET_VISIT_CASE(name, type)                                                    \
  case DType::name:                                                                       \
    static_assert(dtype_of<type> == DType::name && sizeof(type) == dtype_size(DType::name)); \
    if constexpr ((Allowed & bit(DType::name)) != 0) return f(TypeTag<type>{});           \
    break;
    FLOWLET_VISIT_CASE(f32, float)
    FLOWLET_VISIT_CASE(f64, double)
    FLOWLET_VISIT_CASE(i32, int32_t)
    FLOWLET_VISIT_CASE(i64, int64_t)
    FLOWLET_VISIT_CASE(u8, uint8_t)
    FLOWLET_VISIT_CASE(b8, bool)
    FLOWLET_VISIT_CASE(f16, f16_t)
    FLOWLET_VISIT_CASE(bf16, bf16_t)
#undef FLOWLET_VISIT_CASE
  }
  fail_unsupported_dtype(kernel, dt);
}

// Calls f(TypeTag<U>{}) with U the unsigned integer of dt's size: for kernels that move bits
// without arithmetic (copies, selection), one instantiation per size serves every dtype.
template <class F>
decltype(auto) visit_bits(DType dt, F&& f) {
  switch (dtype_size(dt)) {
    case 1: return f(TypeTag<uint8_t>{});
    case 2: return f(TypeTag<uint16_t>{});
    case 4: return f(TypeTag<uint32_t>{});
    default: return f(TypeTag<uint64_t>{});
  }
}

template <class T>
inline constexpr bool kIsHalf = std::is_same_v<T, f16_t> || std::is_same_v<T, bf16_t>;

// The type arithmetic on T runs in: float for the 16-bit storage types, T otherwise.
template <class T>
using compute_t = std::conditional_t<kIsHalf<T>, float, T>;

// Value conversion with defined results everywhere: float to integer truncates toward zero,
// saturates at the integer's range, and maps NaN to 0 (a plain static_cast would be UB there).
// Halves convert through float; on CUDA devices they are loaded as float before any conversion.
template <class To, class From>
FLOWLET_HOST_DEVICE To convert(From value) {
  if constexpr (std::is_same_v<To, From>) {
    return value;
  } else if constexpr (kIsHalf<From>) {
    return convert<To>(static_cast<float>(value));
  } else if constexpr (kIsHalf<To>) {
    return To(convert<float>(value));
  } else if constexpr (std::is_same_v<To, bool>) {
    return value != From{};
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<From>) {
    if (value != value) return To{0};  // NaN
    constexpr auto lo = static_cast<From>(std::numeric_limits<To>::lowest());
    constexpr auto hi = static_cast<From>(std::numeric_limits<To>::max());
    if (value <= lo) return std::numeric_limits<To>::lowest();
    if (value >= hi) return std::numeric_limits<To>::max();
    return static_cast<To>(value);
  } else {
    return static_cast<To>(value);  // integer narrowing wraps (defined since C++20)
  }
}

}  // namespace flowlet::detail
