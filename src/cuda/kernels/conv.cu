// Pooling kernels (max and average, forward and backward) and the helpers of the cuDNN
// convolutions: the bias + ReLU epilogue and the explicit padding / cropping that stands in for
// cuDNN's missing asymmetric padding. One thread per output element, grid-stride loops; the
// backward kernels gather (one thread per input element walks the windows that contain it, in
// window order), so they need no atomics and give the same bits on every run.
#include "cuda/kernels/conv_launch.hpp"
#include "cuda/kernels/device_types.cuh"

namespace flowlet::detail::cuda {
namespace {

constexpr int kBlock = 256;
constexpr DTypeSet kFloatTypes = bit(DType::f32) | bit(DType::f64) | bit(DType::f16) | bit(DType::bf16);

// The type a kernel computes in: f64 for f64, float for the rest (halves are loaded as float).
template <class T> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };

__device__ inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
__device__ inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// Window (oh, ow) covers padded-input rows [oh * stride - pad_top, + kernel); the rows inside the
// input are [h0, h1). The op's rules (src/ops/pool.cpp) leave no window wholly in the padding.
struct Window {
  int64_t h0, h1, w0, w1;  // clipped to the input
  int64_t divisor;         // avg_pool2d's
};
// The divisor, as the CPU's: with count_include_pad the window's positions up to the explicit
// padding (the top and left padding count, ceil_mode's extra rows and columns do not), else the
// input positions it covers.
__device__ inline Window window_of(const PoolGeometry& g, int64_t oh, int64_t ow) {
  const int64_t hs = oh * g.stride_h - g.pad_top, ws = ow * g.stride_w - g.pad_left;
  const int64_t he = hs + g.kernel_h, we = ws + g.kernel_w;
  Window win{max64(hs, 0), min64(he, g.in_h), max64(ws, 0), min64(we, g.in_w), 0};
  win.divisor = g.count_include_pad
                    ? (min64(he, g.in_h + g.pad_bottom - g.ceil_h) - hs) * (min64(we, g.in_w + g.pad_right - g.ceil_w) - ws)
                    : (win.h1 - win.h0) * (win.w1 - win.w0);
  return win;
}

// The position (h * in_w + w) of the window's first maximum in row-major order (-1 only for an
// empty window, which the op's rules exclude). A NaN is the maximum (the first NaN wins), as on the CPU.
template <class T>
__device__ int64_t first_maximum(const T* plane, const PoolGeometry& g, const Window& win) {
  using A = typename Acc<T>::type;
  int64_t best_at = -1;
  A best = A(0);
  for (int64_t h = win.h0; h < win.h1; ++h) {
    for (int64_t w = win.w0; w < win.w1; ++w) {
      const A v = static_cast<A>(Element<T>::load(plane + h * g.in_w + w));
      if (best_at < 0 || v > best || (v != v && best == best)) {
        best = v;
        best_at = h * g.in_w + w;
      }
    }
  }
  return best_at;
}

template <class T>
__global__ void __launch_bounds__(kBlock) max_pool(const T* x, T* y, PoolGeometry g) {
  using A = typename Acc<T>::type;
  const int64_t total = g.planes * g.out_h * g.out_w;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * kBlock) {
    const int64_t ow = i % g.out_w, oh = (i / g.out_w) % g.out_h, p = i / (g.out_w * g.out_h);
    const T* plane = x + p * g.in_h * g.in_w;
    const int64_t at = first_maximum(plane, g, window_of(g, oh, ow));
    const A value = at < 0 ? -std::numeric_limits<A>::infinity() : static_cast<A>(Element<T>::load(plane + at));
    Element<T>::store(y + i, value);
  }
}

// The output windows that contain input row `h`: [first, last] along one axis.
__device__ inline void windows_over(int64_t h, int64_t pad, int64_t kernel, int64_t stride, int64_t out,
                                    int64_t& first, int64_t& last) {
  const int64_t lo = h + pad - kernel + 1;  // oh * stride >= lo
  first = lo <= 0 ? 0 : (lo + stride - 1) / stride;
  last = min64((h + pad) / stride, out - 1);
}

template <class T>
__global__ void __launch_bounds__(kBlock) max_pool_backward(const T* x, const T* dy, T* dx, PoolGeometry g) {
  using A = typename Acc<T>::type;
  const int64_t total = g.planes * g.in_h * g.in_w;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * kBlock) {
    const int64_t w = i % g.in_w, h = (i / g.in_w) % g.in_h, p = i / (g.in_w * g.in_h);
    const T* plane = x + p * g.in_h * g.in_w;
    const T* grads = dy + p * g.out_h * g.out_w;
    int64_t oh0, oh1, ow0, ow1;
    windows_over(h, g.pad_top, g.kernel_h, g.stride_h, g.out_h, oh0, oh1);
    windows_over(w, g.pad_left, g.kernel_w, g.stride_w, g.out_w, ow0, ow1);
    A sum = A(0);
    for (int64_t oh = oh0; oh <= oh1; ++oh) {
      for (int64_t ow = ow0; ow <= ow1; ++ow) {
        if (first_maximum(plane, g, window_of(g, oh, ow)) == h * g.in_w + w) {
          sum += static_cast<A>(Element<T>::load(grads + oh * g.out_w + ow));
        }
      }
    }
    Element<T>::store(dx + i, sum);
  }
}

template <class T>
__global__ void __launch_bounds__(kBlock) avg_pool(const T* x, T* y, PoolGeometry g) {
  using A = typename Acc<T>::type;
  const int64_t total = g.planes * g.out_h * g.out_w;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * kBlock) {
    const int64_t ow = i % g.out_w, oh = (i / g.out_w) % g.out_h, p = i / (g.out_w * g.out_h);
    const T* plane = x + p * g.in_h * g.in_w;
    const Window win = window_of(g, oh, ow);
    A sum = A(0);
    for (int64_t h = win.h0; h < win.h1; ++h) {
      for (int64_t w = win.w0; w < win.w1; ++w) sum += static_cast<A>(Element<T>::load(plane + h * g.in_w + w));
    }
    const int64_t divisor = win.divisor;
    Element<T>::store(y + i, divisor > 0 ? sum / static_cast<A>(divisor) : A(0));
  }
}

template <class T>
__global__ void __launch_bounds__(kBlock) avg_pool_backward(const T* dy, T* dx, PoolGeometry g) {
  using A = typename Acc<T>::type;
  const int64_t total = g.planes * g.in_h * g.in_w;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * kBlock) {
    const int64_t w = i % g.in_w, h = (i / g.in_w) % g.in_h, p = i / (g.in_w * g.in_h);
    const T* grads = dy + p * g.out_h * g.out_w;
    int64_t oh0, oh1, ow0, ow1;
    windows_over(h, g.pad_top, g.kernel_h, g.stride_h, g.out_h, oh0, oh1);
    windows_over(w, g.pad_left, g.kernel_w, g.stride_w, g.out_w, ow0, ow1);
    A sum = A(0);
    for (int64_t oh = oh0; oh <= oh1; ++oh) {
      for (int64_t ow = ow0; ow <= ow1; ++ow) {
        const int64_t divisor = window_of(g, oh, ow).divisor;
        if (divisor > 0) sum += static_cast<A>(Element<T>::load(grads + oh * g.out_w + ow)) / static_cast<A>(divisor);
      }
    }
    Element<T>::store(dx + i, sum);
  }
}

template <class U>
__global__ void __launch_bounds__(kBlock) pad_planes(const U* in, U* out, int64_t planes, int64_t in_h, int64_t in_w,
                                                     int64_t top, int64_t left, int64_t out_h, int64_t out_w) {
  const int64_t total = planes * out_h * out_w;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * kBlock) {
    const int64_t ow = i % out_w, oh = (i / out_w) % out_h, p = i / (out_w * out_h);
    const int64_t h = oh - top, w = ow - left;
    out[i] = h >= 0 && h < in_h && w >= 0 && w < in_w ? in[(p * in_h + h) * in_w + w] : U(0);
  }
}

template <class U>
__global__ void __launch_bounds__(kBlock) crop_planes(const U* in, U* out, int64_t planes, int64_t in_h, int64_t in_w,
                                                      int64_t top, int64_t left, int64_t out_h, int64_t out_w) {
  const int64_t total = planes * out_h * out_w;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * kBlock) {
    const int64_t ow = i % out_w, oh = (i / out_w) % out_h, p = i / (out_w * out_h);
    out[i] = in[(p * in_h + oh + top) * in_w + ow + left];
  }
}

template <class T>
__global__ void __launch_bounds__(kBlock) bias_activation(T* y, const T* bias, int64_t total, int64_t channels,
                                                          int64_t plane, bool relu) {
  using A = typename Acc<T>::type;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * kBlock) {
    A v = static_cast<A>(Element<T>::load(y + i));
    if (bias != nullptr) v += static_cast<A>(Element<T>::load(bias + (i / plane) % channels));
    if (relu) v = v > A(0) ? v : (v != v ? v : A(0));  // NaN stays NaN, as the CPU's relu keeps it
    Element<T>::store(y + i, v);
  }
}


}  // namespace

void launch_max_pool(const void* x, void* y, ElementType type, const PoolGeometry& g, const Launch& where) {
  const int64_t total = g.planes * g.out_h * g.out_w;
  if (total == 0) return;
  visit_type<kFloatTypes>("max_pool2d", type, [&]<class T>(TypeTag<T>) {
    max_pool<T><<<blocks_for(total, kBlock, where), kBlock, 0, where.stream>>>(static_cast<const T*>(x),
                                                                                static_cast<T*>(y), g);
    FLOWLET_CUDA_CHECK_LAUNCH(where.device, "max_pool2d");
  });
}

void launch_max_pool_backward(const void* x, const void* dy, void* dx, ElementType type, const PoolGeometry& g,
                              const Launch& where) {
  const int64_t total = g.planes * g.in_h * g.in_w;
  if (total == 0) return;
  visit_type<kFloatTypes>("max_pool2d_backward", type, [&]<class T>(TypeTag<T>) {
    max_pool_backward<T><<<blocks_for(total, kBlock, where), kBlock, 0, where.stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<T*>(dx), g);
    FLOWLET_CUDA_CHECK_LAUNCH(where.device, "max_pool2d_backward");
  });
}

void launch_avg_pool(const void* x, void* y, ElementType type, const PoolGeometry& g, const Launch& where) {
  const int64_t total = g.planes * g.out_h * g.out_w;
  if (total == 0) return;
  visit_type<kFloatTypes>("avg_pool2d", type, [&]<class T>(TypeTag<T>) {
    avg_pool<T><<<blocks_for(total, kBlock, where), kBlock, 0, where.stream>>>(static_cast<const T*>(x),
                                                                                static_cast<T*>(y), g);
    FLOWLET_CUDA_CHECK_LAUNCH(where.device, "avg_pool2d");
  });
}

void launch_avg_pool_backward(const void* dy, void* dx, ElementType type, const PoolGeometry& g, const Launch& where) {
  const int64_t total = g.planes * g.in_h * g.in_w;
  if (total == 0) return;
  visit_type<kFloatTypes>("avg_pool2d_backward", type, [&]<class T>(TypeTag<T>) {
    avg_pool_backward<T><<<blocks_for(total, kBlock, where), kBlock, 0, where.stream>>>(static_cast<const T*>(dy),
                                                                                         static_cast<T*>(dx), g);
    FLOWLET_CUDA_CHECK_LAUNCH(where.device, "avg_pool2d_backward");
  });
}

void launch_pad_planes(const void* in, void* out, int element_bytes, int64_t planes, int64_t in_h, int64_t in_w,
                       int64_t top, int64_t left, int64_t out_h, int64_t out_w, const Launch& where) {
  const int64_t total = planes * out_h * out_w;
  if (total == 0) return;
  visit_bits("conv2d padding", element_bytes, [&]<class U>(TypeTag<U>) {
    pad_planes<U><<<blocks_for(total, kBlock, where), kBlock, 0, where.stream>>>(
        static_cast<const U*>(in), static_cast<U*>(out), planes, in_h, in_w, top, left, out_h, out_w);
    FLOWLET_CUDA_CHECK_LAUNCH(where.device, "conv2d padding");
  });
}

void launch_crop_planes(const void* in, void* out, int element_bytes, int64_t planes, int64_t in_h, int64_t in_w,
                        int64_t top, int64_t left, int64_t out_h, int64_t out_w, const Launch& where) {
  const int64_t total = planes * out_h * out_w;
  if (total == 0) return;
  visit_bits("conv2d cropping", element_bytes, [&]<class U>(TypeTag<U>) {
    crop_planes<U><<<blocks_for(total, kBlock, where), kBlock, 0, where.stream>>>(
        static_cast<const U*>(in), static_cast<U*>(out), planes, in_h, in_w, top, left, out_h, out_w);
    FLOWLET_CUDA_CHECK_LAUNCH(where.device, "conv2d cropping");
  });
}

void launch_bias_activation(void* y, const void* bias, ElementType type, int64_t n, int64_t channels, int64_t plane,
                            bool relu, const Launch& where) {
  const int64_t total = n * channels * plane;
  if (total == 0 || (bias == nullptr && !relu)) return;
  visit_type<kFloatTypes>("conv2d", type, [&]<class T>(TypeTag<T>) {
    bias_activation<T><<<blocks_for(total, kBlock, where), kBlock, 0, where.stream>>>(
        static_cast<T*>(y), static_cast<const T*>(bias), total, channels, plane, relu);
    FLOWLET_CUDA_CHECK_LAUNCH(where.device, "conv2d");
  });
}

}  // namespace flowlet::detail::cuda
