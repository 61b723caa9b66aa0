// In-place variable updates: value += scale * update over contiguous elements, so an optimizer step
// on a GPU variable writes into the variable's buffer instead of allocating a new value (and keeps
// the buffer a captured CUDA Graph reads and writes: exec/graph_capture.hpp).
#include "cuda/kernels/device_types.cuh"

namespace flowlet::detail::cuda {
namespace {

constexpr int kBlock = 256;

// Computed in the compute type (float for halves, as the elementwise ops do; integers wrap, and
// the host passes them integral scales only), then stored.
template <class T>
__global__ void __launch_bounds__(kBlock) axpy(T* value, const T* update, int64_t n, double scale) {
  using C = compute_t<T>;
  const C s = static_cast<C>(scale);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kBlock) {
    Element<T>::store(value + i, Element<T>::load(value + i) + s * Element<T>::load(update + i));
  }
}

}  // namespace

void launch_axpy(void* value, const void* update, int64_t n, ElementType type, double scale, const Launch& where) {
  if (n == 0) return;
  visit_type<kNumbers>("assign_add", type, [&]<class T>(TypeTag<T>) {
    axpy<T><<<blocks_for(n, kBlock, where), kBlock, 0, where.stream>>>(static_cast<T*>(value),
                                                                      static_cast<const T*>(update), n, scale);
    FLOWLET_CUDA_CHECK_LAUNCH(where.device, "assign_add");
  });
}

}  // namespace flowlet::detail::cuda
