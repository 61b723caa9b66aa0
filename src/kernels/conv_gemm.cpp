// im2col + GEMM convolutions on the CPU (see conv_gemm.hpp). A work item is one image of one
// group; items split over flowlet's pool in contiguous ranges, one column buffer per chunk. The
// three entry points hand the shapes Winograd computes faster (f32, 3x3 or 5x5, stride 1) to
// conv_winograd.cpp; the f32 forward products and 1x1 input-gradient products go to oneDNN's
// sgemm on the calling thread (product_gemm).
#include "kernels/conv_gemm.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <string_view>
#include <utility>
#include <vector>

#include <cblas.h>

#include "kernels/blas_threads.hpp"
#include "kernels/conv_winograd.hpp"
#include "kernels/gemm_thin.hpp"
#include "runtime/thread_pool.hpp"

namespace flowlet::detail {
namespace {

// Multiply-adds below which another thread does not pay for waking it.
constexpr double kConvWorkPerThread = 1 << 18;

// The most bytes of column matrix one block of output rows unfolds: big enough that the GEMM's
// N stays in the hundreds (448 positions for a 3x3 conv over 64 channels of 56-wide rows), small
// enough that a chunk's buffer stays about 1 MiB instead of the whole image's (7 MiB for
// 64x56x56 3x3). Measured against no blocking and 512 KiB in bench_conv: within the noise of a
// loaded machine (docs/notes15/conv.md), so the bounded memory decides.
constexpr size_t kColumnBytes = size_t{1} << 20;
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

// Calls visit(offset in col, input row or -1, first, last, input column offset) for each output
// row in [oy0, oy1) of every column-matrix row: the shared walk of im2col and col2im. The column
// matrix holds output rows [oy0, oy1) only: [channels * kh * kw, (oy1 - oy0) * ow].
template <class Visit>
void walk_columns(const ConvGeometry& g, int64_t channels, int64_t oy0, int64_t oy1, Visit&& visit) {
  const int64_t positions = (oy1 - oy0) * g.ow;
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j) {
        const int64_t row = (c * g.kh + i) * g.kw + j;
        const int64_t x_offset = j * g.dilation_w - g.pad_left;
        const auto [first, last] = valid_outputs(x_offset, g.stride_w, g.w, g.ow);
        for (int64_t oy = oy0; oy < oy1; ++oy) {
          const int64_t iy = oy * g.stride_h - g.pad_top + i * g.dilation_h;
          const int64_t in_row = iy < 0 || iy >= g.h ? -1 : c * g.h + iy;
          visit(row * positions + (oy - oy0) * g.ow, in_row, first, last, x_offset);
        }
      }
}

// col [channels * kh * kw, oh * ow] from one image's channels [channels, h, w]; zero where padded.
template <class T>
void im2col(const ConvGeometry& g, int64_t channels, int64_t oy0, int64_t oy1, const T* x, T* col) {
  walk_columns(g, channels, oy0, oy1, [&](int64_t at, int64_t in_row, int64_t first, int64_t last, int64_t x_offset) {
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
void col2im_add(const ConvGeometry& g, int64_t channels, int64_t oy0, int64_t oy1, const T* col, T* x) {
  walk_columns(g, channels, oy0, oy1, [&](int64_t at, int64_t in_row, int64_t first, int64_t last, int64_t x_offset) {
    if (in_row < 0) return;
    const T* from = col + at;
    T* in = x + in_row * g.w;
    for (int64_t ox = first; ox < last; ++ox) in[ox * g.stride_w + x_offset] += from[ox];
  });
}

// False when FLOWLET_CONV_WINOGRAD=0: the Winograd kernels off (read at each call, so a benchmark
// can compare both engines in one process).
bool winograd_enabled() {
  const char* value = std::getenv("FLOWLET_CONV_WINOGRAD");
  return value == nullptr || std::string_view(value) != "0";
}

// C = op(A) @ B (beta = 0) for the forward products (im2col and 1x1) and the 1x1 input gradient,
// through oneDNN's sgemm held to the calling thread (thin_sgemm, kernels/gemm_thin.hpp) for f32:
// one thread each, interleaved, it took 0.65-0.85x OpenBLAS's CPU time for the CNN demo's conv1
// (K = 25) and the ResNet 1x1 shapes, and was level or better at K = 288 and 1152
// (docs/notes19/wino.md). The weight gradients (beta = 1, long K) measured level and stay with
// OpenBLAS. FLOWLET_CONV_ONEDNN=0 (read per call) or a build without oneDNN keeps OpenBLAS.
template <class T>
void product_gemm(bool trans_a, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb,
                  T* c, int64_t ldc) {
  if constexpr (std::is_same_v<T, float>) {
    if (conv_onednn_enabled() && thin_sgemm(trans_a, false, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc)) return;
  }
  gemm(trans_a, false, m, n, k, a, lda, b, ldb, T(0), c, ldc);
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

bool conv_onednn_enabled() {
  const char* value = std::getenv("FLOWLET_CONV_ONEDNN");
  return value == nullptr || std::string_view(value) != "0";
}

// Output rows per column block: the column matrix of one block stays within kColumnBytes, at
// least one row.
int64_t rows_per_block(const ConvGeometry& g, int64_t k, size_t item_size) {
  const auto bytes = static_cast<double>(k) * static_cast<double>(g.ow) * static_cast<double>(item_size);
  return std::clamp<int64_t>(static_cast<int64_t>(static_cast<double>(kColumnBytes) / std::max(bytes, 1.0)), 1,
                             std::max<int64_t>(g.oh, 1));
}

template <class T>
void conv2d_forward_cpu(const ConvGeometry& g, const T* x, const T* w, const T* bias, bool relu, T* y) {
  if constexpr (std::is_same_v<T, float>) {
    if (winograd_forward_applies(g) && winograd_enabled()) return conv2d_winograd_forward(g, x, w, bias, relu, y);
  }
  use_pool_threads_only();
  const int64_t cg = g.c / g.groups, og = g.o / g.groups, k = cg * g.kh * g.kw, positions = g.oh * g.ow;
  const int64_t items = g.n * g.groups;
  if (items == 0 || og == 0 || positions == 0) return;
  const bool pointwise = is_pointwise(g);
  const int64_t block = pointwise ? g.oh : rows_per_block(g, k, sizeof(T));
  const int64_t chunks = chunks_for(items, static_cast<double>(og) * static_cast<double>(k * positions));
  for_item_ranges(items, chunks, [&](int64_t, int64_t first, int64_t last) {
    std::vector<T> col(pointwise ? 0 : static_cast<size_t>(k * block * g.ow));
    for (int64_t item = first; item < last; ++item) {
      const int64_t image = item / g.groups, group = item % g.groups;
      const T* xs = x + (image * g.c + group * cg) * g.h * g.w;
      T* ys = y + (image * g.o + group * og) * positions;
      if (k == 0) {
        std::fill(ys, ys + og * positions, T(0));
      } else if (pointwise) {
        product_gemm(false, og, positions, k, w + group * og * k, k, xs, positions, ys, positions);
      } else {
        for (int64_t oy0 = 0; oy0 < g.oh; oy0 += block) {
          const int64_t oy1 = std::min(oy0 + block, g.oh), span = (oy1 - oy0) * g.ow;
          im2col(g, cg, oy0, oy1, xs, col.data());
          product_gemm(false, og, span, k, w + group * og * k, k, col.data(), span, ys + oy0 * g.ow, positions);
        }
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
  if constexpr (std::is_same_v<T, float>) {
    if (winograd_backward_input_applies(g) && winograd_enabled()) return conv2d_winograd_backward_input(g, dy, w, dx);
  }
  use_pool_threads_only();
  const int64_t cg = g.c / g.groups, og = g.o / g.groups, k = cg * g.kh * g.kw, positions = g.oh * g.ow;
  const int64_t items = g.n * g.groups;
  if (items == 0 || cg == 0) return;
  const bool pointwise = is_pointwise(g);
  const int64_t block = pointwise ? g.oh : rows_per_block(g, k, sizeof(T));
  const int64_t chunks = chunks_for(items, static_cast<double>(og) * static_cast<double>(k * positions));
  for_item_ranges(items, chunks, [&](int64_t, int64_t first, int64_t last) {
    std::vector<T> col(pointwise ? 0 : static_cast<size_t>(k * block * g.ow));
    for (int64_t item = first; item < last; ++item) {
      const int64_t image = item / g.groups, group = item % g.groups;
      T* dxs = dx + (image * g.c + group * cg) * g.h * g.w;
      const T* dys = dy + (image * g.o + group * og) * positions;
      if (og == 0 || positions == 0) {
        std::fill(dxs, dxs + cg * g.h * g.w, T(0));
        continue;
      }
      // dcol [k, positions] = w_g^T [k, og] @ dy_g [og, positions], a block of output rows at a time
      if (pointwise) {
        product_gemm(true, k, positions, og, w + group * og * k, k, dys, positions, dxs, positions);
        continue;
      }
      std::fill(dxs, dxs + cg * g.h * g.w, T(0));
      for (int64_t oy0 = 0; oy0 < g.oh; oy0 += block) {
        const int64_t oy1 = std::min(oy0 + block, g.oh), span = (oy1 - oy0) * g.ow;
        gemm(true, false, k, span, og, w + group * og * k, k, dys + oy0 * g.ow, positions, T(0), col.data(), span);
        col2im_add(g, cg, oy0, oy1, col.data(), dxs);
      }
    }
  });
}

template <class T>
void conv2d_backward_weight_cpu(const ConvGeometry& g, const T* x, const T* dy, T* dw) {
  if constexpr (std::is_same_v<T, float>) {
    if (winograd_backward_weight_applies(g) && winograd_enabled()) return conv2d_winograd_backward_weight(g, x, dy, dw);
  }
  use_pool_threads_only();
  const int64_t cg = g.c / g.groups, og = g.o / g.groups, k = cg * g.kh * g.kw, positions = g.oh * g.ow;
  const int64_t items = g.n * g.groups, weights = g.o * k;
  std::fill(dw, dw + weights, T(0));
  if (items == 0 || weights == 0 || positions == 0) return;
  const bool pointwise = is_pointwise(g);
  const int64_t block = pointwise ? g.oh : rows_per_block(g, k, sizeof(T));
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
    std::vector<T> col(pointwise ? 0 : static_cast<size_t>(k * block * g.ow));
    for (int64_t item = first; item < last; ++item) {
      const int64_t image = item / g.groups, group = item % g.groups;
      const T* xs = x + (image * g.c + group * cg) * g.h * g.w;
      const T* dys = dy + (image * g.o + group * og) * positions;
      // dw_g [og, k] += dy_g [og, positions] @ col^T [positions, k], a block of output rows at a time
      if (pointwise) {
        gemm(false, true, og, k, positions, dys, positions, xs, positions, T(1), sum + group * og * k, k);
        continue;
      }
      for (int64_t oy0 = 0; oy0 < g.oh; oy0 += block) {
        const int64_t oy1 = std::min(oy0 + block, g.oh), span = (oy1 - oy0) * g.ow;
        im2col(g, cg, oy0, oy1, xs, col.data());
        gemm(false, true, og, k, span, dys + oy0 * g.ow, positions, col.data(), span, T(1), sum + group * og * k, k);
      }
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
