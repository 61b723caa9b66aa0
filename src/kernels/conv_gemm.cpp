// im2col + GEMM convolutions on the CPU (see conv_gemm.hpp). A work item is one image of one
// group; items split over flowlet's pool in contiguous ranges, one column buffer per chunk.
#include "kernels/conv_gemm.hpp"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include <cblas.h>

#include "kernels/blas_threads.hpp"
#include "runtime/thread_pool.hpp"

namespace flowlet::detail {
namespace {

// Multiply-adds below which another thread does not pay for waking it.
constexpr double kConvWorkPerThread = 1 << 18;

// Row-major C = alpha * op(A) op(B) + beta * C.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
          int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0f, a, static_cast<int>(lda), b,
              static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const double* a, int64_t lda, const double* b,
          int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0, a, static_cast<int>(lda), b,
              static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

// The output positions [first, last) of one axis whose input index (pos * stride + offset) lies in
// [0, size).
std::pair<int64_t, int64_t> valid_outputs(int64_t offset, int64_t stride, int64_t size, int64_t count) {
  const int64_t first = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  const int64_t last = size - offset <= 0 ? 0 : (size - offset + stride - 1) / stride;
  const int64_t lo = std::clamp<int64_t>(first, 0, count);
  return {lo, std::clamp<int64_t>(last, lo, count)};
}

// True when the column matrix of an image is the image itself.
bool is_pointwise(const ConvGeometry& g) {
  return g.kh == 1 && g.kw == 1 && g.stride_h == 1 && g.stride_w == 1 && g.pad_top == 0 && g.pad_left == 0 &&
         g.oh == g.h && g.ow == g.w;
}

// Calls visit(row of col, input row or -1, first, last, input column offset) for every row of
// every column-matrix row: the shared walk of im2col and col2im.
template <class Visit>
void walk_columns(const ConvGeometry& g, int64_t channels, Visit&& visit) {
  const int64_t positions = g.oh * g.ow;
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j) {
        const int64_t row = (c * g.kh + i) * g.kw + j;
        const int64_t x_offset = j * g.dilation_w - g.pad_left;
        const auto [first, last] = valid_outputs(x_offset, g.stride_w, g.w, g.ow);
        for (int64_t oy = 0; oy < g.oh; ++oy) {
          const int64_t iy = oy * g.stride_h - g.pad_top + i * g.dilation_h;
          const int64_t in_row = iy < 0 || iy >= g.h ? -1 : c * g.h + iy;
          visit(row * positions + oy * g.ow, in_row, first, last, x_offset);
        }
      }
}

// col [channels * kh * kw, oh * ow] from one image's channels [channels, h, w]; zero where padded.
template <class T>
void im2col(const ConvGeometry& g, int64_t channels, const T* x, T* col) {
  walk_columns(g, channels, [&](int64_t at, int64_t in_row, int64_t first, int64_t last, int64_t x_offset) {
    T* out = col + at;
    if (in_row < 0) {
      std::fill(out, out + g.ow, T(0));
      return;
    }
    const T* in = x + in_row * g.w;
    std::fill(out, out + first, T(0));
    if (g.stride_w == 1) {
      std::copy(in + (first + x_offset), in + (last + x_offset), out + first);
    } else {
      for (int64_t ox = first; ox < last; ++ox) out[ox] = in[ox * g.stride_w + x_offset];
    }
    std::fill(out + last, out + g.ow, T(0));
  });
}

// The reverse: adds each column entry to the image position it came from (padding drops).
template <class T>
void col2im_add(const ConvGeometry& g, int64_t channels, const T* col, T* x) {
  walk_columns(g, channels, [&](int64_t at, int64_t in_row, int64_t first, int64_t last, int64_t x_offset) {
    if (in_row < 0) return;
    const T* from = col + at;
    T* in = x + in_row * g.w;
    for (int64_t ox = first; ox < last; ++ox) in[ox * g.stride_w + x_offset] += from[ox];
  });
}

// How many chunks `items` work items of `work_per_item` multiply-adds split into.
int64_t chunks_for(int64_t items, double work_per_item) {
  const double work = static_cast<double>(items) * work_per_item;
  const auto wanted = static_cast<int64_t>(std::min<double>(intra_op_threads(), work / kConvWorkPerThread));
  return std::clamp<int64_t>(wanted, 1, std::max<int64_t>(items, 1));
}

// Runs body(chunk, first_item, last_item) over `chunks` near-equal ranges of [0, items).
template <class Body>
void for_item_ranges(int64_t items, int64_t chunks, Body&& body) {
  if (chunks <= 1) {
    body(int64_t{0}, int64_t{0}, items);
    return;
  }
  auto one = [&](int64_t chunk) { body(chunk, items * chunk / chunks, items * (chunk + 1) / chunks); };
  run_chunks(chunks, FunctionRef<void(int64_t)>(one));
}

}  // namespace

template <class T>
void conv2d_forward_cpu(const ConvGeometry& g, const T* x, const T* w, const T* bias, bool relu, T* y) {
  use_pool_threads_only();
  const int64_t cg = g.c / g.groups, og = g.o / g.groups, k = cg * g.kh * g.kw, positions = g.oh * g.ow;
  const int64_t items = g.n * g.groups;
  if (items == 0 || og == 0 || positions == 0) return;
  const bool pointwise = is_pointwise(g);
  const int64_t chunks = chunks_for(items, static_cast<double>(og) * static_cast<double>(k * positions));
  for_item_ranges(items, chunks, [&](int64_t, int64_t first, int64_t last) {
    std::vector<T> col(pointwise ? 0 : static_cast<size_t>(k * positions));
    for (int64_t item = first; item < last; ++item) {
      const int64_t image = item / g.groups, group = item % g.groups;
      const T* xs = x + (image * g.c + group * cg) * g.h * g.w;
      T* ys = y + (image * g.o + group * og) * positions;
      if (!pointwise) im2col(g, cg, xs, col.data());
      if (k == 0) {
        std::fill(ys, ys + og * positions, T(0));
      } else {
        gemm(false, false, og, positions, k, w + group * og * k, k, pointwise ? xs : col.data(), positions, T(0), ys,
             positions);
      }
      for (int64_t oc = 0; oc < og; ++oc) {
        T* line = ys + oc * positions;
        const T b = bias != nullptr ? bias[group * og + oc] : T(0);
        if (relu) {
          for (int64_t p = 0; p < positions; ++p) line[p] = std::max(line[p] + b, T(0));
        } else if (bias != nullptr) {
          for (int64_t p = 0; p < positions; ++p) line[p] += b;
        }
      }
    }
  });
}

template <class T>
void conv2d_backward_input_cpu(const ConvGeometry& g, const T* dy, const T* w, T* dx) {
  use_pool_threads_only();
  const int64_t cg = g.c / g.groups, og = g.o / g.groups, k = cg * g.kh * g.kw, positions = g.oh * g.ow;
  const int64_t items = g.n * g.groups;
  if (items == 0 || cg == 0) return;
  const bool pointwise = is_pointwise(g);
  const int64_t chunks = chunks_for(items, static_cast<double>(og) * static_cast<double>(k * positions));
  for_item_ranges(items, chunks, [&](int64_t, int64_t first, int64_t last) {
    std::vector<T> col(pointwise ? 0 : static_cast<size_t>(k * positions));
    for (int64_t item = first; item < last; ++item) {
      const int64_t image = item / g.groups, group = item % g.groups;
      T* dxs = dx + (image * g.c + group * cg) * g.h * g.w;
      const T* dys = dy + (image * g.o + group * og) * positions;
      if (og == 0 || positions == 0) {
        std::fill(dxs, dxs + cg * g.h * g.w, T(0));
        continue;
      }
      // dcol [k, positions] = w_g^T [k, og] @ dy_g [og, positions]
      T* target = pointwise ? dxs : col.data();
      gemm(true, false, k, positions, og, w + group * og * k, k, dys, positions, T(0), target, positions);
      if (!pointwise) {
        std::fill(dxs, dxs + cg * g.h * g.w, T(0));
        col2im_add(g, cg, col.data(), dxs);
      }
    }
  });
}

template <class T>
void conv2d_backward_weight_cpu(const ConvGeometry& g, const T* x, const T* dy, T* dw) {
  use_pool_threads_only();
  const int64_t cg = g.c / g.groups, og = g.o / g.groups, k = cg * g.kh * g.kw, positions = g.oh * g.ow;
  const int64_t items = g.n * g.groups, weights = g.o * k;
  std::fill(dw, dw + weights, T(0));
  if (items == 0 || weights == 0 || positions == 0) return;
  const bool pointwise = is_pointwise(g);
  const int64_t chunks = chunks_for(items, static_cast<double>(og) * static_cast<double>(k * positions));
  // Each chunk past the first sums into its own buffer; the buffers are added at the end.
  std::vector<std::vector<T>> partial(static_cast<size_t>(chunks - 1));
  for_item_ranges(items, chunks, [&](int64_t chunk, int64_t first, int64_t last) {
    T* sum = dw;
    if (chunk > 0) {
      auto& own = partial[static_cast<size_t>(chunk - 1)];
      own.assign(static_cast<size_t>(weights), T(0));
      sum = own.data();
    }
    std::vector<T> col(pointwise ? 0 : static_cast<size_t>(k * positions));
    for (int64_t item = first; item < last; ++item) {
      const int64_t image = item / g.groups, group = item % g.groups;
      const T* xs = x + (image * g.c + group * cg) * g.h * g.w;
      const T* dys = dy + (image * g.o + group * og) * positions;
      if (!pointwise) im2col(g, cg, xs, col.data());
      // dw_g [og, k] += dy_g [og, positions] @ col^T [positions, k]
      gemm(false, true, og, k, positions, dys, positions, pointwise ? xs : col.data(), positions, T(1),
           sum + group * og * k, k);
    }
  });
  for (const auto& own : partial)
    for (int64_t i = 0; i < weights; ++i) dw[i] += own[static_cast<size_t>(i)];
}

template void conv2d_forward_cpu<float>(const ConvGeometry&, const float*, const float*, const float*, bool, float*);
template void conv2d_forward_cpu<double>(const ConvGeometry&, const double*, const double*, const double*, bool,
                                         double*);
template void conv2d_backward_input_cpu<float>(const ConvGeometry&, const float*, const float*, float*);
template void conv2d_backward_input_cpu<double>(const ConvGeometry&, const double*, const double*, double*);
template void conv2d_backward_weight_cpu<float>(const ConvGeometry&, const float*, const float*, float*);
template void conv2d_backward_weight_cpu<double>(const ConvGeometry&, const double*, const double*, double*);

}  // namespace flowlet::detail
