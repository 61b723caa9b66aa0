// Half-precision training: a small MLP in bf16 and in f16 trains with GradientTape and SGD (and
// Adam), eagerly and traced, close to the same model in f32; the gradient of a broadcast operand
// (a bias) in bf16 against f64 finite differences; traced against eager; and the dtype errors a
// half model meets (mixed dtypes, the softmax family's f32/f64 logits).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "support/gradient_check.hpp"
#include "support/mlp.hpp"

namespace {

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// The unit roundoff of a dtype: half the distance from 1 to the next value.
double unit_roundoff(fl::DType dt) { return dt == fl::bf16 ? 0x1p-8 : dt == fl::f16 ? 0x1p-11 : 0x1p-24; }


// Why the tolerances below hold: every SGD step rounds each weight once to the half dtype (relative
// error at most the unit roundoff u: 2^-8 for bf16, 2^-11 for f16) and computes the gradient from
// half activations and gradients (a relative error of a few u, times lr * |g|, which is smaller than
// |w| here). The descent is well conditioned over these few steps, so errors add rather than grow:
// after N steps a weight is within N * u * max|w| of the f32 model's (measured: about a quarter of that).
constexpr int kSteps = 10;

void check_close_to_f32(const test::MlpRun& half, const test::MlpRun& f32, double per_step) {
  REQUIRE(half.values.size() == f32.values.size());
  for (size_t i = 0; i < f32.values.size(); ++i) {
    CAPTURE(i);
    const double tol = kSteps * per_step * max_abs(f32.values[i]);
    test::check_values(half.values[i], f32.values[i], test::Tolerance{0, tol});
  }
}

}  // namespace

TEST_CASE("a bf16 and an f16 MLP train with SGD, eagerly and traced, close to the same model in f32") {
  for (fl::DType dt : test::kHalfDTypes) {
    for (bool traced : {false, true}) {
      CAPTURE(dt);
      CAPTURE(traced);
      test::MlpOptions o;
      o.steps = kSteps;
      o.init_dtype = dt;  // both models start from the half model's exact values
      o.dtype = dt;
      o.traced = traced;
      const test::MlpRun half = test::train_mlp(o);
      o.dtype = fl::f32;
      o.traced = false;
      const test::MlpRun f32 = test::train_mlp(o);
      CHECK(half.losses.back() < 0.25 * half.losses.front());
      // The loss is computed in f32 from half logits: within a few u of the f32 model's.
      CHECK(half.losses.back() == doctest::Approx(f32.losses.back()).epsilon(4 * unit_roundoff(dt)));
      check_close_to_f32(half, f32, unit_roundoff(dt));
      // Both weight updates of the traced step fuse into assign_matmul, as in f32.
      if (traced) CHECK(half.fused_updates == 2);
    }
  }
}

TEST_CASE("a bf16 and an f16 MLP train with Adam, with f32 optimizer state, close to the same model in f32") {
  for (fl::DType dt : test::kHalfDTypes) {
    CAPTURE(dt);
    test::MlpOptions o;
    o.steps = kSteps;
    o.optimizer = test::MlpOptimizer::adam;
    o.lr = 0.01;
    o.init_dtype = dt;
    o.dtype = dt;
    const test::MlpRun half = test::train_mlp(o);
    o.dtype = fl::f32;
    const test::MlpRun f32 = test::train_mlp(o);
    CHECK(half.losses.back() < 0.5 * half.losses.front());
    CHECK(half.losses.back() == doctest::Approx(f32.losses.back()).epsilon(0.01));
    // Adam scales each update to about lr whatever the gradient's size, so rounding can flip the
    // update of a weight whose gradient is near zero: the weights agree within lr per step (measured
    // 0.05 for bf16 and 0.002 for f16 after 10 steps).
    for (size_t i = 0; i < f32.values.size(); ++i) test::check_values(half.values[i], f32.values[i], {0, kSteps * o.lr});
  }
}

TEST_CASE("traced half training equals eager: exactly without the graph passes, within an ulp per step when updates fuse") {
  for (fl::DType dt : test::kHalfDTypes) {
    CAPTURE(dt);
    test::MlpOptions o;
    o.steps = kSteps;
    o.dtype = o.init_dtype = dt;
    const test::MlpRun eager = test::train_mlp(o);
    o.traced = true;
    o.optimize = false;  // the same ops as eager, so the same roundings
    const test::MlpRun plain = test::train_mlp(o);
    CHECK(plain.fused_updates == 0);
    CHECK(plain.losses == eager.losses);
    for (size_t i = 0; i < eager.values.size(); ++i) CHECK(plain.values[i] == eager.values[i]);
    // A fused update rounds once (f32 GEMM into the upcast weight) where the eager one rounds the
    // gradient, its product with lr and the difference: at most an ulp of the weight per step apart.
    o.optimize = true;
    const test::MlpRun fused = test::train_mlp(o);
    CHECK(fused.fused_updates == 2);
    for (size_t i = 0; i < eager.values.size(); ++i) {
      test::check_values(fused.values[i], eager.values[i], {0, kSteps * 2 * unit_roundoff(dt) * max_abs(eager.values[i])});
    }
  }
}

TEST_CASE("the bf16 gradient of a broadcast bias matches central finite differences computed in f64") {
  // loss(b) = sum(tanh(x @ w + b) * r): the bias is broadcast over 8 rows, so its gradient is a sum
  // (over those rows) of r * (1 - tanh^2), computed by the tape in bf16.
  const fl::Tensor x = test::random_tensor({8, 5}, 21, fl::bf16);
  const fl::Tensor w = test::random_tensor({5, 3}, 22, fl::bf16);
  const fl::Tensor b = test::random_tensor({3}, 23, fl::bf16);
  const fl::Tensor r = test::random_tensor({8, 3}, 24, fl::bf16);
  auto loss_of = [](const fl::Tensor& xs, const fl::Tensor& ws, const fl::Tensor& bs, const fl::Tensor& rs) {
    return fl::sum(fl::tanh(fl::matmul(xs, ws) + bs) * rs);
  };
  fl::GradientTape tape;
  tape.watch(b);
  const fl::Tensor loss = loss_of(x, w, b, r);
  CHECK(loss.dtype() == fl::bf16);
  const fl::Tensor grad = tape.gradient(loss, {b})[0];
  // Finite differences in f64 at the same (bf16) values.
  auto f64 = [](const fl::Tensor& t) { return test::make(test::values(t), t.shape(), fl::f64); };
  const std::vector<double> base = test::values(b);
  const std::vector<double> numeric =
      test::gradient::central_differences(base, 1e-6, [&](const std::vector<double>& moved) {
        return test::values(loss_of(f64(x), f64(w), test::make(moved, fl::Shape{3}, fl::f64), f64(r)))[0];
      });
  // Each of the 8 terms |r (1 - tanh^2)| <= |r| carries a few bf16 roundings (the product, the sum
  // with b, tanh, the products of the backward pass): a relative error of about 4u each, so the
  // sum is within 4u * sum|r| (plus rounding the result, u relative).
  const std::vector<double> rv = test::values(r);
  double scale = 0;
  for (double v : rv) scale += std::abs(v);
  test::check_tensor(grad, numeric, fl::Shape{3}, fl::bf16, test::Tolerance{unit_roundoff(fl::bf16), 4 * unit_roundoff(fl::bf16) * scale / 3});
}

TEST_CASE("ops given f16 and f32 inputs throw DTypeError naming the op and both dtypes") {
  const fl::Tensor h = fl::ones({2, 2}, fl::f16);
  const fl::Tensor s = fl::ones({2, 2}, fl::f32);
  test::check_op_throws<fl::DTypeError>("add", [&] { (void)(h + s); }, {"f16", "f32"});
  test::check_op_throws<fl::DTypeError>("mul", [&] { (void)fl::mul(s, h); }, {"f32", "f16"});
  test::check_op_throws<fl::DTypeError>("matmul", [&] { (void)fl::matmul(h, s); }, {"f16", "f32"});
  test::check_op_throws<fl::DTypeError>("where", [&] { (void)fl::where(s > 0.0f, h, s); }, {"f16", "f32"});
  test::check_op_throws<fl::DTypeError>("concat", [&] { (void)fl::concat({h, s}, 0); }, {"f16", "f32"});
  test::check_op_throws<fl::DTypeError>("add", [&] { (void)(fl::ones({2}, fl::bf16) + fl::ones({2}, fl::f16)); },
                                        {"bf16", "f16"});
}

TEST_CASE("the softmax family takes f32/f64 logits and says to cast half ones up; through the cast, gradients return in the half dtype") {
  const fl::Tensor logits = test::random_tensor({4, 3}, 31, fl::bf16);
  const fl::Tensor labels = fl::tensor(std::vector<int64_t>{0, 2, 1, 2}, fl::Shape{4});
  test::check_op_throws<fl::DTypeError>("softmax_cross_entropy", [&] { (void)fl::softmax_cross_entropy(logits, labels); },
                                        {"bf16", "cast(logits, f32)"});
  test::check_op_throws<fl::DTypeError>("softmax", [&] { (void)fl::softmax(logits.astype(fl::f16), -1); }, {"f16", "f32"});
  test::check_op_throws<fl::DTypeError>("log_softmax", [&] { (void)fl::log_softmax(logits, -1); }, {"bf16"});
  fl::GradientTape tape;
  tape.watch(logits);
  const fl::Tensor loss = fl::mean(fl::softmax_cross_entropy(fl::cast(logits, fl::f32), labels));
  const fl::Tensor grad = tape.gradient(loss, {logits})[0];
  CHECK(grad.dtype() == fl::bf16);
  // Reference: (softmax(x) - one_hot(label)) / N in f64 at the same values, rounded to bf16.
  const std::vector<double> x = test::values(logits);
  const std::vector<int64_t> y = {0, 2, 1, 2};
  std::vector<double> want;
  for (size_t i = 0; i < 4; ++i) {
    double top = -1e300, total = 0;
    for (size_t c = 0; c < 3; ++c) top = std::max(top, x[i * 3 + c]);
    for (size_t c = 0; c < 3; ++c) total += std::exp(x[i * 3 + c] - top);
    for (size_t c = 0; c < 3; ++c)
      want.push_back((std::exp(x[i * 3 + c] - top) / total - (static_cast<int64_t>(c) == y[i] ? 1.0 : 0.0)) / 4);
  }
  test::check_tensor(grad, want, fl::Shape{4, 3}, fl::bf16);
}
