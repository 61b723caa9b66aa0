// The loss forward and its fused gradient sharing one softmax (src/trace/passes/
// cross_entropy_softmax_sharing.cpp, src/ops/cross_entropy_grad.hpp): softmax_cross_entropy_with_probs
// against softmax_cross_entropy and softmax, and softmax_cross_entropy_grad_from_probs against
// softmax_cross_entropy_grad, bit for bit (odd sizes, one class, empty, rows split over threads,
// strided logits, huge, -inf and NaN logits, i32 and i64 labels, f32 and f64); a traced step
// returning the loss and its gradient shares the softmax and equals eager and the unfused graph bit
// for bit (with g and at batch 1 without); where it must not fire (the loss unused, so pruned; a
// loss of other logits or other labels); and the ops' errors.
#include <cmath>
#include <cstdint>
#include <limits>
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

Tensors with_probs(const fl::Tensor& logits, const fl::Tensor& labels) {
  return fl::dispatch_all(fl::detail::cross_entropy_probs_op, Tensors{logits, labels}, nullptr);
}
fl::Tensor grad_from(const fl::Op& op, const Tensors& inputs) { return fl::dispatch_all(op, inputs, nullptr)[0]; }

// Both ops against the unshared ones on one input: the loss and the softmax as eager computes them,
// the gradient from the probs as the fused gradient computes it from the logits (with g and without).
void check_ops(const fl::Tensor& logits, const fl::Tensor& labels, const fl::Tensor& g) {
  const Tensors out = with_probs(logits, labels);
  REQUIRE(out.size() == 2);
  test::check_same_bits(out[0], fl::softmax_cross_entropy(logits, labels));
  test::check_same_bits(out[1], fl::softmax(logits));
  test::check_same_bits(grad_from(fl::detail::cross_entropy_grad_from_probs_op, {out[1], labels, g}),
                  grad_from(fl::detail::cross_entropy_grad_op, {logits, labels, g}));
  test::check_same_bits(grad_from(fl::detail::cross_entropy_grad_from_probs_op, {out[1], labels}),
                  grad_from(fl::detail::cross_entropy_grad_op, {logits, labels}));
}

struct Case {
  const char* name;
  int64_t n, c;
};
// Odd sizes, one class, one row, empty, rows split over threads (from 4096 logits a piece for the
// forward, 65536 for the gradients), wider than the forward's 4096-float block.
const std::vector<Case> kCases = {{"7x10", 7, 10},     {"5x1 (one class)", 5, 1}, {"1x13", 1, 13},
                                  {"0x10 (empty)", 0, 10}, {"1024x10", 1024, 10},  {"20001x10 (split)", 20001, 10},
                                  {"33x257", 33, 257},  {"3x5000", 3, 5000}};

// The traced step's shape: the mean loss and its gradient with respect to the logits, both returned.
Tensors loss_and_gradient(const fl::Tensor& x, const fl::Tensor& labels) {
  fl::GradientTape tape;
  tape.watch(x);
  const fl::Tensor loss = fl::mean(fl::softmax_cross_entropy(x, labels));
  return Tensors{loss, tape.gradient(loss, Tensors{x})[0]};
}

}  // namespace

TEST_CASE("softmax_cross_entropy_with_probs and _grad_from_probs equal the unshared ops bit for bit") {
  for (const fl::DType dtype : {fl::f32, fl::f64}) {
    for (const Case& c : kCases) {
      for (const fl::DType label_type : {fl::i32, fl::i64}) {
        CAPTURE(dtype);
        CAPTURE(c.name);
        CAPTURE(label_type);
        check_ops(test::loss_logits({c.n, c.c}, 1, dtype), test::loss_labels(c.n, c.c, label_type, 3), test::loss_logits({c.n, 1}, 2, dtype));
      }
    }
    CAPTURE(dtype);
    // Strided logits (a transposed view) and a column-sliced g.
    check_ops(fl::transpose(test::loss_logits({9, 6}, 4, dtype)), test::loss_labels(6, 9, fl::i64, 5),
              fl::slice(test::loss_logits({6, 3}, 6, dtype), 1, 2, 1));
    // Huge logits, -inf off and at the label, NaN, a row of -inf.
    const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
    const fl::Tensor odd = test::make({1000, -1000, 999, -inf, 0, 1e4, 0, -inf, 1, 0, nan, 2, -inf, -inf, -inf},
                                      fl::Shape{5, 3}, dtype);
    check_ops(odd, fl::tensor(std::vector<int64_t>{0, 2, 1, 0, 1}, fl::Shape{5}), test::loss_logits({5, 1}, 7, dtype));
  }
}

TEST_CASE("a traced step returning the loss and its gradient computes the softmax once, equal to eager") {
  for (const fl::DType dtype : {fl::f32, fl::f64}) {
    for (const int64_t n : {int64_t{1}, int64_t{37}, int64_t{1024}}) {  // 1: no mul left, the gradient has no g
      CAPTURE(dtype);
      CAPTURE(n);
      const int64_t c = 10;
      const fl::Tensor logits = test::loss_logits({n, c}, 11 + static_cast<uint64_t>(n), dtype);
      const fl::Tensor labels = test::loss_labels(n, c, fl::i64, 2);
      auto traced = fl::trace(loss_and_gradient);
      const fl::Graph& graph = traced.graph(logits, labels);
      graph.check_invariants();
      CHECK(count_ops(graph, "softmax_cross_entropy_with_probs") == 1);
      CHECK(count_ops(graph, "softmax_cross_entropy_grad_from_probs") == 1);
      for (const char* gone : {"softmax_cross_entropy", "softmax_cross_entropy_grad", "softmax", "one_hot", "sub"}) {
        CAPTURE(gone);
        CHECK(count_ops(graph, gone) == 0);
      }
      const Tensors got = traced(logits, labels), eager = loss_and_gradient(logits, labels);
      test::check_same_bits(got[0], eager[0]);
      test::check_same_bits(got[1], eager[1]);
      test::PassSwitch off("FLOWLET_DENSE_FUSION", false);
      auto unfused = fl::trace(loss_and_gradient);
      CHECK(count_ops(unfused.graph(logits, labels), "softmax_cross_entropy_with_probs") == 0);
      const Tensors plain = unfused(logits, labels);
      test::check_same_bits(got[0], plain[0]);
      test::check_same_bits(got[1], plain[1]);
    }
  }
}

TEST_CASE("the softmax is shared only with the loss of the same logits and labels") {
  const int64_t n = 6, c = 5;
  const fl::Tensor x = test::loss_logits({n, c}, 21, fl::f32), labels = test::loss_labels(n, c, fl::i64, 1);
  const fl::Tensor other_labels = test::loss_labels(n, c, fl::i64, 2);
  auto gradient = [](const fl::Tensor& xa, const fl::Tensor& la) {
    fl::GradientTape tape;
    tape.watch(xa);
    return tape.gradient(fl::mean(fl::softmax_cross_entropy(xa, la)), Tensors{xa})[0];
  };
  // Counts of (with_probs, grad_from_probs, plain fused gradient) in f's graph; its values equal eager.
  auto counts = [&](auto f) {
    return test::traced_op_counts(f,
                                  {"softmax_cross_entropy_with_probs", "softmax_cross_entropy_grad_from_probs",
                                   "softmax_cross_entropy_grad"},
                                  x, labels, other_labels);
  };
  // The loss unused: its forward node was pruned, nothing to share.
  CHECK(counts([&](const fl::Tensor& xa, const fl::Tensor& la, const fl::Tensor&) {
          return Tensors{gradient(xa, la)};
        }) == std::vector<int>{0, 0, 1});
  // A returned loss of other logits, or of other labels: the gradient keeps its own softmax.
  CHECK(counts([&](const fl::Tensor& xa, const fl::Tensor& la, const fl::Tensor&) {
          return Tensors{fl::softmax_cross_entropy(xa * 2.0, la), gradient(xa, la)};
        }) == std::vector<int>{0, 0, 1});
  CHECK(counts([&](const fl::Tensor& xa, const fl::Tensor& la, const fl::Tensor& lb) {
          return Tensors{fl::softmax_cross_entropy(xa, lb), gradient(xa, la)};
        }) == std::vector<int>{0, 0, 1});
  // The same loss returned: shared.
  CHECK(counts([&](const fl::Tensor& xa, const fl::Tensor& la, const fl::Tensor&) {
          return Tensors{fl::softmax_cross_entropy(xa, la), gradient(xa, la)};
        }) == std::vector<int>{1, 1, 0});
}

TEST_CASE("the shared-softmax ops name themselves and what they refuse") {
  const fl::Tensor x = test::loss_logits({3, 4}, 31, fl::f32), l = test::loss_labels(3, 4, fl::i64, 0), g = test::loss_logits({3, 1}, 32, fl::f32);
  const fl::Tensor bad = fl::tensor(std::vector<int64_t>{0, 4, 1}, fl::Shape{3});
  CHECK(test::check_op_throws<fl::OutOfRange>("softmax_cross_entropy_with_probs", [&] { with_probs(x, bad); },
                                              {"[0, 4)", "label 4", "position 1"}));
  CHECK(test::check_op_throws<fl::ShapeError>("softmax_cross_entropy_with_probs",
                                              [&] { with_probs(x, test::loss_labels(4, 4, fl::i64, 0)); }, {"[3, 4]", "[4]"}));
  CHECK(test::check_op_throws<fl::DTypeError>("softmax_cross_entropy_with_probs",
                                              [&] { with_probs(x, l.astype(fl::f32)); }, {"f32"}));
  const fl::Op& from_probs = fl::detail::cross_entropy_grad_from_probs_op;
  CHECK(test::check_op_throws<fl::OutOfRange>("softmax_cross_entropy_grad_from_probs",
                                              [&] { grad_from(from_probs, {x, bad, g}); }, {"[0, 4)", "label 4"}));
  CHECK(test::check_op_throws<fl::ShapeError>("softmax_cross_entropy_grad_from_probs",
                                              [&] { grad_from(from_probs, {x, l, test::loss_logits({3}, 33, fl::f32)}); },
                                              {"[3, 4]", "[3]"}));
  CHECK(test::check_op_throws<fl::DTypeError>("softmax_cross_entropy_grad_from_probs",
                                              [&] { grad_from(from_probs, {x, l, g.astype(fl::f64)}); }, {"f32", "f64"}));
  const bool no_grads = fl::detail::cross_entropy_probs_op.grad == nullptr && from_probs.grad == nullptr;
  CHECK(no_grads);
  CHECK(fl::find_op("softmax_cross_entropy_with_probs") == &fl::detail::cross_entropy_probs_op);
  CHECK(fl::find_op("softmax_cross_entropy_grad_from_probs") == &from_probs);
}
