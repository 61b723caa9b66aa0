// Reductions: sum, mean, max (all axes or some, keepdims, negative axes) and argmax, with their dtype
// rules, accuracy, empty and non-contiguous inputs, NaN handling and errors.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "support/reference.hpp"

using test::check_op_throws;
using test::check_tensor;
using test::check_throws;
using test::Host;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

fl::Tensor matrix23() { return fl::tensor(std::vector<float>{1, 2, 3, 4, 5, 6}, fl::Shape{2, 3}); }

fl::DType sum_dtype(fl::DType dt) { return test::is_float(dt) ? dt : fl::i64; }

Host mean_ref(const Host& x, const std::vector<int64_t>& axes, bool keepdims) {
  Host s = test::sum_ref(x, axes, keepdims);
  const std::vector<int64_t> ax = test::normalize_axes(axes, x.shape.size());
  double count = 1;
  for (int64_t a : ax) count *= static_cast<double>(x.shape[static_cast<size_t>(a)]);
  for (double& v : s.values) v = count == 0 ? kNaN : v / count;
  return s;
}

// Axis lists for a rank-3 input: none, single (positive and negative), pairs, all.
const std::vector<std::vector<int64_t>> kAxisLists = {{}, {0}, {1}, {2}, {-1}, {0, 2}, {-3, -2}, {2, 0}, {0, 1, 2}};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Hand-worked

TEST_CASE("sum, mean and max of a small matrix over each axis") {
  const fl::Tensor t = matrix23();
  check_tensor(fl::sum(t), {21}, fl::Shape{}, fl::f32);
  check_tensor(fl::sum(t, {0}), {5, 7, 9}, fl::Shape{3}, fl::f32);
  check_tensor(fl::sum(t, {1}), {6, 15}, fl::Shape{2}, fl::f32);
  check_tensor(fl::sum(t, {-1}), {6, 15}, fl::Shape{2}, fl::f32);
  check_tensor(fl::sum(t, {0, 1}), {21}, fl::Shape{}, fl::f32);
  check_tensor(fl::mean(t), {3.5}, fl::Shape{}, fl::f32);
  check_tensor(fl::mean(t, {0}), {2.5, 3.5, 4.5}, fl::Shape{3}, fl::f32);
  check_tensor(fl::mean(t, {-1}), {2, 5}, fl::Shape{2}, fl::f32);
  check_tensor(fl::max(t), {6}, fl::Shape{}, fl::f32);
  check_tensor(fl::max(t, {0}), {4, 5, 6}, fl::Shape{3}, fl::f32);
  check_tensor(fl::max(t, {1}), {3, 6}, fl::Shape{2}, fl::f32);
  check_tensor(fl::argmax(t, 1), {2, 2}, fl::Shape{2}, fl::i64);
  check_tensor(fl::argmax(t, 0), {1, 1, 1}, fl::Shape{3}, fl::i64);
  check_tensor(fl::argmax(t, -1), {2, 2}, fl::Shape{2}, fl::i64);
}

TEST_CASE("keepdims keeps reduced axes as size 1, and not otherwise") {
  const fl::Tensor t = matrix23();
  check_tensor(fl::sum(t, {1}, true), {6, 15}, fl::Shape{2, 1}, fl::f32);
  check_tensor(fl::sum(t, {1}, false), {6, 15}, fl::Shape{2}, fl::f32);
  check_tensor(fl::sum(t, {0}, true), {5, 7, 9}, fl::Shape{1, 3}, fl::f32);
  check_tensor(fl::sum(t, {0, 1}, true), {21}, fl::Shape{1, 1}, fl::f32);
  check_tensor(fl::mean(t, {-1}, true), {2, 5}, fl::Shape{2, 1}, fl::f32);
  check_tensor(fl::max(t, {0, -1}, true), {6}, fl::Shape{1, 1}, fl::f32);
  check_tensor(fl::max(t, {0}, false), {4, 5, 6}, fl::Shape{3}, fl::f32);
  // keepdims results broadcast back against the input: centering rows.
  check_tensor(t - fl::mean(t, {1}, true), {-1, 0, 1, -1, 0, 1}, fl::Shape{2, 3}, fl::f32);
}

TEST_CASE("an empty axes list reduces nothing") {
  const fl::Tensor t = matrix23();
  const fl::Tensor s = fl::sum(t, {});
  check_tensor(s, {1, 2, 3, 4, 5, 6}, fl::Shape{2, 3}, fl::f32);
  check_tensor(fl::sum(t, {}, true), {1, 2, 3, 4, 5, 6}, fl::Shape{2, 3}, fl::f32);
  check_tensor(fl::max(t, {}), {1, 2, 3, 4, 5, 6}, fl::Shape{2, 3}, fl::f32);
  check_tensor(fl::mean(t, {}), {1, 2, 3, 4, 5, 6}, fl::Shape{2, 3}, fl::f32);
  // Integer inputs still get the sum dtype.
  check_tensor(fl::sum(fl::tensor({1, 2}), {}), {1, 2}, fl::Shape{2}, fl::i64);
}

TEST_CASE("reductions of a rank-0 tensor return it") {
  check_tensor(fl::sum(fl::scalar(5.0f)), {5}, fl::Shape{}, fl::f32);
  check_tensor(fl::max(fl::scalar(-2.0)), {-2}, fl::Shape{}, fl::f64);
  check_tensor(fl::mean(fl::scalar(3.0)), {3}, fl::Shape{}, fl::f64);
  check_tensor(fl::sum(fl::scalar(7)), {7}, fl::Shape{}, fl::i64);
}

// ---------------------------------------------------------------------------------------------
// dtypes

TEST_CASE("integer and b8 sums are i64 and do not overflow the input type") {
  check_tensor(fl::sum(fl::full(fl::Shape{200}, 255, fl::u8)), {51000}, fl::Shape{}, fl::i64);
  check_tensor(fl::sum(fl::tensor({2147483647, 2147483647})), {4294967294.0}, fl::Shape{}, fl::i64);
  check_tensor(fl::sum(fl::tensor({true, false, true, true})), {3}, fl::Shape{}, fl::i64);
  check_tensor(fl::sum(fl::tensor(std::vector<bool>{true, false, true, true}, fl::Shape{2, 2}), {0}), {2, 1}, fl::Shape{2},
               fl::i64);
  check_tensor(fl::sum(fl::tensor({int64_t{1} << 60, int64_t{1} << 60})), {std::ldexp(1.0, 61)}, fl::Shape{}, fl::i64);
  // Comparisons count through sum.
  check_tensor(fl::sum(fl::arange(10) > int64_t{6}), {3}, fl::Shape{}, fl::i64);
}

TEST_CASE("max keeps the input dtype") {
  check_tensor(fl::max(fl::tensor({3, -7, 5})), {5}, fl::Shape{}, fl::i32);
  check_tensor(fl::max(fl::tensor({int64_t{-3}, int64_t{-7}})), {-3}, fl::Shape{}, fl::i64);
  check_tensor(fl::max(fl::tensor({uint8_t{3}, uint8_t{250}})), {250}, fl::Shape{}, fl::u8);
  check_tensor(fl::max(fl::tensor({-1.5, -0.5})), {-0.5}, fl::Shape{}, fl::f64);
}

TEST_CASE("sum of 16M f32 values of 0.1 is accurate to 1e-6 relative") {
  const int64_t n = int64_t{1} << 24;
  const fl::Tensor t = fl::full(fl::Shape{n}, 0.1, fl::f32);
  const fl::Tensor s = fl::sum(t);
  REQUIRE(s.dtype() == fl::f32);
  REQUIRE(s.shape() == fl::Shape{});
  const double got = static_cast<double>(s.item<float>());
  CHECK(std::abs(got - 1677721.6) / 1677721.6 < 1e-6);
  CHECK(std::abs(static_cast<double>(fl::mean(t).item<float>()) - 0.1) < 1e-7);
  // Along an axis too: 4096 columns of 4096 rows each.
  const fl::Tensor cols = fl::sum(fl::reshape(t, fl::Shape{4096, 4096}), {0});
  const std::vector<float> cv = cols.to_vector<float>();
  REQUIRE(cv.size() == 4096);
  double worst = 0;
  for (float v : cv) worst = std::max(worst, std::abs(static_cast<double>(v) - 409.6) / 409.6);
  CHECK(worst < 1e-6);
}

// ---------------------------------------------------------------------------------------------
// Against the reference

TEST_CASE("full reductions are exact at every length from 0 to 130, vector tails included") {
  int compared = 0;
  uint64_t seed = 4000;
  for (fl::DType dt : {fl::f32, fl::f64, fl::i32, fl::i64, fl::u8, fl::b8}) {
    for (int64_t n = 0; n <= 130; ++n) {
      CAPTURE(dt);
      CAPTURE(n);
      const fl::Tensor x = test::random_tensor(fl::Shape{n}, seed++, dt);
      const Host h = test::host(x);
      const Host s = test::sum_ref(h, {0});
      check_tensor(fl::sum(x), s.values, fl::Shape{}, sum_dtype(dt));
      check_tensor(fl::sum(x, {0}), s.values, fl::Shape{}, sum_dtype(dt));
      if (n > 0 && dt != fl::b8) {
        check_tensor(fl::max(x), test::max_ref(h, {0}).values, fl::Shape{}, dt);
        check_tensor(fl::argmax(x, 0), test::argmax_ref(h, 0).values, fl::Shape{}, fl::i64);
      }
      ++compared;
    }
  }
  // The largest u8 values, where a narrow accumulator would wrap.
  for (int64_t n : {16, 31, 32, 33, 64, 100, 255, 256, 1000}) {
    CAPTURE(n);
    check_tensor(fl::sum(fl::full(fl::Shape{n}, 255, fl::u8)), {255.0 * static_cast<double>(n)}, fl::Shape{}, fl::i64);
  }
  CHECK(compared == 6 * 131);
}


TEST_CASE("sum, mean and max match the f64 reference over every axis list, keepdims both ways") {
  int compared = 0;
  uint64_t seed = 1;
  const std::vector<fl::Shape> shapes = {{3, 4, 5}, {1, 6, 1}, {2, 1, 3}};
  for (const fl::Shape& shape : shapes) {
    for (const auto& axes : kAxisLists) {
      for (bool keepdims : {false, true}) {
        CAPTURE(shape);
        CAPTURE(keepdims);
        CAPTURE(axes.size());
        for (fl::DType dt : {fl::f32, fl::f64, fl::i32, fl::i64, fl::u8, fl::b8}) {
          CAPTURE(dt);
          const fl::Tensor x = test::random_tensor(shape, seed++, dt);
          const Host want = test::sum_ref(test::host(x), axes, keepdims);
          check_tensor(fl::sum(x, axes, keepdims), want.values, want.shape, sum_dtype(dt));
          ++compared;
          if (dt == fl::b8) continue;
          const Host want_max = test::max_ref(test::host(x), axes, keepdims);
          check_tensor(fl::max(x, axes, keepdims), want_max.values, want_max.shape, dt);
          if (dt == fl::f32 || dt == fl::f64) {
            const Host want_mean = mean_ref(test::host(x), axes, keepdims);
            check_tensor(fl::mean(x, axes, keepdims), want_mean.values, want_mean.shape, dt);
          }
        }
      }
    }
  }
  CHECK(compared == 3 * 9 * 2 * 6);
}

TEST_CASE("reductions give the same results for non-contiguous inputs") {
  int compared = 0;
  uint64_t seed = 900;
  for (fl::DType dt : {fl::f32, fl::f64, fl::i32, fl::u8}) {
    for (const auto& axes : kAxisLists) {
      CAPTURE(dt);
      CAPTURE(axes.size());
      const fl::Tensor x = test::random_tensor(fl::Shape{3, 4, 5}, seed++, dt);
      const Host h = test::host(x);
      for (const fl::Tensor& view : {test::permuted_view(x), test::strided_view(x)}) {
        const Host s = test::sum_ref(h, axes, false);
        check_tensor(fl::sum(view, axes), s.values, s.shape, sum_dtype(dt));
        const Host m = test::max_ref(h, axes, true);
        check_tensor(fl::max(view, axes, true), m.values, m.shape, dt);
        if (dt == fl::f32 || dt == fl::f64) {
          const Host mm = mean_ref(h, axes, false);
          check_tensor(fl::mean(view, axes), mm.values, mm.shape, dt);
        }
        ++compared;
      }
    }
  }
  // Full reductions of views.
  const fl::Tensor x = test::random_tensor(fl::Shape{6, 7}, 5, fl::f64);
  check_tensor(fl::sum(fl::transpose(x)), test::sum_ref(test::host(x), {0, 1}).values, fl::Shape{}, fl::f64);
  check_tensor(fl::max(test::strided_view(x)), test::max_ref(test::host(x), {0, 1}).values, fl::Shape{}, fl::f64);
  CHECK(compared == 4 * 9 * 2);
}

TEST_CASE("argmax matches the reference and picks the first maximum") {
  check_tensor(fl::argmax(fl::tensor({1, 3, 3, 2}), 0), {1}, fl::Shape{}, fl::i64);
  check_tensor(fl::argmax(fl::tensor({-5.0f, -5.0f}), 0), {0}, fl::Shape{}, fl::i64);
  int compared = 0;
  uint64_t seed = 1234;
  for (fl::DType dt : {fl::f32, fl::f64, fl::i32, fl::i64, fl::u8}) {
    for (int64_t axis : {0, 1, 2, -1, -3}) {
      CAPTURE(dt);
      CAPTURE(axis);
      // Small integer values make ties common, which exercises the first-index rule.
      const fl::Tensor x = test::random_tensor(fl::Shape{3, 4, 5}, seed++, dt, test::Domain::small_ints);
      const Host want = test::argmax_ref(test::host(x), axis);
      check_tensor(fl::argmax(x, axis), want.values, want.shape, fl::i64);
      check_tensor(fl::argmax(test::permuted_view(x), axis), want.values, want.shape, fl::i64);
      check_tensor(fl::argmax(test::strided_view(x), axis), want.values, want.shape, fl::i64);
      ++compared;
    }
  }
  CHECK(compared == 25);
}

// ---------------------------------------------------------------------------------------------
// NaN and empty inputs

TEST_CASE("max propagates NaN and argmax treats NaN as the maximum") {
  const fl::Tensor t = fl::tensor(std::vector<float>{1, NAN, 3, 4, 5, 6}, fl::Shape{2, 3});
  check_tensor(fl::max(t), {kNaN}, fl::Shape{}, fl::f32);
  check_tensor(fl::max(t, {1}), {kNaN, 6}, fl::Shape{2}, fl::f32);
  check_tensor(fl::max(t, {0}), {4, kNaN, 6}, fl::Shape{3}, fl::f32);
  check_tensor(fl::argmax(t, 1), {1, 2}, fl::Shape{2}, fl::i64);
  check_tensor(fl::argmax(fl::tensor(std::vector<double>{NAN, 9.0, NAN}, fl::Shape{3}), 0), {0}, fl::Shape{}, fl::i64);
  check_tensor(fl::sum(t, {1}), {kNaN, 15}, fl::Shape{2}, fl::f32);
}

TEST_CASE("reductions over zero elements") {
  const fl::Tensor e = fl::zeros(fl::Shape{0, 3});
  check_tensor(fl::sum(e), {0}, fl::Shape{}, fl::f32);
  check_tensor(fl::sum(e, {0}), {0, 0, 0}, fl::Shape{3}, fl::f32);
  check_tensor(fl::sum(e, {1}), {}, fl::Shape{0}, fl::f32);
  check_tensor(fl::sum(e, {0}, true), {0, 0, 0}, fl::Shape{1, 3}, fl::f32);
  check_tensor(fl::sum(fl::zeros(fl::Shape{0}, fl::i32)), {0}, fl::Shape{}, fl::i64);
  check_tensor(fl::mean(fl::zeros(fl::Shape{0})), {kNaN}, fl::Shape{}, fl::f32);
  check_tensor(fl::mean(e, {0}), {kNaN, kNaN, kNaN}, fl::Shape{3}, fl::f32);
  check_tensor(fl::mean(e, {1}), {}, fl::Shape{0}, fl::f32);
  // Reducing a non-empty axis of an empty tensor is fine.
  check_tensor(fl::max(e, {1}), {}, fl::Shape{0}, fl::f32);
  check_tensor(fl::argmax(e, 1), {}, fl::Shape{0}, fl::i64);
  check_tensor(fl::max(fl::zeros(fl::Shape{2, 0, 3}), {0}, true), {}, fl::Shape{1, 0, 3}, fl::f32);
}

TEST_CASE("max and argmax over a zero-size axis throw InvalidArgument") {
  const fl::Tensor e = fl::zeros(fl::Shape{0, 3});
  check_op_throws<fl::InvalidArgument>("max", [&] { (void)fl::max(e); });
  check_op_throws<fl::InvalidArgument>("max", [&] { (void)fl::max(e, {0}); }, {"[0, 3]"});
  check_op_throws<fl::InvalidArgument>("max", [&] { (void)fl::max(fl::zeros(fl::Shape{0}, fl::i32)); });
  check_op_throws<fl::InvalidArgument>("argmax", [&] { (void)fl::argmax(e, 0); }, {"[0, 3]"});
  check_op_throws<fl::InvalidArgument>("argmax", [&] { (void)fl::argmax(fl::zeros(fl::Shape{3, 0}), -1); });
}

// ---------------------------------------------------------------------------------------------
// Errors

TEST_CASE("axes out of range or repeated throw InvalidArgument") {
  const fl::Tensor t = matrix23();
  check_op_throws<fl::InvalidArgument>("sum", [&] { (void)fl::sum(t, {2}); }, {"2"});
  check_op_throws<fl::InvalidArgument>("sum", [&] { (void)fl::sum(t, {-3}); }, {"-3"});
  check_op_throws<fl::InvalidArgument>("sum", [&] { (void)fl::sum(t, {0, 0}); });
  check_op_throws<fl::InvalidArgument>("sum", [&] { (void)fl::sum(t, {1, -1}); });
  check_op_throws<fl::InvalidArgument>("max", [&] { (void)fl::max(t, {5}); }, {"5"});
  check_op_throws<fl::InvalidArgument>("max", [&] { (void)fl::max(t, {0, -2}); });
  check_op_throws<fl::InvalidArgument>("argmax", [&] { (void)fl::argmax(t, 2); }, {"2"});
  check_op_throws<fl::InvalidArgument>("argmax", [&] { (void)fl::argmax(t, -3); }, {"-3"});
  check_op_throws<fl::InvalidArgument>("sum", [&] { (void)fl::sum(fl::scalar(1.0f), {0}); });
  // mean is built from sum; its errors name the problem either way.
  check_throws<fl::InvalidArgument>([&] { (void)fl::mean(t, {2}); }, {"2"});
  check_throws<fl::InvalidArgument>([&] { (void)fl::mean(t, {1, 1}); });
}

TEST_CASE("sum, mean, max and argmax of f16 and bf16 keep the dtype and accumulate in f64") {
  for (fl::DType dt : test::kHalfDTypes) {
    CAPTURE(dt);
    // 10000 ones: a half accumulator stalls at 2048 (f16) or 256 (bf16), where adding 1 rounds
    // away; 10000 itself is exact in f16 (a multiple of its step 8 there), and rounds to 9984 in
    // bf16 (step 64), the correctly rounded result.
    const fl::Tensor ones = fl::ones(fl::Shape{10000}, dt);
    check_tensor(fl::sum(ones), {dt == fl::f16 ? 10000.0 : 9984.0}, fl::Shape{}, dt, test::Tolerance{0, 0});
    check_tensor(fl::mean(ones), {1}, fl::Shape{}, dt, test::Tolerance{0, 0});
    // Column sums of a long axis (the strided path) too.
    check_tensor(fl::sum(fl::ones(fl::Shape{4096, 3}, dt), {0}), {4096, 4096, 4096}, fl::Shape{3}, dt,
                 test::Tolerance{0, 0});
    const fl::Tensor h = test::make({1, -2.5, 3.25, 7, -8, 0.5}, fl::Shape{2, 3}, dt);
    check_tensor(fl::max(h, {1}), {3.25, 7}, fl::Shape{2}, dt, test::Tolerance{0, 0});
    check_tensor(fl::max(h), {7}, fl::Shape{}, dt, test::Tolerance{0, 0});
    check_tensor(fl::argmax(h, 0), {1, 0, 0}, fl::Shape{3}, fl::i64);
    check_tensor(fl::sum(h, {0}, true), {8, -10.5, 3.75}, fl::Shape{1, 3}, dt, test::Tolerance{0, 0});
  }
}

TEST_CASE("mean of integers throws DTypeError") {
  for (fl::DType dt : {fl::i32, fl::i64, fl::u8, fl::b8}) {
    CAPTURE(dt);
    check_throws<fl::DTypeError>([&] { (void)fl::mean(fl::ones(fl::Shape{3}, dt)); }, {std::string(fl::dtype_name(dt))});
  }
  // Converting first is the documented way.
  check_tensor(fl::mean(fl::arange(4).astype(fl::f64)), {1.5}, fl::Shape{}, fl::f64);
}
