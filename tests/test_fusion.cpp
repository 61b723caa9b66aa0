// Elementwise fusion: which nodes fuse_elementwise merges (chains, trees, repeated operands) and
// which it leaves (graph outputs, shared values, broadcasting operands, other devices, stateful
// nodes, integer dtypes), and that the fused kernel gives exactly the eager ops' results.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "flowlet/dispatch.hpp"
#include "flowlet/graph.hpp"
#include "flowlet/trace.hpp"
#include "ops/fused.hpp"
#include "support/reference.hpp"
#include "trace/passes/passes.hpp"

using test::check_throws;

namespace {

// Builds graphs by hand: arguments, constants and op nodes with hand-filled output metas.
struct Builder {
  fl::Graph graph;
  int arguments = 0;

  fl::ValueRef arg(const fl::Shape& shape, fl::DType dtype = fl::f32) {
    fl::Node n;
    n.kind = fl::NodeKind::argument;
    n.argument = arguments++;
    n.outputs = {{shape, dtype}};
    return {graph.add_node(std::move(n)), 0};
  }
  fl::ValueRef constant(const fl::Tensor& value) { return {graph.add_constant(value), 0}; }
  fl::ValueRef scalar(double value, fl::DType dtype = fl::f32) {
    return constant(fl::full(fl::Shape{}, value, dtype));
  }
  // The output takes the widest input's shape (inputs here are one shape or rank-0) and the first
  // input's dtype, unless given.
  fl::ValueRef op(const fl::Op& op, std::vector<fl::ValueRef> inputs, fl::Device device = fl::Device("cpu")) {
    fl::TensorMeta meta = graph.meta(inputs[0]);
    for (const fl::ValueRef& in : inputs) {
      if (graph.meta(in).shape.rank() > meta.shape.rank()) meta.shape = graph.meta(in).shape;
    }
    fl::Node n;
    n.op = &op;
    n.inputs = std::move(inputs);
    n.outputs = {meta};
    n.device = device;
    return {graph.add_node(std::move(n)), 0};
  }
  fl::ValueRef op(std::string_view name, std::vector<fl::ValueRef> inputs) {
    const fl::Op* found = fl::find_op(name);
    REQUIRE(found != nullptr);
    return op(*found, std::move(inputs));
  }
};

// Runs the graph node by node through dispatch (arguments fed in order); returns the outputs.
std::vector<fl::Tensor> run(const fl::Graph& graph, const std::vector<fl::Tensor>& arguments) {
  std::vector<fl::Tensor> values(graph.nodes().size());
  for (size_t i = 0; i < graph.nodes().size(); ++i) {
    const fl::Node& n = graph.nodes()[i];
    if (n.removed) continue;
    if (n.kind == fl::NodeKind::argument) {
      values[i] = arguments.at(static_cast<size_t>(n.argument));
    } else if (n.kind == fl::NodeKind::constant) {
      values[i] = n.value;
    } else {
      std::vector<fl::Tensor> inputs;
      for (const fl::ValueRef& in : n.inputs) inputs.push_back(values.at(static_cast<size_t>(in.node)));
      values[i] = fl::dispatch_all(*n.op, inputs, n.attributes.get()).at(0);
    }
  }
  std::vector<fl::Tensor> outputs;
  for (const fl::ValueRef& out : graph.outputs()) outputs.push_back(values.at(static_cast<size_t>(out.node)));
  return outputs;
}

// Live op nodes, in order.
std::vector<const fl::Node*> live_ops(const fl::Graph& graph) {
  std::vector<const fl::Node*> ops;
  for (const fl::Node& n : graph.nodes()) {
    if (!n.removed && n.kind == fl::NodeKind::op) ops.push_back(&n);
  }
  return ops;
}

bool is_fused(const fl::Node& n) { return n.op == &fl::detail::fused_elementwise_op; }

const fl::detail::FusedProgram& program_of(const fl::Node& n) {
  return *static_cast<const fl::detail::FusedProgram*>(n.attributes.get());
}

template <class T>
void check_identical(const fl::Tensor& got, const fl::Tensor& want) {
  REQUIRE(got.shape() == want.shape());
  REQUIRE(got.dtype() == want.dtype());
  const std::vector<T> g = got.to_vector<T>();
  const std::vector<T> w = want.to_vector<T>();
  size_t mismatches = 0;
  size_t first = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    // Bitwise, NaN included: the same kernels run in the same order.
    if (std::memcmp(&g[i], &w[i], sizeof(T)) != 0 && mismatches++ == 0) first = i;
  }
  INFO("first mismatch at " << first << ": got " << (g.empty() ? 0 : g[first]) << ", want "
                            << (w.empty() ? 0 : w[first]));
  CHECK(mismatches == 0);
}

// The benchmark's chain: t=x*1.5; t=t+0.5; t=tanh(t); t=t*t; t=t-0.25; t=exp(t); t=t*0.5;
// t=maximum(t,0.1).
fl::ValueRef build_chain(Builder& b, fl::ValueRef x, fl::DType dtype) {
  fl::ValueRef t = b.op("mul", {x, b.scalar(1.5, dtype)});
  t = b.op("add", {t, b.scalar(0.5, dtype)});
  t = b.op("tanh", {t});
  t = b.op("mul", {t, t});
  t = b.op("sub", {t, b.scalar(0.25, dtype)});
  t = b.op("exp", {t});
  t = b.op("mul", {t, b.scalar(0.5, dtype)});
  return b.op("maximum", {t, b.scalar(0.1, dtype)});
}

fl::Tensor eager_chain(const fl::Tensor& x) {
  fl::Tensor t = x * 1.5;
  t = t + 0.5;
  t = fl::tanh(t);
  t = t * t;
  t = t - 0.25;
  t = fl::exp(t);
  t = t * 0.5;
  return fl::maximum(t, fl::scalar_like(t, 0.1, "maximum"));
}

}  // namespace

TEST_CASE_TEMPLATE("an eight-op chain fuses into one node whose kernel matches eager exactly", T, float, double) {
  const fl::DType dtype = std::is_same_v<T, float> ? fl::f32 : fl::f64;
  const int64_t tile = fl::detail::kFusedTile;
  const std::vector<fl::Shape> shapes = {fl::Shape{},    fl::Shape{1},        fl::Shape{1000},
                                         fl::Shape{tile}, fl::Shape{tile + 1}, fl::Shape{100003},
                                         fl::Shape{317, 331}};
  for (const fl::Shape& shape : shapes) {
    CAPTURE(test::shape_text(shape));
    Builder b;
    const fl::ValueRef x = b.arg(shape, dtype);
    const fl::ValueRef y = build_chain(b, x, dtype);
    b.graph.set_outputs({y});

    fl::detail::fuse_elementwise(b.graph);
    b.graph.check_invariants();
    const auto ops = live_ops(b.graph);
    REQUIRE(ops.size() == 1);
    const fl::Node& fused = *ops[0];
    CHECK(is_fused(fused));
    CHECK(b.graph.outputs()[0] == y);  // the last node's id, so its uses did not move
    CHECK(fused.name == fmt::format("fused_{}", y.node));  // names are "<op>_<counter>", counter == id here
    CHECK(program_of(fused).steps.size() == 8);
    CHECK(fused.inputs.size() == 6);  // x and five scalar constants (two nodes hold 0.5)
    CHECK(fused.outputs[0].shape == shape);

    const fl::Tensor input = test::random_tensor(shape, 7, dtype);
    const fl::Tensor got = run(b.graph, {input}).at(0);
    check_identical<T>(got, eager_chain(input));
    b.graph.compact();
    b.graph.check_invariants();
  }
}

TEST_CASE("the fused kernel reads non-contiguous inputs and rank-0 scalar arguments") {
  Builder b;
  const fl::Shape shape{300, 170};
  const fl::ValueRef x = b.arg(shape);
  const fl::ValueRef scale = b.arg(fl::Shape{});  // a scalar that is not a constant
  const fl::ValueRef z = b.arg(shape);
  const fl::ValueRef t = b.op("mul", {x, scale});
  const fl::ValueRef u = b.op("sigmoid", {t});
  const fl::ValueRef v = b.op("add", {u, z});
  const fl::ValueRef w = b.op("div", {v, scale});
  b.graph.set_outputs({w});
  fl::detail::fuse_elementwise(b.graph);
  b.graph.check_invariants();
  REQUIRE(live_ops(b.graph).size() == 1);
  CHECK(fl::detail::describe(program_of(*live_ops(b.graph)[0])) ==
        "mul(in0, in1) -> sigmoid(s0) -> add(s1, in2) -> div(s2, in1)");

  const fl::Tensor xs = test::noncontiguous(test::random_tensor(shape, 1));
  const fl::Tensor zs = test::noncontiguous(test::random_tensor(shape, 2));
  REQUIRE(!xs.is_contiguous());
  const fl::Tensor scale_value = fl::full(fl::Shape{}, 0.75);
  const fl::Tensor got = run(b.graph, {xs, scale_value, zs}).at(0);
  check_identical<float>(got, (fl::sigmoid(xs * scale_value) + zs) / scale_value);
}

TEST_CASE("a tree of single-use values fuses, with a repeated operand read twice") {
  Builder b;
  const fl::Shape shape{5000};
  const fl::ValueRef x = b.arg(shape);
  const fl::ValueRef y = b.arg(shape);
  const fl::ValueRef a = b.op("tanh", {x});
  const fl::ValueRef c = b.op("exp", {y});
  const fl::ValueRef d = b.op("mul", {a, c});
  const fl::ValueRef e = b.op("add", {d, d});
  b.graph.set_outputs({e});
  fl::detail::fuse_elementwise(b.graph);
  b.graph.check_invariants();
  const auto ops = live_ops(b.graph);
  REQUIRE(ops.size() == 1);
  CHECK(fl::detail::describe(program_of(*ops[0])) == "tanh(in0) -> exp(in1) -> mul(s0, s1) -> add(s2, s2)");
  const fl::Tensor xs = test::random_tensor(shape, 3);
  const fl::Tensor ys = test::random_tensor(shape, 4);
  const fl::Tensor d_eager = fl::tanh(xs) * fl::exp(ys);
  check_identical<float>(run(b.graph, {xs, ys}).at(0), d_eager + d_eager);
}

TEST_CASE("a value that is also a graph output is not fused away") {
  Builder b;
  const fl::Shape shape{2000};
  const fl::ValueRef x = b.arg(shape);
  const fl::ValueRef a = b.op("mul", {x, b.scalar(2.0)});
  const fl::ValueRef t = b.op("tanh", {a});
  const fl::ValueRef out = b.op("add", {t, b.scalar(1.0)});
  b.graph.set_outputs({t, out});
  const fl::Graph original = b.graph;

  fl::detail::fuse_elementwise(b.graph);
  b.graph.check_invariants();
  const auto ops = live_ops(b.graph);
  REQUIRE(ops.size() == 2);
  CHECK(is_fused(*ops[0]));  // mul and tanh, rooted at tanh
  CHECK(ops[0] == &b.graph.node(t.node));
  CHECK(program_of(*ops[0]).steps.size() == 2);
  CHECK(ops[1]->op->name == "add");  // alone: a group of one stays as it is
  CHECK(b.graph.outputs() == std::vector<fl::ValueRef>{t, out});

  const fl::Tensor xs = test::random_tensor(shape, 5);
  const auto want = run(original, {xs});
  const auto got = run(b.graph, {xs});
  check_identical<float>(got[0], want[0]);
  check_identical<float>(got[1], want[1]);
}

TEST_CASE("a value with two consumers ends the chain; each consumer's branch fuses on") {
  Builder b;
  const fl::Shape shape{3000};
  const fl::ValueRef x = b.arg(shape);
  const fl::ValueRef a = b.op("mul", {x, b.scalar(3.0)});
  const fl::ValueRef left = b.op("tanh", {a});
  const fl::ValueRef right = b.op("exp", {a});
  const fl::ValueRef out = b.op("sub", {left, right});
  b.graph.set_outputs({out});
  const fl::Graph original = b.graph;

  fl::detail::fuse_elementwise(b.graph);
  b.graph.check_invariants();
  const auto ops = live_ops(b.graph);
  REQUIRE(ops.size() == 2);
  CHECK(ops[0] == &b.graph.node(a.node));  // the shared value stays its own node
  CHECK(ops[0]->op->name == "mul");
  REQUIRE(is_fused(*ops[1]));
  CHECK(ops[1]->inputs == std::vector<fl::ValueRef>{a});
  CHECK(fl::detail::describe(program_of(*ops[1])) == "tanh(in0) -> exp(in0) -> sub(s0, s1)");

  const fl::Tensor xs = test::random_tensor(shape, 6);
  check_identical<float>(run(b.graph, {xs}).at(0), run(original, {xs}).at(0));
}

TEST_CASE("a broadcasting operand keeps its consumer out of fusion") {
  Builder b;
  const fl::ValueRef x = b.arg(fl::Shape{40, 8});
  const fl::ValueRef bias = b.arg(fl::Shape{8});
  const fl::ValueRef one = b.arg(fl::Shape{1});  // one element, but rank 1: it broadcasts, not a scalar
  const fl::ValueRef t = b.op("tanh", {x});
  const fl::ValueRef y = b.op("add", {t, bias});
  const fl::ValueRef z = b.op("exp", {y});
  const fl::ValueRef w = b.op("mul", {z, one});
  b.graph.set_outputs({w});
  fl::detail::fuse_elementwise(b.graph);
  b.graph.check_invariants();
  for (const fl::Node* n : live_ops(b.graph)) CHECK_FALSE(is_fused(*n));
  CHECK(live_ops(b.graph).size() == 4);
}

TEST_CASE("fusion stops at stateful nodes, other devices, integer dtypes and control-edge targets") {
  SUBCASE("stateful") {
    fl::Op stateful_mul = *fl::find_op("mul");
    stateful_mul.flags |= fl::kStateful;
    Builder b;
    const fl::ValueRef x = b.arg(fl::Shape{100});
    const fl::ValueRef a = b.op(stateful_mul, {x, x});
    const fl::ValueRef t = b.op("tanh", {a});
    b.graph.set_outputs({t});
    b.graph.set_effects({a.node});
    fl::detail::fuse_elementwise(b.graph);
    b.graph.check_invariants();
    CHECK(live_ops(b.graph).size() == 2);
  }
  SUBCASE("another device") {
    Builder b;
    const fl::ValueRef x = b.arg(fl::Shape{100});
    const fl::ValueRef a = b.op(*fl::find_op("exp"), {x}, fl::Device("cpu:1"));
    const fl::ValueRef t = b.op(*fl::find_op("tanh"), {a}, fl::Device("cpu:0"));
    b.graph.set_outputs({t});
    fl::detail::fuse_elementwise(b.graph);
    CHECK(live_ops(b.graph).size() == 2);
  }
  SUBCASE("integers") {
    Builder b;
    const fl::ValueRef x = b.arg(fl::Shape{100}, fl::i32);
    const fl::ValueRef a = b.op("mul", {x, x});
    const fl::ValueRef t = b.op("add", {a, x});
    b.graph.set_outputs({t});
    fl::detail::fuse_elementwise(b.graph);
    CHECK(live_ops(b.graph).size() == 2);
  }
  SUBCASE("a control input names the producer") {
    Builder b;
    const fl::ValueRef x = b.arg(fl::Shape{100});
    const fl::ValueRef a = b.op("exp", {x});
    const fl::ValueRef t = b.op("tanh", {a});
    const fl::ValueRef u = b.op("neg", {x});
    b.graph.node(u.node).control_inputs = {a.node};
    b.graph.set_outputs({t, u});
    fl::detail::fuse_elementwise(b.graph);
    b.graph.check_invariants();
    CHECK(live_ops(b.graph).size() == 3);
  }
}

TEST_CASE("a comparison fuses into the where that reads its mask (relu's gradient), matching eager exactly") {
  for (const int64_t n : {int64_t{1}, int64_t{1000}, int64_t{100003}}) {
    CAPTURE(n);
    Builder b;
    const fl::ValueRef x = b.arg(fl::Shape{n});
    const fl::ValueRef g = b.arg(fl::Shape{n});
    const fl::ValueRef zero = b.scalar(0.0);
    const fl::ValueRef mask = b.op("greater", {x, zero});
    b.graph.node(mask.node).outputs[0].dtype = fl::b8;
    const fl::ValueRef y = b.op("where", {mask, g, zero});
    b.graph.node(y.node).outputs[0].dtype = fl::f32;
    b.graph.set_outputs({y});
    fl::Graph unfused = b.graph;
    fl::detail::fuse_elementwise(b.graph);
    b.graph.check_invariants();
    const auto ops = live_ops(b.graph);
    REQUIRE(ops.size() == 1);
    REQUIRE(is_fused(*ops[0]));
    CHECK(program_of(*ops[0]).steps.size() == 2);
    CHECK(program_of(*ops[0]).steps[0].dtype == fl::b8);
    // Signed zeros, NaN and values on both sides of 0, over tiles and a tail.
    std::vector<float> xs(static_cast<size_t>(n)), gs(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const auto k = static_cast<size_t>(i);
      xs[k] = i % 7 == 0 ? -0.0f : i % 11 == 0 ? NAN : static_cast<float>(i % 5) - 2.0f;
      gs[k] = static_cast<float>(i) * 0.25f - 3.0f;
    }
    const fl::Tensor xt = fl::tensor(xs, fl::Shape{n}), gt = fl::tensor(gs, fl::Shape{n});
    check_identical<float>(run(b.graph, {xt, gt}).at(0), run(unfused, {xt, gt}).at(0));
  }
}

TEST_CASE("a comparison nothing float reads stays unfused, and so do comparisons of integers") {
  SUBCASE("a group rooted at a comparison") {
    Builder b;
    const fl::ValueRef x = b.arg(fl::Shape{100});
    const fl::ValueRef e = b.op("exp", {x});
    const fl::ValueRef mask = b.op("greater", {e, b.scalar(1.0)});
    b.graph.node(mask.node).outputs[0].dtype = fl::b8;
    b.graph.set_outputs({mask});
    fl::detail::fuse_elementwise(b.graph);
    b.graph.check_invariants();
    CHECK(live_ops(b.graph).size() == 2);
  }
  SUBCASE("integer operands") {
    Builder b;
    const fl::ValueRef x = b.arg(fl::Shape{100}, fl::i32);
    const fl::ValueRef g = b.arg(fl::Shape{100});
    const fl::ValueRef mask = b.op("greater", {x, b.scalar(0.0, fl::i32)});
    b.graph.node(mask.node).outputs[0].dtype = fl::b8;
    const fl::ValueRef y = b.op("where", {mask, g, b.scalar(0.0)});
    b.graph.node(y.node).outputs[0].dtype = fl::f32;
    b.graph.set_outputs({y});
    fl::detail::fuse_elementwise(b.graph);
    CHECK(live_ops(b.graph).size() == 2);
  }
}

TEST_CASE("the fused node takes the union of its members' control inputs") {
  Builder b;
  const fl::ValueRef x = b.arg(fl::Shape{100});
  const fl::ValueRef before1 = b.op("neg", {x});
  const fl::ValueRef before2 = b.op("abs", {x});
  const fl::ValueRef a = b.op("exp", {x});
  const fl::ValueRef t = b.op("tanh", {a});
  b.graph.node(a.node).control_inputs = {before1.node, before2.node};
  b.graph.node(t.node).control_inputs = {before2.node};
  b.graph.set_outputs({t, before1, before2});
  fl::detail::fuse_elementwise(b.graph);
  b.graph.check_invariants();
  const fl::Node& fused = b.graph.node(t.node);
  REQUIRE(is_fused(fused));
  CHECK(fused.control_inputs == std::vector<int32_t>{before1.node, before2.node});
  CHECK(b.graph.node(a.node).removed);
  b.graph.compact();
  b.graph.check_invariants();
}

TEST_CASE("the fused op checks its inputs against the program") {
  Builder b;
  const fl::ValueRef x = b.arg(fl::Shape{10});
  const fl::ValueRef y = b.arg(fl::Shape{10});
  const fl::ValueRef a = b.op("add", {x, y});
  const fl::ValueRef t = b.op("tanh", {a});
  b.graph.set_outputs({t});
  fl::detail::fuse_elementwise(b.graph);
  const fl::Node& fused = b.graph.node(t.node);
  REQUIRE(is_fused(fused));
  const void* attributes = fused.attributes.get();
  const fl::Op& op = *fused.op;
  const std::vector<fl::Tensor> mismatched = {fl::zeros(fl::Shape{10}), fl::zeros(fl::Shape{2, 5})};
  CHECK(check_throws<fl::InvalidArgument>([&] { fl::dispatch_all(op, mismatched, attributes); },
                                          {"fused_elementwise", "[2, 5]", "[10]"}));
  const std::vector<fl::Tensor> wrong_dtype = {fl::zeros(fl::Shape{10}), fl::zeros(fl::Shape{10}, fl::f64)};
  CHECK(check_throws<fl::DTypeError>([&] { fl::dispatch_all(op, wrong_dtype, attributes); },
                                     {"fused_elementwise", "f64", "f32"}));
  const std::vector<fl::Tensor> too_few = {fl::zeros(fl::Shape{10})};
  CHECK(check_throws<fl::InvalidArgument>([&] { fl::dispatch_all(op, too_few, attributes); },
                                          {"fused_elementwise", "2"}));
  // A scalar broadcasts against the other input, as in the kernels.
  const std::vector<fl::Tensor> with_scalar = {fl::full(fl::Shape{}, 0.5), test::random_tensor(fl::Shape{10}, 9)};
  check_identical<float>(fl::dispatch_all(op, with_scalar, attributes).at(0), fl::tanh(with_scalar[0] + with_scalar[1]));
}

TEST_CASE("the fused op is in the op table (the coverage tests see it) and has no gradient rule") {
  CHECK(fl::find_op("fused_elementwise") == &fl::detail::fused_elementwise_op);
  const bool has_grad = fl::detail::fused_elementwise_op.grad != nullptr;
  CHECK_FALSE(has_grad);
}

TEST_CASE("trace() fuses the chain, a cast step included, and its calls match eager exactly") {
  auto chain = fl::trace([](fl::Tensor x) { return eager_chain(x); });
  auto widen = fl::trace([](fl::Tensor x) { return fl::exp(fl::cast(x * 2.0, fl::f64)) + 1.0; });
  for (const int64_t n : {int64_t{1}, int64_t{1000}, int64_t{100003}}) {
    CAPTURE(n);
    const fl::Tensor x = test::random_tensor(fl::Shape{n}, 11);
    const auto ops = live_ops(chain.graph(x));
    REQUIRE(ops.size() == 1);
    CHECK(is_fused(*ops[0]));
    check_identical<float>(chain(x), eager_chain(x));

    const auto widen_ops = live_ops(widen.graph(x));
    REQUIRE(widen_ops.size() == 1);
    REQUIRE(is_fused(*widen_ops[0]));
    const std::string text = widen_ops[0]->op->describe_attributes(widen_ops[0]->attributes.get());
    CHECK(text.find("cast[dtype=f64]") != std::string::npos);
    check_identical<double>(widen(x), fl::exp(fl::cast(x * 2.0, fl::f64)) + 1.0);
  }
}
