// The CPU convolution engine: im2col + OpenBLAS GEMM over NCHW images (src/ops/conv.cpp calls it
// for conv2d and its two backward ops). Each image's patches are unfolded into a column matrix
// [C/g * kH * kW, H' * W'] and multiplied by the weights of its group; a 1x1 convolution with
// stride 1 and no padding uses the image itself as that matrix. Work splits over images on
// flowlet's pool (each chunk owns its column buffer, a block of output rows at a time, about
// 1 MiB); OpenBLAS runs on one thread per call
// (src/kernels/blas_threads.hpp), so the thread budget holds. f32 calls (forward and both gradients)
// with a 3x3 or 5x5 kernel, stride 1 and enough channels go to the Winograd kernels instead
// (src/kernels/conv_winograd.hpp; FLOWLET_CONV_WINOGRAD=0 keeps them here). The f32 forward
// products (and 1x1 input gradients) run on oneDNN's sgemm, held to the calling thread like
// OpenBLAS (src/kernels/gemm_thin.hpp; FLOWLET_CONV_ONEDNN=0 keeps OpenBLAS).
#pragma once

#include <cstdint>

namespace flowlet::detail {

// Every size a convolution needs, in elements: x [n, c, h, w], w [o, c / groups, kh, kw],
// y [n, o, oh, ow]; pads are the top and left ones (bottom and right only shape oh and ow).
struct ConvGeometry {
  int64_t n = 0, c = 0, h = 0, w = 0;
  int64_t o = 0, kh = 0, kw = 0;
  int64_t oh = 0, ow = 0;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_top = 0, pad_left = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t groups = 1;
};

// False when FLOWLET_CONV_ONEDNN=0 (read per call, so a benchmark can compare both engines in one
// process): the convolution products that take oneDNN's sgemm (src/kernels/gemm_thin.hpp) keep
// OpenBLAS.
bool conv_onednn_enabled();

// y = conv(x, w) (+ bias[o] when bias is non-null), then max(y, 0) when relu. y is overwritten.
template <class T>
void conv2d_forward_cpu(const ConvGeometry& g, const T* x, const T* w, const T* bias, bool relu, T* y);
// dx = the gradient of conv(x, w) wrt x given dy. dx is overwritten.
template <class T>
void conv2d_backward_input_cpu(const ConvGeometry& g, const T* dy, const T* w, T* dx);
// dw = the gradient of conv(x, w) wrt w given dy. dw is overwritten.
template <class T>
void conv2d_backward_weight_cpu(const ConvGeometry& g, const T* x, const T* dy, T* dw);

}  // namespace flowlet::detail
