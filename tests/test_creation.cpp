// Creating tensors: tensor, scalar, zeros, ones, full, arange, randn, uniform, and their errors.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "support/reference.hpp"

using test::check_throws;
using test::check_tensor;

namespace {

struct Moments {
  double mean = 0;
  double std = 0;
  double min = 0;
  double max = 0;
};

Moments moments(const std::vector<double>& v) {
  Moments m;
  REQUIRE(!v.empty());
  m.min = v[0];
  m.max = v[0];
  for (double x : v) {
    m.mean += x;
    m.min = std::min(m.min, x);
    m.max = std::max(m.max, x);
  }
  m.mean /= static_cast<double>(v.size());
  double var = 0;
  for (double x : v) var += (x - m.mean) * (x - m.mean);
  m.std = std::sqrt(var / static_cast<double>(v.size()));
  return m;
}

std::vector<double> repeat(double value, int64_t n) { return std::vector<double>(static_cast<size_t>(n), value); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// tensor and scalar

TEST_CASE("tensor takes its dtype from the element type") {
  CHECK(fl::tensor({1.0f, 2.0f}).dtype() == fl::f32);
  CHECK(fl::tensor({1.0, 2.0}).dtype() == fl::f64);
  CHECK(fl::tensor({1, 2}).dtype() == fl::i32);
  CHECK(fl::tensor({int64_t{1}, int64_t{2}}).dtype() == fl::i64);
  CHECK(fl::tensor({uint8_t{1}, uint8_t{2}}).dtype() == fl::u8);
  CHECK(fl::tensor({true, false}).dtype() == fl::b8);
  CHECK(fl::tensor({fl::f16_t(1.0f)}).dtype() == fl::f16);
  CHECK(fl::tensor({fl::bf16_t(1.0f)}).dtype() == fl::bf16);
  const fl::Tensor t = fl::tensor({3, -1, 4});
  CHECK(t.shape() == fl::Shape{3});
  CHECK(t.to_vector<int32_t>() == std::vector<int32_t>{3, -1, 4});
  CHECK(fl::tensor({true, false, true}).to_vector<bool>() == std::vector<bool>{true, false, true});
}

TEST_CASE("tensor with a shape lays the values out row-major") {
  const fl::Tensor t = fl::tensor(std::vector<double>{1, 2, 3, 4, 5, 6}, fl::Shape{3, 2});
  CHECK(t.shape() == fl::Shape{3, 2});
  CHECK(t.dtype() == fl::f64);
  CHECK(t.is_contiguous());
  CHECK(t.to_vector<double>() == std::vector<double>{1, 2, 3, 4, 5, 6});
  // Row 1 (0-based) is [3, 4]: read through a reduction to be sure of the layout.
  check_tensor(fl::sum(t, {1}), {3, 7, 11}, fl::Shape{3}, fl::f64);
  check_tensor(fl::tensor(std::vector<float>{9}, fl::Shape{}), {9}, fl::Shape{}, fl::f32);
  check_tensor(fl::tensor(std::vector<float>{}, fl::Shape{0, 4}), {}, fl::Shape{0, 4}, fl::f32);
  check_tensor(fl::tensor(std::vector<bool>{true, false, false, true}, fl::Shape{2, 2}), {1, 0, 0, 1},
               fl::Shape{2, 2}, fl::b8);
}

TEST_CASE("tensor rejects a value count that does not match the shape") {
  check_throws<fl::ShapeError>([] { (void)fl::tensor(std::vector<float>{1, 2, 3, 4, 5}, fl::Shape{2, 3}); },
                               {"[2, 3]"});
  check_throws<fl::ShapeError>([] { (void)fl::tensor(std::vector<int32_t>{1}, fl::Shape{0}); }, {"[0]"});
  check_throws<fl::ShapeError>([] { (void)fl::tensor(std::vector<float>{1, 2}, fl::Shape{-1, -2}); });
}

TEST_CASE("scalar makes a rank-0 tensor of the value's type") {
  check_tensor(fl::scalar(2.5f), {2.5}, fl::Shape{}, fl::f32);
  check_tensor(fl::scalar(-2.5), {-2.5}, fl::Shape{}, fl::f64);
  check_tensor(fl::scalar(7), {7}, fl::Shape{}, fl::i32);
  check_tensor(fl::scalar(int64_t{1} << 40), {1099511627776.0}, fl::Shape{}, fl::i64);
  check_tensor(fl::scalar(uint8_t{255}), {255}, fl::Shape{}, fl::u8);
  check_tensor(fl::scalar(true), {1}, fl::Shape{}, fl::b8);
  check_tensor(fl::scalar(fl::f16_t(0.5f)), {0.5}, fl::Shape{}, fl::f16);
}

// ---------------------------------------------------------------------------------------------
// zeros, ones, full

TEST_CASE("zeros and ones fill every dtype") {
  for (fl::DType dt : test::kAllDTypes) {
    CAPTURE(dt);
    check_tensor(fl::zeros(fl::Shape{2, 3}, dt), repeat(0, 6), fl::Shape{2, 3}, dt);
    check_tensor(fl::ones(fl::Shape{3, 1, 2}, dt), repeat(1, 6), fl::Shape{3, 1, 2}, dt);
    check_tensor(fl::zeros(fl::Shape{}, dt), {0}, fl::Shape{}, dt);
    check_tensor(fl::ones(fl::Shape{4, 0}, dt), {}, fl::Shape{4, 0}, dt);
    const fl::Tensor like = test::make(test::random_values(6, 1, dt), fl::Shape{3, 2}, dt);
    check_tensor(fl::zeros_like(like), repeat(0, 6), fl::Shape{3, 2}, dt);
    check_tensor(fl::ones_like(like), repeat(1, 6), fl::Shape{3, 2}, dt);
  }
  const fl::Tensor z = fl::zeros(fl::Shape{2});
  CHECK(z.dtype() == fl::f32);
  CHECK(z.device() == fl::Device("cpu:0"));
}

TEST_CASE("full stores the value rounded to the dtype") {
  const std::vector<std::pair<fl::DType, double>> cases = {
      {fl::f32, 0.1},  {fl::f64, 0.1},   {fl::i32, -7},         {fl::i64, 123456789012.0},
      {fl::u8, 255},   {fl::b8, 1},      {fl::b8, 0},           {fl::f16, 0.1},
      {fl::bf16, 0.1}, {fl::f32, -0.0},  {fl::i32, 2147483647}, {fl::i64, -9223372036854775808.0},
  };
  for (const auto& [dt, value] : cases) {
    CAPTURE(dt);
    CAPTURE(value);
    const fl::Tensor t = fl::full(fl::Shape{2, 2}, value, dt);
    check_tensor(t, repeat(test::round_to(value, dt), 4), fl::Shape{2, 2}, dt, test::Tolerance{0, 0});
  }
  // Exact storage, not just close: 0.1 in f32 is the float nearest 0.1.
  CHECK(fl::full(fl::Shape{1}, 0.1, fl::f32).to_vector<float>()[0] == 0.1f);
  CHECK(fl::full(fl::Shape{1}, 0.1, fl::f16).to_vector<fl::f16_t>()[0].bits == fl::f16_t(0.1f).bits);
  CHECK(fl::full(fl::Shape{}, -9223372036854775808.0, fl::i64).item<int64_t>() == std::numeric_limits<int64_t>::min());
  // Infinities and NaN are fine in floating dtypes.
  CHECK(std::isinf(fl::full(fl::Shape{1}, INFINITY, fl::f32).to_vector<float>()[0]));
  CHECK(std::isnan(fl::full(fl::Shape{1}, NAN, fl::f64).to_vector<double>()[0]));
  CHECK(fl::full(fl::Shape{3}, 2.0).dtype() == fl::f32);
}

TEST_CASE("full rejects values the integer dtype cannot represent with InvalidArgument") {
  struct Case {
    fl::DType dtype;
    double value;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {fl::i32, 2.5, {"full", "2.5", "i32"}},
      {fl::u8, 300, {"full", "300", "u8"}},
      {fl::u8, -1, {"full", "-1", "u8"}},
      {fl::i64, 0.5, {"full", "0.5", "i64"}},
      {fl::i32, 2147483648.0, {"full", "i32"}},
      {fl::i64, 9223372036854775808.0, {"full", "i64"}},  // 2^63: one past the largest i64
      {fl::i32, NAN, {"full", "i32"}},
      {fl::i64, INFINITY, {"full", "i64"}},
      {fl::u8, 0.5, {"full", "u8"}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.dtype);
    CAPTURE(c.value);
    check_throws<fl::InvalidArgument>([&] { (void)fl::full(fl::Shape{2}, c.value, c.dtype); }, c.parts);
  }
}

TEST_CASE("creation rejects negative and overflowing shapes with ShapeError") {
  const fl::Shape negative{2, -1};
  check_throws<fl::ShapeError>([&] { (void)fl::zeros(negative); }, {"[2, -1]"});
  check_throws<fl::ShapeError>([&] { (void)fl::ones(negative, fl::i32); }, {"[2, -1]"});
  check_throws<fl::ShapeError>([&] { (void)fl::full(negative, 1.0); }, {"full", "[2, -1]"});
  check_throws<fl::ShapeError>([&] { (void)fl::randn(negative, 1); }, {"randn", "[2, -1]"});
  check_throws<fl::ShapeError>([&] { (void)fl::uniform(negative, 0, 1, 1); }, {"uniform", "[2, -1]"});
  const int64_t big = int64_t{1} << 32;
  const fl::Shape overflowing{big, big};  // 2^64 elements
  check_throws<fl::ShapeError>([&] { (void)fl::zeros(overflowing); });
  check_throws<fl::ShapeError>([&] { (void)fl::full(fl::Shape{std::numeric_limits<int64_t>::max(), 2}, 0.0); });
  check_throws<fl::ShapeError>([&] { (void)fl::randn(fl::Shape{big, big, 0, -1}, 1); });
  check_throws<fl::ShapeError>([&] { (void)fl::uniform(overflowing, 0, 1, 1); });
  // A zero dimension makes a huge shape empty, not an overflow.
  check_tensor(fl::zeros(fl::Shape{big, 0}), {}, fl::Shape{big, 0}, fl::f32);
}

TEST_CASE("creation on a device that does not exist throws DeviceError") {
  const fl::Device cuda("cuda:0");
  const fl::Device cpu1("cpu:1");
  check_throws<fl::DeviceError>([&] { (void)fl::zeros(fl::Shape{2}, fl::f32, cuda); }, {"cuda:0"});
  check_throws<fl::DeviceError>([&] { (void)fl::ones(fl::Shape{2}, fl::f32, cpu1); }, {"cpu:1"});
  check_throws<fl::DeviceError>([&] { (void)fl::full(fl::Shape{2}, 1.0, fl::f32, cpu1); }, {"full", "cpu:1"});
  check_throws<fl::DeviceError>([&] { (void)fl::arange(3, fl::i64, cuda); }, {"arange", "cuda:0"});
  check_throws<fl::DeviceError>([&] { (void)fl::randn(fl::Shape{2}, 1, fl::f32, cuda); }, {"randn", "cuda:0"});
  check_throws<fl::DeviceError>([&] { (void)fl::uniform(fl::Shape{2}, 0, 1, 1, fl::f32, cpu1); }, {"uniform", "cpu:1"});
}

// ---------------------------------------------------------------------------------------------
// arange

TEST_CASE("arange counts from zero in i64 by default and in other dtypes on request") {
  check_tensor(fl::arange(5), {0, 1, 2, 3, 4}, fl::Shape{5}, fl::i64);
  for (fl::DType dt : {fl::f32, fl::f64, fl::i32, fl::i64, fl::u8}) {
    CAPTURE(dt);
    std::vector<double> expected;
    for (int i = 0; i < 200; ++i) expected.push_back(i);
    check_tensor(fl::arange(200, dt), expected, fl::Shape{200}, dt);
    check_tensor(fl::arange(0, dt), {}, fl::Shape{0}, dt);
    check_tensor(fl::arange(1, dt), {0}, fl::Shape{1}, dt);
  }
  // Large counts stay exact in i64 and f64.
  const std::vector<int64_t> big = fl::arange(100000).to_vector<int64_t>();
  REQUIRE(big.size() == 100000);
  CHECK(big[99999] == 99999);
  CHECK(big[12345] == 12345);
}

// ---------------------------------------------------------------------------------------------
// randn and uniform

TEST_CASE("randn is deterministic for a seed and differs between seeds") {
  for (fl::DType dt : test::kFloatDTypes) {
    CAPTURE(dt);
    const std::vector<double> a = test::values(fl::randn(fl::Shape{64}, 42, dt));
    const std::vector<double> b = test::values(fl::randn(fl::Shape{64}, 42, dt));
    const std::vector<double> c = test::values(fl::randn(fl::Shape{64}, 43, dt));
    REQUIRE(a.size() == 64);
    CHECK(a == b);
    int same = 0;
    for (size_t i = 0; i < a.size(); ++i) same += a[i] == c[i] ? 1 : 0;
    CHECK(same == 0);
    // Not a constant and not a trivial sequence.
    std::vector<double> sorted = a;
    std::sort(sorted.begin(), sorted.end());
    CHECK(std::unique(sorted.begin(), sorted.end()) == sorted.end());
  }
  const fl::Tensor t = fl::randn(fl::Shape{2, 3}, 0);
  CHECK(t.dtype() == fl::f32);
  CHECK(t.shape() == fl::Shape{2, 3});
  check_tensor(fl::randn(fl::Shape{0, 3}, 5), {}, fl::Shape{0, 3}, fl::f32);
}

TEST_CASE("random element i depends only on the seed and i") {
  for (fl::DType dt : test::kFloatDTypes) {
    CAPTURE(dt);
    const std::vector<double> small = test::values(fl::randn(fl::Shape{100}, 7, dt));
    const std::vector<double> large = test::values(fl::randn(fl::Shape{1000}, 7, dt));
    const std::vector<double> matrix = test::values(fl::randn(fl::Shape{10, 10}, 7, dt));
    REQUIRE(small.size() == 100);
    REQUIRE(large.size() == 1000);
    CHECK(std::equal(small.begin(), small.end(), large.begin()));
    CHECK(matrix == small);
    const std::vector<double> u_small = test::values(fl::uniform(fl::Shape{33}, -2, 5, 9, dt));
    const std::vector<double> u_large = test::values(fl::uniform(fl::Shape{3, 100}, -2, 5, 9, dt));
    REQUIRE(u_small.size() == 33);
    CHECK(std::equal(u_small.begin(), u_small.end(), u_large.begin()));
  }
}

TEST_CASE("randn has mean 0 and standard deviation 1") {
  for (fl::DType dt : test::kFloatDTypes) {
    for (uint64_t seed : {1u, 2024u}) {
      CAPTURE(dt);
      CAPTURE(seed);
      const std::vector<double> v = test::values(fl::randn(fl::Shape{100000}, seed, dt));
      const Moments m = moments(v);
      CHECK(std::abs(m.mean) < 0.02);
      CHECK(std::abs(m.std - 1.0) < 0.02);
      CHECK(m.max < 6.5);
      CHECK(m.min > -6.5);
      CHECK(m.max > 3.0);  // tails exist
      CHECK(m.min < -3.0);
      int64_t within_one = 0;
      int64_t positive = 0;
      for (double x : v) {
        within_one += std::abs(x) < 1.0 ? 1 : 0;
        positive += x > 0 ? 1 : 0;
      }
      CHECK(std::abs(static_cast<double>(within_one) / 1e5 - 0.682689) < 0.01);
      CHECK(std::abs(static_cast<double>(positive) / 1e5 - 0.5) < 0.01);
    }
  }
}

TEST_CASE("uniform stays in [lo, hi) with the right mean and spread") {
  struct Case {
    double lo;
    double hi;
  };
  for (fl::DType dt : test::kFloatDTypes) {
    for (const Case& c : {Case{0, 1}, Case{-3, 5}, Case{10, 10.5}}) {
      CAPTURE(dt);
      CAPTURE(c.lo);
      CAPTURE(c.hi);
      const fl::Tensor t = fl::uniform(fl::Shape{400, 250}, c.lo, c.hi, 11, dt);
      CHECK(t.dtype() == dt);
      CHECK(t.shape() == fl::Shape{400, 250});
      const std::vector<double> v = test::values(t);
      const Moments m = moments(v);
      CHECK(m.min >= c.lo);
      CHECK(m.max < c.hi);
      const double width = c.hi - c.lo;
      CHECK(std::abs(m.mean - (c.lo + c.hi) / 2) < 0.01 * width);
      CHECK(std::abs(m.std - width / std::sqrt(12.0)) < 0.01 * width);
      CHECK(m.min < c.lo + 0.001 * width);
      CHECK(m.max > c.hi - 0.001 * width);
    }
  }
  const std::vector<double> a = test::values(fl::uniform(fl::Shape{50}, 0, 1, 3));
  const std::vector<double> b = test::values(fl::uniform(fl::Shape{50}, 0, 1, 3));
  const std::vector<double> c = test::values(fl::uniform(fl::Shape{50}, 0, 1, 4));
  CHECK(a == b);
  CHECK(a != c);
  CHECK(fl::uniform(fl::Shape{2}, 0, 1, 3).dtype() == fl::f32);
}

TEST_CASE("uniform rejects an empty or reversed range with InvalidArgument") {
  check_throws<fl::InvalidArgument>([] { (void)fl::uniform(fl::Shape{2}, 1.0, 1.0, 0); }, {"uniform"});
  check_throws<fl::InvalidArgument>([] { (void)fl::uniform(fl::Shape{2}, 2.0, -1.0, 0); }, {"uniform"});
  check_throws<fl::InvalidArgument>([] { (void)fl::uniform(fl::Shape{2}, 2.0, -1.0, 0, fl::f64); }, {"uniform"});
}
