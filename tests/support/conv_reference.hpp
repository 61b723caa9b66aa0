// Naive f64 references for conv2d and pooling, written as the definitions read (one loop per
// index, bounds checked per element), independent of the library's im2col engine. Used by
// tests/test_conv.cpp and the conv rows of the op table (tests/op_table/conv_rows.inc, which
// includes this file inside test_op_table.cpp's anonymous namespace, so it includes only standard
// headers that file already has).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace conv_ref {

struct Image {
  std::vector<double> values;
  std::vector<int64_t> dims;  // NCHW, or [O, C/g, kH, kW] for weights
  double at(int64_t a, int64_t b, int64_t c, int64_t d) const {
    return values[static_cast<size_t>(((a * dims[1] + b) * dims[2] + c) * dims[3] + d)];
  }
};

struct ConvSpec {
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t groups = 1;
  bool relu = false;
};

// y[n, o, i, j] = bias[o] + sum over c in o's group, ky, kx of x[n, c, i*s - pad + ky*d, ...] * w[o, c', ky, kx].
inline Image conv2d(const Image& x, const Image& w, const std::vector<double>* bias, const ConvSpec& s) {
  const int64_t n = x.dims[0], c = x.dims[1], h = x.dims[2], wd = x.dims[3];
  const int64_t o = w.dims[0], cg = w.dims[1], kh = w.dims[2], kw = w.dims[3];
  const int64_t og = o / s.groups;
  const int64_t oh = (h + s.pad_top + s.pad_bottom - s.dilation_h * (kh - 1) - 1) / s.stride_h + 1;
  const int64_t ow = (wd + s.pad_left + s.pad_right - s.dilation_w * (kw - 1) - 1) / s.stride_w + 1;
  (void)c;
  Image y{{}, {n, o, oh, ow}};
  for (int64_t b = 0; b < n; ++b)
    for (int64_t oc = 0; oc < o; ++oc)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          double total = bias != nullptr ? (*bias)[static_cast<size_t>(oc)] : 0.0;
          const int64_t group = oc / og;
          for (int64_t ic = 0; ic < cg; ++ic)
            for (int64_t ky = 0; ky < kh; ++ky)
              for (int64_t kx = 0; kx < kw; ++kx) {
                const int64_t iy = i * s.stride_h - s.pad_top + ky * s.dilation_h;
                const int64_t ix = j * s.stride_w - s.pad_left + kx * s.dilation_w;
                if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
                total += x.at(b, group * cg + ic, iy, ix) * w.at(oc, ic, ky, kx);
              }
          y.values.push_back(s.relu ? std::max(total, 0.0) : total);
        }
  return y;
}

struct PoolSpec {
  int64_t kernel_h = 2, kernel_w = 2, stride_h = 2, stride_w = 2;
  int64_t pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;  // explicit padding
  bool ceil_mode = false;
  bool count_include_pad = false;
};

inline int64_t pool_extent(int64_t in, int64_t lo, int64_t hi, int64_t k, int64_t s, bool ceil_mode) {
  const int64_t span = in + lo + hi - k;
  if (!ceil_mode) return span / s + 1;
  int64_t out = (span + s - 1) / s + 1;
  if ((out - 1) * s >= in + lo) --out;
  return out;
}

// max (max = true) or average pooling. A kernel position counts toward the average's divisor when
// it is inside the input or, with count_include_pad, inside the explicitly padded input.
inline Image pool2d(const Image& x, const PoolSpec& s, bool max) {
  const int64_t n = x.dims[0], c = x.dims[1], h = x.dims[2], w = x.dims[3];
  const int64_t oh = pool_extent(h, s.pad_top, s.pad_bottom, s.kernel_h, s.stride_h, s.ceil_mode);
  const int64_t ow = pool_extent(w, s.pad_left, s.pad_right, s.kernel_w, s.stride_w, s.ceil_mode);
  Image y{{}, {n, c, oh, ow}};
  for (int64_t b = 0; b < n; ++b)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          double best = -std::numeric_limits<double>::infinity(), total = 0;
          int64_t count = 0;
          for (int64_t ky = 0; ky < s.kernel_h; ++ky)
            for (int64_t kx = 0; kx < s.kernel_w; ++kx) {
              const int64_t iy = i * s.stride_h - s.pad_top + ky, ix = j * s.stride_w - s.pad_left + kx;
              const bool inside = iy >= 0 && iy < h && ix >= 0 && ix < w;
              const bool in_padded = iy < h + s.pad_bottom && ix < w + s.pad_right;
              if (inside) {
                best = std::max(best, x.at(b, ch, iy, ix));
                total += x.at(b, ch, iy, ix);
              }
              if (inside || (s.count_include_pad && in_padded)) ++count;
            }
          y.values.push_back(max ? best : total / static_cast<double>(count));
        }
  return y;
}

}  // namespace conv_ref
