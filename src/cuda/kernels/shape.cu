// gather (rows of params picked by indices) and scatter_add, its gradient (rows added into zeros
// with atomics, so repeated indices accumulate).
#include "cuda/kernels/device_types.cuh"

namespace flowlet::detail::cuda {
namespace {

constexpr int kBlock = 256;
constexpr DTypeSet kIndexTypes = bit(DType::i32) | bit(DType::i64);

__device__ void record_bad(uint64_t* error, int64_t position) {
  atomicMin(reinterpret_cast<unsigned long long*>(error), static_cast<unsigned long long>(position));
}

// Calls f(e, source_row) for every element e of a [count, row] block whose row i has
// indices[i] in [0, rows), and f(e, -1) for the others, whose first position goes to `error`.
template <class Index, class F>
__device__ void for_each_indexed_element(const Index* indices, int64_t count, int64_t rows, int64_t row,
                                         uint64_t* error, F f) {
  const int64_t total = count * row;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * kBlock) {
    const int64_t i = e / row;
    const int64_t index = static_cast<int64_t>(indices[i]);
    const bool bad = index < 0 || index >= rows;
    if (bad && e % row == 0) record_bad(error, i);
    f(e, bad ? -1 : index);
  }
}

template <class U, class Index>
__global__ void __launch_bounds__(kBlock) gather_rows(const U* params, const Index* indices, U* out, int64_t count,
                                                      int64_t rows, int64_t row, uint64_t* error) {
  for_each_indexed_element(indices, count, rows, row, error, [&](int64_t e, int64_t index) {
    out[e] = index < 0 ? U{0} : params[index * row + e % row];
  });
}

// atomicAdd for every scatter_add type; u8 through a compare-and-swap on its 32-bit word.
__device__ void add_to(float* p, float v) { atomicAdd(p, v); }
__device__ void add_to(double* p, double v) { atomicAdd(p, v); }
__device__ void add_to(int32_t* p, int32_t v) { atomicAdd(p, v); }
__device__ void add_to(int64_t* p, int64_t v) {  // two's complement: unsigned addition wraps the same way
  atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
}
__device__ void add_to(uint8_t* p, uint8_t v) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  auto* word = reinterpret_cast<unsigned int*>(address & ~uintptr_t{3});
  const unsigned shift = static_cast<unsigned>(address & 3u) * 8u;
  unsigned int old = *word, assumed = 0;
  do {
    assumed = old;
    const unsigned int byte = ((assumed >> shift) + v) & 0xffu;
    old = atomicCAS(word, assumed, (assumed & ~(0xffu << shift)) | (byte << shift));
  } while (old != assumed);
}

template <class T, class Index>
__global__ void __launch_bounds__(kBlock) scatter_add_rows(const Index* indices, const T* updates, T* out,
                                                           int64_t count, int64_t rows, int64_t row, uint64_t* error) {
  for_each_indexed_element(indices, count, rows, row, error, [&](int64_t e, int64_t index) {
    if (index >= 0) add_to(out + index * row + e % row, updates[e]);
  });
}

}  // namespace

void launch_gather(const void* params, const void* indices, ElementType index_type, void* out, int64_t count,
                   int64_t rows, int64_t row, int element_bytes, uint64_t* error, const Launch& where) {
  if (count * row == 0) return;
  visit_bits("gather", element_bytes, [&]<class U>(TypeTag<U>) {
    visit_type<kIndexTypes>("gather", index_type, [&]<class Index>(TypeTag<Index>) {
      gather_rows<U, Index><<<blocks_for(count * row, kBlock, where), kBlock, 0, where.stream>>>(
          static_cast<const U*>(params), static_cast<const Index*>(indices), static_cast<U*>(out), count, rows, row,
          error);
      FLOWLET_CUDA_CHECK_LAUNCH(where.device, "gather");
    });
  });
}

void launch_scatter_add(const void* indices, ElementType index_type, const void* updates, void* out,
                        ElementType type, int64_t count, int64_t rows, int64_t row, uint64_t* error,
                        const Launch& where) {
  if (count * row == 0) return;
  constexpr DTypeSet kScatterTypes = bit(DType::f32) | bit(DType::f64) | kIntegers;
  visit_type<kScatterTypes>("scatter_add", type, [&]<class T>(TypeTag<T>) {
    visit_type<kIndexTypes>("scatter_add", index_type, [&]<class Index>(TypeTag<Index>) {
      scatter_add_rows<T, Index><<<blocks_for(count * row, kBlock, where), kBlock, 0, where.stream>>>(
          static_cast<const Index*>(indices), static_cast<const T*>(updates), static_cast<T*>(out), count, rows, row,
          error);
      FLOWLET_CUDA_CHECK_LAUNCH(where.device, "scatter_add");
    });
  });
}

}  // namespace flowlet::detail::cuda
