// Neural-network ops: one_hot, softmax, log_softmax and softmax_cross_entropy (the f32 loss within its
// stated error bound), against f64 references, with huge logits, infinities and NaN, every supported
// dtype, non-contiguous and empty inputs, and the declared errors.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "support/reference.hpp"
#include "support/thread_count_child.hpp"

using test::check_op_throws;
using test::check_tensor;
using test::check_throws;
using test::Host;

namespace {

Host one_hot_ref(const Host& indices, int64_t depth) {
  Host out;
  out.shape = indices.shape;
  out.shape.push_back(depth);
  for (double index : indices.values)
    for (int64_t j = 0; j < depth; ++j) out.values.push_back(static_cast<double>(j) == index ? 1.0 : 0.0);
  return out;
}

Host cross_entropy_ref(const Host& logits, const Host& labels) {
  const Host lsm = test::log_softmax_ref(logits, -1);
  const int64_t c = logits.shape[1];
  Host out{{}, fl::Shape{logits.shape[0]}};
  for (size_t i = 0; i < labels.values.size(); ++i)
    out.values.push_back(-lsm.values[static_cast<size_t>(static_cast<int64_t>(i) * c + static_cast<int64_t>(labels.values[i]))]);
  return out;
}

fl::Tensor random_labels(int64_t n, int64_t classes, uint64_t seed, fl::DType dt) {
  test::Rng rng(seed);
  std::vector<double> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(static_cast<double>(rng.integer(0, classes - 1)));
  return test::make(v, fl::Shape{n}, dt);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// one_hot

TEST_CASE("one_hot makes f32 rows with a single one") {
  check_tensor(fl::one_hot(fl::tensor({int64_t{0}, int64_t{2}, int64_t{1}}), 3), {1, 0, 0, 0, 0, 1, 0, 1, 0}, fl::Shape{3, 3},
               fl::f32);
  check_tensor(fl::one_hot(fl::tensor({1, 0}), 4), {0, 1, 0, 0, 1, 0, 0, 0}, fl::Shape{2, 4}, fl::f32);  // i32 indices
  check_tensor(fl::one_hot(fl::scalar(int64_t{2}), 3), {0, 0, 1}, fl::Shape{3}, fl::f32);
  check_tensor(fl::one_hot(fl::zeros(fl::Shape{0}, fl::i64), 5), {}, fl::Shape{0, 5}, fl::f32);
  check_tensor(fl::one_hot(fl::zeros(fl::Shape{2, 0}, fl::i64), 0), {}, fl::Shape{2, 0, 0}, fl::f32);
  check_tensor(fl::one_hot(fl::zeros(fl::Shape{3}, fl::i64), 1), {1, 1, 1}, fl::Shape{3, 1}, fl::f32);
}

TEST_CASE("one_hot matches the reference for any index shape, contiguous or not") {
  int compared = 0;
  uint64_t seed = 10;
  for (fl::DType dt : {fl::i32, fl::i64}) {
    for (const fl::Shape& shape : {fl::Shape{7}, fl::Shape{2, 3}, fl::Shape{2, 2, 2}}) {
      CAPTURE(dt);
      CAPTURE(shape);
      const int64_t depth = 6;
      test::Rng rng(seed++);
      std::vector<double> v;
      for (int64_t i = 0; i < shape.numel(); ++i) v.push_back(static_cast<double>(rng.integer(0, depth - 1)));
      const fl::Tensor indices = test::make(v, shape, dt);
      const Host want = one_hot_ref(test::host(indices), depth);
      check_tensor(fl::one_hot(indices, depth), want.values, want.shape, fl::f32);
      check_tensor(fl::one_hot(test::noncontiguous(indices), depth), want.values, want.shape, fl::f32);
      check_tensor(fl::one_hot(test::strided_view(indices), depth), want.values, want.shape, fl::f32);
      ++compared;
    }
  }
  CHECK(compared == 6);
}

TEST_CASE("one_hot rejects a negative depth and indices outside [0, depth)") {
  const fl::Tensor idx = fl::tensor({int64_t{0}, int64_t{1}});
  check_op_throws<fl::InvalidArgument>("one_hot", [&] { (void)fl::one_hot(idx, -1); }, {"-1"});
  check_op_throws<fl::OutOfRange>("one_hot", [&] { (void)fl::one_hot(fl::tensor({int64_t{0}, int64_t{3}}), 3); }, {"3"});
  check_op_throws<fl::OutOfRange>("one_hot", [&] { (void)fl::one_hot(fl::tensor({-1}), 3); }, {"-1"});
  check_op_throws<fl::OutOfRange>("one_hot", [&] { (void)fl::one_hot(idx, 0); });
}

// ---------------------------------------------------------------------------------------------
// softmax and log_softmax

TEST_CASE("softmax and log_softmax of hand-worked logits") {
  const double e1 = std::exp(1.0), e2 = std::exp(2.0), e3 = std::exp(3.0);
  const double z = e1 + e2 + e3;
  for (fl::DType dt : test::kFloatDTypes) {
    CAPTURE(dt);
    const fl::Tensor x = test::make({1, 2, 3}, dt);
    check_tensor(fl::softmax(x), {e1 / z, e2 / z, e3 / z}, fl::Shape{3}, dt);
    check_tensor(fl::log_softmax(x), {1 - std::log(z), 2 - std::log(z), 3 - std::log(z)}, fl::Shape{3}, dt);
    // Shifting the logits changes nothing.
    check_tensor(fl::softmax(x + 100.0), {e1 / z, e2 / z, e3 / z}, fl::Shape{3}, dt);
    // Equal logits give a uniform distribution.
    check_tensor(fl::softmax(fl::zeros(fl::Shape{2, 4}, dt)), std::vector<double>(8, 0.25), fl::Shape{2, 4}, dt);
  }
}

TEST_CASE("softmax rows sum to one along any axis, matching the reference") {
  int compared = 0;
  uint64_t seed = 100;
  struct Case {
    fl::Shape shape;
    int64_t axis;
  };
  const std::vector<Case> cases = {{{8, 10}, -1}, {{8, 10}, 0}, {{8, 10}, 1}, {{3, 4, 5}, 1}, {{3, 4, 5}, -3},
                                   {{7}, 0},      {{1, 1}, -1}, {{2, 3, 4}, 2}};
  for (fl::DType dt : test::kFloatDTypes) {
    for (const Case& c : cases) {
      CAPTURE(dt);
      CAPTURE(c.shape);
      CAPTURE(c.axis);
      const fl::Tensor x = fl::randn(c.shape, seed++, dt) * 3.0;
      const Host hx = test::host(x);
      const Host want = test::softmax_ref(hx, c.axis);
      const Host want_log = test::log_softmax_ref(hx, c.axis);
      const fl::Tensor s = fl::softmax(x, c.axis);
      check_tensor(s, want.values, want.shape, dt);
      check_tensor(fl::log_softmax(x, c.axis), want_log.values, want_log.shape, dt);
      // Sums along the axis are 1.
      const Host sums = test::sum_ref(test::host(s), {c.axis});
      check_tensor(fl::sum(s, {c.axis}), std::vector<double>(sums.values.size(), 1.0), sums.shape, dt);
      // Non-contiguous inputs.
      check_tensor(fl::softmax(test::noncontiguous(x), c.axis), want.values, want.shape, dt);
      check_tensor(fl::log_softmax(test::strided_view(x), c.axis), want_log.values, want_log.shape, dt);
      ++compared;
    }
  }
  CHECK(compared == 16);
}

TEST_CASE("softmax is stable with huge logits") {
  for (fl::DType dt : test::kFloatDTypes) {
    CAPTURE(dt);
    const fl::Tensor x = test::make({1e4, 0, -1e4, 1e4, 1e4, 1e4 - 1}, fl::Shape{2, 3}, dt);
    const double e = std::exp(-1.0);
    check_tensor(fl::softmax(x), {1, 0, 0, 1 / (2 + e), 1 / (2 + e), e / (2 + e)}, fl::Shape{2, 3}, dt);
    check_tensor(fl::log_softmax(x), {0, -1e4, -2e4, -std::log(2 + e), -std::log(2 + e), -1 - std::log(2 + e)},
                 fl::Shape{2, 3}, dt);
    // Huge negative logits too.
    check_tensor(fl::softmax(test::make({-1e4, -1e4}, dt)), {0.5, 0.5}, fl::Shape{2}, dt);
  }
}

TEST_CASE("log_softmax agrees with log of softmax, and exp of log_softmax with softmax") {
  for (fl::DType dt : test::kFloatDTypes) {
    CAPTURE(dt);
    const fl::Tensor x = fl::randn(fl::Shape{6, 9}, 77, dt);
    const fl::Tensor s = fl::softmax(x);
    const fl::Tensor l = fl::log_softmax(x);
    check_tensor(fl::log(s), test::values(l), fl::Shape{6, 9}, dt);
    check_tensor(fl::exp(l), test::values(s), fl::Shape{6, 9}, dt);
  }
}

TEST_CASE("softmax and log_softmax of empty tensors are empty") {
  check_tensor(fl::softmax(fl::zeros(fl::Shape{0, 3})), {}, fl::Shape{0, 3}, fl::f32);
  check_tensor(fl::log_softmax(fl::zeros(fl::Shape{0, 3}, fl::f64)), {}, fl::Shape{0, 3}, fl::f64);
  check_tensor(fl::softmax(fl::zeros(fl::Shape{3, 0}), -1), {}, fl::Shape{3, 0}, fl::f32);
}

TEST_CASE("softmax and log_softmax reject bad axes and integer inputs") {
  const fl::Tensor x = fl::zeros(fl::Shape{2, 3});
  check_op_throws<fl::InvalidArgument>("softmax", [&] { (void)fl::softmax(x, 2); }, {"2"});
  check_op_throws<fl::InvalidArgument>("softmax", [&] { (void)fl::softmax(x, -3); }, {"-3"});
  check_op_throws<fl::InvalidArgument>("log_softmax", [&] { (void)fl::log_softmax(x, 5); }, {"5"});
  check_op_throws<fl::InvalidArgument>("log_softmax", [&] { (void)fl::log_softmax(x, -3); }, {"-3"});
  for (fl::DType dt : {fl::i32, fl::i64, fl::u8, fl::b8}) {
    CAPTURE(dt);
    const std::string name(fl::dtype_name(dt));
    check_op_throws<fl::DTypeError>("softmax", [&] { (void)fl::softmax(fl::zeros(fl::Shape{2, 3}, dt)); }, {name});
    check_op_throws<fl::DTypeError>("log_softmax", [&] { (void)fl::log_softmax(fl::zeros(fl::Shape{2, 3}, dt)); }, {name});
  }
}

// ---------------------------------------------------------------------------------------------
// softmax_cross_entropy

TEST_CASE("softmax_cross_entropy of hand-worked logits") {
  const fl::Tensor logits = fl::tensor(std::vector<float>{1, 2, 3, 0, 0, 0}, fl::Shape{2, 3});
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  check_tensor(fl::softmax_cross_entropy(logits, fl::tensor({int64_t{2}, int64_t{0}})), {std::log(z) - 3, std::log(3.0)},
               fl::Shape{2}, fl::f32);
  check_tensor(fl::softmax_cross_entropy(logits, fl::tensor({0, 1})), {std::log(z) - 1, std::log(3.0)}, fl::Shape{2},
               fl::f32);  // i32 labels
}

TEST_CASE("softmax_cross_entropy equals -log_softmax picked at the labels") {
  int compared = 0;
  uint64_t seed = 300;
  for (fl::DType dt : test::kFloatDTypes) {
    for (fl::DType label_dt : {fl::i64, fl::i32}) {
      for (const fl::Shape& shape : {fl::Shape{16, 10}, fl::Shape{1, 2}, fl::Shape{5, 1}, fl::Shape{3, 50}}) {
        CAPTURE(dt);
        CAPTURE(label_dt);
        CAPTURE(shape);
        const fl::Tensor logits = fl::randn(shape, seed++, dt) * 4.0;
        const fl::Tensor labels = random_labels(shape[0], shape[1], seed++, label_dt);
        const Host want = cross_entropy_ref(test::host(logits), test::host(labels));
        const fl::Tensor loss = fl::softmax_cross_entropy(logits, labels);
        check_tensor(loss, want.values, want.shape, dt);
        // The same from the library's own log_softmax and gather-by-one_hot.
        const fl::Tensor picked = fl::sum(fl::log_softmax(logits) * fl::one_hot(labels, shape[1]).astype(dt), {1});
        check_tensor(loss, test::values(-picked), fl::Shape{shape[0]}, dt);
        // Non-contiguous logits and labels.
        check_tensor(fl::softmax_cross_entropy(test::noncontiguous(logits), test::strided_view(labels)), want.values,
                     want.shape, dt);
        ++compared;
      }
    }
  }
  CHECK(compared == 16);
}

// The f32 loss's error bound (src/ops/softmax_line.hpp, cross_entropy_rows_f32), per row, from the
// f64 reference on the same f32 logits: 2^-23 (the vector exp's 1 ulp, through the f64 sum and log)
// + 2^-24 sum_c p_c |d_c| + 2^-24 |d_label| (x - max rounded to f32) + 2^-24 |loss| (the result's
// rounding), d = x - max. The libm path (f64 exps) meets the same bound.
TEST_CASE("f32 softmax_cross_entropy is within its stated bound of an f64 loop") {
  int compared = 0;
  uint64_t seed = 700;
  // Odd sizes, one class, rows that span several of the kernel's blocks (4096 / C rows), rows wider
  // than a block, and logits spread wide enough that the rounding of x - max shows.
  for (const fl::Shape& shape : {fl::Shape{1, 1}, fl::Shape{7, 3}, fl::Shape{1024, 10}, fl::Shape{1000, 17},
                                 fl::Shape{3, 5000}, fl::Shape{2, 4097}, fl::Shape{129, 1}}) {
    for (double scale : {1.0, 4.0, 40.0}) {
      CAPTURE(shape);
      CAPTURE(scale);
      const fl::Tensor logits = fl::randn(shape, seed++, fl::f32) * scale;
      const fl::Tensor labels = random_labels(shape[0], shape[1], seed++, fl::i64);
      const std::vector<double> x = test::values(logits), label = test::values(labels),
                                got = test::values(fl::softmax_cross_entropy(logits, labels));
      const int64_t c = shape[1];
      int64_t outside = 0;
      double worst = 0;  // largest |error| / bound
      for (int64_t r = 0; r < shape[0]; ++r) {
        const double* row = x.data() + r * c;
        double top = row[0];
        for (int64_t i = 0; i < c; ++i) top = std::max(top, row[i]);
        double total = 0, weighted = 0;
        for (int64_t i = 0; i < c; ++i) total += std::exp(row[i] - top);
        for (int64_t i = 0; i < c; ++i) weighted += std::exp(row[i] - top) / total * std::abs(row[i] - top);
        const double picked = row[static_cast<int64_t>(label[static_cast<size_t>(r)])] - top;
        const double want = std::log(total) - picked;
        const double bound = std::ldexp(1.0, -23) + std::ldexp(weighted + std::abs(picked) + std::abs(want), -24);
        const double error = std::abs(got[static_cast<size_t>(r)] - want);
        worst = std::max(worst, error / bound);
        if (!(error <= bound)) ++outside;
      }
      CAPTURE(worst);
      CHECK(outside == 0);
      ++compared;
    }
  }
  CHECK(compared == 21);
}

TEST_CASE("softmax_cross_entropy's rows do not depend on the split or the block") {
  // 20000 rows go to the pool in pieces and to the kernel's blocks; a row's loss must be the one it
  // has alone, bit for bit (eager and traced steps rely on this).
  for (fl::DType dt : test::kFloatDTypes) {
    CAPTURE(dt);
    const fl::Tensor logits = fl::randn(fl::Shape{20000, 10}, 811, dt) * 3.0;
    const fl::Tensor labels = random_labels(20000, 10, 812, fl::i32);
    const std::vector<double> all = test::values(fl::softmax_cross_entropy(logits, labels));
    int64_t differ = 0;
    for (int64_t r : {int64_t{0}, int64_t{1}, int64_t{408}, int64_t{409}, int64_t{4097}, int64_t{12345}, int64_t{19999}}) {
      const fl::Tensor one = fl::softmax_cross_entropy(fl::slice(logits, 0, r, 1),
                                                       fl::slice(labels, 0, r, 1));
      if (test::values(one)[0] != all[static_cast<size_t>(r)]) ++differ;
    }
    CHECK(differ == 0);
  }
}

namespace {
// Bits of softmax_cross_entropy's losses (f32 and f64) at sizes the pool splits (from 4096 logits a
// piece) and at sizes it does not, with odd row counts so that pieces differ in length.
std::string cross_entropy_bits() {
  std::string bits;
  for (fl::DType dt : test::kFloatDTypes) {
    for (const auto& [rows, classes] : {std::pair<int64_t, int64_t>{1024, 10}, {1023, 10}, {4099, 3}, {7, 5000},
                                        {300, 10}, {1, 10}}) {
      const fl::Tensor logits = fl::randn(fl::Shape{rows, classes}, 821 + rows, dt) * 3.0;
      const fl::Tensor labels = random_labels(rows, classes, 822 + rows, fl::i64);
      const fl::Tensor loss = fl::softmax_cross_entropy(logits, labels);
      if (dt == fl::f32) {
        for (float v : loss.to_vector<float>()) bits += fmt::format("{:08x}", std::bit_cast<uint32_t>(v));
      } else {
        for (double v : loss.to_vector<double>()) bits += fmt::format("{:016x}", std::bit_cast<uint64_t>(v));
      }
      bits += ' ';
    }
  }
  return bits;
}
}  // namespace

TEST_CASE("softmax_cross_entropy losses are bit-identical whatever the thread count") {
  // Each thread count in its own child process (the pool reads FLOWLET_NUM_THREADS once).
  flowlet_test::check_bits_across_thread_counts("FLOWLET_TEST_LOSS_BITS", "softmax_cross_entropy losses are bit-identical*",
                                                cross_entropy_bits, {1, 2, 3});
}

TEST_CASE("softmax_cross_entropy passes infinities and NaN through as the f64 formula does") {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  for (fl::DType dt : test::kFloatDTypes) {
    CAPTURE(dt);
    // Row 0: a -inf logit off the label adds nothing; row 1: -inf at the label, loss +inf; row 2: a
    // NaN logit makes the row NaN; row 3: all -inf (no maximum to subtract) is NaN; row 4: +inf.
    const fl::Tensor logits =
        test::make({0, -inf, 0, 1, -inf, 1, 0, nan, 2, -inf, -inf, -inf, inf, 0, 0}, fl::Shape{5, 3}, dt);
    const fl::Tensor labels = fl::tensor({int64_t{0}, int64_t{1}, int64_t{0}, int64_t{0}, int64_t{1}});
    check_tensor(fl::softmax_cross_entropy(logits, labels), {std::log(2.0), inf, nan, nan, nan}, fl::Shape{5}, dt);
  }
}

TEST_CASE("softmax_cross_entropy is finite for huge logits") {
  for (fl::DType dt : test::kFloatDTypes) {
    CAPTURE(dt);
    const fl::Tensor logits = test::make({1e4, 0, -1e4, 0, 1e4, 1e4}, fl::Shape{2, 3}, dt);
    const fl::Tensor labels = fl::tensor({int64_t{0}, int64_t{0}});
    // Row 0: the label holds the huge logit, loss 0. Row 1: the label is 1e4 below two equal maxima.
    check_tensor(fl::softmax_cross_entropy(logits, labels), {0, 1e4 + std::log(2.0)}, fl::Shape{2}, dt);
    check_tensor(fl::softmax_cross_entropy(logits, fl::tensor({int64_t{2}, int64_t{2}})), {2e4, std::log(2.0)}, fl::Shape{2},
                 dt);
  }
}

TEST_CASE("softmax_cross_entropy of zero examples is empty") {
  check_tensor(fl::softmax_cross_entropy(fl::zeros(fl::Shape{0, 3}), fl::zeros(fl::Shape{0}, fl::i64)), {}, fl::Shape{0},
               fl::f32);
}

TEST_CASE("softmax_cross_entropy rejects bad shapes, labels and dtypes") {
  const fl::Tensor logits = fl::zeros(fl::Shape{4, 3});
  const fl::Tensor labels = fl::zeros(fl::Shape{4}, fl::i64);
  const std::string op = "softmax_cross_entropy";
  check_op_throws<fl::ShapeError>(op, [&] { (void)fl::softmax_cross_entropy(logits, fl::zeros(fl::Shape{5}, fl::i64)); },
                                  {"[4, 3]", "[5]"});
  check_op_throws<fl::ShapeError>(op, [&] { (void)fl::softmax_cross_entropy(fl::zeros(fl::Shape{3}), labels); }, {"[3]"});
  check_op_throws<fl::ShapeError>(op, [&] { (void)fl::softmax_cross_entropy(fl::zeros(fl::Shape{4, 3, 1}), labels); },
                                  {"[4, 3, 1]"});
  check_op_throws<fl::ShapeError>(op, [&] { (void)fl::softmax_cross_entropy(logits, fl::zeros(fl::Shape{4, 1}, fl::i64)); },
                                  {"[4, 1]"});
  check_op_throws<fl::OutOfRange>(op, [&] {
    (void)fl::softmax_cross_entropy(logits, fl::tensor({int64_t{0}, int64_t{1}, int64_t{3}, int64_t{2}}));
  }, {"3"});
  check_op_throws<fl::OutOfRange>(op, [&] { (void)fl::softmax_cross_entropy(logits, fl::tensor({0, 1, 2, -1})); }, {"-1"});
  check_op_throws<fl::DTypeError>(op, [&] { (void)fl::softmax_cross_entropy(logits, fl::zeros(fl::Shape{4})); }, {"f32"});
  check_op_throws<fl::DTypeError>(op, [&] { (void)fl::softmax_cross_entropy(logits, fl::zeros(fl::Shape{4}, fl::f64)); },
                                  {"f64"});
  check_op_throws<fl::DTypeError>(op, [&] { (void)fl::softmax_cross_entropy(fl::zeros(fl::Shape{4, 3}, fl::i32), labels); },
                                  {"i32"});
}
