// Our f32 exp, log, tanh, sigmoid and erf, written once for any vector width with GCC vector types.
// Included only by the per-instruction-set files (vector_math_avx2.cpp, vector_math_avx512.cpp),
// after their `#pragma GCC target` and <immintrin.h>: each file compiles these templates for its
// own registers. Everything here has internal linkage (anonymous namespace), so the AVX-512 copies
// can never stand in for the AVX2 ones at link time.
//
// F is the float vector (__m256, __m512), I the int32 vector of the same size. Every lane does the
// same operations in the same order, with FMA, so both widths give bit-identical results.
//
// Error bounds (ulp of the correctly rounded f32 result, measured against f64 libm over every
// 61st f32 bit pattern and dense sweeps, denormal results included; asserted by
// tests/test_vector_math.cpp; the figures in docs/notes18/vecmath.md):
//   exp <= 1, log <= 1, tanh <= 2, sigmoid <= 3, erf <= 2
// (measured worst on AVX2: 0.98, 0.92, 1.50, 2.28, 1.53).
// Special values follow C99 Annex F: NaN in gives NaN; exp(-inf) = 0, exp(+inf) = +inf;
// log(+-0) = -inf, log(x < 0) = NaN, log(+inf) = +inf; tanh, erf keep the sign of zero and
// saturate to +-1; sigmoid(-inf) = 0, sigmoid(+inf) = 1. Overflow gives +inf and underflow
// rounds through the denormals to 0, as the correctly rounded result would.
//
// The polynomial coefficients are near-minimax fits printed by
// benchmarks/elementwise/fit_vector_math.py (intervals and degrees there).
#pragma once

namespace flowlet::detail {
namespace {

template <class F>
inline F splat(float value) {
  return F{} + value;
}

template <class F>
inline F fmadd(F a, F b, F c) {  // a * b + c with one rounding
  if constexpr (sizeof(F) == 64) {
#if defined(__AVX512F__)
    return _mm512_fmadd_ps(a, b, c);
#else
    // 16 lanes without AVX-512 (tests/test_vector_math.cpp runs the 16-lane code on AVX2 this way):
    // two 8-lane FMAs, the same rounding per lane.
    using Half = float __attribute__((vector_size(32)));
    const Half lo = _mm256_fmadd_ps(Half{a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]},
                                    Half{b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]},
                                    Half{c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]});
    const Half hi = _mm256_fmadd_ps(Half{a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15]},
                                    Half{b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]},
                                    Half{c[8], c[9], c[10], c[11], c[12], c[13], c[14], c[15]});
    return F{lo[0], lo[1], lo[2], lo[3], lo[4], lo[5], lo[6], lo[7], hi[0], hi[1], hi[2], hi[3], hi[4], hi[5], hi[6], hi[7]};
#endif
  } else {
    return _mm256_fmadd_ps(a, b, c);
  }
}

// Horner's rule, highest coefficient first: c[0] * t^(N-1) + ... + c[N-1].
template <class F, int N>
inline F horner(F t, const float (&c)[N]) {
  F result = splat<F>(c[0]);
  for (int k = 1; k < N; ++k) result = fmadd(result, t, splat<F>(c[k]));
  return result;
}

template <class F, class I>
inline F abs_of(F x) {
  return (F)((I)x & 0x7fffffff);
}

// |magnitude| with the sign of `sign`.
template <class F, class I>
inline F with_sign_of(F magnitude, F sign) {
  return (F)(((I)magnitude & 0x7fffffff) | ((I)sign & static_cast<int32_t>(0x80000000u)));
}

// e^x = p * 2^n: n = round(x / ln2), r = x - n ln2 in two FMA steps (|r| <= ln2/2, ln2's high
// part has trailing zeros so n * it is exact), p = e^r = 1 + r + r^2 q(r). For |x| <= 104.
template <class F, class I>
struct ExpParts {
  F p;
  I n;
};
template <class F, class I>
inline ExpParts<F, I> exp_parts(F x) {
  const F magic = splat<F>(0x1.8p23f);  // adding it rounds to an integer, kept in the low bits
  const F shifted = fmadd(x, splat<F>(0x1.715476p+0f), magic);  // x * log2(e)
  const F n = shifted - magic;
  F r = fmadd(n, splat<F>(-0x1.62e4p-1f), x);
  r = fmadd(n, splat<F>(-0x1.7f7d1cp-20f), r);
  static constexpr float q[] = {0x1.9f0866p-13f, 0x1.6d8cd6p-10f, 0x1.11127p-7f,
                                0x1.55548ep-5f,  0x1.555554p-3f,  0x1.0p-1f};
  return {fmadd(r * r, horner(r, q), r) + 1.0f, (I)shifted - (I)magic};
}

// exp over the whole f32 range: the scale 2^n is applied as 2^n1 * 2^n2 (each a normal number),
// so results near overflow and in the denormal range are rounded once, correctly scaled.
template <class F, class I>
inline F exp_f32(F x) {
  // Clamped so that n stays in [-150, 129]: beyond, the result is 0 or +inf anyway. A NaN turns
  // into the bound here and is put back at the end.
  F clamped = x > -104.0f ? x : splat<F>(-104.0f);
  clamped = clamped < 89.0f ? clamped : splat<F>(89.0f);
  const ExpParts<F, I> parts = exp_parts<F, I>(clamped);
  const I n1 = parts.n >> 1;
  const I n2 = parts.n - n1;
  const F y = (parts.p * (F)((n1 + 127) << 23)) * (F)((n2 + 127) << 23);
  return x != x ? x + x : y;
}

// exp where the caller guarantees x in [-87, 88] (a normal result) and no NaN: one scaling, no
// clamps (tanh and erf, whose arguments are bounded).
template <class F, class I>
inline F exp_normal_f32(F x) {
  const ExpParts<F, I> parts = exp_parts<F, I>(x);
  return parts.p * (F)((parts.n + 127) << 23);
}

// log: x = 2^e m with m in [sqrt(1/2), sqrt(2)), f = m - 1 (exact), log(m) = f + f^2 R(f) (no
// division; the rounding errors sit in the f^2 term), + e ln2 in two parts.
template <class F, class I>
inline F log_f32(F x) {
  const I tiny = x < 0x1p-126f;  // denormals (and zero and negatives, fixed below): scale up first
  const F scaled = tiny ? x * 0x1p23f : x;
  // The sign bit is cleared first: a negative x's bits minus sqrt(1/2)'s would overflow int (UB),
  // and its lanes are replaced by NaN below anyway.
  const I offset = ((I)scaled & 0x7fffffff) - 0x3f3504f3;  // bits of sqrt(1/2)
  const I e = (offset >> 23) - (tiny & 23);
  const F m = (F)((offset & 0x7fffff) + 0x3f3504f3);
  const F f = m - 1.0f;
  static constexpr float r[] = {0x1.1370f2p-4f,  -0x1.de3a18p-4f, 0x1.e77538p-4f,  -0x1.fc3548p-4f, 0x1.232dbep-3f,
                                -0x1.555aacp-3f, 0x1.99a53cp-3f,  -0x1.000012p-2f, 0x1.555546p-2f,  -0x1.0p-1f};
  const F log_m = fmadd(f * f, horner(f, r), f);
  const F ef = __builtin_convertvector(e, F);
  F y = fmadd(ef, splat<F>(0x1.62e4p-1f), fmadd(ef, splat<F>(0x1.7f7d1cp-20f), log_m));
  y = x == 0.0f ? splat<F>(-__builtin_inff()) : y;
  y = x < 0.0f ? splat<F>(__builtin_nanf("")) : y;
  y = x == __builtin_inff() ? x : y;
  return x != x ? x + x : y;
}

// tanh: |x| < 0.625: x + x^3 p(x^2); else (1 - e) / (1 + e) with e = exp(-2|x|) (no cancellation
// there: 1 - e >= 0.71), sign restored (so tanh(-0) = -0).
template <class F, class I>
inline F tanh_f32(F x) {
  const F a = abs_of<F, I>(x);
  const F z = x * x;
  static constexpr float p[] = {0x1.18e5e2p-9f, -0x1.0bf61p-7f, 0x1.638b9p-6f,
                                -0x1.b9ee94p-5f, 0x1.111066p-3f, -0x1.555554p-2f};
  const F small = fmadd(a * z, horner(z, p), a);
  // Beyond 10, tanh rounds to 1 (1 - e < 1 - 2^-25); clamping keeps exp's argument normal.
  const F e = exp_normal_f32<F, I>(-2.0f * (a < 10.0f ? a : splat<F>(10.0f)));
  const F large = (1.0f - e) / (1.0f + e);
  const F y = with_sign_of<F, I>(a < 0.625f ? small : large, x);
  return x != x ? x + x : y;
}

// sigmoid: e = exp(-|x|) never overflows; 1 / (1 + e) for x >= 0, e / (1 + e) below, so tiny
// results keep their relative precision.
template <class F, class I>
inline F sigmoid_f32(F x) {
  const F e = exp_f32<F, I>(-abs_of<F, I>(x));
  const F numerator = x >= 0.0f ? splat<F>(1.0f) : e;
  return numerator / (1.0f + e);
}

// erf: |x| < 0.875: x p(x^2); up to 4: 1 - exp(-x^2) g(t) with t = 1 / (1 + |x|/2) (x^2 split into
// hi + lo by an FMA so that exp sees it exactly to first order); beyond 4 erf rounds to +-1.
template <class F, class I>
inline F erf_f32(F x) {
  const F a = abs_of<F, I>(x);
  // x p(x^2) with p's constant term 2/sqrt(pi) in two parts (its f32 rounding alone is 0.9 ulp):
  // a * hi + a * (lo + z q(z)), the first product exact inside the FMA.
  static constexpr float q[] = {0x1.6be2b8p-14f, -0x1.ae807ep-11f, 0x1.553ad2p-8f, -0x1.b819aap-6f,
                                0x1.ce2e84p-4f,  -0x1.812744p-2f};
  const F z = a * a;
  const F rest = fmadd(z, horner(z, q), splat<F>(-0x1.f7ac92p-25f));  // lo = 2/sqrt(pi) - hi
  const F small = fmadd(a, splat<F>(0x1.20dd76p+0f), a * rest);
  F clamped = a > 0.875f ? a : splat<F>(0.875f);
  clamped = clamped < 4.0f ? clamped : splat<F>(4.0f);
  const F t = 1.0f / fmadd(clamped, splat<F>(0.5f), splat<F>(1.0f));
  static constexpr float g[] = {-0x1.c2715ep-9f, 0x1.9524f8p-5f, -0x1.40f3cep-4f, -0x1.430f4p-4f, 0x1.a8805p-4f,
                                0x1.e4290ap-3f,  0x1.7de6f6p-3f, 0x1.3ad5b6p-2f,  0x1.1b8092p-2f, 0x1.caa6f6p-12f};
  const F square_hi = clamped * clamped;
  const F square_lo = fmadd(clamped, clamped, -square_hi);
  F e = exp_normal_f32<F, I>(-square_hi);  // -square_hi in [-16, -0.76]
  e = fmadd(-e, square_lo, e);  // exp(-hi - lo) = exp(-hi) (1 - lo) to first order
  const F large = fmadd(-e, horner(t, g), splat<F>(1.0f));
  const F y = with_sign_of<F, I>(a < 0.875f ? small : large, x);
  return x != x ? x + x : y;
}

// out[i] = Kernel(in[i]) over a contiguous array; the tail goes through one vector padded with 1
// (inside every function's domain).
template <class F, class Kernel>
inline void apply_vector(const float* in, float* out, int64_t n, Kernel kernel) {
  constexpr int64_t kLanes = sizeof(F) / sizeof(float);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    F v;
    __builtin_memcpy(&v, in + i, sizeof v);
    const F y = kernel(v);
    __builtin_memcpy(out + i, &y, sizeof y);
  }
  if (i < n) {
    float lanes[kLanes];
    for (int64_t k = 0; k < kLanes; ++k) lanes[k] = i + k < n ? in[i + k] : 1.0f;
    F v;
    __builtin_memcpy(&v, lanes, sizeof v);
    const F y = kernel(v);
    __builtin_memcpy(lanes, &y, sizeof y);
    for (int64_t k = 0; i + k < n; ++k) out[i + k] = lanes[k];
  }
}

}  // namespace
}  // namespace flowlet::detail
