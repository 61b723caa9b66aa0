// Device-side element types: how each dtype is loaded, computed on and stored (f16 and bf16 are
// storage types computed in float, as on the CPU), on top of the one dtype visitor and the value
// conversions that the CPU kernels use too (core/dtype_visit.hpp).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <utility>

#include "cuda/check.hpp"
#include "cuda/kernels/launch.hpp"
#include "core/dtype_visit.hpp"

namespace flowlet::detail::cuda {

template <class T>
struct Element {  // arithmetic types and bool: stored as computed
  static __device__ T load(const T* p) { return *p; }
  static __device__ void store(T* p, T v) { *p = v; }
};
template <>
struct Element<f16_t> {
  static __device__ float load(const f16_t* p) { return __half2float(__ushort_as_half(p->bits)); }
  static __device__ void store(f16_t* p, float v) { p->bits = __half_as_ushort(__float2half_rn(v)); }
};
template <>
struct Element<bf16_t> {
  static __device__ float load(const bf16_t* p) { return __bfloat162float(__ushort_as_bfloat16(p->bits)); }
  static __device__ void store(bf16_t* p, float v) { p->bits = __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
};

// f(TypeTag<T>{}) for the storage type of `type` (core/dtype_visit.hpp's visitor); only the
// types in `Allowed` are instantiated, and the error for any other names `kernel`.
template <DTypeSet Allowed, class F>
void visit_type(const char* kernel, ElementType type, F&& f) {
  visit_dtype<Allowed>(type, std::forward<F>(f), kernel);
}

// f(TypeTag<U>{}) with U the unsigned integer of `bytes` bytes: kernels that move bits serve every dtype.
template <class F>
void visit_bits(const char* kernel, int bytes, F&& f) {
  switch (bytes) {
    case 1: return f(TypeTag<uint8_t>{});
    case 2: return f(TypeTag<uint16_t>{});
    case 4: return f(TypeTag<uint32_t>{});
    case 8: return f(TypeTag<uint64_t>{});
    default: fail_element_type(kernel, -bytes);
  }
}

// Blocks for n work items of `per_block` each, capped by the launch (grid-stride loops do the rest).
inline int blocks_for(int64_t n, int64_t per_block, const Launch& where) {
  const int64_t needed = (n + per_block - 1) / per_block;
  return static_cast<int>(needed < where.max_blocks ? (needed > 0 ? needed : 1) : where.max_blocks);
}

}  // namespace flowlet::detail::cuda
