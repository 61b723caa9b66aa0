// Reductions: sum, mean, max (all axes or some, keepdims, negative axes) and argmax, with their dtype
// rules, accuracy, empty and non-contiguous inputs, NaN handling and errors.
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "support/reference.hpp"
#include "support/thread_count_child.hpp"

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

TEST_CASE("sum of 16M f32 values of 0.1 is accurate to 1e-7 relative") {
  const int64_t n = int64_t{1} << 24;
  const fl::Tensor t = fl::full(fl::Shape{n}, 0.1, fl::f32);
  const fl::Tensor s = fl::sum(t);
  REQUIRE(s.dtype() == fl::f32);
  REQUIRE(s.shape() == fl::Shape{});
  const double got = static_cast<double>(s.item<float>());
  CHECK(std::abs(got - 1677721.6) / 1677721.6 < 1e-7);  // issue 18's target; a plain f32 loop: 2.5e-3
  CHECK(std::abs(static_cast<double>(fl::mean(t).item<float>()) - 0.1) < 1e-7);
  // Along an axis too: 4096 columns of 4096 rows each.
  const fl::Tensor cols = fl::sum(fl::reshape(t, fl::Shape{4096, 4096}), {0});
  const std::vector<float> cv = cols.to_vector<float>();
  REQUIRE(cv.size() == 4096);
  double worst = 0;
  for (float v : cv) worst = std::max(worst, std::abs(static_cast<double>(v) - 409.6) / 409.6);
  CHECK(worst < 1e-6);
}

TEST_CASE("f32 sums stay within the stated bound: 4 (rows) or 3 (columns) f32 roundings per element, then f64") {
  // src/kernels/reduce_f32.hpp: each element of a row passes through a 4-level f32 tree (16 per
  // lane), of a column through a 3-level one (8 rows), so the kernel's error is at most 4 (3) *
  // 2^-24 of the sum of magnitudes (+ f64 rounding), and the f32 result adds its own rounding
  // (2^-24 relative). Random data of one sign and of both, rows and columns, lengths around the
  // tree and chunk sizes; the reference sums the stored f32 values in f64.
  const double u = 0x1p-24;
  uint64_t seed = 500;
  for (int64_t n : {1, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1000, 32768, 32769, 100003}) {
    for (bool mixed : {false, true}) {
      CAPTURE(n);
      CAPTURE(mixed);
      const fl::Tensor x = fl::uniform(fl::Shape{n}, mixed ? -1.0 : 0.0, 1.0, seed++);
      const std::vector<float> v = x.to_vector<float>();
      double exact = 0, magnitude = 0;
      for (float e : v) {
        exact += static_cast<double>(e);
        magnitude += std::abs(static_cast<double>(e));
      }
      const double got = static_cast<double>(fl::sum(x).item<float>());
      CHECK(std::abs(got - exact) <= 4 * u * magnitude + u * std::abs(exact) + 1e-12 * magnitude);
      const int64_t cols = 3;
      const fl::Tensor m = fl::reshape(fl::uniform(fl::Shape{n * cols}, mixed ? -1.0 : 0.0, 1.0, seed++), fl::Shape{n, cols});
      const std::vector<float> mv = m.to_vector<float>();
      const std::vector<float> col = fl::sum(m, {0}).to_vector<float>();
      for (int64_t j = 0; j < cols; ++j) {
        double e = 0, mag = 0;
        for (int64_t r = 0; r < n; ++r) {
          e += static_cast<double>(mv[static_cast<size_t>(r * cols + j)]);
          mag += std::abs(static_cast<double>(mv[static_cast<size_t>(r * cols + j)]));
        }
        CHECK(std::abs(static_cast<double>(col[static_cast<size_t>(j)]) - e) <= 3 * u * mag + u * std::abs(e) + 1e-12 * mag);
      }
    }
  }
}

TEST_CASE("f32 sums of adversarial inputs stay within 1e-7 relative of the exact sum") {
  // Pairs (1, just under half an ulp of 1): an f32 add of a one and a small value rounds the small
  // one away (2^-24 relative: the most one level of the kernel's f32 tree loses on these inputs).
  // Plain f32 accumulation would also drop every small term, and stall once the total is large.
  const int64_t n = int64_t{1} << 22;
  const float small = 0x1.fcp-25f;  // 0.99 x 2^-24
  // Half ones, half small values, alternating in runs of 1 to 64 (whichever elements the kernel
  // pairs up, some runs put a one beside a small value).
  std::vector<float> pairs(static_cast<size_t>(n));
  const double exact_pairs = static_cast<double>(n / 2) * (1.0 + static_cast<double>(small));
  for (int64_t run : {1, 2, 8, 32, 64}) {
    CAPTURE(run);
    for (int64_t i = 0; i < n; ++i) pairs[static_cast<size_t>(i)] = (i / run) % 2 == 0 ? 1.0f : small;
    const double got_pairs = static_cast<double>(fl::sum(fl::tensor(pairs, fl::Shape{n})).item<float>());
    CHECK(std::abs(got_pairs - exact_pairs) / exact_pairs <= 1e-7);
  }
  // One huge value, then 2^24 ones: an f32 running total stays at the huge value (1e8 + 1 rounds to
  // 1e8), so a single f32 accumulator loses all 2^24.
  std::vector<float> huge_first(static_cast<size_t>((int64_t{1} << 24) + 1), 1.0f);
  huge_first[0] = 1e8f;
  const double exact_huge = 1e8 + 16777216.0;
  const double got_huge = static_cast<double>(fl::sum(fl::tensor(huge_first, fl::Shape{(int64_t{1} << 24) + 1})).item<float>());
  CHECK(std::abs(got_huge - exact_huge) / exact_huge <= 1e-7);
  // Mean over rows of the pair pattern (the row path: one row per output).
  const fl::Tensor rows = fl::reshape(fl::tensor(pairs, fl::Shape{n}), fl::Shape{4, n / 4});
  const std::vector<float> means = fl::mean(rows, {1}).to_vector<float>();
  const double exact_mean = (1.0 + static_cast<double>(small)) / 2;
  for (float m : means) CHECK(std::abs(static_cast<double>(m) - exact_mean) / exact_mean <= 1e-7);
}

namespace {
// Bits of f32 sums and means over inputs of several sizes and layouts (full, rows, columns).
std::string reduction_bits() {
  std::string bits;
  auto add = [&](const fl::Tensor& t) {
    for (float v : t.to_vector<float>()) bits += fmt::format("{:08x} ", std::bit_cast<uint32_t>(v));
  };
  const fl::Tensor big = fl::uniform(fl::Shape{(int64_t{1} << 23) + 7}, -1.0, 3.0, /*seed=*/11);
  add(fl::sum(big));
  add(fl::mean(big));
  const fl::Tensor rows = fl::uniform(fl::Shape{6, (int64_t{1} << 17) + 5}, -2.0, 1.0, /*seed=*/12);
  add(fl::sum(rows, {1}));
  add(fl::mean(rows, {0}));
  const fl::Tensor many = fl::randn(fl::Shape{3000, 77}, /*seed=*/13);
  add(fl::sum(many, {1}));
  add(fl::sum(many, {0}));
  // In place over non-adjacent axes: runs (one group and several per output) and columns.
  const fl::Tensor nchw = fl::uniform(fl::Shape{32, 5, 28, 28}, -1.0, 2.0, /*seed=*/14);
  add(fl::sum(nchw, {0, 2, 3}));
  add(fl::mean(fl::uniform(fl::Shape{80, 3, 1000}, -1.0, 2.0, /*seed=*/15), {0, 2}));
  add(fl::sum(fl::reshape(nchw, fl::Shape{8, 4, 5, 28, 28}), {0, 2, 3}));
  // Training shapes over either axis (rows pieces, column row blocks and tiles), f32 and f64, and
  // max and argmax, whose pieces are split the same way.
  auto add64 = [&](const fl::Tensor& t) {
    for (double v : t.to_vector<double>()) bits += fmt::format("{:016x} ", std::bit_cast<uint64_t>(v));
  };
  for (const fl::Shape& shape : {fl::Shape{65536, 10}, fl::Shape{4096, 256}, fl::Shape{1500, 784}, fl::Shape{300, 2100}}) {
    const fl::Tensor x = fl::uniform(shape, -1.0, 2.0, /*seed=*/16);
    const fl::Tensor x64 = fl::uniform(shape, -1.0, 2.0, /*seed=*/17, fl::f64);
    for (int64_t axis : {0, 1}) {
      add(fl::sum(x, {axis}));
      add(fl::mean(x, {axis}));
      add(fl::max(x, {axis}));
      add64(fl::sum(x64, {axis}));
      add64(fl::mean(x64, {axis}));
      for (int64_t i : fl::argmax(x, axis).to_vector<int64_t>()) bits += fmt::format("{} ", i);
    }
  }
  return bits;
}
}  // namespace

TEST_CASE("f32 sums and means are bit-identical whatever the thread count") {
  // In a child started below: print the bits and stop (the pool reads FLOWLET_NUM_THREADS once per
  // process, so each thread count needs its own process).
  flowlet_test::check_bits_across_thread_counts("FLOWLET_TEST_REDUCE_BITS", "f32 sums and means are bit-identical*",
                                                reduction_bits, {1, 2, 3, 5});
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


TEST_CASE("f32 sums count every element once around the four-stream split of a run") {
  // sum_f32_run reads runs of 4096 or more elements as four streams (quarters of
  // 4 * floor(n / 256) * 64 elements), shorter ones as one stream of four trees per step, then a
  // pair of trees, a tree, vectors and a masked vector of the last n % 8. One marker value at each
  // position in turn, in zeros, must sum to exactly the marker: an element skipped or read twice by
  // a stream, or by the rest, changes the total. Lengths at and around the tree and stream
  // boundaries, the four-stream threshold (4096), a chunk (32768) and past it.
  int compared = 0;
  for (int64_t n : {255, 256, 257, 319, 320, 383, 384, 447, 448, 511, 512, 513, 700, 1023, 1024, 1031, 4095, 4096,
                    4097, 4096 + 255, 4352, 5000, 32768, 32769 + 255}) {
    CAPTURE(n);
    std::vector<float> v(static_cast<size_t>(n), 0.0f);
    bool all_exact = true;
    for (int64_t p = 0; p < n; ++p) {
      v[static_cast<size_t>(p)] = 3.0f;
      if (n <= 1031 || p % 97 == 0 || p >= n - 300) {  // every position of the short runs
        const float got = fl::sum(fl::tensor(v, fl::Shape{n})).item<float>();
        if (got != 3.0f) {
          all_exact = false;
          CAPTURE(p);
          CHECK(got == 3.0f);
        }
        ++compared;
      }
      v[static_cast<size_t>(p)] = 0.0f;
    }
    CHECK(all_exact);
    // Small integers everywhere (exact in every f32 tree): the total is exact, rounded once.
    for (int64_t p = 0; p < n; ++p) v[static_cast<size_t>(p)] = static_cast<float>(p % 1024 + 1);
    double exact = 0;
    for (float x : v) exact += static_cast<double>(x);
    CHECK(static_cast<double>(fl::sum(fl::tensor(v, fl::Shape{n})).item<float>()) == static_cast<float>(exact));
  }
  CHECK(compared > 8000);
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

namespace {
// x's values in a view whose innermost axis has stride 1 but whose rows are padded with
// `sentinel` (and which starts at offset 3): not contiguous, yet readable in place, row by row.
fl::Tensor padded_rows_view(const fl::Tensor& t, int64_t pad = 3, double sentinel = 99) {
  const std::vector<double> v = test::values(t);
  const fl::Shape shape = t.shape();
  const int64_t last = shape[shape.size() - 1], rows = t.numel() / std::max<int64_t>(last, 1);
  std::vector<double> buffer(static_cast<size_t>(3 + rows * (last + pad)), sentinel);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < last; ++j)
      buffer[static_cast<size_t>(3 + r * (last + pad) + j)] = v[static_cast<size_t>(r * last + j)];
  const fl::Tensor base = test::make(buffer, fl::Shape{static_cast<int64_t>(buffer.size())}, t.dtype());
  fl::Strides strides = fl::contiguous_strides(shape);
  for (size_t d = 0; d + 1 < shape.size(); ++d) strides[d] = strides[d] / last * (last + pad);
  return fl::Tensor::view(base.storage(), shape, strides, 3, t.dtype());
}
}  // namespace

TEST_CASE("reductions over non-adjacent axes and views read in place and match the reference") {
  // The batch-norm patterns (axes 0, 2, 3 of NCHW; 0, 2 of [N, C, L]): the innermost reduced axis
  // is read as contiguous runs; axes 0, 2 of [A, B, C, D]: the kept innermost axis as rows of
  // columns; both on contiguous inputs and on padded-row views. Run lengths below 8 (the copy
  // path), odd ones, and outputs with more than 32K elements each (split into groups) included.
  struct Case {
    fl::Shape shape;
    std::vector<int64_t> axes;
  };
  const std::vector<Case> cases = {
      {{4, 3, 5, 6}, {0, 2, 3}},  {{3, 5, 9}, {0, 2}},     {{2, 3, 33}, {0, -1}},   {{5, 2, 3}, {0, 2}},
      {{3, 4, 5, 11}, {0, 2}},    {{2, 6, 3, 8}, {1, 3}},  {{7, 1, 13}, {0, 2}},    {{3, 4, 20}, {0, 1, 2}},
      {{40, 2, 1000}, {0, 2}},    {{2, 3, 4, 5}, {0, 1, 3}}, {{6, 16}, {0}},        {{6, 16}, {1}},
  };
  int compared = 0;
  uint64_t seed = 7000;
  for (const Case& c : cases) {
    for (fl::DType dt : {fl::f32, fl::f64, fl::i32, fl::u8, fl::bf16}) {
      for (bool keepdims : {false, true}) {
        CAPTURE(test::shape_text(c.shape));
        CAPTURE(dt);
        CAPTURE(keepdims);
        const fl::Tensor x = test::random_tensor(c.shape, seed++, dt);
        const Host h = test::host(x);
        const Host want = test::sum_ref(h, c.axes, keepdims);
        const Host want_max = test::max_ref(h, c.axes, keepdims);
        // bf16 sums round once at the end: compare at bf16's precision.
        for (const fl::Tensor& view : {x, padded_rows_view(x)}) {
          check_tensor(fl::sum(view, c.axes, keepdims), want.values, want.shape, sum_dtype(dt));
          check_tensor(fl::max(view, c.axes, keepdims), want_max.values, want_max.shape, dt);
          if (dt == fl::f32 || dt == fl::f64) {
            const Host want_mean = mean_ref(h, c.axes, keepdims);
            check_tensor(fl::mean(view, c.axes, keepdims), want_mean.values, want_mean.shape, dt);
          }
          ++compared;
        }
      }
    }
  }
  CHECK(compared == 12 * 5 * 2 * 2);
  // NaN in one channel's run only.
  std::vector<float> v(2 * 3 * 16, 1.0f);
  v[static_cast<size_t>(1 * 3 * 16 + 2 * 16 + 5)] = NAN;  // n 1, c 2
  const fl::Tensor with_nan = fl::tensor(v, fl::Shape{2, 3, 16});
  check_tensor(fl::sum(with_nan, {0, 2}), {32, 32, kNaN}, fl::Shape{3}, fl::f32);
  check_tensor(fl::max(with_nan, {0, 2}), {1, 1, kNaN}, fl::Shape{3}, fl::f32);
}

TEST_CASE("f32 column sums match the reference at every row and column count around the vector widths") {
  // Columns go 32 and 8 at a time, then one at a time; rows 8 at a time (a tree), then one at a
  // time. Each column's value must not depend on its position among the columns summed together
  // (vector lane or scalar tail; over 64 columns they go row group by row group): the same columns
  // shifted by one place give the same bits.
  uint64_t seed = 9000;
  for (int64_t rows : {1, 7, 8, 9, 17, 64, 100}) {
    for (int64_t cols : {1, 7, 8, 9, 31, 32, 33, 41, 65, 100}) {
      CAPTURE(rows);
      CAPTURE(cols);
      const fl::Tensor x = test::random_tensor(fl::Shape{rows, cols}, seed++, fl::f32);
      const Host want = test::sum_ref(test::host(x), {0});
      const fl::Tensor got = fl::sum(x, {0});
      check_tensor(got, want.values, want.shape, fl::f32);
      check_tensor(fl::sum(padded_rows_view(x), {0}), want.values, want.shape, fl::f32);
      // The columns from 1 on (a view: rows cols apart), so every column sits one place over.
      if (cols == 1) continue;
      const std::vector<float> all = got.to_vector<float>();
      const std::vector<float> shifted = fl::sum(fl::slice(x, 1, 1, cols - 1), {0}).to_vector<float>();
      for (int64_t j = 1; j < cols; ++j) {
        CHECK(std::bit_cast<uint32_t>(shifted[static_cast<size_t>(j - 1)]) == std::bit_cast<uint32_t>(all[static_cast<size_t>(j)]));
      }
    }
  }
}

TEST_CASE("strided f32 sums keep the 1e-7 accuracy") {
  // The pair pattern of the adversarial test, laid out as [N, C, L] and reduced over 0 and 2.
  const int64_t n = 64, c = 3, l = 2048;
  const float small = 0x1.fcp-25f;
  std::vector<float> v(static_cast<size_t>(n * c * l));
  for (size_t i = 0; i < v.size(); ++i) v[i] = (i / 32) % 2 == 0 ? 1.0f : small;
  const double exact = static_cast<double>(n * l / 2) * (1.0 + static_cast<double>(small));
  for (float got : fl::sum(fl::tensor(v, fl::Shape{n, c, l}), {0, 2}).to_vector<float>()) {
    CHECK(std::abs(static_cast<double>(got) - exact) / exact <= 1e-7);
  }
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
// Training shapes: rows of [N, C] (the last axis) and columns (axis 0), against f64 naive loops

namespace {

// Naive f64 sums, maxima and first-maximum indices of x ([n, c], row-major) over axis 1 (one per
// row) or axis 0 (one per column).
struct MatrixRef {
  std::vector<double> sum, magnitude, max, argmax;
};
MatrixRef matrix_ref(const std::vector<double>& x, int64_t n, int64_t c, int64_t axis) {
  const int64_t outputs = axis == 1 ? n : c, length = axis == 1 ? c : n;
  MatrixRef ref;
  for (int64_t o = 0; o < outputs; ++o) {
    double total = 0, magnitude = 0, best = 0;
    int64_t best_at = -1;
    for (int64_t k = 0; k < length; ++k) {
      const double v = x[static_cast<size_t>(axis == 1 ? o * c + k : k * c + o)];
      total += v;
      magnitude += std::abs(v);
      if (best_at < 0 || (!std::isnan(best) && (v > best || std::isnan(v)))) best = v, best_at = k;
    }
    ref.sum.push_back(total);
    ref.magnitude.push_back(magnitude);
    ref.max.push_back(best_at < 0 ? -INFINITY : best);
    ref.argmax.push_back(static_cast<double>(best_at));
  }
  return ref;
}

}  // namespace

TEST_CASE("sum, mean, max and argmax over either axis of [N, C] match f64 loops at training shapes and odd sizes") {
  // Short rows (C < 64: the masked-tail row kernel), rows under and over a tree, hidden-layer rows
  // (256, 784); column reductions split into row blocks and column tiles (C > 1024), N around the
  // blocks' multiples of 8. f32 within its bound (rows: 4 f32 roundings per element, columns 3,
  // then f64, plus the result's own rounding), f64/f16/bf16 within their dtype tolerance, integers
  // exact (i64 sums).
  const double u = 0x1p-24;
  uint64_t seed = 7000;
  int compared = 0;
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1, 1},    {3, 7},    {17, 8},   {9, 9},     {64, 10},  {65537, 10}, {13, 15},  {5, 16},   {7, 17},
      {33, 63},  {8, 64},   {9, 65},   {100, 127}, {64, 256}, {4099, 256}, {31, 257}, {129, 784}, {2051, 784},
      {40, 1030}, {825, 10}, {8193, 3}, {1, 1500}};
  for (const auto& [n, c] : shapes) {
    for (fl::DType dt : {fl::f32, fl::f64, fl::i32, fl::f16, fl::i64, fl::u8, fl::bf16}) {
      if (dt != fl::f32 && n * c > 600000) continue;  // the big shapes once, in f32
      if ((dt == fl::i64 || dt == fl::u8 || dt == fl::bf16) && n * c > 20000) continue;  // every path, small
      const bool integer = dt == fl::i32 || dt == fl::i64 || dt == fl::u8;
      CAPTURE(n);
      CAPTURE(c);
      CAPTURE(dt);
      const fl::Tensor x = test::random_tensor(fl::Shape{n, c}, seed++, dt);
      const std::vector<double> xv = test::values(x);
      for (int64_t axis : {1, 0}) {
        CAPTURE(axis);
        const MatrixRef ref = matrix_ref(xv, n, c, axis);
        const int64_t count = axis == 1 ? c : n;
        const std::vector<double> got = test::values(fl::sum(x, {axis}));
        const std::vector<double> got_mean = integer ? got : test::values(fl::mean(x, {axis}));
        bool sums_ok = got.size() == ref.sum.size(), means_ok = sums_ok;
        for (size_t o = 0; sums_ok && o < got.size(); ++o) {
          const double want = ref.sum[o];
          if (dt == fl::f32) {
            const double bound = (axis == 1 ? 4 : 3) * u * ref.magnitude[o] + u * std::abs(want) + 1e-12 * ref.magnitude[o];
            sums_ok = std::abs(got[o] - want) <= bound;
            means_ok = std::abs(got_mean[o] - want / static_cast<double>(count)) <= (bound + u * std::abs(want)) / static_cast<double>(count);
          } else if (integer) {
            sums_ok = got[o] == want;
          } else {
            sums_ok = test::same_value(got[o], test::round_to(want, dt), test::default_tolerance(dt));
            means_ok = test::same_value(got_mean[o], test::round_to(want / static_cast<double>(count), dt), test::default_tolerance(dt));
          }
          if (!sums_ok || !means_ok) {
            CAPTURE(o);
            CAPTURE(got[o]);
            CAPTURE(want);
          }
        }
        CHECK(sums_ok);
        CHECK(means_ok);
        check_tensor(fl::max(x, {axis}), ref.max, fl::Shape{axis == 1 ? n : c}, dt, test::Tolerance{0, 0});
        check_tensor(fl::argmax(x, axis), ref.argmax, fl::Shape{axis == 1 ? n : c}, fl::i64);
        // keepdims: the same values, the reduced axis kept as 1.
        const fl::Shape kept = axis == 1 ? fl::Shape{n, 1} : fl::Shape{1, c};
        CHECK(fl::sum(x, {axis}, true).shape() == kept);
        CHECK(test::values(fl::sum(x, {axis}, true)) == got);
        ++compared;
      }
    }
  }
  CHECK(compared >= 180);
}

TEST_CASE("column sums add every element once across row blocks and column tiles, views included") {
  // Axis 0 splits the rows into at most 8 blocks of a multiple of 8 rows (at least ~8K elements)
  // and the columns into tiles of 1024. A marker in zeros at sampled positions must come back
  // exactly in its column and nowhere else; small integers everywhere sum exactly (f32 trees of 8
  // rows hold them exactly). Row counts around the block sizes, columns around the tile.
  for (const auto& [n, c] : std::vector<std::pair<int64_t, int64_t>>{
           {823, 10}, {824, 10}, {825, 10}, {13184, 10}, {13185, 10}, {20001, 10}, {100, 1030}, {17, 2049}, {4099, 256}}) {
    CAPTURE(n);
    CAPTURE(c);
    std::vector<float> v(static_cast<size_t>(n * c), 0.0f);
    bool exact = true;
    for (int64_t p = 0; p < n * c; p += std::max<int64_t>(1, n * c / 150) + 1) {
      v[static_cast<size_t>(p)] = 5.0f;
      const std::vector<float> got = fl::sum(fl::tensor(v, fl::Shape{n, c}), {0}).to_vector<float>();
      for (int64_t j = 0; j < c; ++j) exact &= got[static_cast<size_t>(j)] == (j == p % c ? 5.0f : 0.0f);
      v[static_cast<size_t>(p)] = 0.0f;
    }
    CHECK(exact);
    for (int64_t p = 0; p < n * c; ++p) v[static_cast<size_t>(p)] = static_cast<float>((p * 7) % 19 - 9);
    const fl::Tensor x = fl::tensor(v, fl::Shape{n, c});
    std::vector<double> want(static_cast<size_t>(c), 0.0);
    for (int64_t p = 0; p < n * c; ++p) want[static_cast<size_t>(p % c)] += static_cast<double>(v[static_cast<size_t>(p)]);
    check_tensor(fl::sum(x, {0}), want, fl::Shape{c}, fl::f32, test::Tolerance{0, 0});
    // The same columns read in place through a view: the first c columns of a [n, 2c] tensor (the
    // strided plan's rows a fixed step apart).
    const fl::Tensor wide = fl::concat({x, fl::full(fl::Shape{n, c}, 1000.0, fl::f32)}, 1);
    const fl::Tensor view = fl::slice(wide, 1, 0, c);
    REQUIRE_FALSE(view.is_contiguous());
    check_tensor(fl::sum(view, {0}), want, fl::Shape{c}, fl::f32, test::Tolerance{0, 0});
  }
}

TEST_CASE("argmax over rows and columns: ties pick the first, a NaN wins wherever it sits, -inf rows give 0") {
  for (int64_t c : {1, 2, 9, 10, 17, 64, 100}) {
    for (fl::DType dt : {fl::f32, fl::f64, fl::f16, fl::bf16, fl::i32}) {
      CAPTURE(c);
      CAPTURE(dt);
      const bool floating = dt != fl::i32;
      // Row r: ties of the maximum 3 at positions r % c and (r * 5 + 1) % c, a NaN at (r * 3) % c
      // in every third row (floats), -inf rows every seventh (floats).
      const int64_t n = 3 * c + 7;
      std::vector<double> v(static_cast<size_t>(n * c));
      std::vector<double> want_rows(static_cast<size_t>(n));
      for (int64_t r = 0; r < n; ++r) {
        double* row = v.data() + r * c;
        for (int64_t k = 0; k < c; ++k) row[k] = static_cast<double>((r + k) % 3 - 2);  // -2..0
        const int64_t a = r % c, b = (r * 5 + 1) % c;
        row[a] = row[b] = 3;
        int64_t want = std::min(a, b);
        if (floating && r % 3 == 0) {
          row[(r * 3) % c] = kNaN;
          want = (r * 3) % c;
        } else if (floating && r % 7 == 1) {
          for (int64_t k = 0; k < c; ++k) row[k] = -INFINITY;
          want = 0;
        }
        want_rows[static_cast<size_t>(r)] = static_cast<double>(want);
      }
      const fl::Tensor x = test::make(v, fl::Shape{n, c}, dt);
      check_tensor(fl::argmax(x, 1), want_rows, fl::Shape{n}, fl::i64);
      check_tensor(fl::argmax(fl::transpose(x), 0), want_rows, fl::Shape{n}, fl::i64);  // columns of a view
      check_tensor(fl::argmax(fl::transpose(x).contiguous(), 0), want_rows, fl::Shape{n}, fl::i64);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// NaN and empty inputs

TEST_CASE("f32 max finds a NaN or the maximum wherever it sits: vector body, vector tail, scalar tail") {
  for (int64_t n : {1, 7, 8, 9, 31, 32, 33, 40, 63, 64, 65, 100, 1000}) {
    for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
      CAPTURE(n);
      CAPTURE(at);
      std::vector<float> v(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = -1000.0f - static_cast<float>((i * 37) % 101);
      v[static_cast<size_t>(at)] = -5.0f;  // the maximum, all others below -999
      check_tensor(fl::max(fl::tensor(v, fl::Shape{n})), {-5.0}, fl::Shape{}, fl::f32, test::Tolerance{0, 0});
      v[static_cast<size_t>(at)] = NAN;
      check_tensor(fl::max(fl::tensor(v, fl::Shape{n})), {kNaN}, fl::Shape{}, fl::f32);
      // Two rows: the NaN in the second only.
      std::vector<float> rows(v.size() * 2, -3.0f);
      std::copy(v.begin(), v.end(), rows.begin() + static_cast<std::ptrdiff_t>(n));
      check_tensor(fl::max(fl::tensor(rows, fl::Shape{2, n}), {1}), {-3.0, kNaN}, fl::Shape{2}, fl::f32);
    }
  }
  const float inf = std::numeric_limits<float>::infinity();
  check_tensor(fl::max(fl::full(fl::Shape{77}, -inf, fl::f32)), {-inf}, fl::Shape{}, fl::f32);
  check_tensor(fl::max(fl::tensor(std::vector<float>(70, -inf), fl::Shape{70}) + fl::tensor(std::vector<float>{0}, fl::Shape{1})),
               {-inf}, fl::Shape{}, fl::f32);
}

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
