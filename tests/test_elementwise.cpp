// Elementwise ops: arithmetic, unary math, comparisons, where and cast, with broadcasting, scalars,
// every supported dtype, non-contiguous and empty inputs, and the declared errors.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "flowlet/trace.hpp"
#include "support/reference.hpp"

using test::check_op_throws;
using test::check_tensor;
using test::check_throws;
using test::Domain;
using test::Host;

namespace {

using BinaryFn = fl::Tensor (*)(const fl::Tensor&, const fl::Tensor&);
using UnaryFn = fl::Tensor (*)(const fl::Tensor&);

const std::vector<fl::DType> kArithmeticDTypes = {fl::f32, fl::f64, fl::i32, fl::i64, fl::u8, fl::f16, fl::bf16};
const std::vector<fl::DType> kFloatMathDTypes = {fl::f32, fl::f64, fl::f16, fl::bf16};

struct BinaryOp {
  const char* name;
  BinaryFn fn;
  double (*ref)(double, double);
  Domain a_domain;
  Domain b_domain;
  std::vector<fl::DType> dtypes;
  bool compares;  // result is b8
};

const std::vector<BinaryOp>& binary_ops() {
  static const std::vector<BinaryOp> ops = {
      {"add", &fl::add, [](double a, double b) { return a + b; }, Domain::normal, Domain::normal, kArithmeticDTypes, false},
      {"sub", &fl::sub, [](double a, double b) { return a - b; }, Domain::big, Domain::normal, kArithmeticDTypes, false},
      {"mul", &fl::mul, [](double a, double b) { return a * b; }, Domain::normal, Domain::normal, kArithmeticDTypes, false},
      {"div", &fl::div, [](double a, double b) { return a / b; }, Domain::normal, Domain::nonzero, kArithmeticDTypes, false},
      {"pow", &fl::pow, [](double a, double b) { return std::pow(a, b); }, Domain::positive, Domain::normal, kFloatMathDTypes, false},
      {"maximum", &fl::maximum, [](double a, double b) { return std::max(a, b); }, Domain::normal, Domain::normal, kArithmeticDTypes, false},
      {"minimum", &fl::minimum, [](double a, double b) { return std::min(a, b); }, Domain::normal, Domain::normal, kArithmeticDTypes, false},
      {"equal", &fl::equal, [](double a, double b) { return a == b ? 1.0 : 0.0; }, Domain::small_ints, Domain::small_ints, kArithmeticDTypes, true},
      {"not_equal", &fl::not_equal, [](double a, double b) { return a != b ? 1.0 : 0.0; }, Domain::small_ints, Domain::small_ints, kArithmeticDTypes, true},
      {"less", &fl::less, [](double a, double b) { return a < b ? 1.0 : 0.0; }, Domain::small_ints, Domain::small_ints, kArithmeticDTypes, true},
      {"less_equal", &fl::less_equal, [](double a, double b) { return a <= b ? 1.0 : 0.0; }, Domain::small_ints, Domain::small_ints, kArithmeticDTypes, true},
      {"greater", &fl::greater, [](double a, double b) { return a > b ? 1.0 : 0.0; }, Domain::small_ints, Domain::small_ints, kArithmeticDTypes, true},
      {"greater_equal", &fl::greater_equal, [](double a, double b) { return a >= b ? 1.0 : 0.0; }, Domain::small_ints, Domain::small_ints, kArithmeticDTypes, true},
  };
  return ops;
}

struct UnaryOp {
  const char* name;
  UnaryFn fn;
  double (*ref)(double);
  Domain domain;
  std::vector<fl::DType> dtypes;
};

const std::vector<UnaryOp>& unary_ops() {
  static const std::vector<UnaryOp> ops = {
      {"neg", &fl::neg, [](double x) { return -x; }, Domain::normal, {fl::f32, fl::f64, fl::i32, fl::i64, fl::f16, fl::bf16}},
      {"exp", &fl::exp, [](double x) { return std::exp(x); }, Domain::normal, kFloatMathDTypes},
      {"log", &fl::log, [](double x) { return std::log(x); }, Domain::positive, kFloatMathDTypes},
      {"sqrt", &fl::sqrt, [](double x) { return std::sqrt(x); }, Domain::positive, kFloatMathDTypes},
      {"tanh", &fl::tanh, [](double x) { return std::tanh(x); }, Domain::normal, kFloatMathDTypes},
      {"sigmoid", &fl::sigmoid, [](double x) { return 1.0 / (1.0 + std::exp(-x)); }, Domain::normal, kFloatMathDTypes},
      {"relu", &fl::relu, [](double x) { return x > 0 ? x : 0.0; }, Domain::normal, kArithmeticDTypes},
      {"abs", &fl::abs, [](double x) { return std::abs(x); }, Domain::normal, kArithmeticDTypes},
      {"square", &fl::square, [](double x) { return x * x; }, Domain::normal, kArithmeticDTypes},
  };
  return ops;
}

// Broadcast pairs: same shape, scalar, row, column, rank-expanding, and zero-size dimensions.
const std::vector<std::pair<fl::Shape, fl::Shape>> kBroadcastPairs = {
    {{2, 3}, {2, 3}}, {{2, 3}, {}},     {{}, {2, 3}},     {{2, 3}, {3}},       {{2, 1}, {2, 3}},
    {{4, 1, 3}, {2, 1}}, {{3}, {2, 4, 3}}, {{1}, {5}},   {{0, 3}, {3}},       {{2, 0}, {2, 1}},
    {{1, 0}, {3, 1}}, {{}, {}},         {{7, 1}, {1, 6}},
};

// Expected result of a binary op on a and b in `dt`: reference in f64, integer division truncated.
Host binary_expected(const BinaryOp& op, const fl::Tensor& a, const fl::Tensor& b, fl::DType dt) {
  Host out = test::binary_ref(test::host(a), test::host(b), op.ref);
  if (!op.compares && (test::is_signed_integer(dt) || dt == fl::u8))
    for (double& v : out.values) v = std::trunc(v);
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Hand-worked cases

TEST_CASE("arithmetic on small hand-worked tensors") {
  const fl::Tensor a = fl::tensor(std::vector<float>{1, 2, 3, 4, 5, 6}, fl::Shape{2, 3});
  const fl::Tensor b = fl::tensor(std::vector<float>{10, 20, 30, 40, 50, 60}, fl::Shape{2, 3});
  check_tensor(a + b, {11, 22, 33, 44, 55, 66}, fl::Shape{2, 3}, fl::f32);
  check_tensor(b - a, {9, 18, 27, 36, 45, 54}, fl::Shape{2, 3}, fl::f32);
  check_tensor(a * b, {10, 40, 90, 160, 250, 360}, fl::Shape{2, 3}, fl::f32);
  check_tensor(b / a, {10, 10, 10, 10, 10, 10}, fl::Shape{2, 3}, fl::f32);
  check_tensor(-a, {-1, -2, -3, -4, -5, -6}, fl::Shape{2, 3}, fl::f32);
  check_tensor(fl::pow(a, fl::tensor({2.0f, 0.5f, -1.0f})), {1, std::sqrt(2.0), 1.0 / 3, 16, std::sqrt(5.0), 1.0 / 6},
               fl::Shape{2, 3}, fl::f32);
  check_tensor(fl::maximum(a, fl::tensor({2.0f, 2.0f, 7.0f})), {2, 2, 7, 4, 5, 7}, fl::Shape{2, 3}, fl::f32);
  check_tensor(fl::minimum(a, fl::tensor({2.0f, 2.0f, 7.0f})), {1, 2, 3, 2, 2, 6}, fl::Shape{2, 3}, fl::f32);
}

TEST_CASE("broadcasting follows NumPy rules on hand-worked cases") {
  const fl::Tensor m = fl::tensor(std::vector<int32_t>{1, 2, 3, 4, 5, 6}, fl::Shape{2, 3});
  // Row: [3] against [2, 3].
  check_tensor(m + fl::tensor({10, 20, 30}), {11, 22, 33, 14, 25, 36}, fl::Shape{2, 3}, fl::i32);
  // Column: [2, 1] against [2, 3].
  check_tensor(m * fl::tensor(std::vector<int32_t>{1, -1}, fl::Shape{2, 1}), {1, 2, 3, -4, -5, -6}, fl::Shape{2, 3},
               fl::i32);
  // Scalar tensor on either side.
  check_tensor(fl::scalar(100) - m, {99, 98, 97, 96, 95, 94}, fl::Shape{2, 3}, fl::i32);
  // Outer sum: [3, 1] + [1, 2] -> [3, 2].
  check_tensor(fl::tensor(std::vector<int32_t>{0, 10, 20}, fl::Shape{3, 1}) + fl::tensor(std::vector<int32_t>{1, 2}, fl::Shape{1, 2}),
               {1, 2, 11, 12, 21, 22}, fl::Shape{3, 2}, fl::i32);
  // Rank expansion: [2, 1, 2] + [3, 1] -> [2, 3, 2].
  const fl::Tensor x = fl::tensor(std::vector<int32_t>{1, 2, 3, 4}, fl::Shape{2, 1, 2});
  const fl::Tensor y = fl::tensor(std::vector<int32_t>{0, 10, 20}, fl::Shape{3, 1});
  check_tensor(x + y, {1, 2, 11, 12, 21, 22, 3, 4, 13, 14, 23, 24}, fl::Shape{2, 3, 2}, fl::i32);
  // Zero-size dimensions broadcast to empty results.
  check_tensor(fl::zeros(fl::Shape{0, 3}) + fl::ones(fl::Shape{3}), {}, fl::Shape{0, 3}, fl::f32);
  check_tensor(fl::zeros(fl::Shape{1, 0}) + fl::ones(fl::Shape{4, 1}), {}, fl::Shape{4, 0}, fl::f32);
}

TEST_CASE("integer division truncates toward zero") {
  const fl::Tensor a = fl::tensor({7, -7, 7, -7, 0, 9});
  const fl::Tensor b = fl::tensor({2, 2, -2, -2, 5, 3});
  check_tensor(a / b, {3, -3, -3, 3, 0, 3}, fl::Shape{6}, fl::i32);
  check_tensor(fl::div(a.astype(fl::i64), b.astype(fl::i64)), {3, -3, -3, 3, 0, 3}, fl::Shape{6}, fl::i64);
  check_tensor(fl::tensor({uint8_t{7}, uint8_t{255}}) / fl::tensor({uint8_t{2}, uint8_t{16}}), {3, 15}, fl::Shape{2}, fl::u8);
  check_tensor(a / 2, {3, -3, 3, -3, 0, 4}, fl::Shape{6}, fl::i32);
}

TEST_CASE("integer division by zero throws InvalidArgument, float division gives IEEE results") {
  for (fl::DType dt : test::kIntegerDTypes) {
    CAPTURE(dt);
    const fl::Tensor a = test::make({4, 5, 6}, dt);
    const fl::Tensor b = test::make({1, 0, 2}, dt);
    check_op_throws<fl::InvalidArgument>("div", [&] { (void)fl::div(a, b); }, {"zero"});
  }
  const fl::Tensor f = fl::tensor({1.0f, -1.0f, 0.0f}) / fl::tensor({0.0f, 0.0f, 0.0f});
  const std::vector<float> v = f.to_vector<float>();
  CHECK(v[0] == std::numeric_limits<float>::infinity());
  CHECK(v[1] == -std::numeric_limits<float>::infinity());
  CHECK(std::isnan(v[2]));
}

TEST_CASE("unary math on hand-worked values, including the edges") {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (fl::DType dt : test::kFloatDTypes) {
    CAPTURE(dt);
    check_tensor(fl::exp(test::make({0, 1, -1, 1000, -1000}, dt)), {1, std::exp(1.0), std::exp(-1.0), inf, 0},
                 fl::Shape{5}, dt);
    check_tensor(fl::log(test::make({1, std::exp(2.0), 0, -1}, dt)), {0, 2, -inf, nan}, fl::Shape{4}, dt);
    check_tensor(fl::sqrt(test::make({4, 2, 0, -1}, dt)), {2, std::sqrt(2.0), 0, nan}, fl::Shape{4}, dt);
    check_tensor(fl::tanh(test::make({0, 0.5, -20, 20, 1000}, dt)), {0, std::tanh(0.5), -1, 1, 1}, fl::Shape{5}, dt);
    // sigmoid stays finite and exact at the extremes.
    check_tensor(fl::sigmoid(test::make({0, 2, -1000, 1000, -30}, dt)),
                 {0.5, 1 / (1 + std::exp(-2.0)), 0, 1, 1 / (1 + std::exp(30.0))}, fl::Shape{5}, dt);
    check_tensor(fl::relu(test::make({-1.5, 0, 2.5}, dt)), {0, 0, 2.5}, fl::Shape{3}, dt);
    check_tensor(fl::abs(test::make({-1.5, 0, 2.5}, dt)), {1.5, 0, 2.5}, fl::Shape{3}, dt);
    check_tensor(fl::square(test::make({-1.5, 0, 3}, dt)), {2.25, 0, 9}, fl::Shape{3}, dt);
    check_tensor(fl::neg(test::make({-1.5, 0, 3}, dt)), {1.5, 0, -3}, fl::Shape{3}, dt);
    check_tensor(fl::pow(test::make({2, 0, 4, 9}, dt), test::make({10, 0, -0.5, 0.5}, dt)), {1024, 1, 0.5, 3},
                 fl::Shape{4}, dt);
  }
  for (fl::DType dt : {fl::i32, fl::i64}) {
    CAPTURE(dt);
    check_tensor(fl::neg(test::make({-3, 0, 4}, dt)), {3, 0, -4}, fl::Shape{3}, dt);
    check_tensor(fl::abs(test::make({-3, 0, 4}, dt)), {3, 0, 4}, fl::Shape{3}, dt);
    check_tensor(fl::relu(test::make({-3, 0, 4}, dt)), {0, 0, 4}, fl::Shape{3}, dt);
    check_tensor(fl::square(test::make({-3, 0, 4}, dt)), {9, 0, 16}, fl::Shape{3}, dt);
  }
  check_tensor(fl::square(test::make({3, 15}, fl::u8)), {9, 225}, fl::Shape{2}, fl::u8);
  check_tensor(fl::abs(test::make({3, 200}, fl::u8)), {3, 200}, fl::Shape{2}, fl::u8);
}

// ---------------------------------------------------------------------------------------------
// Against the f64 reference

TEST_CASE("binary ops match the f64 reference in every supported dtype and broadcast") {
  int compared = 0;
  uint64_t seed = 1;
  for (const BinaryOp& op : binary_ops()) {
    for (fl::DType dt : op.dtypes) {
      for (const auto& [sa, sb] : kBroadcastPairs) {
        CAPTURE(op.name);
        CAPTURE(dt);
        CAPTURE(sa);
        CAPTURE(sb);
        const fl::Tensor a = test::random_tensor(sa, seed++, dt, op.a_domain);
        const fl::Tensor b = test::random_tensor(sb, seed++, dt, op.b_domain);
        const Host want = binary_expected(op, a, b, dt);
        const fl::DType out_dt = op.compares ? fl::b8 : dt;
        check_tensor(op.fn(a, b), want.values, want.shape, out_dt);
        ++compared;
      }
    }
  }
  // 12 ops in 7 dtypes, pow in 4.
  CHECK(compared == (12 * 7 + 4) * static_cast<int>(kBroadcastPairs.size()));
}

TEST_CASE("elementwise ops are right at every length from 0 to 70, vector tails included") {
  int compared = 0;
  uint64_t seed = 20000;
  for (fl::DType dt : kArithmeticDTypes) {
    for (int64_t n = 0; n <= 70; ++n) {
      CAPTURE(dt);
      CAPTURE(n);
      for (const BinaryOp& op : binary_ops()) {
        if (std::find(op.dtypes.begin(), op.dtypes.end(), dt) == op.dtypes.end()) continue;
        CAPTURE(op.name);
        const fl::Tensor a = test::random_tensor(fl::Shape{n}, seed++, dt, op.a_domain);
        const fl::Tensor b = test::random_tensor(fl::Shape{n}, seed++, dt, op.b_domain);
        const Host want = binary_expected(op, a, b, dt);
        check_tensor(op.fn(a, b), want.values, want.shape, op.compares ? fl::b8 : dt);
        // And against a broadcast scalar.
        const fl::Tensor s = test::random_tensor(fl::Shape{}, seed++, dt, op.b_domain);
        const Host want_s = binary_expected(op, a, s, dt);
        check_tensor(op.fn(a, s), want_s.values, want_s.shape, op.compares ? fl::b8 : dt);
      }
      for (const UnaryOp& op : unary_ops()) {
        if (std::find(op.dtypes.begin(), op.dtypes.end(), dt) == op.dtypes.end()) continue;
        CAPTURE(op.name);
        const fl::Tensor x = test::random_tensor(fl::Shape{n}, seed++, dt, op.domain);
        const Host want = test::unary_ref(test::host(x), op.ref);
        check_tensor(op.fn(x), want.values, want.shape, dt);
      }
      ++compared;
    }
  }
  CHECK(compared == 7 * 71);
}

TEST_CASE("binary ops give the same results for non-contiguous inputs") {
  int compared = 0;
  uint64_t seed = 1000;
  const std::vector<std::pair<fl::Shape, fl::Shape>> pairs = {{{3, 4}, {3, 4}}, {{2, 3, 4}, {3, 4}}, {{5}, {5}},
                                                               {{4, 1}, {1, 3}}, {{0, 2}, {2}}};
  for (const BinaryOp& op : binary_ops()) {
    for (fl::DType dt : {fl::f32, fl::i32, fl::f16}) {
      if (std::find(op.dtypes.begin(), op.dtypes.end(), dt) == op.dtypes.end()) continue;
      for (const auto& [sa, sb] : pairs) {
        CAPTURE(op.name);
        CAPTURE(dt);
        CAPTURE(sa);
        CAPTURE(sb);
        const fl::Tensor a = test::random_tensor(sa, seed++, dt, op.a_domain);
        const fl::Tensor b = test::random_tensor(sb, seed++, dt, op.b_domain);
        const Host want = binary_expected(op, a, b, dt);
        const fl::DType out_dt = op.compares ? fl::b8 : dt;
        check_tensor(op.fn(test::permuted_view(a), test::permuted_view(b)), want.values, want.shape, out_dt);
        check_tensor(op.fn(test::strided_view(a), b), want.values, want.shape, out_dt);
        check_tensor(op.fn(a, test::strided_view(b)), want.values, want.shape, out_dt);
        ++compared;
      }
    }
  }
  CHECK(compared > 13 * 5);
}

TEST_CASE("unary ops match the f64 reference in every supported dtype, contiguous or not") {
  int compared = 0;
  uint64_t seed = 5000;
  const std::vector<fl::Shape> shapes = {{2, 3}, {7}, {}, {0, 4}, {3, 4, 5}, {1, 1}};
  for (const UnaryOp& op : unary_ops()) {
    for (fl::DType dt : op.dtypes) {
      for (const fl::Shape& shape : shapes) {
        CAPTURE(op.name);
        CAPTURE(dt);
        CAPTURE(shape);
        const fl::Tensor x = test::random_tensor(shape, seed++, dt, op.domain);
        const Host want = test::unary_ref(test::host(x), op.ref);
        check_tensor(op.fn(x), want.values, want.shape, dt);
        check_tensor(op.fn(test::strided_view(x)), want.values, want.shape, dt);
        if (shape.size() >= 2) check_tensor(op.fn(test::permuted_view(x)), want.values, want.shape, dt);
        ++compared;
      }
    }
  }
  CHECK(compared == 6 * (6 + 4 * 5 + 7 * 3));
}

TEST_CASE("f16 and bf16 math computes in f32 and rounds once to the storage type") {
  for (fl::DType dt : test::kHalfDTypes) {
    CAPTURE(dt);
    const fl::Tensor a = test::random_tensor(fl::Shape{64}, 1, dt);
    const fl::Tensor b = test::random_tensor(fl::Shape{64}, 2, dt, Domain::nonzero);
    const std::vector<double> av = test::values(a);
    const std::vector<double> bv = test::values(b);
    std::vector<double> sum, quotient, e;
    for (size_t i = 0; i < av.size(); ++i) {
      // f32 arithmetic on the widened values, then one rounding to the storage type.
      sum.push_back(test::round_to(static_cast<float>(av[i]) + static_cast<float>(bv[i]), dt));
      quotient.push_back(test::round_to(static_cast<float>(av[i]) / static_cast<float>(bv[i]), dt));
      e.push_back(test::round_to(std::exp(static_cast<float>(av[i])), dt));
    }
    // One unit in the last place at most (an exp that rounds differently in f32).
    const test::Tolerance ulp = dt == fl::f16 ? test::Tolerance{1e-3, 1e-7} : test::Tolerance{8e-3, 1e-7};
    check_tensor(a + b, sum, fl::Shape{64}, dt, test::Tolerance{0, 0});
    check_tensor(a / b, quotient, fl::Shape{64}, dt, test::Tolerance{0, 0});
    check_tensor(fl::exp(a), e, fl::Shape{64}, dt, ulp);
  }
}

// ---------------------------------------------------------------------------------------------
// Scalars

TEST_CASE("a scalar on either side takes the tensor's dtype") {
  const fl::Tensor f = fl::tensor({1.0f, 2.0f, 4.0f});
  check_tensor(f + 2.0f, {3, 4, 6}, fl::Shape{3}, fl::f32);
  check_tensor(f + 2.0, {3, 4, 6}, fl::Shape{3}, fl::f32);  // a double scalar does not promote
  check_tensor(0.5 * f, {0.5, 1, 2}, fl::Shape{3}, fl::f32);
  check_tensor(f * 0.1, {0.1f * 1.0f, 0.1f * 2.0f, 0.1f * 4.0f}, fl::Shape{3}, fl::f32);
  check_tensor(10 - f, {9, 8, 6}, fl::Shape{3}, fl::f32);
  check_tensor(f - 1, {0, 1, 3}, fl::Shape{3}, fl::f32);
  check_tensor(8.0f / f, {8, 4, 2}, fl::Shape{3}, fl::f32);
  check_tensor(f / 2, {0.5, 1, 2}, fl::Shape{3}, fl::f32);
  check_tensor(f > 1.5f, {0, 1, 1}, fl::Shape{3}, fl::b8);
  check_tensor(f >= 2, {0, 1, 1}, fl::Shape{3}, fl::b8);
  check_tensor(f < 2.0, {1, 0, 0}, fl::Shape{3}, fl::b8);
  check_tensor(f <= 2, {1, 1, 0}, fl::Shape{3}, fl::b8);
  check_tensor(f == 4, {0, 0, 1}, fl::Shape{3}, fl::b8);
  check_tensor(f != 4, {1, 1, 0}, fl::Shape{3}, fl::b8);
  check_tensor(3 < f, {0, 0, 1}, fl::Shape{3}, fl::b8);
  const fl::Tensor d = fl::tensor({1.0, 2.0});
  check_tensor(d * 3.0f, {3, 6}, fl::Shape{2}, fl::f64);
  const fl::Tensor i = fl::tensor({1, 2, 3});
  check_tensor(i + 2, {3, 4, 5}, fl::Shape{3}, fl::i32);
  check_tensor(i * 2.0, {2, 4, 6}, fl::Shape{3}, fl::i32);  // 2.0 fits i32 exactly
  check_tensor(i > 1, {0, 1, 1}, fl::Shape{3}, fl::b8);
  const fl::Tensor u = fl::tensor({uint8_t{1}, uint8_t{200}});
  check_tensor(u + 55, {56, 255}, fl::Shape{2}, fl::u8);
  const fl::Tensor h = fl::tensor({fl::f16_t(1.0f), fl::f16_t(2.0f)});
  check_tensor(h * 1.5, {1.5, 3}, fl::Shape{2}, fl::f16);
}

TEST_CASE("a scalar the tensor's dtype cannot represent throws InvalidArgument") {
  const fl::Tensor i = fl::tensor({1, 2, 3});
  const fl::Tensor u = fl::tensor({uint8_t{1}, uint8_t{2}});
  check_throws<fl::InvalidArgument>([&] { (void)(i + 2.5); }, {"add", "2.5", "i32"});
  check_throws<fl::InvalidArgument>([&] { (void)(2.5 * i); }, {"mul", "2.5", "i32"});
  check_throws<fl::InvalidArgument>([&] { (void)(u + 300); }, {"add", "300", "u8"});
  check_throws<fl::InvalidArgument>([&] { (void)(u - (-1)); }, {"sub", "-1", "u8"});
  check_throws<fl::InvalidArgument>([&] { (void)(i > 0.5); }, {"greater", "0.5", "i32"});
  check_throws<fl::InvalidArgument>([&] { (void)(i * (int64_t{1} << 40)); }, {"mul", "i32"});
  check_throws<fl::InvalidArgument>([&] { (void)fl::scalar_like(u, 256.0, "add"); }, {"add", "256", "u8"});
}

// ---------------------------------------------------------------------------------------------
// Comparisons and where

TEST_CASE("comparisons give b8 with ties handled exactly") {
  const fl::Tensor a = fl::tensor({1, 2, 3, 2});
  const fl::Tensor b = fl::tensor({2, 2, 2, 3});
  check_tensor(a == b, {0, 1, 0, 0}, fl::Shape{4}, fl::b8);
  check_tensor(a != b, {1, 0, 1, 1}, fl::Shape{4}, fl::b8);
  check_tensor(a < b, {1, 0, 0, 1}, fl::Shape{4}, fl::b8);
  check_tensor(a <= b, {1, 1, 0, 1}, fl::Shape{4}, fl::b8);
  check_tensor(a > b, {0, 0, 1, 0}, fl::Shape{4}, fl::b8);
  check_tensor(a >= b, {0, 1, 1, 0}, fl::Shape{4}, fl::b8);
  // NaN compares unequal to everything, itself included.
  const fl::Tensor n = fl::tensor({NAN, 1.0f});
  check_tensor(n == n, {0, 1}, fl::Shape{2}, fl::b8);
  check_tensor(n != n, {1, 0}, fl::Shape{2}, fl::b8);
  check_tensor(n < fl::tensor({5.0f, 5.0f}), {0, 1}, fl::Shape{2}, fl::b8);
  // Broadcast column against row.
  check_tensor(fl::tensor(std::vector<int32_t>{1, 2, 3}, fl::Shape{3, 1}) < fl::tensor({2, 3}), {1, 1, 0, 1, 0, 0},
               fl::Shape{3, 2}, fl::b8);
}

TEST_CASE("where picks from a or b by a broadcast b8 condition") {
  const fl::Tensor c = fl::tensor({true, false, true});
  check_tensor(fl::where(c, fl::tensor({1, 2, 3}), fl::tensor({10, 20, 30})), {1, 20, 3}, fl::Shape{3}, fl::i32);
  // [2, 1] condition, [3] a, scalar b -> [2, 3].
  const fl::Tensor c2 = fl::tensor(std::vector<bool>{true, false}, fl::Shape{2, 1});
  check_tensor(fl::where(c2, fl::tensor({1.0f, 2.0f, 3.0f}), fl::scalar(-1.0f)), {1, 2, 3, -1, -1, -1}, fl::Shape{2, 3},
               fl::f32);
  // A comparison result feeds where directly: relu by hand.
  const fl::Tensor x = fl::tensor({-2.0, 0.5, 3.0});
  check_tensor(fl::where(x > 0, x, fl::zeros_like(x)), {0, 0.5, 3}, fl::Shape{3}, fl::f64);
  // Every dtype of a and b, against the reference, contiguous or not, with empty shapes too.
  int compared = 0;
  uint64_t seed = 77;
  const std::vector<std::vector<fl::Shape>> cases = {
      {{2, 3}, {2, 3}, {2, 3}}, {{2, 1}, {3}, {2, 3}}, {{}, {2, 3}, {}}, {{0, 3}, {3}, {1}}, {{4, 1, 2}, {3, 1}, {2}}};
  for (fl::DType dt : {fl::f32, fl::f64, fl::i32, fl::i64, fl::u8, fl::f16, fl::bf16, fl::b8}) {
    for (const auto& shapes : cases) {
      CAPTURE(dt);
      CAPTURE(shapes[0]);
      CAPTURE(shapes[1]);
      CAPTURE(shapes[2]);
      const fl::Tensor cond = test::random_tensor(shapes[0], seed++, fl::b8);
      const fl::Tensor a = test::random_tensor(shapes[1], seed++, dt);
      const fl::Tensor b = test::random_tensor(shapes[2], seed++, dt);
      const Host want = test::broadcast_map({test::host(cond), test::host(a), test::host(b)},
                                            [](const std::vector<double>& v) { return v[0] != 0 ? v[1] : v[2]; });
      check_tensor(fl::where(cond, a, b), want.values, want.shape, dt);
      check_tensor(fl::where(test::noncontiguous(cond), test::strided_view(a), test::noncontiguous(b)), want.values,
                   want.shape, dt);
      ++compared;
    }
  }
  CHECK(compared == 8 * 5);
}

TEST_CASE("where rejects a non-b8 condition, mixed dtypes and shapes that do not broadcast") {
  const fl::Tensor a = fl::tensor({1.0f, 2.0f});
  const fl::Tensor b = fl::tensor({3.0f, 4.0f});
  check_op_throws<fl::DTypeError>("where", [&] { (void)fl::where(a, a, b); }, {"f32"});
  check_op_throws<fl::DTypeError>("where", [&] { (void)fl::where(fl::tensor({1, 0}), a, b); }, {"i32"});
  check_op_throws<fl::DTypeError>("where", [&] { (void)fl::where(a > 1.0f, a, fl::tensor({3.0, 4.0})); },
                                  {"f32", "f64"});
  check_op_throws<fl::ShapeError>("where", [&] { (void)fl::where(fl::tensor({true, false, true}), a, b); }, {"[3]", "[2]"});
}

// ---------------------------------------------------------------------------------------------
// cast

TEST_CASE("cast truncates floats toward zero and maps to and from b8") {
  const fl::Tensor f = fl::tensor({-2.75f, -0.5f, 0.5f, 2.75f, 100.0f});
  check_tensor(fl::cast(f, fl::i32), {-2, 0, 0, 2, 100}, fl::Shape{5}, fl::i32);
  check_tensor(fl::cast(f, fl::i64), {-2, 0, 0, 2, 100}, fl::Shape{5}, fl::i64);
  check_tensor(fl::cast(fl::tensor({0.5, 2.75, 255.0}), fl::u8), {0, 2, 255}, fl::Shape{3}, fl::u8);
  check_tensor(fl::cast(fl::tensor({0.0f, 3.0f, -1.5f}), fl::b8), {0, 1, 1}, fl::Shape{3}, fl::b8);
  check_tensor(fl::cast(fl::tensor({0, 7}), fl::b8), {0, 1}, fl::Shape{2}, fl::b8);
  check_tensor(fl::cast(fl::tensor({true, false}), fl::f32), {1, 0}, fl::Shape{2}, fl::f32);
  check_tensor(fl::cast(fl::tensor({true, false}), fl::i64), {1, 0}, fl::Shape{2}, fl::i64);
  check_tensor(fl::cast(fl::tensor({-3, 1000000}), fl::f32), {-3, 1000000}, fl::Shape{2}, fl::f32);
  check_tensor(fl::cast(fl::tensor({uint8_t{255}}), fl::i32), {255}, fl::Shape{1}, fl::i32);
  check_tensor(fl::cast(fl::tensor({int64_t{1} << 40}), fl::f64), {1099511627776.0}, fl::Shape{1}, fl::f64);
  // f64 -> f32 rounds to nearest.
  CHECK(fl::cast(fl::tensor({0.1}), fl::f32).to_vector<float>()[0] == 0.1f);
  // astype is cast.
  check_tensor(f.astype(fl::i32), {-2, 0, 0, 2, 100}, fl::Shape{5}, fl::i32);
}

TEST_CASE("cast to f16 and bf16 rounds to nearest even, overflow gives infinity") {
  const fl::Tensor f = fl::tensor({1.0f + 0x1.0p-11f, 1.0f + 3 * 0x1.0p-11f, 65520.0f, 0x1.0p-25f, -0.0f});
  const std::vector<fl::f16_t> h = fl::cast(f, fl::f16).to_vector<fl::f16_t>();
  REQUIRE(h.size() == 5);
  CHECK(h[0].bits == 0x3c00);
  CHECK(h[1].bits == 0x3c02);
  CHECK(h[2].bits == 0x7c00);
  CHECK(h[3].bits == 0x0000);
  CHECK(h[4].bits == 0x8000);
  const fl::Tensor g = fl::tensor({std::bit_cast<float>(0x3f808000u), std::bit_cast<float>(0x3f818000u)});
  const std::vector<fl::bf16_t> b = fl::cast(g, fl::bf16).to_vector<fl::bf16_t>();
  CHECK(b[0].bits == 0x3f80);
  CHECK(b[1].bits == 0x3f82);
  // And back exactly.
  check_tensor(fl::cast(fl::cast(f, fl::f16), fl::f32), {1, 1 + 2 * 0x1.0p-10, INFINITY, 0, 0}, fl::Shape{5}, fl::f32,
               test::Tolerance{0, 0});
}

TEST_CASE("cast between every pair of dtypes matches the reference, contiguous or not") {
  int compared = 0;
  uint64_t seed = 300;
  for (fl::DType from : test::kAllDTypes) {
    for (fl::DType to : test::kAllDTypes) {
      CAPTURE(from);
      CAPTURE(to);
      const fl::Tensor x = test::random_tensor(fl::Shape{3, 5}, seed++, from, Domain::castable);
      std::vector<double> want;
      for (double v : test::values(x)) want.push_back(test::round_to(test::is_float(to) ? v : std::trunc(v), to));
      check_tensor(fl::cast(x, to), want, fl::Shape{3, 5}, to, test::Tolerance{0, 0});
      check_tensor(fl::cast(test::permuted_view(x), to), want, fl::Shape{3, 5}, to, test::Tolerance{0, 0});
      check_tensor(fl::cast(test::strided_view(x), to), want, fl::Shape{3, 5}, to, test::Tolerance{0, 0});
      check_tensor(fl::cast(fl::zeros(fl::Shape{0, 2}, from), to), {}, fl::Shape{0, 2}, to);
      ++compared;
    }
  }
  CHECK(compared == 64);
}

// ---------------------------------------------------------------------------------------------
// Errors

TEST_CASE("binary ops reject shapes that do not broadcast with ShapeError naming both shapes") {
  const fl::Tensor a = fl::zeros(fl::Shape{2, 3});
  const fl::Tensor b = fl::zeros(fl::Shape{4});
  CHECK(binary_ops().size() == 13);
  for (const BinaryOp& op : binary_ops()) {
    CAPTURE(op.name);
    check_op_throws<fl::ShapeError>(op.name, [&] { (void)op.fn(a, b); }, {"cannot broadcast", "[2, 3]", "[4]"});
    check_op_throws<fl::ShapeError>(op.name, [&] { (void)op.fn(fl::zeros(fl::Shape{0, 3}), fl::zeros(fl::Shape{2, 3})); },
                                    {"[0, 3]", "[2, 3]"});
  }
  // The exact documented message.
  check_throws<fl::ShapeError>([&] { (void)(a + b); }, {"add: cannot broadcast; got a [2, 3] and b [4]"});
}

TEST_CASE("binary ops reject mixed dtypes with DTypeError naming both") {
  for (const BinaryOp& op : binary_ops()) {
    CAPTURE(op.name);
    check_op_throws<fl::DTypeError>(op.name, [&] { (void)op.fn(fl::ones(fl::Shape{2}), fl::ones(fl::Shape{2}, fl::f64)); },
                                    {"f32", "f64"});
    check_op_throws<fl::DTypeError>(op.name, [&] { (void)op.fn(fl::ones(fl::Shape{2}, fl::i32), fl::ones(fl::Shape{2}, fl::i64)); },
                                    {"i32", "i64"});
  }
  check_throws<fl::DTypeError>([] { (void)(fl::ones(fl::Shape{2}) + fl::ones(fl::Shape{2}, fl::f64)); },
                               {"add: dtypes differ; got f32 and f64"});
}

TEST_CASE("float-only ops reject integer inputs and arithmetic rejects b8, with DTypeError") {
  const fl::Tensor i = fl::tensor({1, 2});
  for (const UnaryOp& op : unary_ops()) {
    CAPTURE(op.name);
    const bool float_only = std::find(op.dtypes.begin(), op.dtypes.end(), fl::i32) == op.dtypes.end();
    if (float_only) check_op_throws<fl::DTypeError>(op.name, [&] { (void)op.fn(i); }, {"i32"});
    check_op_throws<fl::DTypeError>(op.name, [&] { (void)op.fn(fl::tensor({true, false})); }, {"b8"});
  }
  check_op_throws<fl::DTypeError>("pow", [&] { (void)fl::pow(i, i); }, {"i32"});
  check_op_throws<fl::DTypeError>("add", [] { (void)fl::add(fl::tensor({true}), fl::tensor({false})); }, {"b8"});
  check_op_throws<fl::DTypeError>("mul", [] { (void)fl::mul(fl::tensor({true}), fl::tensor({false})); }, {"b8"});
}

TEST_CASE("elementwise ops on empty tensors give empty results of the right shape and dtype") {
  const fl::Tensor e = fl::zeros(fl::Shape{3, 0, 2});
  for (const UnaryOp& op : unary_ops()) {
    CAPTURE(op.name);
    check_tensor(op.fn(e), {}, fl::Shape{3, 0, 2}, fl::f32);
  }
  for (const BinaryOp& op : binary_ops()) {
    CAPTURE(op.name);
    check_tensor(op.fn(e, fl::ones(fl::Shape{2})), {}, fl::Shape{3, 0, 2}, op.compares ? fl::b8 : fl::f32);
  }
  check_tensor(e + 1.0f, {}, fl::Shape{3, 0, 2}, fl::f32);
  check_tensor(fl::where(fl::zeros(fl::Shape{0}, fl::b8), fl::ones(fl::Shape{0}), fl::zeros(fl::Shape{1})), {},
               fl::Shape{0}, fl::f32);
}

// ---------------------------------------------------------------------------------------------
// NaN through branchy functors, the newer math ops, and scalars no dtype holds

TEST_CASE("NaN propagates through relu, abs, sign, sigmoid, clamp, maximum and minimum, at every position") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (fl::DType dt : kFloatMathDTypes) {
    CAPTURE(dt);
    // 70 elements: NaN in the vectorized body and in the scalar tail of the CPU loops.
    std::vector<double> v(70, -1.5);
    for (size_t i : {0, 17, 33, 69}) v[i] = nan;
    const fl::Tensor x = test::make(v, fl::Shape{70}, dt);
    for (auto [name, fn] : std::vector<std::pair<const char*, UnaryFn>>{
             {"relu", &fl::relu}, {"abs", &fl::abs}, {"sign", &fl::sign}, {"sigmoid", &fl::sigmoid}, {"gelu", &fl::gelu},
             {"floor", &fl::floor}, {"round", &fl::round}, {"erf", &fl::erf}, {"expm1", &fl::expm1}}) {
      CAPTURE(name);
      const std::vector<double> got = test::values(fn(x));
      for (size_t i = 0; i < v.size(); ++i) CHECK(std::isnan(got[i]) == std::isnan(v[i]));
    }
    const fl::Tensor zero = fl::zeros(fl::Shape{70}, dt);
    for (const fl::Tensor& got : {fl::maximum(x, zero), fl::maximum(zero, x), fl::minimum(x, zero), fl::minimum(zero, x),
                                  fl::clamp(x, -1.0, 1.0), fl::relu(x * 2.0)}) {
      const std::vector<double> values = test::values(got);
      for (size_t i = 0; i < v.size(); ++i) CHECK(std::isnan(values[i]) == std::isnan(v[i]));
    }
  }
  // relu agrees with maximum(x, 0) on the edges.
  const fl::Tensor edges = fl::tensor({static_cast<float>(nan), -0.0f, 0.0f, -2.0f, 3.0f});
  const std::vector<float> relu = fl::relu(edges).to_vector<float>();
  const std::vector<float> max0 = fl::maximum(edges, fl::zeros_like(edges)).to_vector<float>();
  CHECK(std::isnan(relu[0]));
  CHECK(std::isnan(max0[0]));
  for (size_t i = 1; i < relu.size(); ++i) CHECK(relu[i] == max0[i]);
}

TEST_CASE("max and argmax keep NaN: max is NaN and argmax is the first NaN's index, at every position") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (fl::DType dt : kFloatMathDTypes) {
    CAPTURE(dt);
    for (int64_t n : {1, 7, 16, 70, 1000}) {
      for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
        CAPTURE(n);
        CAPTURE(at);
        std::vector<double> v(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<double>((i * 7) % 11) - 5.0;
        v[static_cast<size_t>(at)] = nan;
        if (at + 1 < n) v[static_cast<size_t>(n - 1)] = nan;  // a later NaN does not move argmax
        const fl::Tensor x = test::make(v, fl::Shape{n}, dt);
        CHECK(std::isnan(test::values(fl::max(x))[0]));
        CHECK(fl::argmax(x, 0).item<int64_t>() == at);
        // Along an axis: only the row holding the NaN becomes NaN.
        const fl::Tensor rows = fl::concat({fl::reshape(x, {1, n}), fl::zeros(fl::Shape{1, n}, dt)}, 0);
        const std::vector<double> per_row = test::values(fl::max(rows, {1}, false));
        CHECK(std::isnan(per_row[0]));
        CHECK(per_row[1] == 0.0);
      }
    }
  }
}

TEST_CASE("log1p, expm1, erf and gelu on hand-worked values, accurate where the naive forms are not") {
  for (fl::DType dt : test::kFloatDTypes) {
    CAPTURE(dt);
    // log(1 + 1e-10) rounds 1 + 1e-10 first; log1p keeps the small argument's digits.
    check_tensor(fl::log1p(test::make({0, 1e-10, 1, -1}, dt)),
                 {0, 1e-10, std::log(2.0), -std::numeric_limits<double>::infinity()}, fl::Shape{4}, dt);
    check_tensor(fl::expm1(test::make({0, 1e-10, 1, -1000}, dt)), {0, 1e-10, std::exp(1.0) - 1, -1}, fl::Shape{4}, dt);
    check_tensor(fl::erf(test::make({0, 1, -1, 10}, dt)), {0, 0.8427007929497149, -0.8427007929497149, 1}, fl::Shape{4}, dt);
    // GELU(x) = x Phi(x): Phi(1) = 0.8413447460685429; at -10 the result is tiny, not 0.
    check_tensor(fl::gelu(test::make({0, 1, -1, 10}, dt)), {0, 0.8413447460685429, -0.15865525393145707, 10},
                 fl::Shape{4}, dt);
  }
  const double tiny = fl::gelu(fl::tensor({-10.0})).item<double>();
  CHECK(tiny == doctest::Approx(-7.619853024160593e-23).epsilon(1e-12));
}

TEST_CASE("sign, floor and round on hand-worked values; round sends halves to even") {
  for (fl::DType dt : kFloatMathDTypes) {
    CAPTURE(dt);
    check_tensor(fl::sign(test::make({-2.5, -0.0, 0, 3}, dt)), {-1, 0, 0, 1}, fl::Shape{4}, dt);
    check_tensor(fl::floor(test::make({-1.5, -0.5, 0.5, 2.75, 3}, dt)), {-2, -1, 0, 2, 3}, fl::Shape{5}, dt);
    check_tensor(fl::round(test::make({0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 2.25, 2.75}, dt)), {0, 2, 2, -0.0, -2, -2, 2, 3},
                 fl::Shape{8}, dt);
  }
  for (fl::DType dt : {fl::i32, fl::i64}) {
    CAPTURE(dt);
    check_tensor(fl::sign(test::make({-7, 0, 9}, dt)), {-1, 0, 1}, fl::Shape{3}, dt);
  }
  check_tensor(fl::sign(test::make({0, 200}, fl::u8)), {0, 1}, fl::Shape{2}, fl::u8);
  check_op_throws<fl::DTypeError>("floor", [] { (void)fl::floor(fl::tensor({1, 2})); }, {"i32"});
  check_op_throws<fl::DTypeError>("round", [] { (void)fl::round(fl::tensor({1, 2})); }, {"i32"});
}

TEST_CASE("clamp bounds x by scalars or broadcast tensors; lo above hi gives hi") {
  check_tensor(fl::clamp(fl::tensor({-3.0f, -1.0f, 0.5f, 1.0f, 4.0f}), -1.0, 1.0), {-1, -1, 0.5, 1, 1}, fl::Shape{5}, fl::f32);
  check_tensor(fl::clamp(fl::tensor({-3, 0, 9}), 0.0, 6.0), {0, 0, 6}, fl::Shape{3}, fl::i32);
  check_tensor(fl::clamp(fl::tensor({1.0, 5.0}), 3.0, 2.0), {2, 2}, fl::Shape{2}, fl::f64);
  // Per-column bounds broadcast against a [2, 3] x.
  const fl::Tensor x = fl::reshape(fl::tensor({0.0f, 5.0f, -5.0f, 2.0f, 2.0f, 2.0f}), {2, 3});
  check_tensor(fl::clamp(x, fl::tensor({-1.0f, 1.0f, 3.0f}), fl::tensor({1.0f, 4.0f, 4.0f})), {0, 4, 3, 1, 2, 3},
               fl::Shape{2, 3}, fl::f32);
  check_op_throws<fl::InvalidArgument>("clamp", [] { (void)fl::clamp(fl::tensor({1, 2}), 0.5, 1.0); }, {"0.5", "i32"});
  check_op_throws<fl::InvalidArgument>("clamp", [] { (void)fl::clamp(fl::tensor({uint8_t{1}}), -1.0, 1.0); }, {"-1", "u8"});
}

TEST_CASE("an unsigned 64-bit scalar above INT64_MAX throws InvalidArgument instead of wrapping") {
  const uint64_t huge = std::numeric_limits<uint64_t>::max();
  for (fl::DType dt : {fl::i64, fl::i32, fl::u8, fl::f32, fl::f64}) {
    CAPTURE(dt);
    const fl::Tensor t = fl::ones(fl::Shape{2}, dt);
    check_throws<fl::InvalidArgument>([&] { (void)(t + huge); }, {"add", "18446744073709551615", std::string(fl::dtype_name(dt))});
    check_throws<fl::InvalidArgument>([&] { (void)(huge * t); }, {"mul", "18446744073709551615"});
    check_throws<fl::InvalidArgument>([&] { (void)(t < (uint64_t{1} << 63)); }, {"less", "9223372036854775808"});
  }
  // Unsigned values that fit are exact.
  check_tensor(fl::ones(fl::Shape{2}, fl::i64) + uint64_t{5}, {6, 6}, fl::Shape{2}, fl::i64);
  CHECK((fl::zeros(fl::Shape{1}, fl::i64) + uint64_t{INT64_MAX}).to_vector<int64_t>()[0] == INT64_MAX);
}

TEST_CASE("an integer scalar a floating dtype cannot hold exactly, or a float beyond its range, throws InvalidArgument") {
  const int64_t f32_gap = (int64_t{1} << 24) + 1;  // the first integer f32 rounds
  check_throws<fl::InvalidArgument>([&] { (void)(fl::ones(fl::Shape{2}) + f32_gap); }, {"add", "16777217", "f32"});
  check_tensor(fl::zeros(fl::Shape{1}) + (int64_t{1} << 24), {16777216}, fl::Shape{1}, fl::f32);
  check_throws<fl::InvalidArgument>([&] { (void)(fl::ones(fl::Shape{2}, fl::f64) + ((int64_t{1} << 53) + 1)); },
                                    {"add", "9007199254740993", "f64"});
  check_throws<fl::InvalidArgument>([&] { (void)(fl::ones(fl::Shape{2}, fl::f64) * INT64_MAX); }, {"mul", "f64"});
  check_throws<fl::InvalidArgument>([&] { (void)(fl::ones(fl::Shape{2}, fl::f16) + 2049); }, {"add", "2049", "f16"});
  check_throws<fl::InvalidArgument>([&] { (void)(fl::ones(fl::Shape{2}, fl::f16) + 65536); }, {"add", "65536", "f16"});
  check_tensor(fl::zeros(fl::Shape{1}, fl::f16) + 2048, {2048}, fl::Shape{1}, fl::f16);
  check_throws<fl::InvalidArgument>([&] { (void)(fl::ones(fl::Shape{2}, fl::bf16) - 257); }, {"sub", "257", "bf16"});
  check_tensor(fl::zeros(fl::Shape{1}, fl::bf16) + 256, {256}, fl::Shape{1}, fl::bf16);
  // Floating scalars round to the dtype, but one beyond its largest finite value is refused.
  check_throws<fl::InvalidArgument>([&] { (void)(fl::ones(fl::Shape{2}, fl::f16) * 70000.0); }, {"mul", "overflows", "f16"});
  check_throws<fl::InvalidArgument>([&] { (void)(fl::ones(fl::Shape{2}) + 1e39); }, {"add", "overflows", "f32"});
  check_tensor(fl::zeros(fl::Shape{1}, fl::f16) + 65504.0, {65504}, fl::Shape{1}, fl::f16);
  check_tensor(fl::zeros(fl::Shape{1}) + 0.1, {static_cast<double>(0.1f)}, fl::Shape{1}, fl::f32);
  const double inf = std::numeric_limits<double>::infinity();
  check_tensor(fl::zeros(fl::Shape{1}, fl::f16) - inf, {-inf}, fl::Shape{1}, fl::f16);
}

TEST_CASE("NaN propagates through relu and clamp inside a traced (fused) elementwise chain as eagerly") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> v(40000, -1.0f);  // several fused tiles
  for (size_t i : {0, 16383, 16384, 39999}) v[i] = nan;
  const fl::Tensor x = fl::tensor(v, fl::Shape{static_cast<int64_t>(v.size())});
  auto chain = [](fl::Tensor t) { return fl::clamp(fl::relu(t * 2.0f) + 1.0f, 0.0, 5.0) * 3.0f; };
  auto traced = fl::trace(chain);
  const std::vector<float> got = traced(x).to_vector<float>();
  const std::vector<float> eager = chain(x).to_vector<float>();
  REQUIRE(got.size() == v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    CHECK(std::isnan(got[i]) == std::isnan(v[i]));
    if (!std::isnan(v[i])) CHECK(got[i] == eager[i]);
  }
}
