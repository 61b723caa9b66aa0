// Neural-network ops: one_hot, softmax, log_softmax and softmax_cross_entropy, against f64 references,
// with huge logits, every supported dtype, non-contiguous and empty inputs, and the declared errors.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "support/reference.hpp"

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
