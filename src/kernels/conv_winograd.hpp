// Winograd F(m x m, r x r) convolutions on the CPU, f32, for square 3x3 and 5x5 kernels with stride 1
// and dilation 1 (src/kernels/conv_gemm.cpp routes conv2d and both its gradients here when they
// apply). Each 2x2 block of outputs is computed from an (r+1) x (r+1) input tile with (r+1)^2
// multiplications per channel pair instead of 4 r^2 (2.25x fewer for 3x3, 2.8x for 5x5); a 5x5
// kernel takes 4x4 blocks from 8x8 tiles where that needs fewer (64 per 16 outputs, 6.25x fewer
// than direct; its weight gradient 4x4 tiles of dy). The tiles' transforms are batched over blocks
// of tiles across the whole batch, and the alpha^2 channel contractions are small, cache-resident
// GEMMs (oneDNN's sgemm forward, OpenBLAS for the weight gradient; one thread per call, the
// blocks split over flowlet's pool). The transform matrices are the Toom-Cook ones for
// fixed interpolation points (winograd_transform); their f32 error is bounded and tested in
// tests/test_conv.cpp.
#pragma once

#include <vector>

#include "kernels/conv_gemm.hpp"

namespace flowlet::detail {

// The 1-D transforms of F(m, r): for a correlation y_i = sum_k g_k d_{i+k}, i < m, over
// alpha = m + r - 1 inputs d, y = A^T [(G g) * (B^T d)] (element-wise product). Row-major, in double.
struct WinogradTransform {
  int r = 0, m = 0, alpha = 0;
  std::vector<double> bt;  // B^T [alpha, alpha]
  std::vector<double> g;   // G [alpha, r]
  std::vector<double> at;  // A^T [m, alpha]
};

// F(2, 3) (points 0, 1, -1, infinity), F(2, 5) (0, 1, -1, 2, -2, infinity) and F(4, 5) (0, +-1,
// +-2, +-1/2, infinity), as the kernels use them. Anything else is a caller bug
// (std::invalid_argument).
const WinogradTransform& winograd_transform(int r, int m = 2);

// The output tile all three passes take for this geometry (forward and input gradient: m x m
// outputs; weight gradient: m x m tiles of dy): 4 (F(4x4, 5x5)) for 5x5 kernels where its tiles
// need fewer multiplications than 2x2 ones, else 2. FLOWLET_CONV_WINOGRAD_4X4=0 keeps 2.
int winograd_tile(const ConvGeometry& g);

// True when conv2d_winograd_forward computes this geometry (any padding and groups) and pays:
// stride 1, dilation 1, a 3x3 or 5x5 kernel, and enough channels per group on both sides that the
// transforms cost less than the multiplications they save.
bool winograd_forward_applies(const ConvGeometry& g);
// The same for the input gradient (a stride-1 convolution of dy with the flipped kernel).
bool winograd_backward_input_applies(const ConvGeometry& g);

// y = conv(x, w) (+ bias) (then relu), as conv2d_forward_cpu; y is overwritten.
void conv2d_winograd_forward(const ConvGeometry& g, const float* x, const float* w, const float* bias, bool relu,
                             float* y);
// dx = the gradient of conv(x, w) wrt x given dy, as conv2d_backward_input_cpu; dx is overwritten.
void conv2d_winograd_backward_input(const ConvGeometry& g, const float* dy, const float* w, float* dx);
// The same for the weight gradient, F(r x r, m x m) over m x m tiles of dy (each tile's r x r
// contribution from the same (m+r-1) x (m+r-1) input windows).
bool winograd_backward_weight_applies(const ConvGeometry& g);
// dw = the gradient of conv(x, w) wrt w given dy, as conv2d_backward_weight_cpu; dw is overwritten.
void conv2d_winograd_backward_weight(const ConvGeometry& g, const float* x, const float* dy, float* dw);

}  // namespace flowlet::detail
