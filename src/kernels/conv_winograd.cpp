// Winograd F(m x m, r x r) convolutions (see conv_winograd.hpp). The tiles of all images are numbered
// q = (image * tiles_h + tile_y) * tiles_w + tile_x and processed in blocks of `block` tiles. The
// input is first copied zero-padded and channel-blocked ([n][c/8][hp][wp][8], so a window of 8
// channels is one vector load and no tile needs a bounds check). Per block and group: the input
// transform writes V [tile][alpha^2][channel], alpha^2 GEMMs
// M_xi [tiles, og] = V_xi [tiles, cg] @ U_xi [cg, og] contract the channels (row stride
// alpha^2 * channels; oneDNN's sgemm on the calling thread, or OpenBLAS without it or with
// FLOWLET_CONV_ONEDNN=0), and the output transform turns each tile's M [tile][alpha^2][og] into
// its m x m outputs. The weight gradient runs the same tiles the other way round (m x m tiles of
// dy, OpenBLAS for its products). Tile-major V and M keep a tile's alpha^2 vectors together:
// position-major, the transforms' stores and loads hit alpha^2 lines a block apart (perf: the
// transform share of the CNN step fell from 0.53 to 0.39 of the GEMM kernel's). Transforms run on
// 8 channels at once (GCC vector types) with the matrices as compile-time constants, so their
// zeros cost nothing, and the +-p pairs of rows (B^T, G') or columns (A^T) share their partial
// sums.
#include "kernels/conv_winograd.hpp"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string_view>

#include <cblas.h>

#include "kernels/blas_threads.hpp"
#include "kernels/gemm_thin.hpp"
#include "runtime/thread_pool.hpp"

namespace flowlet::detail {
namespace {

// Channels per group (on both sides) below which the transforms cost more than they save.
constexpr int64_t kMinChannels = 16;
// Channels per vector.
constexpr int64_t kLanes = 8;
// The bytes of V and M one block keeps. Meant to fit one core's L2; this VM's is 512 KiB, yet 1 MiB
// measured fastest with oneDNN's products (their M grows with the block; docs/notes19/wino.md).
constexpr double kBlockBytes = 1.0 * (1 << 20);
// Multiply-adds (of the direct convolution) below which another thread does not pay.
constexpr double kWorkPerThread = 1 << 18;

using v8 = float __attribute__((vector_size(32)));

v8 load(const float* p) {
  v8 v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
void store(float* p, v8 v) { __builtin_memcpy(p, &v, sizeof v); }

template <int Rows, int Cols>
struct Matrix {
  double m[Rows][Cols];
};

// F(2, 3) at the points 0, 1, -1, infinity, and F(2, 5) at 0, 1, -1, 2, -2, infinity (Toom-Cook).
// Each row of B^T is scaled to small integers (the input transform then adds and scales by
// integers only) and the matching row of G by the inverse (the weights are transformed once, in
// double). tests/test_conv.cpp checks that each triple computes the correlation.
constexpr Matrix<4, 4> kBt3{{{1, 0, -1, 0}, {0, 1, 1, 0}, {0, -1, 1, 0}, {0, -1, 0, 1}}};
constexpr Matrix<4, 3> kG3{{{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}}};
constexpr Matrix<2, 4> kAt3{{{1, 1, 1, 0}, {0, 1, -1, 1}}};
constexpr Matrix<6, 6> kBt5{{{4, 0, -5, 0, 1, 0},
                             {0, 4, 4, -1, -1, 0},
                             {0, -4, 4, 1, -1, 0},
                             {0, -2, -1, 2, 1, 0},
                             {0, 2, -1, -2, 1, 0},
                             {0, 4, 0, -5, 0, 1}}};
constexpr Matrix<6, 5> kG5{{{1.0 / 4, 0, 0, 0, 0},
                            {1.0 / 6, 1.0 / 6, 1.0 / 6, 1.0 / 6, 1.0 / 6},
                            {1.0 / 6, -1.0 / 6, 1.0 / 6, -1.0 / 6, 1.0 / 6},
                            {1.0 / 24, 2.0 / 24, 4.0 / 24, 8.0 / 24, 16.0 / 24},
                            {1.0 / 24, -2.0 / 24, 4.0 / 24, -8.0 / 24, 16.0 / 24},
                            {0, 0, 0, 0, 1}}};
constexpr Matrix<2, 6> kAt5{{{1, 1, 1, 1, 1, 0}, {0, 1, -1, 2, -2, 1}}};
// F(4, 5) at 0, +-1, +-2, +-1/2, infinity: 64 multiplications per 4x4 outputs instead of 4 x 36 per
// 2x2 (1.7x fewer on the CNN demo's 14x14 outputs, 16x16 of which the tiles cover). Built like the
// others (B^T's rows the polynomials prod_{l != j} (x - p_l), scaled to integers, G's rows p_j^k
// over prod_{l != j} (p_j - p_l) and the same scale; A^T[i][j] = p_j^i); the halves keep its f32
// error near F(2, 5)'s (an f32 simulation on 32 channels: median 3.1e-6 of the tile's largest
// output vs 1.5e-6, max 9.2e-6 vs 7.9e-6; the points +-3 instead gave 1.8e-4, +-4 2.5e-4).
constexpr Matrix<8, 8> kBt5x4{{{4, 0, -21, 0, 21, 0, -4, 0},
                               {0, 4, 4, -17, -17, 4, 4, 0},
                               {0, -4, 4, 17, -17, -4, 4, 0},
                               {0, 2, 1, -10, -5, 8, 4, 0},
                               {0, -2, 1, 10, -5, -8, 4, 0},
                               {0, 4, 8, -5, -10, 1, 2, 0},
                               {0, -4, 8, 5, -10, -1, 2, 0},
                               {0, -4, 0, 21, 0, -21, 0, 4}}};
constexpr Matrix<8, 5> kG5x4{{{1.0 / 4, 0, 0, 0, 0},
                              {-1.0 / 18, -1.0 / 18, -1.0 / 18, -1.0 / 18, -1.0 / 18},
                              {-1.0 / 18, 1.0 / 18, -1.0 / 18, 1.0 / 18, -1.0 / 18},
                              {1.0 / 360, 1.0 / 180, 1.0 / 90, 1.0 / 45, 2.0 / 45},
                              {1.0 / 360, -1.0 / 180, 1.0 / 90, -1.0 / 45, 2.0 / 45},
                              {16.0 / 45, 8.0 / 45, 4.0 / 45, 2.0 / 45, 1.0 / 45},
                              {16.0 / 45, -8.0 / 45, 4.0 / 45, -2.0 / 45, 1.0 / 45},
                              {0, 0, 0, 0, 1.0 / 4}}};
constexpr Matrix<4, 8> kAt5x4{{{1, 1, 1, 1, 1, 1, 1, 0},
                               {0, 1, -1, 2, -2, 1.0 / 2, -1.0 / 2, 0},
                               {0, 1, 1, 4, 4, 1.0 / 4, 1.0 / 4, 0},
                               {0, 1, -1, 8, -8, 1.0 / 8, -1.0 / 8, 1}}};

// The weight gradient is F(r, 2): r outputs from the same alpha-input windows and a 2-tap "kernel"
// (a 2x2 tile of dy). With the same points and B^T, sum_j p_j^e s_j B^T[j][s] = [s == e] (the
// identity F(2, r) rests on, s_j the row scales of G) gives A'^T[i][j] = p_j^i (i < r) and
// G'[j][k] = s_j p_j^k (k < 2), the point at infinity in the last row and column.
constexpr Matrix<3, 4> kWeightAt3{{{1, 1, 1, 0}, {0, 1, -1, 0}, {0, 1, 1, 1}}};
constexpr Matrix<4, 2> kWeightG3{{{1, 0}, {0.5, 0.5}, {0.5, -0.5}, {0, 1}}};
constexpr Matrix<5, 6> kWeightAt5{{{1, 1, 1, 1, 1, 0},
                                   {0, 1, -1, 2, -2, 0},
                                   {0, 1, 1, 4, 4, 0},
                                   {0, 1, -1, 8, -8, 0},
                                   {0, 1, 1, 16, 16, 1}}};
constexpr Matrix<6, 2> kWeightG5{
    {{1.0 / 4, 0}, {1.0 / 6, 1.0 / 6}, {1.0 / 6, -1.0 / 6}, {1.0 / 24, 2.0 / 24}, {1.0 / 24, -2.0 / 24}, {0, 1}}};

template <class M>
std::vector<double> flat(const M& matrix) {
  std::vector<double> out;
  for (const auto& row : matrix.m)
    for (double value : row) out.push_back(value);
  return out;
}

template <int R>
struct Tables;
template <>
struct Tables<3> {
  static constexpr const Matrix<4, 4>& bt = kBt3;
  static constexpr const Matrix<4, 3>& g = kG3;
  static constexpr const Matrix<2, 4>& at = kAt3;
  static constexpr const Matrix<3, 4>& weight_at = kWeightAt3;
  static constexpr const Matrix<4, 2>& weight_g = kWeightG3;
};
template <>
struct Tables<5> {
  static constexpr const Matrix<6, 6>& bt = kBt5;
  static constexpr const Matrix<6, 5>& g = kG5;
  static constexpr const Matrix<2, 6>& at = kAt5;
  static constexpr const Matrix<5, 6>& weight_at = kWeightAt5;
  static constexpr const Matrix<6, 2>& weight_g = kWeightG5;
};

// The weight gradient with 4x4 tiles of dy, F(5, 4) on F(4, 5)'s points: G'[j][k] = s_j p_j^k
// (k < 4, s_j the row scales of kG5x4), A'^T[i][j] = p_j^i (i < 5); infinity in the last row and
// column (see kWeightAt3).
constexpr Matrix<8, 4> kWeightG5x4{{{1.0 / 4, 0, 0, 0},
                                    {-1.0 / 18, -1.0 / 18, -1.0 / 18, -1.0 / 18},
                                    {-1.0 / 18, 1.0 / 18, -1.0 / 18, 1.0 / 18},
                                    {1.0 / 360, 2.0 / 360, 4.0 / 360, 8.0 / 360},
                                    {1.0 / 360, -2.0 / 360, 4.0 / 360, -8.0 / 360},
                                    {16.0 / 45, 8.0 / 45, 4.0 / 45, 2.0 / 45},
                                    {16.0 / 45, -8.0 / 45, 4.0 / 45, -2.0 / 45},
                                    {0, 0, 0, 1.0 / 4}}};
constexpr Matrix<5, 8> kWeightAt5x4{{{1, 1, 1, 1, 1, 1, 1, 0},
                                     {0, 1, -1, 2, -2, 1.0 / 2, -1.0 / 2, 0},
                                     {0, 1, 1, 4, 4, 1.0 / 4, 1.0 / 4, 0},
                                     {0, 1, -1, 8, -8, 1.0 / 8, -1.0 / 8, 0},
                                     {0, 1, 1, 16, 16, 1.0 / 16, 1.0 / 16, 1}}};

// The forward transforms of F(M x M, R x R): bt [A][A], g [A][R], at [M][A] with A = M + R - 1.
template <int R, int M>
struct ForwardTables;
template <int R>
struct ForwardTables<R, 2> {
  static constexpr const auto& bt = Tables<R>::bt;
  static constexpr const auto& g = Tables<R>::g;
  static constexpr const auto& at = Tables<R>::at;
};
template <>
struct ForwardTables<5, 4> {
  static constexpr const Matrix<8, 8>& bt = kBt5x4;
  static constexpr const Matrix<8, 5>& g = kG5x4;
  static constexpr const Matrix<4, 8>& at = kAt5x4;
};
// The weight gradient's: bt [A][A], weight_g [A][M] (dy's M x M tile), weight_at [R][A].
template <int R, int M>
struct WeightTables;
template <int R>
struct WeightTables<R, 2> {
  static constexpr const auto& bt = Tables<R>::bt;
  static constexpr const auto& weight_g = Tables<R>::weight_g;
  static constexpr const auto& weight_at = Tables<R>::weight_at;
};
template <>
struct WeightTables<5, 4> {
  static constexpr const Matrix<8, 8>& bt = kBt5x4;
  static constexpr const Matrix<8, 4>& weight_g = kWeightG5x4;
  static constexpr const Matrix<5, 8>& weight_at = kWeightAt5x4;
};

// sum_s m[u][s] x[s * stride] on 8 lanes over the columns s of the given parity (-1: all), starting
// from the first nonzero term and taking +-1 as an add or subtract (an accumulator starting from
// zero costs an add per output, which the compiler may not drop: 0 + -0 is +0).
template <int NOut, int NIn, const Matrix<NOut, NIn>& M, int Parity = -1>
[[gnu::always_inline]] inline v8 row_dot(int u, const v8* x, int stride) {
  v8 acc = {};
  bool first = true;
#pragma GCC unroll 8
  for (int s = 0; s < NIn; ++s) {
    const double c = M.m[u][s];
    if (c == 0 || (Parity >= 0 && s % 2 != Parity)) continue;
    const v8 value = x[s * stride];
    if (first) {
      acc = c == 1 ? value : c == -1 ? -value : static_cast<float>(c) * value;
      first = false;
    } else if (c == 1) {
      acc += value;
    } else if (c == -1) {
      acc -= value;
    } else {
      acc += static_cast<float>(c) * value;
    }
  }
  return acc;
}

// True when rows u and u + 1 are the points p and -p of the same transform: equal on the even
// columns, opposite on the odd ones (the rows of B^T and G' for +-1, +-2, +-1/2). Then both come from
// the even and odd partial sums, E + O and E - O: 8 terms instead of 12 for an 8-point row pair.
template <int NOut, int NIn>
constexpr bool rows_pair(const Matrix<NOut, NIn>& m, int u) {
  if (u + 1 >= NOut) return false;
  bool odd_terms = false;
  for (int s = 0; s < NIn; ++s) {
    if (s % 2 == 0 ? m.m[u + 1][s] != m.m[u][s] : m.m[u + 1][s] != -m.m[u][s]) return false;
    if (s % 2 == 1 && m.m[u][s] != 0) odd_terms = true;
  }
  return odd_terms;
}

// out[u * out_stride] = sum_s m[u][s] x[s * stride] for rows U.. of M, pairing rows greedily.
template <int NOut, int NIn, const Matrix<NOut, NIn>& M, int U = 0>
[[gnu::always_inline]] inline void apply_rows(const v8* x, int stride, v8* out, int out_stride) {
  if constexpr (U < NOut) {
    if constexpr (rows_pair(M, U)) {
      const v8 even = row_dot<NOut, NIn, M, 0>(U, x, stride), odd = row_dot<NOut, NIn, M, 1>(U, x, stride);
      out[U * out_stride] = even + odd;
      out[(U + 1) * out_stride] = even - odd;
      apply_rows<NOut, NIn, M, U + 2>(x, stride, out, out_stride);
    } else {
      out[U * out_stride] = row_dot<NOut, NIn, M>(U, x, stride);
      apply_rows<NOut, NIn, M, U + 1>(x, stride, out, out_stride);
    }
  }
}

// True when columns s and s + 1 are the points p and -p in every row (equal or opposite per row:
// A^T's columns for +-1, +-2, +-1/2). Then each row takes x_s + x_{s+1} or x_s - x_{s+1}, formed
// once for all rows.
template <int NOut, int NIn>
constexpr bool columns_pair(const Matrix<NOut, NIn>& m, int s) {
  if (s + 1 >= NIn) return false;
  bool nonzero = false;
  for (int u = 0; u < NOut; ++u) {
    if (m.m[u][s + 1] != m.m[u][s] && m.m[u][s + 1] != -m.m[u][s]) return false;
    if (m.m[u][s] != 0) nonzero = true;
  }
  return nonzero;
}

// Column s's part in the greedy pairing from column 0: 0 alone, 1 first of a pair, 2 second.
template <int NOut, int NIn>
constexpr std::array<int, NIn> column_roles(const Matrix<NOut, NIn>& m) {
  std::array<int, NIn> roles{};
  for (int s = 0; s < NIn; ++s) roles[s] = s > 0 && roles[s - 1] == 1 ? 2 : columns_pair(m, s) ? 1 : 0;
  return roles;
}

template <int NOut, int NIn>
constexpr bool has_column_pairs(const Matrix<NOut, NIn>& m) {
  for (const int role : column_roles(m))
    if (role == 1) return true;
  return false;
}

// apply_rows for a matrix with column pairs: their sums and differences first, then each row.
template <int NOut, int NIn, const Matrix<NOut, NIn>& M>
[[gnu::always_inline]] inline void apply_rows_paired_columns(const v8* x, int stride, v8* out, int out_stride) {
  static constexpr std::array<int, NIn> roles = column_roles(M);
  v8 sum[NIn], difference[NIn];
#pragma GCC unroll 8
  for (int s = 0; s + 1 < NIn; ++s)
    if (roles[s] == 1) {
      sum[s] = x[s * stride] + x[(s + 1) * stride];
      difference[s] = x[s * stride] - x[(s + 1) * stride];
    }
#pragma GCC unroll 8
  for (int u = 0; u < NOut; ++u) {
    v8 acc = {};
    bool first = true;
#pragma GCC unroll 8
    for (int s = 0; s < NIn; ++s) {
      const double c = M.m[u][s];
      if (roles[s] == 2 || c == 0) continue;
      const v8 value = roles[s] == 1 ? (M.m[u][s + 1] == c ? sum[s] : difference[s]) : x[s * stride];
      if (first) {
        acc = c == 1 ? value : c == -1 ? -value : static_cast<float>(c) * value;
        first = false;
      } else if (c == 1) {
        acc += value;
      } else if (c == -1) {
        acc -= value;
      } else {
        acc += static_cast<float>(c) * value;
      }
    }
    out[u * out_stride] = acc;
  }
}

// Either pairing, whichever M has (the row pairs of B^T and G', the column pairs of A^T).
template <int NOut, int NIn, const Matrix<NOut, NIn>& M>
[[gnu::always_inline]] inline void apply_matrix(const v8* x, int stride, v8* out, int out_stride) {
  if constexpr (has_column_pairs(M)) {
    apply_rows_paired_columns<NOut, NIn, M>(x, stride, out, out_stride);
  } else {
    apply_rows<NOut, NIn, M>(x, stride, out, out_stride);
  }
}

// out[u][v] = sum_{s,t} m[u][s] in[s][t] m[v][t] on 8 lanes; in is [NIn][NIn], out [NOut][NOut].
// Fully unrolled, so the zero coefficients drop out at compile time.
template <int NOut, int NIn, const Matrix<NOut, NIn>& M>
[[gnu::always_inline]] inline void transform_2d(const v8* in, v8* out) {
  v8 half[NOut * NIn];
#pragma GCC unroll 8
  for (int t = 0; t < NIn; ++t) apply_matrix<NOut, NIn, M>(in + t, NIn, half + t, NIn);
#pragma GCC unroll 8
  for (int u = 0; u < NOut; ++u) apply_matrix<NOut, NIn, M>(half + u * NIn, 1, out + u * NOut, 1);
}

// False when FLOWLET_CONV_WINOGRAD_4X4=0: 5x5 kernels keep F(2x2, 5x5) (read per call, so a
// benchmark can compare both in one process).
bool large_tiles_enabled() {
  const char* value = std::getenv("FLOWLET_CONV_WINOGRAD_4X4");
  return value == nullptr || std::string_view(value) != "0";
}

bool square_kernel_stride_one(const ConvGeometry& g) {
  return g.stride_h == 1 && g.stride_w == 1 && g.dilation_h == 1 && g.dilation_w == 1 && g.kh == g.kw &&
         (g.kh == 3 || g.kh == 5);
}

int64_t round_up(int64_t value, int64_t to) { return (value + to - 1) / to * to; }

// The input zero-padded to hp x wp (every tile's window inside) in blocks of 8 channels per group:
// padded [n][group][cg8 / 8][hp][wp][8], channels past cg zero. Writes channel blocks [first, last).
void pad_channel_blocks(const ConvGeometry& g, const float* x, int64_t cg8, int64_t hp, int64_t wp, int64_t first,
                        int64_t last, float* padded) {
  const int64_t cg = g.c / g.groups, c8 = g.groups * cg8;
  for (int64_t cb = first; cb < last; ++cb) {
    const int64_t image = cb / (c8 / kLanes), rest = cb % (c8 / kLanes);
    const int64_t group = rest / (cg8 / kLanes), channel = (rest % (cg8 / kLanes)) * kLanes;
    float* to = padded + cb * hp * wp * kLanes;
    std::fill(to, to + hp * wp * kLanes, 0.0f);
    for (int64_t k = 0; k < kLanes && channel + k < cg; ++k) {
      const float* from = x + (image * g.c + group * cg + channel + k) * g.h * g.w;
      for (int64_t py = std::max<int64_t>(0, g.pad_top); py < std::min(hp, g.h + g.pad_top); ++py)
        for (int64_t px = std::max<int64_t>(0, g.pad_left); px < std::min(wp, g.w + g.pad_left); ++px)
          to[(py * wp + px) * kLanes + k] = from[(py - g.pad_top) * g.w + px - g.pad_left];
    }
  }
}

// The forward convolution F(M x M, R x R) (alpha = M + R - 1); see the file comment.
template <int R, int M>
void forward(const ConvGeometry& g, const float* x, const float* w, const float* bias, bool relu, float* y) {
  constexpr int A = M + R - 1, A2 = A * A;
  using T = ForwardTables<R, M>;
  use_pool_threads_only();
  const bool onednn = conv_onednn_enabled();
  const int64_t cg = g.c / g.groups, og = g.o / g.groups;
  const int64_t cg8 = round_up(cg, kLanes), og8 = round_up(og, kLanes), c8 = g.groups * cg8;
  const int64_t tiles_h = (g.oh + M - 1) / M, tiles_w = (g.ow + M - 1) / M, per_image = tiles_h * tiles_w;
  const int64_t tiles = g.n * per_image;
  if (tiles == 0 || og == 0) return;

  // U [group][xi][cg][og8] = G w G^T for every kernel, in double (the weights are small next to
  // the images); the columns past og are zero. Output channels [first, last), run by the chunks
  // of the padding pass below.
  std::vector<float> u(static_cast<size_t>(g.groups * A2 * cg * og8), 0.0f);
  auto transform_weights = [&](int64_t first, int64_t last) {
    for (int64_t oc = first; oc < last; ++oc)
      for (int64_t ci = 0; ci < cg; ++ci) {
        const int64_t group = oc / og, oi = oc % og;
        const float* kernel = w + (oc * cg + ci) * R * R;
        double half[A][R];
        for (int p = 0; p < A; ++p)
          for (int l = 0; l < R; ++l) {
            double sum = 0;
            for (int k = 0; k < R; ++k) sum += T::g.m[p][k] * kernel[k * R + l];
            half[p][l] = sum;
          }
        for (int p = 0; p < A; ++p)
          for (int q = 0; q < A; ++q) {
            double sum = 0;
            for (int l = 0; l < R; ++l) sum += half[p][l] * T::g.m[q][l];
            u[static_cast<size_t>(((group * A2 + p * A + q) * cg + ci) * og8 + oi)] = static_cast<float>(sum);
          }
      }
  };
  std::vector<float> shift(static_cast<size_t>(g.groups * og8), 0.0f);
  if (bias != nullptr)
    for (int64_t oc = 0; oc < g.o; ++oc) shift[static_cast<size_t>((oc / og) * og8 + oc % og)] = bias[oc];

  const double per_tile_bytes = static_cast<double>(A2 * (cg8 + og8)) * sizeof(float);
  const int64_t block = std::clamp<int64_t>(static_cast<int64_t>(kBlockBytes / per_tile_bytes), 16, 512);
  const int64_t blocks = (tiles + block - 1) / block;
  const double work = static_cast<double>(g.n * g.o * g.oh * g.ow) * static_cast<double>(cg * R * R);
  const int64_t chunks =
      std::clamp<int64_t>(static_cast<int64_t>(std::min<double>(intra_op_threads(), work / kWorkPerThread)), 1, blocks);

  // The input padded and channel-blocked by pad_channel_blocks, its chunks beside the weights'.
  const int64_t hp = M * tiles_h + R - 1, wp = M * tiles_w + R - 1;
  const int64_t channel_blocks = g.n * c8 / kLanes;
  const auto padded = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(channel_blocks * hp * wp * kLanes));
  auto pad_input = [&](int64_t chunk) {
    transform_weights(g.o * chunk / chunks, g.o * (chunk + 1) / chunks);
    pad_channel_blocks(g, x, cg8, hp, wp, channel_blocks * chunk / chunks, channel_blocks * (chunk + 1) / chunks,
                       padded.get());
  };

  auto run = [&](int64_t chunk) {
    const int64_t first = blocks * chunk / chunks, last = blocks * (chunk + 1) / chunks;
    // Uninitialized: every element a GEMM or transform reads is written first in its block.
    const auto v = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(A2 * block * cg8));
    const auto mm = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(A2 * block * og8));
    v8 d[A2], vt[A2], out[M * M];
    for (int64_t b = first; b < last; ++b) {
      const int64_t q0 = b * block, count = std::min(block, tiles - q0);
      for (int64_t group = 0; group < g.groups; ++group) {
        // Input transform: V[xi][tile][channel].
        for (int64_t t = 0; t < count; ++t) {
          const int64_t q = q0 + t, image = q / per_image, rest = q % per_image;
          const float* window = padded.get() + (image * c8 + group * cg8) * hp * wp +
                                ((rest / tiles_w) * wp + rest % tiles_w) * M * kLanes;
          for (int64_t cb = 0; cb < cg8; cb += kLanes) {
            const float* p = window + cb * hp * wp;
            for (int s = 0; s < A; ++s)
              for (int col = 0; col < A; ++col) d[s * A + col] = load(p + (s * wp + col) * kLanes);
            transform_2d<A, A, T::bt>(d, vt);
            for (int xi = 0; xi < A2; ++xi) store(&v[static_cast<size_t>((t * A2 + xi) * cg8 + cb)], vt[xi]);
          }
        }
        // The channel contractions, one small GEMM per transform position.
        for (int xi = 0; xi < A2; ++xi) {
          const float* vx = &v[static_cast<size_t>(xi * cg8)];
          const float* ux = &u[static_cast<size_t>((group * A2 + xi) * cg * og8)];
          float* mx = &mm[static_cast<size_t>(xi * og8)];
          // oneDNN's sgemm on this thread where built: 0.83-0.87x OpenBLAS's CPU time here (an own
          // 6x16 register-blocked kernel reading V in place: 0.9x OpenBLAS's, 1.15-1.2x oneDNN's).
          if (!(onednn && thin_sgemm(false, false, count, og8, cg, 1.0f, vx, A2 * cg8, ux, og8, 0.0f, mx, A2 * og8)))
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(count), static_cast<int>(og8),
                        static_cast<int>(cg), 1.0f, vx, static_cast<int>(A2 * cg8), ux, static_cast<int>(og8), 0.0f,
                        mx, static_cast<int>(A2 * og8));
        }
        // Output transform: each tile's M x M outputs, bias and relu, into y (tiles past the edge
        // of the output drop the rows and columns outside it).
        for (int64_t t = 0; t < count; ++t) {
          const int64_t q = q0 + t, image = q / per_image, rest = q % per_image;
          const int64_t oy = (rest / tiles_w) * M, ox = (rest % tiles_w) * M;
          const int64_t rows = std::min<int64_t>(M, g.oh - oy), cols = std::min<int64_t>(M, g.ow - ox);
          float* at_out = y + (image * g.o + group * og) * g.oh * g.ow + oy * g.ow + ox;
          for (int64_t ob = 0; ob < og8; ob += kLanes) {
            for (int xi = 0; xi < A2; ++xi) vt[xi] = load(&mm[static_cast<size_t>((t * A2 + xi) * og8 + ob)]);
            transform_2d<M, A, T::at>(vt, out);
            const v8 b8 = load(&shift[static_cast<size_t>(group * og8 + ob)]);
            float values[M * M][kLanes];
            for (int k = 0; k < M * M; ++k) {
              v8 value = out[k] + b8;
              if (relu) value = value > 0.0f ? value : v8{};
              store(values[k], value);
            }
            const int64_t lanes = std::min<int64_t>(kLanes, og - ob);
            for (int64_t k = 0; k < lanes; ++k) {
              float* to = at_out + (ob + k) * g.oh * g.ow;
              for (int64_t i = 0; i < rows; ++i)
                for (int64_t j = 0; j < cols; ++j) to[i * g.ow + j] = values[i * M + j][k];
            }
          }
        }
      }
    }
  };
  if (chunks == 1) {
    pad_input(0);
    run(0);
  } else {
    run_chunks(chunks, FunctionRef<void(int64_t)>(pad_input));
    run_chunks(chunks, FunctionRef<void(int64_t)>(run));
  }
}

// The weight gradient for kernel size R over M x M tiles of dy (alpha = M + R - 1): per block of
// tiles, V [tile][alpha^2][cg8] from the input windows (as forward), D [tile][alpha^2][og8] =
// G' dy_tile G'^T from each tile's M x M of dy (zero
// past the output's edge), and S_xi [og, cg8] += D_xi^T @ V_xi (K = the tiles: long, efficient
// GEMMs); each chunk sums into its own S, and dw = A'^T S A' at the end.
template <int R, int M>
void backward_weight(const ConvGeometry& g, const float* x, const float* dy, float* dw) {
  constexpr int A = M + R - 1, A2 = A * A;
  using T = WeightTables<R, M>;
  use_pool_threads_only();
  const int64_t cg = g.c / g.groups, og = g.o / g.groups;
  const int64_t cg8 = round_up(cg, kLanes), og8 = round_up(og, kLanes), c8 = g.groups * cg8;
  const int64_t tiles_h = (g.oh + M - 1) / M, tiles_w = (g.ow + M - 1) / M, per_image = tiles_h * tiles_w;
  const int64_t tiles = g.n * per_image;
  std::fill(dw, dw + g.o * cg * R * R, 0.0f);
  if (tiles == 0 || og == 0 || cg == 0) return;

  const double per_tile_bytes = static_cast<double>(A2 * (cg8 + og8)) * sizeof(float);
  const int64_t block = std::clamp<int64_t>(static_cast<int64_t>(kBlockBytes / per_tile_bytes), 16, 512);
  const int64_t blocks = (tiles + block - 1) / block;
  const double work = static_cast<double>(g.n * g.o * g.oh * g.ow) * static_cast<double>(cg * R * R);
  const int64_t chunks =
      std::clamp<int64_t>(static_cast<int64_t>(std::min<double>(intra_op_threads(), work / kWorkPerThread)), 1, blocks);

  const int64_t hp = M * tiles_h + R - 1, wp = M * tiles_w + R - 1;
  const int64_t channel_blocks = g.n * c8 / kLanes;
  const auto padded = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(channel_blocks * hp * wp * kLanes));
  auto pad_input = [&](int64_t chunk) {
    pad_channel_blocks(g, x, cg8, hp, wp, channel_blocks * chunk / chunks, channel_blocks * (chunk + 1) / chunks,
                       padded.get());
  };

  // sums[chunk] = S [group][xi][og][cg8]
  const size_t sum_size = static_cast<size_t>(g.groups * A2 * og * cg8);
  std::vector<std::vector<float>> sums(static_cast<size_t>(chunks));
  auto run = [&](int64_t chunk) {
    std::vector<float>& sum = sums[static_cast<size_t>(chunk)];
    sum.assign(sum_size, 0.0f);
    const int64_t first = blocks * chunk / chunks, last = blocks * (chunk + 1) / chunks;
    const auto v = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(A2 * block * cg8));
    const auto dd = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(A2 * block * og8));
    v8 d[A2], vt[A2], tile_dy[M * M];
    for (int64_t b = first; b < last; ++b) {
      const int64_t q0 = b * block, count = std::min(block, tiles - q0);
      for (int64_t group = 0; group < g.groups; ++group) {
        for (int64_t t = 0; t < count; ++t) {
          const int64_t q = q0 + t, image = q / per_image, rest = q % per_image;
          const int64_t ty = rest / tiles_w, tx = rest % tiles_w;
          const float* window =
              padded.get() + (image * c8 + group * cg8) * hp * wp + (ty * wp + tx) * M * kLanes;
          for (int64_t cb = 0; cb < cg8; cb += kLanes) {
            const float* p = window + cb * hp * wp;
            for (int s = 0; s < A; ++s)
              for (int col = 0; col < A; ++col) d[s * A + col] = load(p + (s * wp + col) * kLanes);
            transform_2d<A, A, T::bt>(d, vt);
            for (int xi = 0; xi < A2; ++xi) store(&v[static_cast<size_t>((t * A2 + xi) * cg8 + cb)], vt[xi]);
          }
          // dy's M x M tile for 8 output channels at a time (zero past the edge and past og).
          const int64_t oy = ty * M, ox = tx * M;
          const float* at_dy = dy + (image * g.o + group * og) * g.oh * g.ow + oy * g.ow + ox;
          for (int64_t ob = 0; ob < og8; ob += kLanes) {
            float values[M * M][kLanes] = {};
            for (int64_t k = 0; k < kLanes && ob + k < og; ++k) {
              const float* plane = at_dy + (ob + k) * g.oh * g.ow;
              for (int i = 0; i < M && oy + i < g.oh; ++i)
                for (int j = 0; j < M && ox + j < g.ow; ++j) values[i * M + j][k] = plane[i * g.ow + j];
            }
            for (int k = 0; k < M * M; ++k) tile_dy[k] = load(values[k]);
            transform_2d<A, M, T::weight_g>(tile_dy, vt);
            for (int xi = 0; xi < A2; ++xi) store(&dd[static_cast<size_t>((t * A2 + xi) * og8 + ob)], vt[xi]);
          }
        }
        for (int xi = 0; xi < A2; ++xi) {
          const float* dpos = &dd[static_cast<size_t>(xi * og8)];
          const float* vx = &v[static_cast<size_t>(xi * cg8)];
          float* sx = &sum[static_cast<size_t>((group * A2 + xi) * og * cg8)];
          // OpenBLAS here (K = the block's tiles, both operands a tile apart per k step): oneDNN's
          // sgemm took 1.2-1.35x its CPU time on the demo's conv2 weight gradient, an own kernel
          // reading the operands in place 1.1-1.25x.
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(og), static_cast<int>(cg8),
                      static_cast<int>(count), 1.0f, dpos, static_cast<int>(A2 * og8), vx, static_cast<int>(A2 * cg8),
                      1.0f, sx, static_cast<int>(cg8));
        }
      }
    }
  };
  if (chunks == 1) {
    pad_input(0);
    run(0);
  } else {
    run_chunks(chunks, FunctionRef<void(int64_t)>(pad_input));
    run_chunks(chunks, FunctionRef<void(int64_t)>(run));
  }
  std::vector<float>& total = sums[0];
  for (size_t chunk = 1; chunk < sums.size(); ++chunk)
    for (size_t i = 0; i < sum_size; ++i) total[i] += sums[chunk][i];
  // dw[o][c] = A'^T S A', in double (once per weight).
  for (int64_t oc = 0; oc < g.o; ++oc)
    for (int64_t ci = 0; ci < cg; ++ci) {
      const int64_t group = oc / og, oi = oc % og;
      double half[R][A];
      for (int i = 0; i < R; ++i)
        for (int q = 0; q < A; ++q) {
          double acc = 0;
          for (int p = 0; p < A; ++p)
            acc += T::weight_at.m[i][p] * total[static_cast<size_t>(((group * A2 + p * A + q) * og + oi) * cg8 + ci)];
          half[i][q] = acc;
        }
      float* kernel = dw + (oc * cg + ci) * R * R;
      for (int i = 0; i < R; ++i)
        for (int j = 0; j < R; ++j) {
          double acc = 0;
          for (int q = 0; q < A; ++q) acc += half[i][q] * T::weight_at.m[j][q];
          kernel[i * R + j] = static_cast<float>(acc);
        }
    }
}

}  // namespace

const WinogradTransform& winograd_transform(int r, int m) {
  static const WinogradTransform f3{3, 2, 4, flat(kBt3), flat(kG3), flat(kAt3)};
  static const WinogradTransform f5{5, 2, 6, flat(kBt5), flat(kG5), flat(kAt5)};
  static const WinogradTransform f5x4{5, 4, 8, flat(kBt5x4), flat(kG5x4), flat(kAt5x4)};
  if (r == 3 && m == 2) return f3;
  if (r == 5 && m == 2) return f5;
  if (r == 5 && m == 4) return f5x4;
  throw std::invalid_argument("winograd_transform: only F(2, 3), F(2, 5) and F(4, 5) are built");
}

int winograd_tile(const ConvGeometry& g) {
  if (g.kh != 5) return 2;
  // Multiplications per channel pair: alpha^2 per tile, over the tiles covering the output.
  auto cost = [&](int64_t m) {
    const int64_t alpha = m + g.kh - 1;
    return alpha * alpha * ((g.oh + m - 1) / m) * ((g.ow + m - 1) / m);
  };
  return cost(4) < cost(2) && large_tiles_enabled() ? 4 : 2;
}

bool winograd_forward_applies(const ConvGeometry& g) {
  return square_kernel_stride_one(g) && g.c / g.groups >= kMinChannels && g.o / g.groups >= kMinChannels;
}

bool winograd_backward_input_applies(const ConvGeometry& g) { return winograd_forward_applies(g); }

void conv2d_winograd_forward(const ConvGeometry& g, const float* x, const float* w, const float* bias, bool relu,
                             float* y) {
  if (g.kh == 3) {
    forward<3, 2>(g, x, w, bias, relu, y);
  } else if (winograd_tile(g) == 4) {
    forward<5, 4>(g, x, w, bias, relu, y);
  } else {
    forward<5, 2>(g, x, w, bias, relu, y);
  }
}

// dx[p] = sum_i w[i] dy[p - i + pad] = sum_i w[r-1-i] dy[p + i - (r-1-pad)]: a stride-1 convolution
// of dy with the kernel flipped in both axes, in and out channels swapped per group, and pads
// r-1-pad (reads outside dy are zero, whatever the bottom/right padding was).
void conv2d_winograd_backward_input(const ConvGeometry& g, const float* dy, const float* w, float* dx) {
  const int64_t cg = g.c / g.groups, og = g.o / g.groups, r = g.kh;
  std::vector<float> flipped(static_cast<size_t>(g.c * og * r * r));
  for (int64_t group = 0; group < g.groups; ++group)
    for (int64_t oi = 0; oi < og; ++oi)
      for (int64_t ci = 0; ci < cg; ++ci) {
        const float* from = w + ((group * og + oi) * cg + ci) * r * r;
        float* to = flipped.data() + ((group * cg + ci) * og + oi) * r * r;
        for (int64_t k = 0; k < r * r; ++k) to[k] = from[r * r - 1 - k];
      }
  ConvGeometry t = g;
  t.c = g.o, t.h = g.oh, t.w = g.ow;
  t.o = g.c, t.oh = g.h, t.ow = g.w;
  t.pad_top = r - 1 - g.pad_top, t.pad_left = r - 1 - g.pad_left;
  conv2d_winograd_forward(t, dy, flipped.data(), nullptr, false, dx);
}

bool winograd_backward_weight_applies(const ConvGeometry& g) { return winograd_forward_applies(g); }

void conv2d_winograd_backward_weight(const ConvGeometry& g, const float* x, const float* dy, float* dw) {
  if (g.kh == 3) {
    backward_weight<3, 2>(g, x, dy, dw);
  } else if (winograd_tile(g) == 4) {
    backward_weight<5, 4>(g, x, dy, dw);
  } else {
    backward_weight<5, 2>(g, x, dy, dw);
  }
}

}  // namespace flowlet::detail
