// Batch normalization, layer normalization and dropout kernels. They follow the CPU kernels'
// arithmetic (src/ops/normalization.cpp, src/ops/dropout.cpp): sums in f64, per-channel (or
// per-row) scale and shift rounded to the compute type (float for f32/f16/bf16, double for f64),
// then one multiply-add per element, so the GPU and the CPU differ in the order of the f64 sums
// and by at most an ulp of the result; dropout's mask and values are the CPU's exactly.
//
// Batch norm splits each channel among blocks (partial f64 sums in a scratch buffer, then the
// elementwise pass: three launches forward, two backward); layer norm runs one warp per row, and
// its dgamma/dbeta one thread per column summing over rows; dropout one thread per Philox block
// (four stream indices, kernels/dropout_mask.hpp's mapping).
#include "cuda/kernels/conv_launch.hpp"
#include "cuda/kernels/device_types.cuh"
#include "kernels/dropout_mask.hpp"

#include <algorithm>

namespace flowlet::detail::cuda {
namespace {

constexpr int kChannelBlock = 512;
constexpr int kWarp = 32;
constexpr int kRowBlock = 256;
constexpr int kWarpsPerBlock = kRowBlock / kWarp;
constexpr int kBlock = 256;
constexpr DTypeSet kFloatTypes = bit(DType::f32) | bit(DType::f64) | bit(DType::f16) | bit(DType::bf16);

template <class T>
using C = compute_t<T>;

template <class T>
__device__ double load_f64(const T* p, int64_t i) {
  return static_cast<double>(Element<T>::load(p + i));
}

__device__ double warp_sum(double v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// The sums of a and b over the block, returned to every thread. `shared` holds 2 * warps doubles.
__device__ void block_sum(double& a, double& b, double* shared) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp, warp = static_cast<int>(threadIdx.x) / kWarp;
  const int warps = static_cast<int>(blockDim.x) / kWarp;
  a = warp_sum(a);
  b = warp_sum(b);
  __syncthreads();  // the previous use of `shared` is over
  if (lane == 0) shared[warp] = a, shared[warps + warp] = b;
  __syncthreads();
  a = 0, b = 0;
  for (int i = 0; i < warps; ++i) a += shared[i], b += shared[warps + i];
}

// Each channel's m = outer * inner elements are split into `chunks` pieces, one block each, so
// that few channels still fill the GPU: pieces of `per` whole planes when a plane is at least a
// block wide (walked without division, coalesced), else of `per` flat positions j = n * inner + s.
// Blocks write partial sums (f64) to a scratch buffer; the next kernel's blocks each add a
// channel's partials up in chunk order, so every block sees the same totals.
struct ChannelSplit {
  int64_t chunks = 1, per = 1;
  bool by_plane = false;
};

__device__ inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

template <class F>
__device__ inline void for_chunk(const ChannelLayout& l, const ChannelSplit& sp, int64_t c, int64_t k, F&& f) {
  if (sp.by_plane) {
    const int64_t n1 = min64((k + 1) * sp.per, l.outer);
    for (int64_t n = k * sp.per; n < n1; ++n) {
      const int64_t base = (n * l.channels + c) * l.inner;
      for (int64_t s = threadIdx.x; s < l.inner; s += blockDim.x) f(base + s);
    }
  } else {
    const int64_t j1 = min64((k + 1) * sp.per, l.outer * l.inner);
    for (int64_t j = k * sp.per + threadIdx.x; j < j1; j += blockDim.x) {
      f(((j / l.inner) * l.channels + c) * l.inner + j % l.inner);
    }
  }
}

// Channel c's total of partial[(c * chunks + k) * stride + offset] over its chunks k.
__device__ inline double channel_total(const double* partial, int64_t c, const ChannelSplit& sp, int stride = 1,
                                       int offset = 0) {
  double total = 0;
  for (int64_t k = 0; k < sp.chunks; ++k) total += partial[(c * sp.chunks + k) * stride + offset];
  return total;
}

// Pass 1: sums[b] = the sum of block b's piece. Pass 2 (mean given by pass 1): squares[b] = the sum
// of squared deviations from the channel's mean.
template <class T, bool Squares>
__global__ void __launch_bounds__(kChannelBlock) batch_norm_partials(const T* x, ChannelLayout l, ChannelSplit sp,
                                                                     const double* sums, double* out) {
  __shared__ double shared[2 * kChannelBlock / kWarp];
  const double m = static_cast<double>(l.outer * l.inner);
  for (int64_t b = blockIdx.x; b < l.channels * sp.chunks; b += gridDim.x) {
    const int64_t c = b / sp.chunks, k = b % sp.chunks;
    double total = 0, unused = 0;
    if (Squares) {
      const double mean = channel_total(sums, c, sp) / m;
      for_chunk(l, sp, c, k, [&](int64_t at) {
        const double d = load_f64(x, at) - mean;
        total += d * d;
      });
    } else {
      for_chunk(l, sp, c, k, [&](int64_t at) { total += load_f64(x, at); });
    }
    block_sum(total, unused, shared);
    if (threadIdx.x == 0) out[b] = total;
  }
}

// y = x * scale + shift from the totals (mean, biased var); chunk 0 of each channel stores them.
template <class T>
__global__ void __launch_bounds__(kChannelBlock) batch_norm_training_apply(const T* x, const T* gamma, const T* beta,
                                                                           T* y, T* mean_out, T* var_out,
                                                                           ChannelLayout l, ChannelSplit sp,
                                                                           const double* sums, const double* squares,
                                                                           double eps) {
  const double m = static_cast<double>(l.outer * l.inner);
  for (int64_t b = blockIdx.x; b < l.channels * sp.chunks; b += gridDim.x) {
    const int64_t c = b / sp.chunks, k = b % sp.chunks;
    const double mean = channel_total(sums, c, sp) / m;
    const double var = channel_total(squares, c, sp) / m;
    const double scale = load_f64(gamma, c) / sqrt(var + eps);
    const C<T> scale_c = static_cast<C<T>>(scale), shift_c = static_cast<C<T>>(load_f64(beta, c) - mean * scale);
    for_chunk(l, sp, c, k, [&](int64_t at) {
      Element<T>::store(y + at, static_cast<C<T>>(static_cast<C<T>>(Element<T>::load(x + at)) * scale_c + shift_c));
    });
    if (k == 0 && threadIdx.x == 0) {
      Element<T>::store(mean_out + c, static_cast<C<T>>(mean));
      Element<T>::store(var_out + c, static_cast<C<T>>(var));
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kBlock) batch_norm_inference(const T* x, const T* gamma, const T* beta,
                                                               const T* mean, const T* var, T* y, ChannelLayout l,
                                                               double eps) {
  const int64_t total = l.outer * l.channels * l.inner;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * kBlock) {
    const int64_t c = (i / l.inner) % l.channels;
    const double scale = load_f64(gamma, c) / sqrt(load_f64(var, c) + eps);
    const C<T> scale_c = static_cast<C<T>>(scale), shift_c = static_cast<C<T>>(load_f64(beta, c) - load_f64(mean, c) * scale);
    Element<T>::store(y + i, static_cast<C<T>>(static_cast<C<T>>(Element<T>::load(x + i)) * scale_c + shift_c));
  }
}

// Backward pass 1: partial[2 b] = sum of dy, partial[2 b + 1] = sum of dy * (x - mean) over block b's piece.
template <class T>
__global__ void __launch_bounds__(kChannelBlock) batch_norm_backward_partials(const T* x, const T* mean, const T* dy,
                                                                              ChannelLayout l, ChannelSplit sp,
                                                                              double* partial) {
  __shared__ double shared[2 * kChannelBlock / kWarp];
  for (int64_t b = blockIdx.x; b < l.channels * sp.chunks; b += gridDim.x) {
    const int64_t c = b / sp.chunks, k = b % sp.chunks;
    const double mu = load_f64(mean, c);
    double sum_dy = 0, sum_dy_xc = 0;
    for_chunk(l, sp, c, k, [&](int64_t at) {
      const double d = load_f64(dy, at);
      sum_dy += d;
      sum_dy_xc += d * (load_f64(x, at) - mu);
    });
    block_sum(sum_dy, sum_dy_xc, shared);
    if (threadIdx.x == 0) partial[2 * b] = sum_dy, partial[2 * b + 1] = sum_dy_xc;
  }
}

// Backward pass 2: dx = a * dy + bx * x + k per channel; chunk 0 stores dgamma and dbeta.
template <class T>
__global__ void __launch_bounds__(kChannelBlock) batch_norm_backward_apply(const T* x, const T* gamma, const T* mean,
                                                                           const T* var, const T* dy, T* dx,
                                                                           T* dgamma, T* dbeta, ChannelLayout l,
                                                                           ChannelSplit sp, const double* partial,
                                                                           double eps) {
  const double m = static_cast<double>(l.outer * l.inner);
  for (int64_t b = blockIdx.x; b < l.channels * sp.chunks; b += gridDim.x) {
    const int64_t c = b / sp.chunks, chunk = b % sp.chunks;
    const double sum_dy = channel_total(partial, c, sp, 2, 0), sum_dy_xc = channel_total(partial, c, sp, 2, 1);
    const double mu = load_f64(mean, c);
    const double rstd = 1.0 / sqrt(load_f64(var, c) + eps);
    const double dg = sum_dy_xc * rstd;
    const double a = load_f64(gamma, c) * rstd;
    const double bx = -a * dg * rstd / m;  // dx = a * dy + bx * x + k
    const double k = -a * sum_dy / m - bx * mu;
    const C<T> a_c = static_cast<C<T>>(a), bx_c = static_cast<C<T>>(bx), k_c = static_cast<C<T>>(k);
    for_chunk(l, sp, c, chunk, [&](int64_t at) {
      Element<T>::store(dx + at, static_cast<C<T>>(a_c * static_cast<C<T>>(Element<T>::load(dy + at)) +
                                                   bx_c * static_cast<C<T>>(Element<T>::load(x + at)) + k_c));
    });
    if (chunk == 0 && threadIdx.x == 0) {
      Element<T>::store(dgamma + c, static_cast<C<T>>(dg));
      Element<T>::store(dbeta + c, static_cast<C<T>>(sum_dy));
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kRowBlock) layer_norm(const T* x, const T* gamma, const T* beta, T* y, T* mean_out,
                                                        T* rstd_out, int64_t rows, int64_t d, double eps) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp; r < rows;
       r += static_cast<int64_t>(gridDim.x) * kWarpsPerBlock) {
    const T* row = x + r * d;
    double total = 0;
    for (int64_t j = lane; j < d; j += kWarp) total += load_f64(row, j);
    const double mean = warp_sum(total) / static_cast<double>(d);
    double squares = 0;
    for (int64_t j = lane; j < d; j += kWarp) {
      const double dev = load_f64(row, j) - mean;
      squares += dev * dev;
    }
    const double rstd = 1.0 / sqrt(warp_sum(squares) / static_cast<double>(d) + eps);
    const C<T> mean_c = static_cast<C<T>>(mean), rstd_c = static_cast<C<T>>(rstd);
    for (int64_t j = lane; j < d; j += kWarp) {
      const C<T> v = (static_cast<C<T>>(Element<T>::load(row + j)) - mean_c) * rstd_c *
                         static_cast<C<T>>(Element<T>::load(gamma + j)) +
                     static_cast<C<T>>(Element<T>::load(beta + j));
      Element<T>::store(y + r * d + j, v);
    }
    if (lane == 0) {
      Element<T>::store(mean_out + r, static_cast<C<T>>(mean));
      Element<T>::store(rstd_out + r, static_cast<C<T>>(rstd));
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kRowBlock) layer_norm_backward_rows(const T* x, const T* gamma, const T* mean,
                                                                      const T* rstd, const T* dy, T* dx, int64_t rows,
                                                                      int64_t d) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp; r < rows;
       r += static_cast<int64_t>(gridDim.x) * kWarpsPerBlock) {
    const double mu = load_f64(mean, r), rstd_r = load_f64(rstd, r);
    const int64_t at = r * d;
    double sum_u = 0, sum_u_xh = 0;
    for (int64_t j = lane; j < d; j += kWarp) {
      const double u = load_f64(dy, at + j) * load_f64(gamma, j);
      sum_u += u;
      sum_u_xh += u * (load_f64(x, at + j) - mu) * rstd_r;
    }
    const double mean_u = warp_sum(sum_u) / static_cast<double>(d);
    const double mean_u_xh = warp_sum(sum_u_xh) / static_cast<double>(d);
    for (int64_t j = lane; j < d; j += kWarp) {
      const double u = load_f64(dy, at + j) * load_f64(gamma, j);
      const double xh = (load_f64(x, at + j) - mu) * rstd_r;
      Element<T>::store(dx + at + j, static_cast<C<T>>(rstd_r * (u - mean_u - xh * mean_u_xh)));
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kBlock) layer_norm_backward_columns(const T* x, const T* mean, const T* rstd,
                                                                      const T* dy, T* dgamma, T* dbeta, int64_t rows,
                                                                      int64_t d) {
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x; j < d;
       j += static_cast<int64_t>(gridDim.x) * kBlock) {
    double sum_dy = 0, sum_dy_xh = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const double dyv = load_f64(dy, r * d + j);
      sum_dy += dyv;
      sum_dy_xh += dyv * (load_f64(x, r * d + j) - load_f64(mean, r)) * load_f64(rstd, r);
    }
    Element<T>::store(dgamma + j, static_cast<C<T>>(sum_dy_xh));
    Element<T>::store(dbeta + j, static_cast<C<T>>(sum_dy));
  }
}

// Thread t handles Philox block first + t, i.e. stream indices 4 (first + t) ... + 3, each the
// element (index - offset) when that lies in [0, n).
template <class T>
__global__ void __launch_bounds__(kBlock) dropout(const T* x, T* y, int64_t n, const int64_t* state, int64_t blocks,
                                                  uint32_t threshold, C<T> scale) {
  const auto seed = static_cast<uint64_t>(state[0]), offset = static_cast<uint64_t>(state[1]);
  const uint64_t first = offset >> 2;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x; t < blocks;
       t += static_cast<int64_t>(gridDim.x) * kBlock) {
    const uint64_t block_index = first + static_cast<uint64_t>(t);
    const auto words = philox4x32(block_index, seed);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint64_t k = block_index * 4 + static_cast<uint64_t>(w);
      if (k < offset || k - offset >= static_cast<uint64_t>(n)) continue;
      const int64_t i = static_cast<int64_t>(k - offset);
      Element<T>::store(y + i, words[w] >= threshold ? static_cast<C<T>>(static_cast<C<T>>(Element<T>::load(x + i)) * scale)
                                                     : C<T>(0));
    }
  }
}

constexpr int64_t kMinChunk = 4096;  // elements a block's piece should have at least

// Chunks enough for about where.max_blocks blocks in all, none below kMinChunk elements.
ChannelSplit split_of(const ChannelLayout& l, const Launch& where) {
  const int64_t m = l.outer * l.inner;
  int64_t chunks = std::max<int64_t>(1, where.max_blocks / std::max<int64_t>(l.channels, 1));
  chunks = std::min(chunks, std::max<int64_t>(1, m / kMinChunk));
  ChannelSplit sp;
  sp.by_plane = l.inner >= kChannelBlock;
  const int64_t units = sp.by_plane ? l.outer : m;  // what the pieces divide
  chunks = std::min(chunks, std::max<int64_t>(units, 1));
  sp.per = (units + chunks - 1) / chunks;
  sp.chunks = (units + sp.per - 1) / sp.per;
  return sp;
}

int split_blocks(const ChannelLayout& l, const ChannelSplit& sp) {
  return static_cast<int>(std::min<int64_t>(l.channels * sp.chunks, 65535));
}

}  // namespace

int64_t batch_norm_scratch_doubles(const ChannelLayout& l, const Launch& where) {
  return 2 * l.channels * split_of(l, where).chunks;
}

void launch_batch_norm_training(const void* x, const void* gamma, const void* beta, void* y, void* mean, void* var,
                                ElementType type, const ChannelLayout& l, double eps, double* scratch,
                                const Launch& where) {
  if (l.channels == 0 || l.outer * l.inner == 0) return;
  const ChannelSplit sp = split_of(l, where);
  double* sums = scratch;
  double* squares = scratch + l.channels * sp.chunks;
  const int blocks = split_blocks(l, sp);
  visit_type<kFloatTypes>("batch_norm_training", type, [&]<class T>(TypeTag<T>) {
    const T* xs = static_cast<const T*>(x);
    batch_norm_partials<T, false><<<blocks, kChannelBlock, 0, where.stream>>>(xs, l, sp, nullptr, sums);
    FLOWLET_CUDA_CHECK_LAUNCH(where.device, "batch_norm_training");
    batch_norm_partials<T, true><<<blocks, kChannelBlock, 0, where.stream>>>(xs, l, sp, sums, squares);
    FLOWLET_CUDA_CHECK_LAUNCH(where.device, "batch_norm_training");
    batch_norm_training_apply<T><<<blocks, kChannelBlock, 0, where.stream>>>(
        xs, static_cast<const T*>(gamma), static_cast<const T*>(beta), static_cast<T*>(y), static_cast<T*>(mean),
        static_cast<T*>(var), l, sp, sums, squares, eps);
    FLOWLET_CUDA_CHECK_LAUNCH(where.device, "batch_norm_training");
  });
}

void launch_batch_norm_inference(const void* x, const void* gamma, const void* beta, const void* mean,
                                 const void* var, void* y, ElementType type, const ChannelLayout& l, double eps,
                                 const Launch& where) {
  const int64_t total = l.outer * l.channels * l.inner;
  if (total == 0) return;
  visit_type<kFloatTypes>("batch_norm_inference", type, [&]<class T>(TypeTag<T>) {
    batch_norm_inference<T><<<blocks_for(total, kBlock, where), kBlock, 0, where.stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(gamma), static_cast<const T*>(beta),
        static_cast<const T*>(mean), static_cast<const T*>(var), static_cast<T*>(y), l, eps);
    FLOWLET_CUDA_CHECK_LAUNCH(where.device, "batch_norm_inference");
  });
}

void launch_batch_norm_backward(const void* x, const void* gamma, const void* mean, const void* var, const void* dy,
                                void* dx, void* dgamma, void* dbeta, ElementType type, const ChannelLayout& l,
                                double eps, double* scratch, const Launch& where) {
  if (l.channels == 0 || l.outer * l.inner == 0) return;
  const ChannelSplit sp = split_of(l, where);
  const int blocks = split_blocks(l, sp);
  visit_type<kFloatTypes>("batch_norm_backward", type, [&]<class T>(TypeTag<T>) {
    batch_norm_backward_partials<T><<<blocks, kChannelBlock, 0, where.stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(mean), static_cast<const T*>(dy), l, sp, scratch);
    FLOWLET_CUDA_CHECK_LAUNCH(where.device, "batch_norm_backward");
    batch_norm_backward_apply<T><<<blocks, kChannelBlock, 0, where.stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(gamma), static_cast<const T*>(mean),
        static_cast<const T*>(var), static_cast<const T*>(dy), static_cast<T*>(dx), static_cast<T*>(dgamma),
        static_cast<T*>(dbeta), l, sp, scratch, eps);
    FLOWLET_CUDA_CHECK_LAUNCH(where.device, "batch_norm_backward");
  });
}

void launch_layer_norm(const void* x, const void* gamma, const void* beta, void* y, void* mean, void* rstd,
                       ElementType type, int64_t rows, int64_t cols, double eps, const Launch& where) {
  if (rows == 0 || cols == 0) return;
  visit_type<kFloatTypes>("layer_norm", type, [&]<class T>(TypeTag<T>) {
    layer_norm<T><<<blocks_for(rows, kWarpsPerBlock, where), kRowBlock, 0, where.stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(gamma), static_cast<const T*>(beta), static_cast<T*>(y),
        static_cast<T*>(mean), static_cast<T*>(rstd), rows, cols, eps);
    FLOWLET_CUDA_CHECK_LAUNCH(where.device, "layer_norm");
  });
}

void launch_layer_norm_backward(const void* x, const void* gamma, const void* mean, const void* rstd, const void* dy,
                                void* dx, void* dgamma, void* dbeta, ElementType type, int64_t rows, int64_t cols,
                                const Launch& where) {
  if (cols == 0) return;
  visit_type<kFloatTypes>("layer_norm_backward", type, [&]<class T>(TypeTag<T>) {
    if (rows > 0) {
      layer_norm_backward_rows<T><<<blocks_for(rows, kWarpsPerBlock, where), kRowBlock, 0, where.stream>>>(
          static_cast<const T*>(x), static_cast<const T*>(gamma), static_cast<const T*>(mean),
          static_cast<const T*>(rstd), static_cast<const T*>(dy), static_cast<T*>(dx), rows, cols);
      FLOWLET_CUDA_CHECK_LAUNCH(where.device, "layer_norm_backward");
    }
    layer_norm_backward_columns<T><<<blocks_for(cols, kBlock, where), kBlock, 0, where.stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(mean), static_cast<const T*>(rstd), static_cast<const T*>(dy),
        static_cast<T*>(dgamma), static_cast<T*>(dbeta), rows, cols);
    FLOWLET_CUDA_CHECK_LAUNCH(where.device, "layer_norm_backward");
  });
}

void launch_dropout(const void* x, void* y, ElementType type, int64_t n, const int64_t* state, double rate,
                    const Launch& where) {
  if (n == 0) return;
  const int64_t blocks = n / 4 + 2;  // Philox blocks a run of n stream indices can touch, any alignment
  visit_type<kFloatTypes>("dropout", type, [&]<class T>(TypeTag<T>) {
    dropout<T><<<blocks_for(blocks, kBlock, where), kBlock, 0, where.stream>>>(
        static_cast<const T*>(x), static_cast<T*>(y), n, state, blocks, dropout_threshold(rate),
        static_cast<C<T>>(dropout_scale(rate)));
    FLOWLET_CUDA_CHECK_LAUNCH(where.device, "dropout");
  });
}

}  // namespace flowlet::detail::cuda
