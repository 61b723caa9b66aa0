// The f32 run sum and max (see reduce_f32.hpp). GCC vector types: AVX2 registers where the build targets
// them (-march=native), two SSE halves otherwise; the arithmetic and its order are the same.
#include "kernels/reduce_f32.hpp"

#include <cstring>
#include <limits>

namespace flowlet::detail {
namespace {

using F32x8 = float __attribute__((vector_size(32)));
using F64x4 = double __attribute__((vector_size(32)));
using I32x8 = int32_t __attribute__((vector_size(32)));

// Vectors pass by reference, never by value: in a build without AVX (-Dnative=false) a 32-byte
// vector argument or return value would have a different calling convention (GCC -Wpsabi).
inline void load(F32x8& v, const float* p) {
  std::memcpy(&v, p, sizeof v);  // unaligned load
}

// acc[0..1] += the 8 lanes of v, widened to f64.
inline void widen_add(F64x4* acc, const F32x8& v) {
  acc[0] += __builtin_convertvector(__builtin_shufflevector(v, v, 0, 1, 2, 3), F64x4);
  acc[1] += __builtin_convertvector(__builtin_shufflevector(v, v, 4, 5, 6, 7), F64x4);
}

constexpr int64_t kBlock = 64;  // 32 lanes x 2 elements

}  // namespace

double sum_f32_run(const float* x, int64_t n) {
  if (n < kBlock) {  // short rows (softmax over classes, small axes): two accumulators, no pairing
    F64x4 acc[2] = {};
    int64_t i = 0;
    F32x8 v;
    for (; i + 8 <= n; i += 8) {
      load(v, x + i);
      widen_add(acc, v);
    }
    const F64x4 all = acc[0] + acc[1];
    double total = (all[0] + all[1]) + (all[2] + all[3]);
    for (; i < n; ++i) total += static_cast<double>(x[i]);
    return total;
  }
  F64x4 acc[8] = {};  // 32 f64 lanes: 8 independent add chains hide the add latency
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    // Lane j of pair sum k adds elements i + 8k + j and i + 32 + 8k + j.
    for (int k = 0; k < 4; ++k) {
      F32x8 first, second;
      load(first, x + i + 8 * k);
      load(second, x + i + 32 + 8 * k);
      widen_add(acc + 2 * k, first + second);
    }
  }
  // Whole vectors of the tail (short rows: softmax, small axes) still go through the f64 lanes,
  // unpaired, rather than one add after another.
  for (int k = 0; i + 8 <= n; i += 8, k = (k + 2) % 8) {
    F32x8 v;
    load(v, x + i);
    widen_add(acc + k, v);
  }
  // Fixed-order combination: pairwise over the accumulators, then the lanes in order.
  const F64x4 quarter0 = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  const F64x4 quarter1 = (acc[4] + acc[5]) + (acc[6] + acc[7]);
  const F64x4 all = quarter0 + quarter1;
  double total = (all[0] + all[1]) + (all[2] + all[3]);
  for (; i < n; ++i) total += static_cast<double>(x[i]);
  return total;
}

float max_f32_run(const float* x, int64_t n) {
  constexpr float kLowest = -std::numeric_limits<float>::infinity();
  F32x8 best[4] = {F32x8{} + kLowest, F32x8{} + kLowest, F32x8{} + kLowest, F32x8{} + kLowest};
  I32x8 nan = {};  // lanes that have seen a NaN
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int k = 0; k < 4; ++k) {
      F32x8 v;
      load(v, x + i + 8 * k);
      best[k] = v > best[k] ? v : best[k];
      nan |= v != v;
    }
  }
  for (; i + 8 <= n; i += 8) {
    F32x8 v;
    load(v, x + i);
    best[0] = v > best[0] ? v : best[0];
    nan |= v != v;
  }
  F32x8 all = best[0];
  for (int k = 1; k < 4; ++k) all = best[k] > all ? best[k] : all;
  bool any_nan = false;
  float result = kLowest;
  for (int lane = 0; lane < 8; ++lane) {
    any_nan |= nan[lane] != 0;
    result = all[lane] > result ? all[lane] : result;
  }
  for (; i < n; ++i) {
    any_nan |= x[i] != x[i];
    result = x[i] > result ? x[i] : result;
  }
  return any_nan ? std::numeric_limits<float>::quiet_NaN() : result;
}

}  // namespace flowlet::detail
