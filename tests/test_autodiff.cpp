// Gradient tapes: every gradient rule against central finite differences, tape semantics
// (watching, the unconnected rule, persistence, errors) and higher-order gradients via nested tapes.
//
// The generic check: for each op in all_ops() with a gradient rule, a table of cases (keyed by op
// name, like the op table) builds f64 inputs; loss = sum(op(inputs) * w) for fixed random weights
// w; the tape's gradient with respect to each floating input is compared with central finite
// differences of the loss, element by element. Integer inputs (indices, labels) and where's
// condition are fixed. The test fails when an op with a gradient rule has no case. The table and
// the check live in support/gradient_check.hpp, so test_cuda runs the same checks on a GPU.
#include <functional>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "support/gradient_check.hpp"

using namespace test::gradient;  // the case table and check_case (shared with tests/test_cuda.cpp)

TEST_CASE("every op with a gradient rule matches central finite differences in f64") {
  const std::map<std::string, Builder> builders = build_cases();
  std::set<std::string> with_grad;
  int cases_run = 0;
  for (const fl::Op* op : fl::all_ops()) {
    if (op->grad == nullptr) continue;
    const std::string name(op->name);
    with_grad.insert(name);
    CAPTURE(name);
    const auto found = builders.find(name);
    if (found == builders.end()) {
      FAIL_CHECK("op '" << name << "' has a gradient rule but no case in tests/test_autodiff.cpp");
      continue;
    }
    const std::vector<GradCase> cases = found->second();
    CHECK_MESSAGE(!cases.empty(), "op '" << name << "' has no gradient cases");
    for (const GradCase& c : cases) {
      ++cases_run;
      INFO("op ", name, ", case ", c.label);
      REQUIRE(c.differentiable.size() == c.inputs.size());
      try {
        check_case(c);
      } catch (const std::exception& e) {
        FAIL_CHECK("threw " << test::error_kind(e) << ": " << e.what());
      }
    }
  }
  for (const auto& [name, builder] : builders) {
    CAPTURE(name);
    CHECK_MESSAGE(with_grad.count(name) == 1, "case table names '" << name << "', which is not an op with a gradient rule");
  }
  CHECK(cases_run >= 100);
  // The documented differentiable primitives are all there.
  for (const char* name : {"add", "mul", "matmul", "sum", "max", "softmax_cross_entropy", "gather", "scatter_add", "slice"}) {
    CAPTURE(name);
    CHECK(with_grad.count(name) == 1);
  }
}

TEST_CASE("every gradient rule keeps f32 inputs in f32, close to the f64 gradients at the same values") {
  const std::map<std::string, Builder> builders = build_cases();
  int cases_run = 0;
  for (const fl::Op* op : fl::all_ops()) {
    if (op->grad == nullptr) continue;
    const std::string name(op->name);
    const auto found = builders.find(name);
    if (found == builders.end()) continue;  // reported by the finite-difference test
    for (const GradCase& c : found->second()) {
      INFO("op ", name, ", case ", c.label);
      try {
        const Inputs in32 = inputs_in(c, fl::f32);
        const Inputs in64 = inputs_in(c, fl::f64);  // the same (f32-rounded) values in f64
        const fl::Tensor probe = c.fn(in32);
        const std::vector<double> w = test::random_values(probe.shape().numel(), 4343, fl::f32);
        const std::vector<fl::Tensor> g32 = tape_gradients(c, in32, test::make(w, probe.shape(), probe.dtype()));
        const std::vector<fl::Tensor> g64 = tape_gradients(c, in64, test::make(w, probe.shape(), fl::f64));
        REQUIRE(g32.size() == g64.size());
        for (size_t k = 0; k < g32.size(); ++k)
          test::check_tensor(g32[k], test::values(g64[k]), g64[k].shape(), fl::f32, test::Tolerance{1e-4, 1e-4});
      } catch (const std::exception& e) {
        FAIL_CHECK("threw " << test::error_kind(e) << ": " << e.what());
      }
      ++cases_run;
    }
  }
  CHECK(cases_run >= 100);
}

TEST_CASE("documented conventions at ties and kinks") {
  auto grad = [](const std::function<fl::Tensor(const fl::Tensor&)>& f, const fl::Tensor& x) {
    fl::GradientTape tape;
    tape.watch(x);
    return tape.gradient(f(x), {x})[0];
  };
  // max: the gradient is split evenly between tied maxima.
  test::check_tensor(grad([](const fl::Tensor& t) { return fl::max(t); }, fl::tensor({1.0, 3.0, 3.0, 2.0})),
                     {0, 0.5, 0.5, 0}, {4}, fl::f64);
  test::check_tensor(grad([](const fl::Tensor& t) { return fl::sum(fl::max(t, {1}) * fl::tensor({1.0, 10.0})); },
                          fl::tensor(std::vector<double>{2, 2, 2, 0, 5, 1}, fl::Shape{2, 3})),
                     {1.0 / 3, 1.0 / 3, 1.0 / 3, 0, 10, 0}, {2, 3}, fl::f64);
  // maximum/minimum: ties send the gradient to the first argument.
  {
    const fl::Tensor a = fl::tensor({1.0, 2.0}), b = fl::tensor({1.0, 3.0});
    fl::GradientTape tape(/*persistent=*/true);
    tape.watch(a);
    tape.watch(b);
    const std::vector<fl::Tensor> gmax = tape.gradient(fl::maximum(a, b), {a, b});
    test::check_tensor(gmax[0], {1, 0}, {2}, fl::f64);
    test::check_tensor(gmax[1], {0, 1}, {2}, fl::f64);
    const std::vector<fl::Tensor> gmin = tape.gradient(fl::minimum(a, b), {a, b});
    test::check_tensor(gmin[0], {1, 1}, {2}, fl::f64);
    test::check_tensor(gmin[1], {0, 0}, {2}, fl::f64);
  }
  // relu and abs at 0 have gradient 0.
  test::check_tensor(grad([](const fl::Tensor& t) { return fl::relu(t); }, fl::tensor({-1.0, 0.0, 2.0})), {0, 0, 1}, {3},
                     fl::f64);
  test::check_tensor(grad([](const fl::Tensor& t) { return fl::abs(t); }, fl::tensor({-1.0, 0.0, 2.0})), {-1, 0, 1}, {3},
                     fl::f64);
  // pow: d/db a^b is taken as 0 where a <= 0 (no NaN); d/da is b a^(b-1).
  {
    const fl::Tensor a = fl::tensor({0.0, -2.0, 2.0}), b = fl::tensor({2.0, 2.0, 3.0});
    fl::GradientTape tape;
    tape.watch(a);
    tape.watch(b);
    const std::vector<fl::Tensor> g = tape.gradient(fl::pow(a, b), {a, b});
    test::check_tensor(g[0], {0, -4, 12}, {3}, fl::f64);
    test::check_tensor(g[1], {0, 0, 8 * std::log(2.0)}, {3}, fl::f64);
  }
}

TEST_CASE("ops without a gradient rule: comparisons, argmax, one_hot and creation ops") {
  for (const char* name : {"equal", "less", "argmax", "one_hot", "full", "arange", "randn", "uniform"}) {
    CAPTURE(name);
    const fl::Op* op = fl::find_op(name);
    REQUIRE(op != nullptr);
    const bool has_rule = op->grad != nullptr;
    CHECK_FALSE_MESSAGE(has_rule, "op '" << name << "' unexpectedly has a gradient rule");
  }
}

TEST_CASE("cast from f32 to f64 returns its gradient in f32; from an integer it gives zeros") {
  const fl::Tensor x = test::random_tensor({3, 4}, 70, fl::f32);
  const fl::Tensor w = test::random_tensor({3, 4}, 71, fl::f64);
  fl::GradientTape tape;
  tape.watch(x);
  const fl::Tensor loss = fl::sum(fl::cast(x, fl::f64) * w);
  const fl::Tensor g = tape.gradient(loss, std::vector<fl::Tensor>{x})[0];
  std::vector<double> want = test::values(w);
  for (double& v : want) v = test::round_to(v, fl::f32);
  test::check_tensor(g, want, {3, 4}, fl::f32);

  // f64 -> f32: the gradient comes back in f64.
  const fl::Tensor y = test::random_tensor({5}, 72, fl::f64);
  fl::GradientTape tape2;
  tape2.watch(y);
  const fl::Tensor g2 = tape2.gradient(fl::sum(fl::cast(y, fl::f32) * 3.0f), std::vector<fl::Tensor>{y})[0];
  test::check_tensor(g2, {3, 3, 3, 3, 3}, {5}, fl::f64);

  // i64 -> f64: an integer source has no gradient; it gets zeros of its shape and dtype.
  const fl::Tensor n = fl::tensor({int64_t{1}, int64_t{2}, int64_t{3}});
  fl::GradientTape tape3;
  tape3.watch(n);  // ignored for integers
  const fl::Tensor g3 = tape3.gradient(fl::sum(fl::cast(n, fl::f64)), std::vector<fl::Tensor>{n})[0];
  test::check_tensor(g3, {0, 0, 0}, {3}, fl::i64);
}

// ---------------------------------------------------------------------------------------------
// Tape semantics

TEST_CASE("variables are watched automatically: mean squared error gradient equals 2/N X^T (Xw - y)") {
  const int64_t n = 8;
  const fl::Tensor x = test::random_tensor({n, 3}, 80, fl::f64);
  const fl::Tensor y = test::random_tensor({n, 1}, 81, fl::f64);
  fl::Variable w(test::random_tensor({3, 1}, 82, fl::f64), "w");
  fl::GradientTape tape;
  const fl::Tensor loss = fl::mean(fl::square(fl::matmul(x, w) - y));
  const std::vector<fl::Tensor> g = tape.gradient(loss, std::vector<fl::Variable>{w});
  REQUIRE(g.size() == 1);

  const std::vector<double> xv = test::values(x), yv = test::values(y), wv = test::values(w.value());
  std::vector<double> want(3, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    double residual = -yv[static_cast<size_t>(i)];
    for (int64_t k = 0; k < 3; ++k) residual += xv[static_cast<size_t>(i * 3 + k)] * wv[static_cast<size_t>(k)];
    for (int64_t k = 0; k < 3; ++k) want[static_cast<size_t>(k)] += 2.0 / n * xv[static_cast<size_t>(i * 3 + k)] * residual;
  }
  test::check_tensor(g[0], want, {3, 1}, fl::f64, test::Tolerance{1e-12, 1e-12});
}

TEST_CASE("a variable read several times gets the sum of the gradients of its reads") {
  fl::Variable v(fl::tensor({1.0, 2.0, 3.0}), "v");
  fl::GradientTape tape;
  const fl::Tensor a = v;       // first read
  const fl::Tensor b = v.value();  // second read (same value)
  const fl::Tensor loss = fl::sum(a * b) + fl::sum(fl::Tensor(v) * 2.0);
  const fl::Tensor g = tape.gradient(loss, std::vector<fl::Variable>{v})[0];
  test::check_tensor(g, {4, 6, 8}, {3}, fl::f64);
}

TEST_CASE("a variable updated under the tape: gradients flow to both the old and the new value") {
  fl::Variable v(fl::tensor({1.0, 2.0}), "v");
  fl::GradientTape tape;
  const fl::Tensor first = v;
  v.assign(fl::tensor({10.0, 20.0}));
  const fl::Tensor second = v;
  const fl::Tensor loss = fl::sum(first * 3.0) + fl::sum(second * second);
  const fl::Tensor g = tape.gradient(loss, std::vector<fl::Variable>{v})[0];
  test::check_tensor(g, {3 + 20, 3 + 40}, {2}, fl::f64);
}

TEST_CASE("watch() makes a plain tensor a source; unwatched and unconnected sources get zeros of their shape") {
  const fl::Tensor x = fl::tensor({1.0, -2.0, 3.0});
  const fl::Tensor unwatched = fl::tensor({4.0, 5.0});
  const fl::Tensor unused = fl::zeros({2, 2}, fl::f64);
  fl::GradientTape tape;
  tape.watch(x);
  tape.watch(unused);
  const fl::Tensor loss = fl::sum(x * x) + fl::sum(unwatched);
  const std::vector<fl::Tensor> g = tape.gradient(loss, {x, unwatched, unused});
  REQUIRE(g.size() == 3);
  test::check_tensor(g[0], {2, -4, 6}, {3}, fl::f64);
  test::check_tensor(g[1], {0, 0}, {2}, fl::f64);
  test::check_tensor(g[2], {0, 0, 0, 0}, {2, 2}, fl::f64);
}

TEST_CASE("a target that depends on no watched tensor gives zeros for every source") {
  const fl::Tensor x = fl::tensor({1.0f, 2.0f});
  const fl::Tensor c = fl::tensor({3.0f, 4.0f});
  fl::GradientTape tape;
  tape.watch(x);
  const std::vector<fl::Tensor> g = tape.gradient(fl::sum(c * c), {x, c});
  test::check_tensor(g[0], {0, 0}, {2}, fl::f32);
  test::check_tensor(g[1], {0, 0}, {2}, fl::f32);
  fl::Variable v(fl::tensor({1.0, 2.0}), "unread");
  fl::GradientTape tape2;
  const fl::Tensor gv = tape2.gradient(fl::sum(fl::tensor({1.0})), std::vector<fl::Variable>{v})[0];
  test::check_tensor(gv, {0, 0}, {2}, fl::f64);
}

TEST_CASE("integer sources get zeros of their shape and dtype") {
  const fl::Tensor x = fl::tensor({1.0, 2.0});
  const fl::Tensor i = fl::tensor({int32_t{3}, int32_t{4}});
  fl::GradientTape tape;
  tape.watch(x);
  tape.watch(i);
  const fl::Tensor loss = fl::sum(x * fl::cast(i, fl::f64));
  const std::vector<fl::Tensor> g = tape.gradient(loss, {x, i});
  test::check_tensor(g[0], {3, 4}, {2}, fl::f64);
  test::check_tensor(g[1], {0, 0}, {2}, fl::i32);
}

TEST_CASE("an intermediate result can be a source") {
  const fl::Tensor x = fl::tensor({0.5, -1.0});
  fl::GradientTape tape;
  tape.watch(x);
  const fl::Tensor h = fl::tanh(x);
  const fl::Tensor loss = fl::sum(h * h * 3.0);
  const std::vector<fl::Tensor> g = tape.gradient(loss, {h, x});
  const std::vector<double> hv = test::values(h);
  test::check_tensor(g[0], {6 * hv[0], 6 * hv[1]}, {2}, fl::f64);
  test::check_tensor(g[1], {6 * hv[0] * (1 - hv[0] * hv[0]), 6 * hv[1] * (1 - hv[1] * hv[1])}, {2}, fl::f64);
}

TEST_CASE("a tape records only the ops of its own thread") {
  const fl::Tensor x = fl::tensor({1.0, 2.0});
  fl::GradientTape tape;
  tape.watch(x);
  fl::Tensor elsewhere;
  bool other_thread_saw_tape = true;
  std::thread worker([&] {
    other_thread_saw_tape = fl::detail::any_tape_active();
    elsewhere = x * 3.0;
  });
  worker.join();
  CHECK_FALSE(other_thread_saw_tape);
  const fl::Tensor loss = fl::sum(elsewhere) + fl::sum(x * x);
  test::check_tensor(tape.gradient(loss, {x})[0], {2, 4}, {2}, fl::f64);
}

TEST_CASE("a non-persistent tape computes gradients once; a persistent one several times") {
  const fl::Tensor x = fl::tensor({1.0, 2.0});
  {
    fl::GradientTape tape;
    tape.watch(x);
    const fl::Tensor y = fl::sum(fl::exp(x));
    (void)tape.gradient(y, {x});
    test::check_throws<fl::InvalidArgument>([&] { (void)tape.gradient(y, {x}); }, {"gradient:", "persistent"});
  }
  {
    fl::GradientTape tape(/*persistent=*/true);
    tape.watch(x);
    const fl::Tensor y = fl::sum(x * x * x);
    const fl::Tensor z = fl::sum(fl::square(x));
    const fl::Tensor g1 = tape.gradient(y, {x})[0];
    const fl::Tensor g2 = tape.gradient(y, {x})[0];
    const fl::Tensor gz = tape.gradient(z, {x})[0];
    test::check_tensor(g1, {3, 12}, {2}, fl::f64);
    test::check_tensor(g2, {3, 12}, {2}, fl::f64);
    test::check_tensor(gz, {2, 4}, {2}, fl::f64);
  }
}

TEST_CASE("a non-scalar target is summed first") {
  const fl::Tensor x = fl::tensor(std::vector<double>{0.5, -1.0, 2.0, 3.0}, fl::Shape{2, 2});
  fl::GradientTape tape(/*persistent=*/true);
  tape.watch(x);
  const fl::Tensor y = fl::tanh(x) * x;
  const fl::Tensor g = tape.gradient(y, {x})[0];
  const fl::Tensor g_sum = tape.gradient(fl::sum(y), {x})[0];
  test::check_tensor(g, test::values(g_sum), {2, 2}, fl::f64);
  // The target itself as a source: ones of its shape.
  test::check_tensor(tape.gradient(y, {y})[0], {1, 1, 1, 1}, {2, 2}, fl::f64);
}

TEST_CASE("tapes stop recording when destroyed; an inner tape's ops also record on the outer tape") {
  CHECK_FALSE(fl::detail::any_tape_active());
  const fl::Tensor x = fl::tensor({1.0, 2.0});
  fl::Tensor y_after;
  {
    fl::GradientTape outer;
    outer.watch(x);
    {
      fl::GradientTape inner;
      CHECK(fl::detail::any_tape_active());
    }
    CHECK(fl::detail::any_tape_active());  // the outer one is still live
    const fl::Tensor y = fl::sum(x * 5.0);
    test::check_tensor(outer.gradient(y, {x})[0], {5, 5}, {2}, fl::f64);
  }
  CHECK_FALSE(fl::detail::any_tape_active());
  y_after = fl::sum(x * 7.0);  // no tape: nothing records
  fl::GradientTape later;
  later.watch(x);
  // y_after was computed before this tape existed: it is not connected to x here.
  test::check_tensor(later.gradient(y_after, {x})[0], {0, 0}, {2}, fl::f64);
}

TEST_CASE("gradient() rejects empty handles and non-floating targets") {
  const fl::Tensor x = fl::tensor({1.0, 2.0});
  {
    fl::GradientTape tape;
    tape.watch(x);
    test::check_throws<fl::InvalidArgument>([&] { (void)tape.gradient(fl::Tensor(), {x}); }, {"gradient:", "empty Tensor handle"});
  }
  {
    fl::GradientTape tape;
    tape.watch(x);
    const fl::Tensor y = fl::sum(x * x);
    test::check_throws<fl::InvalidArgument>([&] { (void)tape.gradient(y, {x, fl::Tensor()}); },
                                            {"gradient:", "empty Tensor handle"});
  }
  {
    fl::GradientTape tape;
    test::check_throws<fl::InvalidArgument>([&] { (void)tape.gradient(fl::sum(x), std::vector<fl::Variable>{fl::Variable()}); },
                                            {"gradient:", "empty Variable handle"});
  }
  {
    fl::GradientTape tape;
    tape.watch(x);
    const fl::Tensor count = fl::sum(fl::tensor({1, 2, 3}));
    test::check_throws<fl::DTypeError>([&] { (void)tape.gradient(count, {x}); }, {"gradient:", "i64"});
    const fl::Tensor flags = x > 1.0;
    test::check_throws<fl::DTypeError>([&] { (void)tape.gradient(flags, {x}); }, {"gradient:", "b8"});
  }
  {
    fl::GradientTape tape;
    test::check_throws<fl::InvalidArgument>([&] { tape.watch(fl::Tensor()); }, {"watch:", "empty Tensor handle"});
  }
}

// ---------------------------------------------------------------------------------------------
// Higher order

namespace {

using ScalarFn = std::function<fl::Tensor(const fl::Tensor&)>;

// The tape's gradient of f at x.
fl::Tensor first_gradient(const ScalarFn& f, const fl::Tensor& x) {
  fl::GradientTape tape;
  tape.watch(x);
  return tape.gradient(f(x), {x})[0];
}

// H v by nested tapes: the outer tape records the inner tape's gradient computation.
fl::Tensor hessian_vector(const ScalarFn& f, const fl::Tensor& x, const fl::Tensor& v) {
  fl::GradientTape outer;
  outer.watch(x);
  fl::Tensor g;
  {
    fl::GradientTape inner;
    inner.watch(x);
    g = inner.gradient(f(x), {x})[0];
  }
  return outer.gradient(fl::sum(g * v), {x})[0];
}

// (grad f(x + h v) - grad f(x - h v)) / 2h.
std::vector<double> numeric_hessian_vector(const ScalarFn& f, const fl::Tensor& x, const fl::Tensor& v, double h = 1e-5) {
  const std::vector<double> plus = test::values(first_gradient(f, x + v * h));
  const std::vector<double> minus = test::values(first_gradient(f, x - v * h));
  std::vector<double> out(plus.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = (plus[i] - minus[i]) / (2 * h);
  return out;
}

}  // namespace

TEST_CASE("nested tapes: the second derivative of x^3 (written with mul) is 6x") {
  const fl::Tensor x = fl::tensor({-1.5, 0.0, 0.5, 2.0});
  fl::GradientTape outer;
  outer.watch(x);
  fl::Tensor g;
  {
    fl::GradientTape inner;
    inner.watch(x);
    g = inner.gradient(x * x * x, {x})[0];
  }
  test::check_tensor(g, {6.75, 0, 0.75, 12}, {4}, fl::f64);
  const fl::Tensor h = outer.gradient(g, {x})[0];
  test::check_tensor(h, {-9, 0, 3, 12}, {4}, fl::f64);
}

TEST_CASE("nested tapes: third derivative of x^3 is 6 (three tapes)") {
  const fl::Tensor x = fl::tensor({-1.0, 2.0});
  fl::GradientTape t3;
  t3.watch(x);
  fl::Tensor g2;
  {
    fl::GradientTape t2;
    t2.watch(x);
    fl::Tensor g1;
    {
      fl::GradientTape t1;
      t1.watch(x);
      g1 = t1.gradient(x * x * x, {x})[0];
    }
    g2 = t2.gradient(g1, {x})[0];
  }
  test::check_tensor(t3.gradient(g2, {x})[0], {6, 6}, {2}, fl::f64);
}

TEST_CASE("nested tapes: second derivatives of elementwise functions and a softmax loss match finite differences") {
  const fl::Tensor x = test::random_tensor({3, 4}, 90, fl::f64);
  const fl::Tensor positive = test::random_tensor({3, 4}, 91, fl::f64, Domain::positive);
  const fl::Tensor v = test::random_tensor({3, 4}, 92, fl::f64);
  const fl::Tensor weights = test::random_tensor({3, 4}, 93, fl::f64);
  const fl::Tensor labels = fl::tensor({int64_t{1}, int64_t{3}, int64_t{0}});
  struct Named {
    const char* name;
    ScalarFn f;
    bool positive_input;
  };
  const std::vector<Named> functions = {
      {"sum(tanh(x))", [](const fl::Tensor& t) { return fl::sum(fl::tanh(t)); }, false},
      {"sum(sigmoid(x) * w)", [&](const fl::Tensor& t) { return fl::sum(fl::sigmoid(t) * weights); }, false},
      {"sum(exp(x) * w)", [&](const fl::Tensor& t) { return fl::sum(fl::exp(t) * weights); }, false},
      {"sum(log(x) * w)", [&](const fl::Tensor& t) { return fl::sum(fl::log(t) * weights); }, true},
      {"sum(sqrt(x) * w)", [&](const fl::Tensor& t) { return fl::sum(fl::sqrt(t) * weights); }, true},
      {"sum(x / (1 + x^2))", [](const fl::Tensor& t) { return fl::sum(t / (fl::square(t) + 1.0)); }, false},
      {"sum(softmax(x) * w)", [&](const fl::Tensor& t) { return fl::sum(fl::softmax(t, -1) * weights); }, false},
      {"sum(log_softmax(x, 0) * w)", [&](const fl::Tensor& t) { return fl::sum(fl::log_softmax(t, 0) * weights); }, false},
      {"mean(softmax_cross_entropy(x, labels))",
       [&](const fl::Tensor& t) { return fl::mean(fl::softmax_cross_entropy(t, labels)); }, false},
      {"sum(pow(x, 2.5) * w)", [&](const fl::Tensor& t) { return fl::sum(fl::pow(t, fl::full({}, 2.5, fl::f64)) * weights); },
       true},
      {"max-based: sum(max(x, {1}) ^ 2)", [](const fl::Tensor& t) { return fl::sum(fl::square(fl::max(t, {1}))); }, false},
  };
  for (const Named& fn : functions) {
    INFO(fn.name);
    const fl::Tensor at = fn.positive_input ? positive : x;
    const fl::Tensor hv = hessian_vector(fn.f, at, v);
    test::check_tensor(hv, numeric_hessian_vector(fn.f, at, v), {3, 4}, fl::f64, test::Tolerance{1e-6, 1e-6});
  }
  // Elementwise: the gradient of sum(first gradient) is the diagonal second derivative.
  const fl::Tensor d2 = hessian_vector([](const fl::Tensor& t) { return fl::sum(fl::tanh(t)); }, x, fl::ones_like(x));
  std::vector<double> want;
  for (double t : test::values(x)) want.push_back(-2 * std::tanh(t) * (1 - std::tanh(t) * std::tanh(t)));
  test::check_tensor(d2, want, {3, 4}, fl::f64, test::Tolerance{1e-12, 1e-12});
}

namespace {

// A two-layer tanh network with a cross-entropy loss, over variables.
struct Mlp {
  fl::Tensor x = test::random_tensor({6, 4}, 100, fl::f64);
  fl::Tensor labels = fl::tensor({int64_t{0}, int64_t{2}, int64_t{1}, int64_t{2}, int64_t{0}, int64_t{1}});
  fl::Variable w1{test::random_tensor({4, 5}, 101, fl::f64) * 0.5, "w1"};
  fl::Variable b1{test::random_tensor({5}, 102, fl::f64) * 0.1, "b1"};
  fl::Variable w2{test::random_tensor({5, 3}, 103, fl::f64) * 0.5, "w2"};

  fl::Tensor loss() const {
    const fl::Tensor h = fl::tanh(fl::matmul(x, w1) + b1);
    return fl::mean(fl::softmax_cross_entropy(fl::matmul(h, w2), labels));
  }
  std::vector<fl::Variable> vars() const { return {w1, b1, w2}; }
};

std::vector<double> flat_gradient(const Mlp& m) {
  fl::GradientTape tape;
  const std::vector<fl::Tensor> g = tape.gradient(m.loss(), m.vars());
  std::vector<double> out;
  for (const fl::Tensor& t : g) {
    const std::vector<double> v = test::values(t);
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

}  // namespace

TEST_CASE("Hessian-vector product of an MLP loss with respect to its weights matches finite differences") {
  Mlp m;
  const std::vector<fl::Variable> vars = m.vars();
  std::vector<fl::Tensor> dirs;
  for (size_t i = 0; i < vars.size(); ++i) dirs.push_back(test::random_tensor(vars[i].shape(), 110 + i, fl::f64));

  std::vector<fl::Tensor> hv;
  {
    fl::GradientTape outer;
    std::vector<fl::Tensor> g;
    {
      fl::GradientTape inner;
      g = inner.gradient(m.loss(), vars);
    }
    fl::Tensor gv = fl::sum(g[0] * dirs[0]);
    for (size_t i = 1; i < g.size(); ++i) gv = gv + fl::sum(g[i] * dirs[i]);
    hv = outer.gradient(gv, vars);
  }
  std::vector<double> got;
  for (const fl::Tensor& t : hv) {
    const std::vector<double> v = test::values(t);
    got.insert(got.end(), v.begin(), v.end());
  }

  const double h = 1e-5;
  std::vector<fl::Tensor> original;
  for (const fl::Variable& v : vars) original.push_back(v.value());
  auto shift = [&](double scale) {
    for (size_t i = 0; i < vars.size(); ++i) {
      fl::Variable var = vars[i];
      var.assign(original[i] + dirs[i] * scale);
    }
  };
  shift(h);
  const std::vector<double> plus = flat_gradient(m);
  shift(-h);
  const std::vector<double> minus = flat_gradient(m);
  shift(0);
  std::vector<double> want(plus.size());
  for (size_t i = 0; i < want.size(); ++i) want[i] = (plus[i] - minus[i]) / (2 * h);
  test::check_values(got, want, test::Tolerance{1e-6, 1e-6});
}

TEST_CASE("a gradient penalty (the squared norm of the input gradient) differentiates with respect to the weights") {
  const fl::Tensor x = test::random_tensor({4, 3}, 120, fl::f64);
  const fl::Tensor c = test::random_tensor({4, 2}, 121, fl::f64);
  fl::Variable w(test::random_tensor({3, 2}, 122, fl::f64), "w");

  // Under an outer tape the inner tape's gradient computation is recorded, so the penalty
  // differentiates with respect to w; alone it just evaluates the penalty.
  auto penalty = [&] {
    fl::GradientTape inner;
    inner.watch(x);
    const fl::Tensor loss = fl::sum(fl::tanh(fl::matmul(x, w)) * c);
    const fl::Tensor gx = inner.gradient(loss, {x})[0];
    return fl::sum(fl::square(gx));
  };

  fl::Tensor got;
  {
    fl::GradientTape outer;
    const fl::Tensor p = penalty();
    got = outer.gradient(p, std::vector<fl::Variable>{w})[0];
  }

  const std::vector<double> base = test::values(w.value());
  const std::vector<double> want =
      test::gradient::central_differences(base, 1e-6, [&](const std::vector<double>& moved) {
        w.assign(test::make(moved, {3, 2}, fl::f64));
        return penalty().item<double>();
      });
  w.assign(test::make(base, {3, 2}, fl::f64));
  test::check_tensor(got, want, {3, 2}, fl::f64, test::Tolerance{1e-6, 1e-6});
}
