// The launchers of the issue 15 kernels (kernels/conv.cu: pooling, the conv epilogue, padding;
// kernels/normalization.cu: batch and layer normalization, dropout), apart from launch.hpp so that
// adding them recompiled none of the older .cu files. Plain structs and pointers only, like
// launch.hpp: nvcc sees no flowlet header beyond it.
#pragma once

#include "cuda/kernels/launch.hpp"

namespace flowlet::detail::cuda {

// A 2-D window over `planes` = N * C contiguous planes of in_h x in_w, giving out_h x out_w.
// The padding is the op's (Pool2dAttrs: ceil_mode already folded into bottom and right, ceil_h
// and ceil_w of it, which count_include_pad does not count).
struct PoolGeometry {
  int64_t planes = 0, in_h = 0, in_w = 0, out_h = 0, out_w = 0;
  int64_t kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1;
  int64_t pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;
  int64_t ceil_h = 0, ceil_w = 0;
  bool count_include_pad = false;
};

// y = the largest element of each window (padding never counts); NaN as the CPU treats it.
void launch_max_pool(const void* x, void* y, ElementType type, const PoolGeometry& g, const Launch& where);
// dx[i] = sum of dy over the windows whose first maximum is element i (a gather per input
// element, in window order: deterministic, no atomics).
void launch_max_pool_backward(const void* x, const void* dy, void* dx, ElementType type, const PoolGeometry& g,
                              const Launch& where);
// y = the mean of each window (divisor: see pool_divisor in conv.cu).
void launch_avg_pool(const void* x, void* y, ElementType type, const PoolGeometry& g, const Launch& where);
void launch_avg_pool_backward(const void* dy, void* dx, ElementType type, const PoolGeometry& g, const Launch& where);

// out [planes, out_h, out_w] = in [planes, in_h, in_w] placed at (top, left), zeros elsewhere
// (out_h >= top + in_h): asymmetric convolution padding, which cuDNN lacks.
void launch_pad_planes(const void* in, void* out, int element_bytes, int64_t planes, int64_t in_h, int64_t in_w,
                       int64_t top, int64_t left, int64_t out_h, int64_t out_w, const Launch& where);
// out [planes, out_h, out_w] = the window of in [planes, in_h, in_w] starting at (top, left).
void launch_crop_planes(const void* in, void* out, int element_bytes, int64_t planes, int64_t in_h, int64_t in_w,
                        int64_t top, int64_t left, int64_t out_h, int64_t out_w, const Launch& where);
// In place over y [n, channels, plane]: y += bias[channel] (bias may be null), then max(y, 0) when `relu`.
void launch_bias_activation(void* y, const void* bias, ElementType type, int64_t n, int64_t channels, int64_t plane,
                            bool relu, const Launch& where);

// Batch normalization over x [outer, channels, inner] (outer = N, inner = the spatial size). Every
// tensor has x's element type. Sums accumulate in f64 and the per-element arithmetic runs in x's
// compute type with per-channel scale and shift, as the CPU kernels (src/ops/normalization.cpp) do.
struct ChannelLayout {
  int64_t outer = 0, channels = 0, inner = 0;
};
// The f64 scratch (elements) the two batch norm launchers below need: partial sums of the pieces
// each channel is split into, so that few channels still fill the GPU.
int64_t batch_norm_scratch_doubles(const ChannelLayout& l, const Launch& where);
// mean[c], the biased var[c] (two passes: the mean, then squared deviations), then
// y = x * scale + shift with scale = gamma / sqrt(var + eps), shift = beta - mean * scale.
void launch_batch_norm_training(const void* x, const void* gamma, const void* beta, void* y, void* mean, void* var,
                                ElementType type, const ChannelLayout& l, double eps, double* scratch,
                                const Launch& where);
// y = x * scale + shift with the given statistics.
void launch_batch_norm_inference(const void* x, const void* gamma, const void* beta, const void* mean,
                                 const void* var, void* y, ElementType type, const ChannelLayout& l, double eps,
                                 const Launch& where);
// The training-mode gradient (through the batch statistics):
// dbeta = sum dy, dgamma = sum dy * xhat, dx = gamma * rstd * (dy - dbeta / m - xhat * dgamma / m).
void launch_batch_norm_backward(const void* x, const void* gamma, const void* mean, const void* var, const void* dy,
                                void* dx, void* dgamma, void* dbeta, ElementType type, const ChannelLayout& l,
                                double eps, double* scratch, const Launch& where);

// Layer normalization of each row of x [rows, cols]: mean[r], rstd[r] = 1 / sqrt(var + eps) and
// y = (x - mean) * rstd * gamma[col] + beta[col].
void launch_layer_norm(const void* x, const void* gamma, const void* beta, void* y, void* mean, void* rstd,
                       ElementType type, int64_t rows, int64_t cols, double eps, const Launch& where);
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gamma per row; dgamma[col] =
// sum over rows of dy * xhat, dbeta[col] = sum of dy.
void launch_layer_norm_backward(const void* x, const void* gamma, const void* mean, const void* rstd, const void* dy,
                                void* dx, void* dgamma, void* dbeta, ElementType type, int64_t rows, int64_t cols,
                                const Launch& where);

// y[i] = keep(i) ? x[i] * scale : 0 with keep from kernels/dropout_mask.hpp for the state
// (seed, offset) read on the device from `state` (i64 [2]): no host round trip, so it records into
// a CUDA Graph and each replay reads the state's current value.
void launch_dropout(const void* x, void* y, ElementType type, int64_t n, const int64_t* state, double rate,
                    const Launch& where);

}  // namespace flowlet::detail::cuda
