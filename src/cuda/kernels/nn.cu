// Neural-network kernels: softmax and log-softmax along an axis, the fused softmax cross-entropy,
// and one_hot. One warp per line: lines are short (classes) and many (batch), and a warp reduces
// without shared memory. Like the CPU kernels, they subtract the line's maximum first and sum the
// exponentials in f64, so any finite logits give finite results.
#include "cuda/kernels/device_types.cuh"

namespace flowlet::detail::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kBlock = 256;
constexpr int kWarpsPerBlock = kBlock / kWarp;

__device__ float exp_of(float x) { return expf(x); }
__device__ double exp_of(double x) { return exp(x); }

// The line's maximum (a NaN is skipped, as std::max skips it on the CPU; it then makes the sum NaN).
template <class T>
__device__ T line_max(const T* line, int64_t extent, int64_t stride, int lane) {
  T top = -std::numeric_limits<T>::infinity();
  for (int64_t i = lane; i < extent; i += kWarp) {
    const T x = line[i * stride];
    top = top < x ? x : top;
  }
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const T other = __shfl_xor_sync(0xffffffffu, top, offset);
    top = top < other ? other : top;
  }
  return top;
}

// log(sum(exp(x - top))) over the line, the sum in f64.
template <class T>
__device__ double line_log_sum_exp(const T* line, int64_t extent, int64_t stride, T top, int lane) {
  double total = 0.0;
  for (int64_t i = lane; i < extent; i += kWarp) total += exp(static_cast<double>(line[i * stride] - top));
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) total += __shfl_xor_sync(0xffffffffu, total, offset);
  return log(total);
}

template <class T, bool Log>
__global__ void __launch_bounds__(kBlock) softmax_lines(const T* x, T* y, int64_t outer, int64_t extent, int64_t inner) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t lines = outer * inner;
  for (int64_t line = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp; line < lines;
       line += static_cast<int64_t>(gridDim.x) * kWarpsPerBlock) {
    const int64_t start = (line / inner) * extent * inner + line % inner;
    const T* xs = x + start;
    T* ys = y + start;
    const T top = line_max(xs, extent, inner, lane);
    const T log_total = static_cast<T>(line_log_sum_exp(xs, extent, inner, top, lane));
    for (int64_t i = lane; i < extent; i += kWarp) {
      const T shifted = xs[i * inner] - top - log_total;
      ys[i * inner] = Log ? shifted : exp_of(shifted);
    }
  }
}

template <class T, class Label>
__global__ void __launch_bounds__(kBlock) cross_entropy_rows(const T* logits, const Label* labels, T* loss,
                                                             int64_t rows, int64_t classes, uint64_t* error) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp; r < rows;
       r += static_cast<int64_t>(gridDim.x) * kWarpsPerBlock) {
    const T* row = logits + r * classes;
    const int64_t label = static_cast<int64_t>(labels[r]);
    const T top = line_max(row, classes, 1, lane);
    const double log_total = line_log_sum_exp(row, classes, 1, top, lane);
    if (lane != 0) continue;
    if (label < 0 || label >= classes) {
      atomicMin(reinterpret_cast<unsigned long long*>(error), static_cast<unsigned long long>(r));
      loss[r] = T{0};
    } else {
      loss[r] = static_cast<T>(log_total - static_cast<double>(row[label] - top));
    }
  }
}

template <class Index>
__global__ void __launch_bounds__(kBlock) one_hot_rows(const Index* indices, float* out, int64_t count, int64_t depth,
                                                       uint64_t* error) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * kBlock) {
    const int64_t index = static_cast<int64_t>(indices[i]);
    if (index < 0 || index >= depth) {
      atomicMin(reinterpret_cast<unsigned long long*>(error), static_cast<unsigned long long>(i));
    } else {
      out[i * depth + index] = 1.0f;
    }
  }
}

constexpr DTypeSet kSoftmaxTypes = bit(DType::f32) | bit(DType::f64);
constexpr DTypeSet kIndexTypes = bit(DType::i32) | bit(DType::i64);

}  // namespace

void launch_softmax(const void* in, void* out, ElementType type, int64_t outer, int64_t extent, int64_t inner,
                    bool log, const Launch& where) {
  if (outer * inner * extent == 0) return;
  visit_type<kSoftmaxTypes>("softmax", type, [&]<class T>(TypeTag<T>) {
    const int blocks = blocks_for(outer * inner, kWarpsPerBlock, where);
    if (log) {
      softmax_lines<T, true><<<blocks, kBlock, 0, where.stream>>>(static_cast<const T*>(in), static_cast<T*>(out),
                                                                  outer, extent, inner);
    } else {
      softmax_lines<T, false><<<blocks, kBlock, 0, where.stream>>>(static_cast<const T*>(in), static_cast<T*>(out),
                                                                   outer, extent, inner);
    }
    FLOWLET_CUDA_CHECK_LAUNCH(where.device, log ? "log_softmax" : "softmax");
  });
}

void launch_cross_entropy(const void* logits, const void* labels, ElementType label_type, void* loss,
                          ElementType type, int64_t rows, int64_t classes, uint64_t* error, const Launch& where) {
  if (rows == 0) return;
  visit_type<kSoftmaxTypes>("softmax_cross_entropy", type, [&]<class T>(TypeTag<T>) {
    visit_type<kIndexTypes>("softmax_cross_entropy", label_type, [&]<class Label>(TypeTag<Label>) {
      cross_entropy_rows<T, Label><<<blocks_for(rows, kWarpsPerBlock, where), kBlock, 0, where.stream>>>(
          static_cast<const T*>(logits), static_cast<const Label*>(labels), static_cast<T*>(loss), rows, classes,
          error);
      FLOWLET_CUDA_CHECK_LAUNCH(where.device, "softmax_cross_entropy");
    });
  });
}

void launch_one_hot(const void* indices, ElementType index_type, float* out, int64_t count, int64_t depth,
                    uint64_t* error, const Launch& where) {
  if (count * depth == 0) return;
  FLOWLET_CUDA_CHECK(where.device, cudaMemsetAsync(out, 0, static_cast<size_t>(count * depth) * sizeof(float), where.stream));
  visit_type<kIndexTypes>("one_hot", index_type, [&]<class Index>(TypeTag<Index>) {
    one_hot_rows<Index><<<blocks_for(count, kBlock, where), kBlock, 0, where.stream>>>(
        static_cast<const Index*>(indices), out, count, depth, error);
    FLOWLET_CUDA_CHECK_LAUNCH(where.device, "one_hot");
  });
}

}  // namespace flowlet::detail::cuda
