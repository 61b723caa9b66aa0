// Element types: the DType enum, its names and sizes, and the map from C++ types to dtypes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "flowlet/core/half.hpp"

namespace flowlet {

enum class DType : uint8_t { f32, f64, i32, i64, u8, b8, f16, bf16 };
inline constexpr int kNumDTypes = 8;

inline constexpr DType f32 = DType::f32;
inline constexpr DType f64 = DType::f64;
inline constexpr DType i32 = DType::i32;
inline constexpr DType i64 = DType::i64;
inline constexpr DType u8 = DType::u8;
inline constexpr DType b8 = DType::b8;
inline constexpr DType f16 = DType::f16;
inline constexpr DType bf16 = DType::bf16;

constexpr std::string_view dtype_name(DType dt) {
  constexpr std::string_view names[] = {"f32", "f64", "i32", "i64", "u8", "b8", "f16", "bf16"};
  return names[static_cast<int>(dt)];
}
constexpr size_t dtype_size(DType dt) {
  constexpr size_t sizes[] = {4, 8, 4, 8, 1, 1, 2, 2};
  return sizes[static_cast<int>(dt)];
}
// f32 and f64 compute; f16 and bf16 are floating but stored only (compute upcasts to f32).
constexpr bool is_floating(DType dt) {
  return dt == f32 || dt == f64 || dt == f16 || dt == bf16;
}
constexpr bool is_integral(DType dt) { return dt == i32 || dt == i64 || dt == u8; }

// dtype_of<T>: the DType that stores a C++ T. `bool` is b8.
template <class T>
struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = f32; };
template <> struct DTypeOf<double> { static constexpr DType value = f64; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = i32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = i64; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = u8; };
template <> struct DTypeOf<bool> { static constexpr DType value = b8; };
template <> struct DTypeOf<f16_t> { static constexpr DType value = f16; };
template <> struct DTypeOf<bf16_t> { static constexpr DType value = bf16; };

template <class T>
concept Element = requires { DTypeOf<std::remove_cv_t<T>>::value; };

template <Element T>
inline constexpr DType dtype_of = DTypeOf<std::remove_cv_t<T>>::value;

}  // namespace flowlet
