// Device-side element types: how each dtype is loaded, computed on and stored (f16 and bf16 are
// storage types computed in float, as on the CPU), value conversions with the CPU's rules, and
// dispatch from ElementType to a C++ type restricted to the types a kernel is built for.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <limits>
#include <type_traits>

#include "cuda/check.hpp"
#include "cuda/kernels/launch.hpp"

namespace flowlet::detail::cuda {

// The 16-bit floats as their bits (layout-compatible with flowlet::f16_t and bf16_t).
struct Half {
  uint16_t bits;
};
struct BFloat {
  uint16_t bits;
};

template <class T>
struct Element {  // arithmetic types and bool: stored as computed
  using compute = T;
  static __device__ T load(const T* p) { return *p; }
  static __device__ void store(T* p, T v) { *p = v; }
};
template <>
struct Element<Half> {
  using compute = float;
  static __device__ float load(const Half* p) { return __half2float(__ushort_as_half(p->bits)); }
  static __device__ void store(Half* p, float v) { p->bits = __half_as_ushort(__float2half_rn(v)); }
};
template <>
struct Element<BFloat> {
  using compute = float;
  static __device__ float load(const BFloat* p) { return __bfloat162float(__ushort_as_bfloat16(p->bits)); }
  static __device__ void store(BFloat* p, float v) { p->bits = __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
};
template <class T>
using compute_t = typename Element<T>::compute;

// Conversions between compute types as kernels/dtypes.hpp's convert does them: float to integer
// truncates toward zero, saturates and maps NaN to 0; to bool is "not zero"; integers wrap.
template <class To, class From>
__device__ To convert(From value) {
  if constexpr (std::is_same_v<To, From>) {
    return value;
  } else if constexpr (std::is_same_v<To, bool>) {
    return value != From{};
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<From>) {
    if (value != value) return To{0};
    constexpr From lo = static_cast<From>(std::numeric_limits<To>::lowest());
    constexpr From hi = static_cast<From>(std::numeric_limits<To>::max());
    if (value <= lo) return std::numeric_limits<To>::lowest();
    if (value >= hi) return std::numeric_limits<To>::max();
    return static_cast<To>(value);
  } else {
    return static_cast<To>(value);
  }
}

template <class T>
struct Tag {
  using type = T;
};

constexpr unsigned type_bit(ElementType t) { return 1u << static_cast<unsigned>(t); }
inline constexpr unsigned kFloatingTypes =
    type_bit(ElementType::f32) | type_bit(ElementType::f64) | type_bit(ElementType::f16) | type_bit(ElementType::bf16);
inline constexpr unsigned kIntegerTypes = type_bit(ElementType::i32) | type_bit(ElementType::i64) | type_bit(ElementType::u8);
inline constexpr unsigned kNumberTypes = kFloatingTypes | kIntegerTypes;
inline constexpr unsigned kAllTypes = kNumberTypes | type_bit(ElementType::b8);

// f(Tag<T>{}) for the storage type of `type`; only the types in `Allowed` are instantiated.
template <unsigned Allowed, class F>
void visit_type(const char* kernel, ElementType type, F&& f) {
  switch (type) {
#define FLOWLET_CUDA_VISIT(name, cpp_type)                              \
  case ElementType::name:                                               \
    if constexpr ((Allowed & type_bit(ElementType::name)) != 0) {       \
      f(Tag<cpp_type>{});                                               \
      return;                                                           \
    }                                                                   \
    break;
    FLOWLET_CUDA_VISIT(f32, float)
    FLOWLET_CUDA_VISIT(f64, double)
    FLOWLET_CUDA_VISIT(i32, int32_t)
    FLOWLET_CUDA_VISIT(i64, int64_t)
    FLOWLET_CUDA_VISIT(u8, uint8_t)
    FLOWLET_CUDA_VISIT(b8, bool)
    FLOWLET_CUDA_VISIT(f16, Half)
    FLOWLET_CUDA_VISIT(bf16, BFloat)
#undef FLOWLET_CUDA_VISIT
  }
  fail_element_type(kernel, static_cast<int>(type));
}

// f(Tag<U>{}) with U the unsigned integer of `bytes` bytes: kernels that move bits serve every dtype.
template <class F>
void visit_bits(const char* kernel, int bytes, F&& f) {
  switch (bytes) {
    case 1: return f(Tag<uint8_t>{});
    case 2: return f(Tag<uint16_t>{});
    case 4: return f(Tag<uint32_t>{});
    case 8: return f(Tag<uint64_t>{});
    default: fail_element_type(kernel, -bytes);
  }
}

// Blocks for n work items of `per_block` each, capped by the launch (grid-stride loops do the rest).
inline int blocks_for(int64_t n, int64_t per_block, const Launch& where) {
  const int64_t needed = (n + per_block - 1) / per_block;
  return static_cast<int>(needed < where.max_blocks ? (needed > 0 ? needed : 1) : where.max_blocks);
}

}  // namespace flowlet::detail::cuda
