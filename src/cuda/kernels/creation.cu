// Creation kernels: fill, arange, and randn/uniform from the CPU's counter-based Philox stream
// (kernels/philox.hpp is compiled for the device too), so a seed gives the same tensor on every
// device. Element i is a function of (seed, i) only, as on the CPU.
#include "cuda/kernels/device_types.cuh"
#include "kernels/philox.hpp"

namespace flowlet::detail::cuda {
namespace {

constexpr int kBlock = 256;

// out[i] = value_of(i) converted with the CPU's rules (double -> float -> half for 16-bit types).
template <class T, class ValueOf>
__global__ void __launch_bounds__(kBlock) fill_elements(T* out, int64_t n, ValueOf value_of) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kBlock) {
    Element<T>::store(out + i, convert<compute_t<T>>(value_of(i)));
  }
}

template <DTypeSet Allowed, class ValueOf>
void launch_fill_with(const char* op, void* out, int64_t n, ElementType type, ValueOf value_of, const Launch& where) {
  if (n == 0) return;
  visit_type<Allowed>(op, type, [&]<class T>(TypeTag<T>) {
    fill_elements<T><<<blocks_for(n, kBlock, where), kBlock, 0, where.stream>>>(static_cast<T*>(out), n, value_of);
    FLOWLET_CUDA_CHECK_LAUNCH(where.device, op);
  });
}

struct Constant {
  double value;
  __device__ double operator()(int64_t) const { return value; }
};
struct Index {
  __device__ int64_t operator()(int64_t i) const { return i; }
};
struct IndexAsDouble {
  __device__ double operator()(int64_t i) const { return static_cast<double>(i); }
};
struct Normal {
  uint64_t seed;
  __device__ double operator()(int64_t i) const { return normal_element(seed, static_cast<uint64_t>(i)); }
};
// lo + (hi - lo) * u; when rounding to T reaches hi, lo instead (the CPU's rule: results stay in [lo, hi)).
template <class T>
struct Uniform {
  double lo, hi;
  uint64_t seed;
  __device__ double operator()(int64_t i) const {
    const double v = lo + (hi - lo) * uniform_element(seed, static_cast<uint64_t>(i));
    double stored = v;
    if constexpr (!std::is_same_v<T, double>) {
      T rounded;
      Element<T>::store(&rounded, convert<compute_t<T>>(v));
      stored = static_cast<double>(static_cast<float>(Element<T>::load(&rounded)));
    }
    return stored >= hi ? lo : v;
  }
};

}  // namespace

void launch_fill(void* out, int64_t n, ElementType type, double value, const Launch& where) {
  launch_fill_with<kAll>("full", out, n, type, Constant{value}, where);
}

void launch_arange(void* out, int64_t n, ElementType type, const Launch& where) {
  if (type == ElementType::i64) {  // exact beyond 2^53
    launch_fill_with<bit(DType::i64)>("arange", out, n, type, Index{}, where);
  } else {
    launch_fill_with<kNumbers>("arange", out, n, type, IndexAsDouble{}, where);
  }
}

void launch_randn(void* out, int64_t n, ElementType type, uint64_t seed, const Launch& where) {
  launch_fill_with<kFloating>("randn", out, n, type, Normal{seed}, where);
}

void launch_uniform(void* out, int64_t n, ElementType type, double lo, double hi, uint64_t seed, const Launch& where) {
  if (n == 0) return;
  visit_type<kFloating>("uniform", type, [&]<class T>(TypeTag<T>) {
    fill_elements<T><<<blocks_for(n, kBlock, where), kBlock, 0, where.stream>>>(static_cast<T*>(out), n,
                                                                                 Uniform<T>{lo, hi, seed});
    FLOWLET_CUDA_CHECK_LAUNCH(where.device, "uniform");
  });
}

}  // namespace flowlet::detail::cuda
