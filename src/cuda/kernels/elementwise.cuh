// The elementwise kernel shared by binary.cu, unary.cu and copy.cu: out[i] = f(in[i]...) over a
// merged layout (launch.hpp), in a grid-stride loop. When the layout is one dimension (contiguous
// operands and scalars, the common case) each thread handles kUnroll elements a block-width apart,
// loading all of them before storing any so the loads overlap; otherwise one element at a time
// with a division per dimension.
#pragma once

#include <utility>

#include "cuda/kernels/device_types.cuh"
#include "kernels/elementwise_functors.hpp"

namespace flowlet::detail::cuda {

inline constexpr int kThreads = 256;
inline constexpr int kUnroll = 4;

template <class F, class... In, size_t... K>
__device__ __forceinline__ auto apply_loaded(const F& f, const ElementwiseArgs& a, const int64_t* offset,
                                             std::index_sequence<K...>) {
  return f(Element<In>::load(static_cast<const In*>(a.data[K + 1]) + offset[K + 1])...);
}

template <class Out, class F, class... In>
__global__ void __launch_bounds__(kThreads) map_kernel(const ElementwiseArgs a, const F f) {
  constexpr int N = 1 + static_cast<int>(sizeof...(In));
  using Result = decltype(f(compute_t<In>{}...));
  Out* const out = static_cast<Out*>(a.data[0]);
  if (a.dims == 1) {  // offsets are multiples of one stride per operand: unrolled for bandwidth
    const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads * kUnroll;
    for (int64_t base = static_cast<int64_t>(blockIdx.x) * kThreads * kUnroll + threadIdx.x; base < a.numel;
         base += stride) {
      Result results[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = base + u * kThreads;
        int64_t offset[N];
#pragma unroll
        for (int k = 0; k < N; ++k) offset[k] = i * a.strides[k][0];
        if (i < a.numel) results[u] = apply_loaded<F, In...>(f, a, offset, std::index_sequence_for<In...>{});
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = base + u * kThreads;
        if (i < a.numel) Element<Out>::store(out + i * a.strides[0][0], convert<compute_t<Out>>(results[u]));
      }
    }
    return;
  }
  // Strided views and broadcasts: one element per thread per step, a division per dimension. Kept
  // simple (not unrolled) because its code is instantiated for every op and type.
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < a.numel; i += stride) {
    int64_t offset[N] = {};
    int64_t rest = i;
    for (int d = a.dims - 1; d >= 0; --d) {
      const int64_t size = a.sizes[d];
      const int64_t index = rest % size;
      rest /= size;
#pragma unroll
      for (int k = 0; k < N; ++k) offset[k] += index * a.strides[k][d];
    }
    Element<Out>::store(out + offset[0], convert<compute_t<Out>>(
                                             apply_loaded<F, In...>(f, a, offset, std::index_sequence_for<In...>{})));
  }
}

// Launches map_kernel<Out, F, In...> for `op` (the name errors carry).
template <class Out, class... In, class F>
void launch_map(const char* op, const ElementwiseArgs& a, const F& f, const Launch& where) {
  if (a.numel == 0) return;
  map_kernel<Out, F, In...><<<blocks_for(a.numel, kThreads * kUnroll, where), kThreads, 0, where.stream>>>(a, f);
  FLOWLET_CUDA_CHECK_LAUNCH(where.device, op);
}

// The launcher of one row of FLOWLET_ELEMENTWISE_OPS: its functor over its dtypes, with the
// operand count and output type its kind says.
template <ElementwiseKind Kind, class F, DTypeSet Allowed>
void launch_elementwise(const char* op, const ElementwiseArgs& args, ElementType type, const Launch& where,
                        uint64_t* error) {
  visit_type<Allowed>(op, type, [&]<class T>(TypeTag<T>) {
    const F f = make_functor<F>(error);
    if constexpr (Kind == ElementwiseKind::unary) launch_map<T, T>(op, args, f, where);
    else if constexpr (Kind == ElementwiseKind::binary) launch_map<T, T, T>(op, args, f, where);
    else if constexpr (Kind == ElementwiseKind::compare) launch_map<bool, T, T>(op, args, f, where);
    else launch_map<T, T, T, T>(op, args, f, where);
  });
}

// The row's launcher when this file builds it (`Build`), else an empty one.
template <bool Build, ElementwiseKind Kind, class F, DTypeSet Allowed>
constexpr ElementwiseLauncher launcher_if() {
  if constexpr (!Build) {
    return {};
  } else if constexpr (kReportsIntegerErrors<F>) {
    return {&launch_elementwise<Kind, F, Allowed>, F::kIntegerError};
  } else {
    return {&launch_elementwise<Kind, F, Allowed>, nullptr};
  }
}

}  // namespace flowlet::detail::cuda
