// The vectorized f32 exp, log, tanh, sigmoid and erf (src/kernels/vector_math*): their stated
// error bounds in ulp against f64 libm over a sweep of the whole f32 range and dense sweeps of the
// interesting ranges, special values (+-0, +-inf, NaN, denormals, overflow and underflow
// thresholds, saturation), array tails, every instruction set the CPU has giving the same bits,
// and the public ops (contiguous f32 through these kernels, views and f64 through libm).
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "kernels/vector_math.hpp"
#include "support/reference.hpp"

namespace {

using flowlet::detail::VectorMathF32;
using flowlet::detail::VectorMathTable;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// One function under test: its kernel in a table, its f64 reference and its stated bound.
struct Function {
  const char* name;
  VectorMathF32 VectorMathTable::*entry;
  double (*reference)(double);
  double bound_ulp;  // as stated in src/kernels/vector_math_impl.hpp
};

double sigmoid_ref(double x) { return x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x)); }

const std::vector<Function> kFunctions = {
    {"exp", &VectorMathTable::exp, [](double x) { return std::exp(x); }, 1.0},
    {"log", &VectorMathTable::log, [](double x) { return std::log(x); }, 1.0},
    {"tanh", &VectorMathTable::tanh, [](double x) { return std::tanh(x); }, 2.0},
    {"sigmoid", &VectorMathTable::sigmoid, &sigmoid_ref, 3.0},
    {"erf", &VectorMathTable::erf, [](double x) { return std::erf(x); }, 2.0},
};

// The tables this CPU runs (AVX2 on any recent x86-64; AVX-512 where present).
std::vector<const VectorMathTable*> tables() {
  std::vector<const VectorMathTable*> found;
  for (const VectorMathTable* t : {flowlet::detail::vector_math_avx512(), flowlet::detail::vector_math_avx2()}) {
    if (t != nullptr) found.push_back(t);
  }
  return found;
}

// |got - ref| in units of the f32 spacing at ref (the spacing of denormals below 2^-126). A NaN or
// infinite reference must be matched exactly; a finite one beyond the f32 range must give inf.
double ulp_error(float got, double ref) {
  if (std::isnan(ref)) return std::isnan(got) ? 0.0 : kInf;
  const float rounded = static_cast<float>(ref);
  if (std::isinf(rounded)) return got == rounded ? 0.0 : kInf;
  if (std::isnan(got) || std::isinf(got)) return kInf;
  const int exponent = ref == 0 ? -126 : std::max(std::ilogb(ref), -126);
  return std::abs(static_cast<double>(got) - ref) / std::ldexp(1.0, exponent - 23);
}

struct Worst {
  double ulp = 0;
  float at = 0;
};

Worst worst_error(const Function& f, VectorMathF32 kernel, const std::vector<float>& x) {
  std::vector<float> y(x.size());
  kernel(x.data(), y.data(), static_cast<int64_t>(x.size()));
  Worst w;
  for (size_t i = 0; i < x.size(); ++i) {
    const double e = ulp_error(y[i], f.reference(static_cast<double>(x[i])));
    if (e > w.ulp || std::isnan(e)) w = {e, x[i]};
  }
  return w;
}

// Every `stride`-th f32 bit pattern (both signs, denormals, infinities and NaNs included).
std::vector<float> bit_sweep(uint32_t stride) {
  std::vector<float> x;
  for (uint64_t bits = 0; bits <= 0xffffffffu; bits += stride) x.push_back(std::bit_cast<float>(static_cast<uint32_t>(bits)));
  return x;
}

std::vector<float> linear_sweep(float lo, float hi, int count) {
  std::vector<float> x(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) x[static_cast<size_t>(i)] = lo + (hi - lo) * static_cast<float>(i) / static_cast<float>(count - 1);
  return x;
}

// Values where these functions change regime or saturate.
const std::vector<float> kEdgeCases = {
    0.0f, -0.0f, kInf, -kInf, kNaN, -kNaN, 1.0f, -1.0f, 0x1p-149f, -0x1p-149f, 0x1p-127f, -0x1p-127f, 0x1p-126f,
    0x1.fffffep127f, -0x1.fffffep127f, 88.72283f, 88.722839f, 88.72284f, 89.0f, 100.0f, -87.33654f, -87.33655f,
    -103.97207f, -103.97208f, -104.0f, -150.0f, 0.625f, -0.625f, 0.62499994f, 0.875f, -0.875f, 0.87499994f, 3.9999998f,
    4.0f, 4.0000005f, 9.0f, 9.1f, -9.1f, 10.0f, 20.0f, -20.0f, 0.70710677f, 0.7071068f, 1.4142135f, 1.4142137f,
    0.99999994f, 1.0000001f, 1e-20f, -1e-20f, 1e-38f, 1e30f, -1e30f};

}  // namespace

TEST_CASE("each vector math table stays within its stated ulp bound over the f32 range") {
  const auto found = tables();
  if (found.empty()) {
    MESSAGE("this CPU has neither AVX2 + FMA nor AVX-512: the ops use libm (tested below)");
    return;
  }
  const std::vector<float> sweep = bit_sweep(251);
  for (const VectorMathTable* table : found) {
    for (const Function& f : kFunctions) {
      CAPTURE(std::string(table->isa));
      CAPTURE(std::string(f.name));
      std::vector<std::vector<float>> sets = {sweep, kEdgeCases, linear_sweep(-10.0f, 10.0f, 1 << 20),
                                              linear_sweep(-1.0f, 1.0f, 1 << 18)};
      if (std::string(f.name) == "log") sets.push_back(linear_sweep(0.5f, 2.0f, 1 << 20));
      if (std::string(f.name) == "exp") sets.push_back(linear_sweep(-104.0f, 89.0f, 1 << 20));
      if (std::string(f.name) == "sigmoid") sets.push_back(linear_sweep(-104.0f, 20.0f, 1 << 20));
      if (std::string(f.name) == "erf") sets.push_back(linear_sweep(0.8f, 4.2f, 1 << 20));
      Worst all;
      for (const auto& x : sets) {
        const Worst w = worst_error(f, table->*f.entry, x);
        if (w.ulp > all.ulp || std::isnan(w.ulp)) all = w;
      }
      MESSAGE(std::string(table->isa) << " " << std::string(f.name) << ": worst " << all.ulp << " ulp at " << all.at);
      CHECK(all.ulp <= f.bound_ulp);
    }
  }
}

TEST_CASE("vector math special values: signs of zero, saturation, overflow and underflow") {
  for (const VectorMathTable* table : tables()) {
    CAPTURE(std::string(table->isa));
    auto run = [&](VectorMathF32 kernel, float x) {
      float y = 0;
      kernel(&x, &y, 1);
      return y;
    };
    CHECK(run(table->exp, 0.0f) == 1.0f);
    CHECK(run(table->exp, -0.0f) == 1.0f);
    CHECK(run(table->exp, -kInf) == 0.0f);
    CHECK(run(table->exp, kInf) == kInf);
    CHECK(std::isnan(run(table->exp, kNaN)));
    CHECK(std::isfinite(run(table->exp, 88.72283f)));
    CHECK(run(table->exp, 88.72284f) == kInf);
    CHECK(run(table->exp, -87.33654f) >= 0x1p-126f);        // still normal
    CHECK(run(table->exp, -100.0f) > 0.0f);                 // a denormal, not flushed
    CHECK(run(table->exp, -100.0f) < 0x1p-126f);
    CHECK(run(table->exp, -104.0f) == 0.0f);                // below half the smallest denormal
    CHECK(run(table->log, 1.0f) == 0.0f);
    CHECK(run(table->log, 0.0f) == -kInf);
    CHECK(run(table->log, -0.0f) == -kInf);
    CHECK(std::isnan(run(table->log, -1.0f)));
    CHECK(std::isnan(run(table->log, -kInf)));
    CHECK(std::isnan(run(table->log, kNaN)));
    CHECK(run(table->log, kInf) == kInf);
    CHECK(run(table->log, 0x1p-149f) == doctest::Approx(-103.27893).epsilon(1e-7));
    for (VectorMathF32 odd : {table->tanh, table->erf}) {
      CHECK(std::signbit(run(odd, -0.0f)));
      CHECK(run(odd, -0.0f) == 0.0f);
      CHECK(!std::signbit(run(odd, 0.0f)));
      CHECK(run(odd, kInf) == 1.0f);
      CHECK(run(odd, -kInf) == -1.0f);
      CHECK(run(odd, 1e30f) == 1.0f);
      CHECK(run(odd, -1e30f) == -1.0f);
      CHECK(std::isnan(run(odd, kNaN)));
      CHECK(run(odd, 1e-30f) == doctest::Approx(odd == table->tanh ? 1e-30 : 1.1283791670955126e-30).epsilon(1e-7));
    }
    CHECK(run(table->sigmoid, 0.0f) == 0.5f);
    CHECK(run(table->sigmoid, kInf) == 1.0f);
    CHECK(run(table->sigmoid, -kInf) == 0.0f);
    CHECK(run(table->sigmoid, 20.0f) == 1.0f);
    CHECK(run(table->sigmoid, -100.0f) > 0.0f);  // e^-100 ~ 3.7e-44, a denormal
    CHECK(std::isnan(run(table->sigmoid, kNaN)));
  }
}

TEST_CASE("vector math arrays: every length up to 3 vectors, tails padded, nothing written past the end") {
  for (const VectorMathTable* table : tables()) {
    for (const Function& f : kFunctions) {
      CAPTURE(std::string(table->isa));
      CAPTURE(std::string(f.name));
      for (int64_t n = 0; n <= 50; ++n) {
        CAPTURE(n);
        std::vector<float> x(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = 0.37f * static_cast<float>(i) - 3.1f + (i % 3 == 0 ? 5.0f : 0.0f);
        std::vector<float> y(static_cast<size_t>(n) + 4, -7.0f);  // sentinels after the end
        (table->*f.entry)(x.data(), y.data(), n);
        for (int64_t i = 0; i < n; ++i) {
          // Element by element through the same kernel: the tail's padding must not change a lane.
          float one = 0;
          (table->*f.entry)(&x[static_cast<size_t>(i)], &one, 1);
          CHECK(std::bit_cast<uint32_t>(y[static_cast<size_t>(i)]) == std::bit_cast<uint32_t>(one));
          CHECK(ulp_error(one, f.reference(x[static_cast<size_t>(i)])) <= f.bound_ulp);
        }
        for (size_t k = static_cast<size_t>(n); k < y.size(); ++k) CHECK(y[k] == -7.0f);
      }
    }
  }
}

TEST_CASE("every instruction set the CPU has gives the same bits") {
  const auto found = tables();
  if (found.size() < 2) {
    MESSAGE("one instruction set here (" << std::string(found.empty() ? "none" : found[0]->isa) << "): nothing to compare");
    return;
  }
  const std::vector<float> x = bit_sweep(4099);
  for (const Function& f : kFunctions) {
    CAPTURE(std::string(f.name));
    std::vector<float> a(x.size()), b(x.size());
    (found[0]->*f.entry)(x.data(), a.data(), static_cast<int64_t>(x.size()));
    (found[1]->*f.entry)(x.data(), b.data(), static_cast<int64_t>(x.size()));
    int64_t differ = 0;
    for (size_t i = 0; i < x.size(); ++i) differ += std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i]);
    CHECK(differ == 0);
  }
}

// The 16-lane code (what vector_math_avx512.cpp compiles) run here on AVX2: GCC's generic 64-byte
// vectors become pairs of 8-lane operations, so this checks the width-generic logic (the tail of a
// 16-lane loop, shifts, conversions, selects) against the 8-lane table on any AVX2 machine, even
// where no AVX-512 CPU is at hand to run the real thing (the test above does, where there is one).
#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include <immintrin.h>

#include "kernels/vector_math_impl.hpp"

namespace {
using F16 = float __attribute__((vector_size(64)));
using I16 = int32_t __attribute__((vector_size(64)));
#define FLOWLET_WIDE_KERNEL(name)                                                                       \
  struct name##_wide_kernel {                                                                           \
    F16 operator()(F16 x) const { return flowlet::detail::name##_f32<F16, I16>(x); }                    \
  };                                                                                                    \
  void name##_wide(const float* in, float* out, int64_t n) {                                            \
    flowlet::detail::apply_vector<F16>(in, out, n, name##_wide_kernel{});                               \
  }
FLOWLET_WIDE_KERNEL(exp)
FLOWLET_WIDE_KERNEL(log)
FLOWLET_WIDE_KERNEL(tanh)
FLOWLET_WIDE_KERNEL(sigmoid)
FLOWLET_WIDE_KERNEL(erf)
#undef FLOWLET_WIDE_KERNEL
}  // namespace
#pragma GCC pop_options

TEST_CASE("the 16-lane code gives the 8-lane table's bits (emulated on AVX2)") {
  const VectorMathTable* avx2 = flowlet::detail::vector_math_avx2();
  if (avx2 == nullptr) {
    MESSAGE("no AVX2 + FMA here: nothing to compare");
    return;
  }
  const std::vector<std::pair<VectorMathF32, VectorMathF32>> pairs = {
      {&exp_wide, avx2->exp}, {&log_wide, avx2->log}, {&tanh_wide, avx2->tanh},
      {&sigmoid_wide, avx2->sigmoid}, {&erf_wide, avx2->erf}};
  std::vector<float> x = bit_sweep(1021);
  x.insert(x.end(), kEdgeCases.begin(), kEdgeCases.end());
  for (size_t f = 0; f < pairs.size(); ++f) {
    CAPTURE(f);
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{15}, int64_t{17}, int64_t{31}, static_cast<int64_t>(x.size())}) {
      CAPTURE(n);
      std::vector<float> wide(static_cast<size_t>(n) + 1, -7.0f), narrow(static_cast<size_t>(n));
      pairs[f].first(x.data(), wide.data(), n);
      pairs[f].second(x.data(), narrow.data(), n);
      int64_t differ = 0;
      for (int64_t i = 0; i < n; ++i) {
        differ += std::bit_cast<uint32_t>(wide[static_cast<size_t>(i)]) != std::bit_cast<uint32_t>(narrow[static_cast<size_t>(i)]);
      }
      CHECK(differ == 0);
      CHECK(wide[static_cast<size_t>(n)] == -7.0f);
    }
  }
}
#endif

TEST_CASE("exp, log, tanh, sigmoid and erf ops: f32 contiguous, views, f64 and empty tensors") {
  struct Op {
    const char* name;
    fl::Tensor (*op)(const fl::Tensor&);
    double (*reference)(double);
    double bound_ulp;
    double lo, hi;
  };
  const std::vector<Op> ops = {
      {"exp", [](const fl::Tensor& t) { return fl::exp(t); }, [](double x) { return std::exp(x); }, 1.0, -20, 20},
      {"log", [](const fl::Tensor& t) { return fl::log(t); }, [](double x) { return std::log(x); }, 1.0, 1e-3, 50},
      {"tanh", [](const fl::Tensor& t) { return fl::tanh(t); }, [](double x) { return std::tanh(x); }, 2.0, -6, 6},
      {"sigmoid", [](const fl::Tensor& t) { return fl::sigmoid(t); }, &sigmoid_ref, 3.0, -30, 30},
      {"erf", [](const fl::Tensor& t) { return fl::erf(t); }, [](double x) { return std::erf(x); }, 2.0, -5, 5},
  };
  for (const Op& op : ops) {
    CAPTURE(std::string(op.name));
    // Large enough to be split across threads, with an odd tail.
    const int64_t n = (int64_t{1} << 17) + 13;
    std::vector<float> values(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      values[static_cast<size_t>(i)] = static_cast<float>(op.lo + (op.hi - op.lo) * static_cast<double>(i) / static_cast<double>(n - 1));
    }
    const fl::Tensor x = fl::tensor(values, fl::Shape{n});
    const std::vector<float> y = op.op(x).to_vector<float>();
    double worst = 0;
    for (int64_t i = 0; i < n; ++i) worst = std::max(worst, ulp_error(y[static_cast<size_t>(i)], op.reference(values[static_cast<size_t>(i)])));
    CHECK(worst <= op.bound_ulp);
    // A strided view (every other element) takes the scalar libm path (glibc's tanhf measured 2.02
    // ulp here, the scalar sigmoid 2.28): within 3 ulp.
    const fl::Tensor view = fl::reshape(fl::slice(x, 0, 0, n - 1), fl::Shape{(n - 1) / 2, 2});
    const fl::Tensor column = fl::slice(view, 1, 0, 1);
    CHECK(!column.is_contiguous());
    const std::vector<float> yc = op.op(column).to_vector<float>();
    const std::vector<float> xc = column.to_vector<float>();
    REQUIRE(yc.size() == xc.size());
    double worst_view = 0;
    for (size_t i = 0; i < xc.size(); ++i) worst_view = std::max(worst_view, ulp_error(yc[i], op.reference(xc[i])));
    CHECK(worst_view <= std::max(op.bound_ulp, 3.0));
    // f64 stays on libm: within a few f64 ulp.
    const fl::Tensor x64 = fl::tensor(std::vector<double>{op.lo, 0.5 * (op.lo + op.hi), op.hi}, fl::Shape{3});
    const std::vector<double> y64 = op.op(x64).to_vector<double>();
    for (size_t i = 0; i < 3; ++i) {
      const double ref = op.reference(x64.to_vector<double>()[i]);
      CHECK(std::abs(y64[i] - ref) <= 4e-16 * std::abs(ref) + 1e-300);
    }
    CHECK(op.op(fl::zeros(fl::Shape{0, 3}, fl::f32)).shape() == fl::Shape{0, 3});
  }
}
