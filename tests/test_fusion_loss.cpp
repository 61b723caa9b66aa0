// The cross-entropy gradient fusion (src/trace/passes/cross_entropy_grad_fusion.cpp,
// src/ops/cross_entropy_grad.hpp): softmax_cross_entropy_grad against a naive f64 loop and against
// eager's one_hot/cast/softmax/sub/mul, bit for bit (odd sizes, one
// class, empty, rows split over threads, strided logits, huge and -inf logits, NaN, i32 and i64
// labels); the traced loss gradient fuses to one
// node and equals eager, the unfused graph and f64 finite differences; at batch 1 (no mul left, the
// op without g) likewise; where the pass must not fire (softmax over the other axis, operands
// swapped, targets that are not one_hot, the lone difference whose softmax is read elsewhere) and
// where only the difference fuses (it is also returned, g of [N, C] or [1, C]); and the op's errors.
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "flowlet/dispatch.hpp"
#include "flowlet/graph.hpp"
#include "flowlet/trace.hpp"
#include "ops/cross_entropy_grad.hpp"
#include "support/loss_inputs.hpp"
#include "support/pass_switch.hpp"
#include "support/reference.hpp"

namespace {

using Tensors = std::vector<fl::Tensor>;
using test::count_ops;

// Naive f64: g_i * (exp(x_ic) / sum_c exp(x_ic) - [c == label_i]).
std::vector<double> naive_grad(const fl::Tensor& logits, const fl::Tensor& labels, const fl::Tensor& g) {
  const std::vector<double> x = test::values(logits), l = test::values(labels), gv = test::values(g);
  const int64_t n = logits.shape()[0], c = logits.shape()[1];
  std::vector<double> dx(static_cast<size_t>(n * c));
  for (int64_t i = 0; i < n; ++i) {
    double total = 0;
    for (int64_t j = 0; j < c; ++j) total += std::exp(x[static_cast<size_t>(i * c + j)]);
    for (int64_t j = 0; j < c; ++j) {
      const double p = std::exp(x[static_cast<size_t>(i * c + j)]) / total;
      dx[static_cast<size_t>(i * c + j)] = gv[static_cast<size_t>(i)] * (p - (j == static_cast<int64_t>(l[static_cast<size_t>(i)]) ? 1.0 : 0.0));
    }
  }
  return dx;
}

// What softmax_cross_entropy's gradient rule computes, op by op (eager).
fl::Tensor eager_chain(const fl::Tensor& logits, const fl::Tensor& labels, const fl::Tensor& g) {
  return g * (fl::softmax(logits) - fl::cast(fl::one_hot(labels, logits.shape()[1]), logits.dtype()));
}

fl::Tensor fused_op(const fl::Tensor& logits, const fl::Tensor& labels, const fl::Tensor& g) {
  return fl::dispatch_all(fl::detail::cross_entropy_grad_op, Tensors{logits, labels, g}, nullptr)[0];
}
// The op without g (g = 1), as the pass makes it where no mul was left.
fl::Tensor fused_op(const fl::Tensor& logits, const fl::Tensor& labels) {
  return fl::dispatch_all(fl::detail::cross_entropy_grad_op, Tensors{logits, labels}, nullptr)[0];
}

// Against a naive f64 loop: f32's p carries a few ulp; g * (p - 1) loses p's leading digit.
test::Tolerance tolerance(fl::DType dtype) {
  return dtype == fl::f64 ? test::Tolerance{1e-12, 1e-14} : test::Tolerance{1e-5, 2e-6};
}

// Against eager's ops, bit for bit (NaN where eager has NaN): the fused node runs the softmax op's
// own arithmetic (f32 rows with the vectorized exp, f64 with libm) and eager's sub and mul.
void check_matches_eager(const fl::Tensor& got, const fl::Tensor& want) { test::check_same_bits(got, want); }

struct Case {
  const char* name;
  int64_t n, c;
};
// Odd sizes, one class (softmax is 1: the gradient is 0), one row, empty, rows split over threads
// (6553 rows a chunk at 10 classes).
const std::vector<Case> kCases = {{"7x10", 7, 10}, {"5x1 (one class)", 5, 1}, {"1x13", 1, 13},
                                  {"0x10 (empty)", 0, 10}, {"20000x10 (split)", 20000, 10}, {"33x257", 33, 257}};

// loss = sum(softmax_cross_entropy(logits, labels) * weights): the gradient's g is the weights.
fl::Tensor logits_gradient(const fl::Tensor& logits, const fl::Tensor& labels, const fl::Tensor& weights) {
  fl::GradientTape tape;
  tape.watch(logits);
  const fl::Tensor loss = fl::sum(fl::softmax_cross_entropy(logits, labels) * weights);
  return tape.gradient(loss, Tensors{logits})[0];
}

}  // namespace

TEST_CASE_TEMPLATE("softmax_cross_entropy_grad equals eager's ops bit for bit and a naive f64 loop", T, float, double) {
  const fl::DType dtype = std::is_same_v<T, float> ? fl::f32 : fl::f64;
  for (const Case& c : kCases) {
    for (const fl::DType label_type : {fl::i32, fl::i64}) {
      CAPTURE(c.name);
      CAPTURE(label_type);
      const fl::Tensor logits = test::loss_logits({c.n, c.c}, 1, dtype), g = test::loss_logits({c.n, 1}, 2, dtype);
      const fl::Tensor labels = test::loss_labels(c.n, c.c, label_type, 3);
      const fl::Tensor got = fused_op(logits, labels, g);
      check_matches_eager(got, eager_chain(logits, labels, g));
      CHECK(test::check_tensor(got, naive_grad(logits, labels, g), fl::Shape{c.n, c.c}, dtype, tolerance(dtype)));
      // Without g: softmax - one_hot, as eager's chain with g = 1 (its mul by 1 changes nothing).
      const fl::Tensor ones = fl::ones(fl::Shape{c.n, 1}, dtype), no_g = fused_op(logits, labels);
      check_matches_eager(no_g, eager_chain(logits, labels, ones));
      CHECK(test::check_tensor(no_g, naive_grad(logits, labels, ones), fl::Shape{c.n, c.c}, dtype, tolerance(dtype)));
    }
  }
  // Strided logits (a transposed view) and a column-sliced g.
  const fl::Tensor logits = fl::transpose(test::loss_logits({9, 6}, 4, dtype)), labels = test::loss_labels(6, 9, fl::i64, 5);
  const fl::Tensor g = fl::slice(test::loss_logits({6, 3}, 6, dtype), 1, 2, 1);
  check_matches_eager(fused_op(logits, labels, g), eager_chain(logits, labels, g));
  // Large logits stay finite (the maximum is subtracted first); -inf logits get probability 0.
  std::vector<double> big = {1000, -1000, 999, -std::numeric_limits<double>::infinity(), 0, 1e4};
  const fl::Tensor wide = test::make(big, fl::Shape{2, 3}, dtype), two = test::loss_labels(2, 3, fl::i64, 1);
  const fl::Tensor ones = fl::ones(fl::Shape{2, 1}, dtype);
  const fl::Tensor out = fused_op(wide, two, ones);
  check_matches_eager(out, eager_chain(wide, two, ones));
  for (const double v : test::values(out)) CHECK(std::isfinite(v));
  // A NaN logit makes its row NaN, as in eager's softmax; the other row stays finite.
  big[1] = std::numeric_limits<double>::quiet_NaN();
  const fl::Tensor with_nan = test::make(big, fl::Shape{2, 3}, dtype);
  const std::vector<double> nan_out = test::values(fused_op(with_nan, two, ones));
  for (size_t i = 0; i < nan_out.size(); ++i) CHECK(std::isnan(nan_out[i]) == (i < 3));
  check_matches_eager(fused_op(with_nan, two, ones), eager_chain(with_nan, two, ones));
}

TEST_CASE("a traced cross-entropy gradient becomes one node, equal to eager, the unfused graph and finite differences") {
  for (const fl::DType dtype : {fl::f32, fl::f64}) {
    for (const bool mean : {true, false}) {  // mean: g is a folded constant; weights: g is reshape(weights)
      CAPTURE(dtype);
      CAPTURE(mean);
      const int64_t n = 37, c = 10;
      const fl::Tensor logits = test::loss_logits({n, c}, 11, dtype), labels = test::loss_labels(n, c, fl::i64, 2);
      const fl::Tensor weights = test::loss_logits({n}, 12, dtype);
      auto f = [mean](const fl::Tensor& x, const fl::Tensor& l, const fl::Tensor& w) {
        if (!mean) return logits_gradient(x, l, w);
        fl::GradientTape tape;
        tape.watch(x);
        return tape.gradient(fl::mean(fl::softmax_cross_entropy(x, l)), Tensors{x})[0];
      };
      auto traced = fl::trace(f);
      const fl::Graph& graph = traced.graph(logits, labels, weights);
      graph.check_invariants();
      CHECK(count_ops(graph, "softmax_cross_entropy_grad") == 1);
      for (const char* gone : {"softmax", "one_hot", "cast", "sub", "mul"}) {
        CAPTURE(gone);
        CHECK(count_ops(graph, gone) == 0);
      }
      const fl::Tensor got = traced(logits, labels, weights);
      check_matches_eager(got, f(logits, labels, weights));
      {
        test::PassSwitch off("FLOWLET_DENSE_FUSION", false);
        auto unfused = fl::trace(f);
        CHECK(count_ops(unfused.graph(logits, labels, weights), "softmax_cross_entropy_grad") == 0);
        check_matches_eager(got, unfused(logits, labels, weights));
      }
      if (dtype != fl::f64 || mean) continue;
      // Central differences of the f64 loss sum(ce(x, labels) * weights) at a few entries.
      auto loss_at = [&](const fl::Tensor& x) {
        return fl::sum(fl::softmax_cross_entropy(x, labels) * weights).item<double>();
      };
      const std::vector<double> grad = test::values(got);
      const double eps = 1e-5;
      for (const size_t at : {size_t{0}, size_t{13}, size_t{n * c - 1}}) {
        std::vector<double> plus = test::values(logits), minus = plus;
        plus[at] += eps;
        minus[at] -= eps;
        const double numeric = (loss_at(fl::tensor(plus, logits.shape())) - loss_at(fl::tensor(minus, logits.shape()))) / (2 * eps);
        CAPTURE(at);
        // The loss (~80) rounds to ~1e-14, so the quotient carries ~1e-9; a wrong term would be ~1e-3.
        CHECK(grad[at] == doctest::Approx(numeric).epsilon(1e-6).scale(1.0));
      }
    }
  }
}

TEST_CASE("at batch 1 (no mul left after simplify) the traced loss gradient is still one node, equal to eager") {
  for (const fl::DType dtype : {fl::f32, fl::f64}) {
    for (const int64_t n : {int64_t{1}, int64_t{3}}) {  // 3: a plain sum, whose gradient is 1 per row too
      CAPTURE(dtype);
      CAPTURE(n);
      const int64_t c = 10;
      const fl::Tensor logits = test::loss_logits({n, c}, 41, dtype), labels = test::loss_labels(n, c, fl::i64, 4);
      auto f = [n](const fl::Tensor& x, const fl::Tensor& l) {
        fl::GradientTape tape;
        tape.watch(x);
        const fl::Tensor per_row = fl::softmax_cross_entropy(x, l);
        return tape.gradient(n == 1 ? fl::mean(per_row) : fl::sum(per_row), Tensors{x})[0];
      };
      auto traced = fl::trace(f);
      const fl::Graph& graph = traced.graph(logits, labels);
      graph.check_invariants();
      CHECK(count_ops(graph, "softmax_cross_entropy_grad") == 1);
      for (const char* gone : {"softmax", "one_hot", "cast", "sub", "mul"}) {
        CAPTURE(gone);
        CHECK(count_ops(graph, gone) == 0);
      }
      const fl::Tensor got = traced(logits, labels);
      check_matches_eager(got, f(logits, labels));
      CHECK(test::check_tensor(got, naive_grad(logits, labels, fl::ones(fl::Shape{n, 1}, dtype)), fl::Shape{n, c}, dtype,
                               tolerance(dtype)));
    }
  }
}

TEST_CASE("the cross-entropy gradient pass fires on g * (softmax(x) - one_hot(l)) only") {
  const int64_t n = 6, c = 5;
  const fl::Tensor x = test::loss_logits({n, c}, 21, fl::f64), labels = test::loss_labels(n, c, fl::i64, 1);
  const fl::Tensor g = test::loss_logits({n, 1}, 22, fl::f64);
  auto fused_count = [&](auto f) { return test::traced_op_counts(f, {"softmax_cross_entropy_grad"}, x, labels, g)[0]; };
  auto targets = [c](const fl::Tensor& l) { return fl::cast(fl::one_hot(l, c), fl::f64); };
  // The pattern, either mul order; with the softmax also read elsewhere (it stays for that reader).
  CHECK(fused_count([&](const fl::Tensor& xa, const fl::Tensor& la, const fl::Tensor& ga) {
          return Tensors{ga * (fl::softmax(xa) - targets(la))};
        }) == 1);
  CHECK(fused_count([&](const fl::Tensor& xa, const fl::Tensor& la, const fl::Tensor& ga) {
          return Tensors{(fl::softmax(xa, 1) - targets(la)) * ga};
        }) == 1);
  CHECK(fused_count([&](const fl::Tensor& xa, const fl::Tensor& la, const fl::Tensor& ga) {
          const fl::Tensor p = fl::softmax(xa);
          return Tensors{ga * (p - targets(la)), p};
        }) == 1);
  // The difference also returned, g of [N, C] or [1, C]: the mul stays, the difference alone fuses
  // (g = 1).
  auto muls_left = [&](auto f) { return count_ops(fl::trace(f).graph(x, labels, g), "mul"); };
  const auto also_returned = [&](const fl::Tensor& xa, const fl::Tensor& la, const fl::Tensor& ga) {
    const fl::Tensor d = fl::softmax(xa) - targets(la);
    return Tensors{ga * d, d};
  };
  CHECK(fused_count(also_returned) == 1);
  CHECK(muls_left(also_returned) == 1);
  const auto full_g = [&](const fl::Tensor& xa, const fl::Tensor& la, const fl::Tensor& ga) {
    return Tensors{(ga * xa) * (fl::softmax(xa) - targets(la))};
  };
  CHECK(fused_count(full_g) == 1);
  CHECK(muls_left(full_g) == 2);
  const auto row_g = [&](const fl::Tensor& xa, const fl::Tensor& la, const fl::Tensor& ga) {  // g [1, C]
    return Tensors{fl::reshape(fl::slice(ga, 0, 0, c), {1, c}) * (fl::softmax(xa) - targets(la))};
  };
  CHECK(fused_count(row_g) == 1);
  CHECK(muls_left(row_g) == 1);
  // No mul at all (a loss gradient of 1): the difference fuses, unless the softmax is also read
  // elsewhere (the fused node would compute a softmax a kept node computes too).
  CHECK(fused_count([&](const fl::Tensor& xa, const fl::Tensor& la, const fl::Tensor&) {
          return Tensors{fl::softmax(xa) - targets(la)};
        }) == 1);
  CHECK(fused_count([&](const fl::Tensor& xa, const fl::Tensor& la, const fl::Tensor&) {
          const fl::Tensor p = fl::softmax(xa);
          return Tensors{p - targets(la), p};
        }) == 0);
  // Not: softmax over the rows, targets minus softmax, targets that are not one_hot.
  CHECK(fused_count([&](const fl::Tensor& xa, const fl::Tensor& la, const fl::Tensor& ga) {
          return Tensors{ga * (fl::softmax(xa, 0) - targets(la))};
        }) == 0);
  CHECK(fused_count([&](const fl::Tensor& xa, const fl::Tensor& la, const fl::Tensor& ga) {
          return Tensors{ga * (targets(la) - fl::softmax(xa))};
        }) == 0);
  CHECK(fused_count([&](const fl::Tensor& xa, const fl::Tensor&, const fl::Tensor& ga) {
          return Tensors{ga * (fl::softmax(xa) - fl::exp(xa))};
        }) == 0);
}

TEST_CASE("softmax_cross_entropy_grad names itself and the shapes, dtypes and labels it refuses") {
  const fl::Op& op = fl::detail::cross_entropy_grad_op;
  const fl::Tensor x = test::loss_logits({3, 4}, 31, fl::f32), l = test::loss_labels(3, 4, fl::i64, 0), g = test::loss_logits({3, 1}, 32, fl::f32);
  CHECK(test::check_op_throws<fl::ShapeError>("softmax_cross_entropy_grad", [&] { fused_op(x, l, test::loss_logits({3}, 33, fl::f32)); },
                                              {"[3, 4]", "[3]"}));
  CHECK(test::check_op_throws<fl::ShapeError>("softmax_cross_entropy_grad",
                                              [&] { fused_op(x, test::loss_labels(4, 4, fl::i64, 0), g); }, {"[4]"}));
  CHECK(test::check_op_throws<fl::ShapeError>("softmax_cross_entropy_grad",
                                              [&] { fused_op(x, test::loss_labels(4, 4, fl::i64, 0)); }, {"[3, 4]", "[4]"}));
  CHECK(test::check_op_throws<fl::ShapeError>("softmax_cross_entropy_grad",
                                              [&] { fused_op(test::loss_logits({3, 4, 1}, 34, fl::f32), l, g); }, {"[3, 4, 1]"}));
  CHECK(test::check_op_throws<fl::DTypeError>("softmax_cross_entropy_grad", [&] { fused_op(x, l, g.astype(fl::f64)); },
                                              {"f32", "f64"}));
  CHECK(test::check_op_throws<fl::DTypeError>("softmax_cross_entropy_grad",
                                              [&] { fused_op(x.astype(fl::i32), l, g.astype(fl::i32)); }, {"i32"}));
  CHECK(test::check_op_throws<fl::DTypeError>("softmax_cross_entropy_grad", [&] { fused_op(x, l.astype(fl::f32), g); },
                                              {"f32"}));
  const fl::Tensor bad = fl::tensor(std::vector<int64_t>{0, 4, 1}, fl::Shape{3});
  CHECK(test::check_op_throws<fl::OutOfRange>("softmax_cross_entropy_grad", [&] { fused_op(x, bad, g); },
                                              {"[0, 4)", "label 4", "position 1"}));
  CHECK(test::check_op_throws<fl::OutOfRange>("softmax_cross_entropy_grad", [&] { fused_op(x, bad); },
                                              {"[0, 4)", "label 4", "position 1"}));
  const fl::Tensor negative = fl::tensor(std::vector<int32_t>{0, 1, -1}, fl::Shape{3});
  CHECK(test::check_op_throws<fl::OutOfRange>("softmax_cross_entropy_grad", [&] { fused_op(x, negative, g); },
                                              {"label -1", "position 2"}));
  const bool has_grad = op.grad != nullptr;
  CHECK_FALSE(has_grad);
  CHECK(fl::find_op("softmax_cross_entropy_grad") == &op);
}
