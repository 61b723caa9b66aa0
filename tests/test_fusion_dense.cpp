// The dense-layer fusions. Forward (src/trace/passes/matmul_bias_fusion.cpp, src/ops/matmul_bias.hpp):
// where add(matmul(a, w), bias) and a following relu become one matmul_bias node (inference and
// training graphs, either operand order), where they must not (the product or the sum has another
// user or is an output, a bias that is not [n], halves, the pass switched off, a relu ordered
// after a later node), and that the fused node computes what eager execution, the unfused graph
// and a naive f64 loop do (odd sizes, a split GEMM, transposed and strided views, k = 0, m = 0,
// NaN). Backward (relu_bias_grad_fusion.cpp, src/ops/relu_bias_grad.hpp): where(y > 0, g, 0) and
// its column sums become one relu_bias_grad node, checked against a naive loop (tails, row blocks
// over threads, NaN, -0, empty) and where it must not fire. The traced MLP step's loss and
// gradients against eager, the unfused graph and f64 finite differences; both ops' errors.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "flowlet/dispatch.hpp"
#include "flowlet/graph.hpp"
#include "flowlet/trace.hpp"
#include "ops/matmul_bias.hpp"
#include "ops/relu_bias_grad.hpp"
#include "support/pass_switch.hpp"
#include "support/reference.hpp"
#include "trace/passes/passes.hpp"

namespace {

using Tensors = std::vector<fl::Tensor>;

// FLOWLET_DENSE_FUSION set for a scope (graphs traced inside see it).
struct DenseFusionSetting : test::PassSwitch {
  explicit DenseFusionSetting(bool on) : PassSwitch("FLOWLET_DENSE_FUSION", on) {}
};

using test::count_ops;

// The activations of the live matmul_bias nodes, in graph order ("activation=relu" / "none").
std::vector<std::string> dense_activations(const fl::Graph& graph) {
  std::vector<std::string> found;
  for (const fl::Node& node : graph.nodes()) {
    if (node.removed || node.kind != fl::NodeKind::op || node.op->name != "matmul_bias") continue;
    found.push_back(node.op->describe_attributes(node.attributes.get()));
  }
  return found;
}

fl::Tensor random(const fl::Shape& shape, uint64_t seed, fl::DType dtype = fl::f64) {
  return fl::uniform(shape, -1.0, 1.0, seed, dtype);
}

// Naive f64 act(a @ w + bias) from the stored values.
std::vector<double> naive_dense(const fl::Tensor& a, const fl::Tensor& w, const fl::Tensor& bias, bool relu) {
  const std::vector<double> av = test::values(a), wv = test::values(w), bv = test::values(bias);
  const int64_t m = a.shape()[0], k = a.shape()[1], n = w.shape()[1];
  std::vector<double> y(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = bv[static_cast<size_t>(j)];
      for (int64_t p = 0; p < k; ++p) s += av[static_cast<size_t>(i * k + p)] * wv[static_cast<size_t>(p * n + j)];
      y[static_cast<size_t>(i * n + j)] = relu && s < 0 ? 0.0 : s;
    }
  }
  return y;
}

test::Tolerance tolerance(fl::DType dtype, int64_t k) {
  // A sum of k products: rounding grows with k (f32 sums in blocks, in another order than eager).
  return dtype == fl::f64 ? test::Tolerance{1e-12, 1e-12 * static_cast<double>(k + 1)}
                          : test::Tolerance{1e-5, 2e-6 * static_cast<double>(k + 1)};
}

void check_close(const fl::Tensor& got, const fl::Tensor& want, test::Tolerance tol) {
  REQUIRE(got.shape() == want.shape());
  CHECK(test::check_values(test::values(got), test::values(want), tol));
}

struct DenseCase {
  const char* name;
  int64_t m, k, n;
};

// Odd sizes and tails; two rows (one row stays unfused: see the test case after next), k = 1
// (rank-1), a product big enough to split over threads (300 x 200 x 300 is 18M multiply-adds),
// k = 0 (the bias alone) and m = 0 (empty).
const std::vector<DenseCase> kCases = {
    {"2x5x3 (two rows)", 2, 5, 3},  {"7x13x9", 7, 13, 9},    {"64x33x17", 64, 33, 17}, {"5x1x6 (k = 1)", 5, 1, 6},
    {"300x200x300 (split)", 300, 200, 300}, {"4x0x3 (k = 0)", 4, 0, 3}, {"0x6x3 (m = 0)", 0, 6, 3},
};

}  // namespace

TEST_CASE_TEMPLATE("relu(matmul(a, w) + b) becomes one matmul_bias node, equal to eager, unfused and a naive loop", T,
                   float, double) {
  const fl::DType dtype = std::is_same_v<T, float> ? fl::f32 : fl::f64;
  for (const DenseCase& c : kCases) {
    for (const bool relu : {true, false}) {
      for (const bool bias_first : {false, true}) {
        CAPTURE(c.name);
        CAPTURE(relu);
        CAPTURE(bias_first);
        const fl::Tensor a = random({c.m, c.k}, 1, dtype), w = random({c.k, c.n}, 2, dtype), b = random({c.n}, 3, dtype);
        auto f = [relu, bias_first](const fl::Tensor& x, const fl::Tensor& wa, const fl::Tensor& ba) {
          const fl::Tensor z = bias_first ? ba + fl::matmul(x, wa) : fl::matmul(x, wa) + ba;
          return relu ? fl::relu(z) : z;
        };
        auto fused = fl::trace(f);
        const fl::Graph& graph = fused.graph(a, w, b);
        graph.check_invariants();
        CHECK(count_ops(graph, "matmul") == 0);
        CHECK(count_ops(graph, "add") == 0);
        CHECK(count_ops(graph, "relu") == 0);
        CHECK(dense_activations(graph) == std::vector<std::string>{relu ? "activation=relu" : "activation=none"});
        const fl::Tensor got = fused(a, w, b);
        check_close(got, f(a, w, b), tolerance(dtype, c.k));
        CHECK(test::check_tensor(got, naive_dense(a, w, b, relu), fl::Shape{c.m, c.n}, dtype, tolerance(dtype, c.k)));
        DenseFusionSetting off(false);
        auto unfused = fl::trace(f);
        CHECK(count_ops(unfused.graph(a, w, b), "matmul_bias") == 0);
        check_close(got, unfused(a, w, b), tolerance(dtype, c.k));
      }
    }
  }
}

TEST_CASE("matmul_bias reads transposed and strided views, and relu keeps NaN as eager's relu does") {
  const fl::Tensor at = random({9, 6}, 4, fl::f32);         // a = at^T: [6, 9], a transposed view
  const fl::Tensor wide = random({9, 14}, 5, fl::f32);      // w = its first 7 columns: [9, 7], row step 14
  const fl::Tensor bias_source = random({7, 2}, 6, fl::f32);  // bias = its second column
  auto f = [](const fl::Tensor& x, const fl::Tensor& wa, const fl::Tensor& ba) {
    return fl::relu(fl::matmul(fl::transpose(x), fl::slice(wa, 1, 0, 7)) + fl::reshape(fl::slice(ba, 1, 1, 1), {7}));
  };
  auto fused = fl::trace(f);
  CHECK(dense_activations(fused.graph(at, wide, bias_source)) == std::vector<std::string>{"activation=relu"});
  check_close(fused(at, wide, bias_source), f(at, wide, bias_source), tolerance(fl::f32, 9));

  // NaN in a row of a: the row is NaN before relu and stays NaN after it, as eager's relu leaves it.
  std::vector<float> values = at.to_vector<float>();
  values[2 * 6 + 3] = std::numeric_limits<float>::quiet_NaN();  // at[2, 3] = a[3, 2]: row 3 of the product
  const fl::Tensor with_nan = fl::tensor(values, fl::Shape{9, 6});
  const fl::Tensor got = fused(with_nan, wide, bias_source), want = f(with_nan, wide, bias_source);
  const std::vector<double> g = test::values(got), e = test::values(want);
  for (int64_t j = 0; j < 7; ++j) {
    CHECK(std::isnan(g[static_cast<size_t>(3 * 7 + j)]));
    CHECK(std::isnan(e[static_cast<size_t>(3 * 7 + j)]));
  }
  check_close(got, want, tolerance(fl::f32, 9));
}

TEST_CASE("a traced MLP training step fuses both layers; loss and gradients equal eager and the unfused graph") {
  for (const fl::DType dtype : {fl::f32, fl::f64}) {
    CAPTURE(dtype);
    const fl::Tensor x = random({13, 11}, 7, dtype), w1 = random({11, 9}, 8, dtype), b1 = random({9}, 9, dtype);
    const fl::Tensor w2 = random({9, 4}, 10, dtype), b2 = random({4}, 11, dtype);
    const fl::Tensor labels = fl::tensor(std::vector<int64_t>{0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0}, fl::Shape{13});
    auto step = [&labels](const fl::Tensor& xa, const fl::Tensor& w1a, const fl::Tensor& b1a, const fl::Tensor& w2a,
                          const fl::Tensor& b2a) {
      fl::GradientTape tape;
      for (const fl::Tensor* t : {&w1a, &b1a, &w2a, &b2a}) tape.watch(*t);
      const fl::Tensor h = fl::relu(fl::matmul(xa, w1a) + b1a);
      const fl::Tensor loss = fl::mean(fl::softmax_cross_entropy(fl::matmul(h, w2a) + b2a, labels));
      Tensors grads = tape.gradient(loss, Tensors{w1a, b1a, w2a, b2a});
      grads.insert(grads.begin(), loss);
      return grads;
    };
    const Tensors eager = step(x, w1, b1, w2, b2);
    auto fused = fl::trace(step);
    const fl::Graph& graph = fused.graph(x, w1, b1, w2, b2);
    graph.check_invariants();
    CHECK(dense_activations(graph) == std::vector<std::string>{"activation=relu", "activation=none"});
    CHECK(count_ops(graph, "relu") == 0);
    CHECK(count_ops(graph, "relu_bias_grad") == 1);  // the hidden layer's; the logits have no relu
    CHECK(count_ops(graph, "greater") + count_ops(graph, "where") == 0);
    const Tensors got = fused(x, w1, b1, w2, b2);
    REQUIRE(got.size() == eager.size());
    const test::Tolerance tol = dtype == fl::f64 ? test::Tolerance{1e-11, 1e-12} : test::Tolerance{1e-4, 1e-6};
    for (size_t i = 0; i < got.size(); ++i) check_close(got[i], eager[i], tol);
    DenseFusionSetting off(false);
    auto unfused = fl::trace(step);
    CHECK(count_ops(unfused.graph(x, w1, b1, w2, b2), "matmul_bias") == 0);
    CHECK(count_ops(unfused.graph(x, w1, b1, w2, b2), "relu_bias_grad") == 0);
    const Tensors plain = unfused(x, w1, b1, w2, b2);
    for (size_t i = 0; i < got.size(); ++i) check_close(got[i], plain[i], tol);
    // Some hidden units must be off for the relu mask to matter: the gradient of w1 has zero columns
    // per row where relu cut (checked against eager above); here only that both kinds occur.
    const std::vector<double> h = test::values(fl::matmul(x, w1) + b1);
    CHECK(std::count_if(h.begin(), h.end(), [](double v) { return v < 0; }) > 0);
    CHECK(std::count_if(h.begin(), h.end(), [](double v) { return v > 0; }) > 0);
    if (dtype != fl::f64) continue;
    // Central differences of the eager f64 loss against the traced gradients of w1 and b1 (the
    // ones the fused nodes compute), a few entries each.
    auto loss_at = [&](const fl::Tensor& w1v, const fl::Tensor& b1v) {
      const fl::Tensor hv = fl::relu(fl::matmul(x, w1v) + b1v);
      return fl::mean(fl::softmax_cross_entropy(fl::matmul(hv, w2) + b2, labels)).item<double>();
    };
    const double eps = 1e-6;
    for (const int which : {1, 2}) {  // 1: w1, 2: b1
      const fl::Tensor base = which == 1 ? w1 : b1;
      const std::vector<double> grad = test::values(got[static_cast<size_t>(which)]);
      for (const size_t at : {size_t{0}, size_t{5}, static_cast<size_t>(base.numel() - 1)}) {
        std::vector<double> plus = test::values(base), minus = plus;
        plus[at] += eps;
        minus[at] -= eps;
        const fl::Tensor p = fl::tensor(plus, base.shape()), q = fl::tensor(minus, base.shape());
        const double numeric = which == 1 ? (loss_at(p, b1) - loss_at(q, b1)) / (2 * eps)
                                          : (loss_at(w1, p) - loss_at(w1, q)) / (2 * eps);
        CAPTURE(which);
        CAPTURE(at);
        CHECK(grad[at] == doctest::Approx(numeric).epsilon(1e-6).scale(1e-3));
      }
    }
  }
}

TEST_CASE("the pass leaves add(matmul) alone where the product or sum is needed elsewhere") {
  const fl::Tensor a = random({5, 4}, 21), w = random({4, 3}, 22), b = random({3}, 23);
  SUBCASE("another op reads the product") {
    auto f = [](const fl::Tensor& x, const fl::Tensor& wa, const fl::Tensor& ba) {
      const fl::Tensor p = fl::matmul(x, wa);
      return fl::relu(p + ba) * p;
    };
    auto traced = fl::trace(f);
    CHECK(count_ops(traced.graph(a, w, b), "matmul_bias") == 0);
    check_close(traced(a, w, b), f(a, w, b), tolerance(fl::f64, 4));
  }
  SUBCASE("the product is also an output") {
    auto f = [](const fl::Tensor& x, const fl::Tensor& wa, const fl::Tensor& ba) {
      const fl::Tensor p = fl::matmul(x, wa);
      return Tensors{p + ba, p};
    };
    auto traced = fl::trace(f);
    CHECK(count_ops(traced.graph(a, w, b), "matmul_bias") == 0);
    const Tensors got = traced(a, w, b), want = f(a, w, b);
    check_close(got[0], want[0], tolerance(fl::f64, 4));
    check_close(got[1], want[1], tolerance(fl::f64, 4));
  }
  SUBCASE("the sum is also an output: the bias fuses, the relu does not") {
    auto f = [](const fl::Tensor& x, const fl::Tensor& wa, const fl::Tensor& ba) {
      const fl::Tensor z = fl::matmul(x, wa) + ba;
      return Tensors{fl::relu(z), z};
    };
    auto traced = fl::trace(f);
    const fl::Graph& graph = traced.graph(a, w, b);
    CHECK(dense_activations(graph) == std::vector<std::string>{"activation=none"});
    const Tensors got = traced(a, w, b), want = f(a, w, b);
    check_close(got[0], want[0], tolerance(fl::f64, 4));
    check_close(got[1], want[1], tolerance(fl::f64, 4));
    CHECK(fl::max(-got[1]).item<double>() > 0.0);  // the sum kept its negative values
  }
  SUBCASE("a comparison other than > 0 reads the sum: the relu stays") {
    auto f = [](const fl::Tensor& x, const fl::Tensor& wa, const fl::Tensor& ba) {
      const fl::Tensor z = fl::matmul(x, wa) + ba;
      return fl::where(z > -0.25, fl::relu(z), fl::zeros_like(z));
    };
    auto traced = fl::trace(f);
    CHECK(dense_activations(traced.graph(a, w, b)) == std::vector<std::string>{"activation=none"});
    check_close(traced(a, w, b), f(a, w, b), tolerance(fl::f64, 4));
  }
  SUBCASE("one row (a batch-1 step): nothing to save, and the fused node measured slower there") {
    const fl::Tensor a_row = random({1, 4}, 26);
    auto f = [](const fl::Tensor& x, const fl::Tensor& wa, const fl::Tensor& ba) { return fl::relu(fl::matmul(x, wa) + ba); };
    auto traced = fl::trace(f);
    CHECK(count_ops(traced.graph(a_row, w, b), "matmul_bias") == 0);
    CHECK(count_ops(traced.graph(a, w, b), "matmul_bias") == 1);
    check_close(traced(a_row, w, b), f(a_row, w, b), tolerance(fl::f64, 4));
  }
  SUBCASE("a bias that is not [n], and half-precision operands") {
    const fl::Tensor row = random({1, 3}, 24), full = random({5, 3}, 25);
    auto f = [](const fl::Tensor& x, const fl::Tensor& wa, const fl::Tensor& ba) { return fl::matmul(x, wa) + ba; };
    auto traced = fl::trace(f);
    CHECK(count_ops(traced.graph(a, w, row), "matmul_bias") == 0);
    CHECK(count_ops(traced.graph(a, w, full), "matmul_bias") == 0);
    check_close(traced(a, w, row), f(a, w, row), tolerance(fl::f64, 4));
    const fl::Tensor ah = a.astype(fl::f16), wh = w.astype(fl::f16), bh = b.astype(fl::f16);
    CHECK(count_ops(traced.graph(ah, wh, bh), "matmul_bias") == 0);
  }
  SUBCASE("switched off: FLOWLET_DENSE_FUSION=0 and TraceOptions::optimize = false") {
    auto f = [](const fl::Tensor& x, const fl::Tensor& wa, const fl::Tensor& ba) {
      return fl::relu(fl::matmul(x, wa) + ba);
    };
    fl::TraceOptions no_passes;
    no_passes.optimize = false;
    auto plain = fl::trace(f, no_passes);
    CHECK(count_ops(plain.graph(a, w, b), "matmul_bias") == 0);
    DenseFusionSetting off(false);
    auto traced = fl::trace(f);
    CHECK(count_ops(traced.graph(a, w, b), "matmul_bias") == 0);
  }
}

TEST_CASE("a relu that waits for a node after the sum is not taken over (hand-built graph)") {
  fl::Graph graph;
  auto arg = [&](const fl::Shape& shape, int index) {
    fl::Node n;
    n.kind = fl::NodeKind::argument;
    n.argument = index;
    n.outputs = {{shape, fl::f32}};
    return fl::ValueRef{graph.add_node(std::move(n)), 0};
  };
  auto op = [&](const char* name, std::vector<fl::ValueRef> inputs, const fl::Shape& shape,
                std::vector<int32_t> control = {}) {
    fl::Node n;
    n.op = fl::find_op(name);
    REQUIRE(n.op != nullptr);
    n.inputs = std::move(inputs);
    n.control_inputs = std::move(control);
    n.outputs = {{shape, fl::f32}};
    n.device = fl::Device("cpu");
    return fl::ValueRef{graph.add_node(std::move(n)), 0};
  };
  const fl::ValueRef a = arg({2, 3}, 0), w = arg({3, 4}, 1), b = arg({4}, 2);
  const fl::ValueRef z = op("add", {op("matmul", {a, w}, {2, 4}), b}, {2, 4});
  const fl::ValueRef other = op("neg", {a}, {2, 3});  // after the sum
  const fl::ValueRef y = op("relu", {z}, {2, 4}, {other.node});
  graph.set_outputs({y, other});
  graph.check_invariants();
  fl::detail::fuse_matmul_bias(graph);
  graph.check_invariants();
  CHECK(dense_activations(graph) == std::vector<std::string>{"activation=none"});
  CHECK(count_ops(graph, "relu") == 1);
}

TEST_CASE("matmul_bias names itself and the shapes or dtypes it refuses") {
  const fl::Op& op = fl::detail::matmul_bias_op;
  const fl::detail::MatmulBiasAttrs attrs{fl::detail::DenseActivation::relu};
  const fl::Tensor a = random({2, 3}, 31, fl::f32), w = random({3, 4}, 32, fl::f32), b = random({4}, 33, fl::f32);
  auto call = [&](const Tensors& inputs) { return fl::dispatch_all(op, inputs, &attrs); };
  check_close(call({a, w, b}).at(0), fl::relu(fl::matmul(a, w) + b), tolerance(fl::f32, 3));
  CHECK(test::check_op_throws<fl::ShapeError>("matmul_bias", [&] { call({a, random({4, 4}, 34, fl::f32), b}); },
                                              {"[2, 3]", "[4, 4]"}));
  CHECK(test::check_op_throws<fl::ShapeError>("matmul_bias", [&] { call({a, w, random({3}, 35, fl::f32)}); },
                                              {"bias [3]"}));
  CHECK(test::check_op_throws<fl::ShapeError>("matmul_bias", [&] { call({random({2, 2, 3}, 36, fl::f32), w, b}); },
                                              {"[2, 2, 3]"}));
  CHECK(test::check_op_throws<fl::DTypeError>("matmul_bias", [&] { call({a, w, b.astype(fl::f64)}); },
                                              {"f32", "f64"}));
  CHECK(test::check_op_throws<fl::DTypeError>("matmul_bias",
                                              [&] { call({a.astype(fl::f16), w.astype(fl::f16), b.astype(fl::f16)}); },
                                              {"f16"}));
  const bool has_grad = op.grad != nullptr;
  CHECK_FALSE(has_grad);
  CHECK(fl::find_op("matmul_bias") == &op);
}

namespace {

// Naive f64 where(y > 0, g, 0) and its column sums.
void naive_relu_bias_grad(const fl::Tensor& y, const fl::Tensor& g, std::vector<double>& dz, std::vector<double>& db) {
  const std::vector<double> yv = test::values(y), gv = test::values(g);
  const int64_t m = y.shape()[0], n = y.shape()[1];
  dz.assign(yv.size(), 0.0);
  db.assign(static_cast<size_t>(n), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const auto k = static_cast<size_t>(i * n + j);
      dz[k] = yv[k] > 0 ? gv[k] : 0.0;
      db[static_cast<size_t>(j)] += dz[k];
    }
  }
}

}  // namespace

TEST_CASE_TEMPLATE("relu_bias_grad computes where(y > 0, g, 0) and its column sums like a naive loop", T, float, double) {
  const fl::DType dtype = std::is_same_v<T, float> ? fl::f32 : fl::f64;
  // Tails, a row (m = 1), row blocks over the threads (600 x 300 is 180K elements), empty.
  for (const auto& [m, n] : std::vector<std::pair<int64_t, int64_t>>{{1, 7}, {13, 9}, {600, 300}, {0, 5}, {4, 0}}) {
    CAPTURE(m);
    CAPTURE(n);
    fl::Tensor y = random({m, n}, 41, dtype), g = random({m, n}, 42, dtype);
    if (m == 13) {  // NaN and -0 in y give 0 (they are not > 0); NaN in g where y > 0 passes through
      std::vector<double> yv = test::values(y), gv = test::values(g);
      yv[3] = std::nan("");
      yv[4] = -0.0;
      yv[5] = 0.5;
      gv[5] = std::nan("");
      y = fl::tensor(yv, fl::Shape{m, n}).astype(dtype);
      g = fl::tensor(gv, fl::Shape{m, n}).astype(dtype);
    }
    const Tensors out = fl::dispatch_all(fl::detail::relu_bias_grad_op, Tensors{y, g}, nullptr);
    REQUIRE(out.size() == 2);
    std::vector<double> dz, db;
    naive_relu_bias_grad(y, g, dz, db);
    CHECK(test::check_tensor(out[0], dz, fl::Shape{m, n}, dtype, test::Tolerance{0, 0}));
    CHECK(test::check_tensor(out[1], db, fl::Shape{1, n}, dtype, tolerance(dtype, m)));
    // The eager ops it replaces.
    if (m > 0 && n > 0) {
      const fl::Tensor want = fl::where(y > 0.0, g, fl::zeros(fl::Shape{}, dtype));
      check_close(out[0], want, test::Tolerance{0, 0});
      check_close(out[1], fl::sum(want, {0}, true), tolerance(dtype, m));
    }
  }
  // A transposed view of y.
  const fl::Tensor yt = random({9, 6}, 43, dtype), g = random({6, 9}, 44, dtype);
  const Tensors out = fl::dispatch_all(fl::detail::relu_bias_grad_op, Tensors{fl::transpose(yt), g}, nullptr);
  std::vector<double> dz, db;
  naive_relu_bias_grad(fl::transpose(yt), g, dz, db);
  CHECK(test::check_tensor(out[0], dz, fl::Shape{6, 9}, dtype, test::Tolerance{0, 0}));
  CHECK(test::check_tensor(out[1], db, fl::Shape{1, 9}, dtype, tolerance(dtype, 6)));
}

TEST_CASE("the relu_bias_grad pass fires on where(y > 0, g, 0) summed over rows, and only there") {
  const fl::Tensor y = random({6, 5}, 51), g = random({6, 5}, 52);
  auto traced_count = [&](auto f) {
    auto traced = fl::trace(f);
    const fl::Graph& graph = traced.graph(y, g);
    graph.check_invariants();
    const Tensors got = traced(y, g), want = f(y, g);
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) check_close(got[i], want[i], tolerance(fl::f64, 6));
    return count_ops(graph, "relu_bias_grad");
  };
  auto zero = [] { return fl::zeros(fl::Shape{}, fl::f64); };
  // The matching shape, with dz also read elsewhere (as the weight gradient's matmul does).
  CHECK(traced_count([&](const fl::Tensor& ya, const fl::Tensor& ga) {
          const fl::Tensor dz = fl::where(ya > 0.0, ga, zero());
          return Tensors{fl::sum(dz, {0}, true), fl::matmul(fl::transpose(ya), dz)};
        }) == 1);
  CHECK(traced_count([&](const fl::Tensor& ya, const fl::Tensor& ga) {
          return Tensors{fl::sum(fl::where(ya > 0.0, ga, zero()), {-2}, true)};
        }) == 1);
  // Not: over the other axis, without keepdims, a threshold other than 0, a fill other than +0,
  // a mask someone else reads.
  CHECK(traced_count([&](const fl::Tensor& ya, const fl::Tensor& ga) {
          return Tensors{fl::sum(fl::where(ya > 0.0, ga, zero()), {1}, true)};
        }) == 0);
  CHECK(traced_count([&](const fl::Tensor& ya, const fl::Tensor& ga) {
          return Tensors{fl::sum(fl::where(ya > 0.0, ga, zero()), {0}, false)};
        }) == 0);
  CHECK(traced_count([&](const fl::Tensor& ya, const fl::Tensor& ga) {
          return Tensors{fl::sum(fl::where(ya > 0.25, ga, zero()), {0}, true)};
        }) == 0);
  CHECK(traced_count([&](const fl::Tensor& ya, const fl::Tensor& ga) {
          return Tensors{fl::sum(fl::where(ya > 0.0, ga, fl::full(fl::Shape{}, -0.0, fl::f64)), {0}, true)};
        }) == 0);
  CHECK(traced_count([&](const fl::Tensor& ya, const fl::Tensor& ga) {
          const fl::Tensor mask = ya > 0.0;
          return Tensors{fl::sum(fl::where(mask, ga, zero()), {0}, true), fl::where(mask, ya, zero())};
        }) == 0);
}

TEST_CASE("relu_bias_grad names itself and the shapes or dtypes it refuses") {
  const fl::Op& op = fl::detail::relu_bias_grad_op;
  auto call = [&](const Tensors& inputs) { return fl::dispatch_all(op, inputs, nullptr); };
  const fl::Tensor y = random({3, 4}, 61, fl::f32);
  CHECK(test::check_op_throws<fl::ShapeError>("relu_bias_grad", [&] { call({y, random({4, 3}, 62, fl::f32)}); },
                                              {"[3, 4]", "[4, 3]"}));
  CHECK(test::check_op_throws<fl::ShapeError>("relu_bias_grad",
                                              [&] { call({random({2, 3, 4}, 63, fl::f32), random({2, 3, 4}, 64, fl::f32)}); },
                                              {"[2, 3, 4]"}));
  CHECK(test::check_op_throws<fl::DTypeError>("relu_bias_grad", [&] { call({y, y.astype(fl::f64)}); }, {"f32", "f64"}));
  CHECK(test::check_op_throws<fl::DTypeError>("relu_bias_grad", [&] { call({y.astype(fl::i32), y.astype(fl::i32)}); },
                                              {"i32"}));
  const bool has_grad = op.grad != nullptr;
  CHECK_FALSE(has_grad);
  CHECK(fl::find_op("relu_bias_grad") == &op);
}
