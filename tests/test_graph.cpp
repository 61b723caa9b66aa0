// Graph IR and its passes on hand-built graphs: prune, CSE, constant folding, algebraic
// simplification, the optimize() pipeline and its dumps, DOT and JSON rendering, and the invariant
// check. Output metas are written by hand, as the tracer's shape rules would fill them.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "support/reference.hpp"
#include "ops/attributes.hpp"
#include "ops/known_ops.hpp"
#include "trace/passes/passes.hpp"

using fl::NodeKind;
using fl::TensorMeta;
using fl::ValueRef;
using test::check_throws;

namespace {

// --- stand-in ops ---------------------------------------------------------------------------------

void same_meta_infer(const fl::OpCall& call, fl::OutputSpec& spec) {
  spec.outputs[0] = {call.inputs[0].shape(), call.inputs[0].dtype()};
}

// A stateful op (think "assign a variable"): never merged, folded or rewritten.
fl::Op fake_state_op{"fake_state", 1, 1, fl::kStateful, &same_meta_infer};

// An op with an attribute struct, to check that CSE compares attributes.
struct ScaleAttrs {
  double factor;
  std::string describe() const { return fmt::format("factor={}", factor); }
};
fl::Op scale_op{"scale", 1, 1, fl::kNoFlags, &same_meta_infer, {}, nullptr, &fl::copy_attributes<ScaleAttrs>,
                &fl::describe_attributes<ScaleAttrs>};

// --- building graphs ------------------------------------------------------------------------------

struct Builder {
  fl::Graph graph;
  int32_t arguments = 0;

  ValueRef arg(fl::Shape shape, fl::DType dtype = fl::f32) {
    fl::Node n;
    n.kind = NodeKind::argument;
    n.argument = arguments++;
    n.outputs.push_back(TensorMeta{shape, dtype});
    return ValueRef{graph.add_node(std::move(n)), 0};
  }
  ValueRef constant(fl::Tensor t) { return ValueRef{graph.add_constant(std::move(t)), 0}; }
  ValueRef op(const fl::Op* op, std::vector<ValueRef> inputs, TensorMeta out,
              std::shared_ptr<const void> attributes = nullptr, std::string name = "") {
    REQUIRE(op != nullptr);
    fl::Node n;
    n.op = op;
    n.inputs = std::move(inputs);
    n.outputs.push_back(std::move(out));
    n.attributes = std::move(attributes);
    n.name = std::move(name);
    return ValueRef{graph.add_node(std::move(n)), 0};
  }
  ValueRef op(std::string_view name, std::vector<ValueRef> inputs, TensorMeta out) {
    return op(fl::find_op(name), std::move(inputs), std::move(out));
  }
  const fl::Node& node(ValueRef v) const { return graph.node(v.node); }
  bool removed(ValueRef v) const { return graph.node(v.node).removed; }
};

template <class Attributes>
std::shared_ptr<const void> attrs(const fl::Op& op, const Attributes& a) {
  return op.copy_attributes(&a);
}

const TensorMeta kVec3{fl::Shape{3}, fl::f32};

// --- a strict JSON checker (the tests have no JSON library) ----------------------------------------

struct JsonChecker {
  std::string_view text;
  size_t at = 0;

  void space() {
    while (at < text.size() && (text[at] == ' ' || text[at] == '\n' || text[at] == '\t' || text[at] == '\r')) ++at;
  }
  bool eat(char c) {
    space();
    if (at < text.size() && text[at] == c) return ++at, true;
    return false;
  }
  bool string() {
    if (!eat('"')) return false;
    while (at < text.size() && text[at] != '"') {
      if (static_cast<unsigned char>(text[at]) < 0x20) return false;
      if (text[at] == '\\') ++at;
      ++at;
    }
    return eat('"');
  }
  bool number() {
    const size_t start = at;
    if (at < text.size() && text[at] == '-') ++at;
    while (at < text.size() && (std::isdigit(static_cast<unsigned char>(text[at])) || text[at] == '.' ||
                                text[at] == 'e' || text[at] == 'E' || text[at] == '+' || text[at] == '-')) {
      ++at;
    }
    return at > start;
  }
  bool value() {
    space();
    if (at >= text.size()) return false;
    const char c = text[at];
    if (c == '"') return string();
    if (c == '{') return sequence('}', true);
    if (c == '[') return sequence(']', false);
    for (std::string_view word : {"true", "false", "null"}) {
      if (text.substr(at, word.size()) == word) return at += word.size(), true;
    }
    return number();
  }
  bool sequence(char close, bool object) {
    ++at;
    if (eat(close)) return true;
    do {
      if (object && (!string() || !eat(':'))) return false;
      if (!value()) return false;
    } while (eat(','));
    return eat(close);
  }
  bool document() { return value() && (space(), at == text.size()); }
};

bool valid_json(std::string_view text) { return JsonChecker{text}.document(); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// describe_attributes

TEST_CASE("describe_attributes prints every field of an attribute struct") {
  const ScaleAttrs a{0.1};
  CHECK(fl::describe_attributes<ScaleAttrs>(&a) == "factor=0.1");
  const fl::detail::PermuteAttrs p{{2, 0, 1}};
  CHECK(fl::describe_attributes<fl::detail::PermuteAttrs>(&p) == "perm=[2, 0, 1]");
}

TEST_CASE("every op with an attribute struct can describe it") {
  for (const fl::Op* op : fl::all_ops()) {
    INFO("op ", std::string(op->name));
    const bool describable = op->describe_attributes != nullptr;
    if (op->copy_attributes) CHECK(describable);
  }
}

// ---------------------------------------------------------------------------------------------
// prune

TEST_CASE("prune removes what neither outputs nor effects need, and keeps every argument") {
  Builder b;
  const ValueRef x = b.arg(fl::Shape{3});
  const ValueRef unused_arg = b.arg(fl::Shape{3});
  const ValueRef sum = b.op("add", {x, x}, kVec3);
  const ValueRef dead = b.op("mul", {x, x}, kVec3);
  const ValueRef dead_too = b.op("exp", {dead}, kVec3);
  const ValueRef ordered = b.op("neg", {x}, kVec3);  // needed only as a control input of the effect
  const ValueRef effect = b.op(&fake_state_op, {x}, kVec3);
  b.graph.node(effect.node).control_inputs.push_back(ordered.node);
  const ValueRef unused_state = b.op(&fake_state_op, {x}, kVec3);
  b.graph.set_outputs({sum});
  b.graph.set_effects({effect.node});

  fl::detail::prune(b.graph);
  b.graph.check_invariants();
  CHECK_FALSE(b.removed(x));
  CHECK_FALSE(b.removed(unused_arg));
  CHECK_FALSE(b.removed(sum));
  CHECK_FALSE(b.removed(ordered));
  CHECK_FALSE(b.removed(effect));
  CHECK(b.removed(dead));
  CHECK(b.removed(dead_too));
  CHECK(b.removed(unused_state));
  CHECK(b.graph.num_nodes() == 5);

  b.graph.compact();
  b.graph.check_invariants();
  CHECK(b.graph.num_nodes() == 5);
  CHECK(b.graph.node(1).kind == NodeKind::argument);
  CHECK(b.graph.node(1).argument == 1);
}

// ---------------------------------------------------------------------------------------------
// CSE

TEST_CASE("CSE merges nodes with the same op, attributes and inputs") {
  Builder b;
  const ValueRef x = b.arg(fl::Shape{3});
  const ValueRef y = b.arg(fl::Shape{3});
  const ValueRef first = b.op("add", {x, y}, kVec3);
  const ValueRef second = b.op("add", {x, y}, kVec3);
  const ValueRef swapped = b.op("add", {y, x}, kVec3);  // not merged: the pass knows no commutativity
  const ValueRef product = b.op("mul", {first, second}, kVec3);
  const ValueRef half = b.op(&scale_op, {x}, kVec3, attrs(scale_op, ScaleAttrs{0.5}));
  const ValueRef half_again = b.op(&scale_op, {x}, kVec3, attrs(scale_op, ScaleAttrs{0.5}));
  const ValueRef third = b.op(&scale_op, {x}, kVec3, attrs(scale_op, ScaleAttrs{1.0 / 3}));
  b.graph.set_outputs({product, swapped, second, half, half_again, third});

  fl::detail::eliminate_common_subexpressions(b.graph);
  b.graph.check_invariants();
  CHECK(b.removed(second));
  CHECK_FALSE(b.removed(swapped));
  CHECK(b.node(product).inputs == std::vector<ValueRef>{first, first});
  CHECK(b.removed(half_again));
  CHECK_FALSE(b.removed(third));
  CHECK(b.graph.outputs() == std::vector<ValueRef>{product, swapped, first, half, half, third});
}

TEST_CASE("CSE never merges stateful nodes") {
  Builder b;
  const ValueRef x = b.arg(fl::Shape{3});
  const ValueRef a = b.op(&fake_state_op, {x}, kVec3);
  const ValueRef c = b.op(&fake_state_op, {x}, kVec3);
  b.graph.node(c.node).control_inputs.push_back(a.node);
  b.graph.set_outputs({a, c});
  b.graph.set_effects({a.node, c.node});

  fl::detail::eliminate_common_subexpressions(b.graph);
  b.graph.check_invariants();
  CHECK_FALSE(b.removed(a));
  CHECK_FALSE(b.removed(c));
  CHECK(b.graph.effects() == std::vector<int32_t>{a.node, c.node});
}

TEST_CASE("CSE merges small equal constants and moves control uses of a duplicate") {
  Builder b;
  const ValueRef two = b.constant(fl::tensor({2.0f, 2.0f}));
  const ValueRef two_again = b.constant(fl::tensor({2.0f, 2.0f}));
  const ValueRef three = b.constant(fl::tensor({2.0f, 3.0f}));
  const ValueRef two_f64 = b.constant(fl::tensor({2.0, 2.0}));
  const TensorMeta vec2{fl::Shape{2}, fl::f32};
  const ValueRef n1 = b.op("neg", {two}, vec2);
  const ValueRef n2 = b.op("neg", {two_again}, vec2);  // the same once the constants merge
  const ValueRef effect = b.op(&fake_state_op, {three}, vec2);
  b.graph.node(effect.node).control_inputs.push_back(n2.node);
  b.graph.set_outputs({n1, n2, ValueRef{two_f64.node, 0}});
  b.graph.set_effects({effect.node});

  fl::detail::eliminate_common_subexpressions(b.graph);
  b.graph.check_invariants();
  CHECK(b.removed(two_again));
  CHECK_FALSE(b.removed(three));
  CHECK_FALSE(b.removed(two_f64));
  CHECK(b.removed(n2));
  CHECK(b.node(effect).control_inputs == std::vector<int32_t>{n1.node});
  CHECK(b.graph.outputs() == std::vector<ValueRef>{n1, n1, two_f64});
}

TEST_CASE("CSE merges large constants only when they are the same view of the same storage") {
  Builder b;
  const fl::Tensor big = fl::zeros(fl::Shape{100});
  const ValueRef first = b.constant(big);
  const ValueRef same = b.constant(big);
  const ValueRef equal_values = b.constant(fl::zeros(fl::Shape{100}));  // not compared byte by byte
  b.graph.set_outputs({first, same, equal_values});

  fl::detail::eliminate_common_subexpressions(b.graph);
  CHECK(b.removed(same));
  CHECK_FALSE(b.removed(equal_values));
  CHECK(b.graph.outputs() == std::vector<ValueRef>{first, first, equal_values});
}

// ---------------------------------------------------------------------------------------------
// Constant folding

TEST_CASE("fold_constants turns an op on constants into a constant with its value, in place") {
  Builder b;
  const ValueRef x = b.arg(fl::Shape{});
  const ValueRef two = b.constant(fl::scalar(2.0f));
  const ValueRef three = b.constant(fl::scalar(3.0f));
  const TensorMeta scalar{fl::Shape{}, fl::f32};
  const ValueRef five = b.op("add", {two, three}, scalar);
  const ValueRef minus_five = b.op("neg", {five}, scalar);  // folds too: its input is folded first
  const ValueRef with_arg = b.op("add", {x, three}, scalar);
  const ValueRef state = b.op(&fake_state_op, {two}, scalar);
  b.graph.set_outputs({minus_five, with_arg});
  b.graph.set_effects({state.node});

  fl::detail::fold_constants(b.graph);
  b.graph.check_invariants();
  REQUIRE(b.node(five).kind == NodeKind::constant);
  CHECK(b.node(five).value.item<float>() == 5.0f);
  CHECK(b.node(five).inputs.empty());
  CHECK(b.node(five).name == "add_3");
  REQUIRE(b.node(minus_five).kind == NodeKind::constant);
  CHECK(b.node(minus_five).value.item<float>() == -5.0f);
  CHECK(b.node(with_arg).kind == NodeKind::op);
  CHECK(b.node(state).kind == NodeKind::op);
}

TEST_CASE("fold_constants leaves ops that fail, and results too large to keep") {
  Builder b;
  // matmul of [2, 3] and [2, 3] fails; the graph says [2, 2] (a hand-made lie the op will refuse).
  const ValueRef a = b.constant(fl::ones(fl::Shape{2, 3}));
  const ValueRef bad = b.op("matmul", {a, a}, TensorMeta{fl::Shape{2, 2}, fl::f32});
  const int64_t big = (int64_t{1} << 20) + 1;
  const ValueRef large = b.constant(fl::zeros(fl::Shape{big}));
  const ValueRef large_sum = b.op("add", {large, large}, TensorMeta{fl::Shape{big}, fl::f32});
  b.graph.set_outputs({bad, large_sum});

  fl::detail::fold_constants(b.graph);
  b.graph.check_invariants();
  CHECK(b.node(bad).kind == NodeKind::op);
  CHECK(b.node(large_sum).kind == NodeKind::op);
}

// ---------------------------------------------------------------------------------------------
// Algebraic simplification

TEST_CASE("simplify_algebra removes multiplications by one and additions of zero") {
  Builder b;
  const ValueRef x = b.arg(fl::Shape{3});
  const ValueRef one = b.constant(fl::scalar(1.0f));
  const ValueRef ones = b.constant(fl::ones(fl::Shape{3}));
  const ValueRef zero = b.constant(fl::scalar(0.0f));
  const ValueRef two = b.constant(fl::scalar(2.0f));
  const ValueRef times_one = b.op("mul", {x, one}, kVec3);
  const ValueRef one_times = b.op("mul", {ones, times_one}, kVec3);  // chains: reads x once rewritten
  const ValueRef plus_zero = b.op("add", {zero, x}, kVec3);
  const ValueRef minus_zero = b.op("sub", {x, zero}, kVec3);
  const ValueRef over_one = b.op("div", {x, one}, kVec3);
  const ValueRef zero_minus = b.op("sub", {zero, x}, kVec3);  // -x: stays
  const ValueRef one_over = b.op("div", {one, x}, kVec3);     // 1/x: stays
  const ValueRef times_two = b.op("mul", {x, two}, kVec3);    // stays
  const ValueRef user = b.op("exp", {one_times}, kVec3);
  b.graph.set_outputs({user, plus_zero, minus_zero, over_one, zero_minus, one_over, times_two});

  fl::detail::simplify_algebra(b.graph);
  b.graph.check_invariants();
  CHECK(b.removed(times_one));
  CHECK(b.removed(one_times));
  CHECK(b.node(user).inputs == std::vector<ValueRef>{x});
  CHECK(b.graph.outputs() == std::vector<ValueRef>{user, x, x, x, zero_minus, one_over, times_two});
}

TEST_CASE("simplify_algebra keeps x*1 when the ones would change the result's shape or dtype") {
  Builder b;
  const ValueRef x = b.arg(fl::Shape{3});
  const ValueRef ones = b.constant(fl::ones(fl::Shape{2, 3}));
  const ValueRef broadcast = b.op("mul", {x, ones}, TensorMeta{fl::Shape{2, 3}, fl::f32});
  const ValueRef xi = b.arg(fl::Shape{3}, fl::i32);
  const ValueRef one_f = b.constant(fl::scalar(1.0f));
  // A made-up promoting mul (the library's mul rejects mixed dtypes; the check must not rely on it).
  const ValueRef promoted = b.op("mul", {xi, one_f}, kVec3);
  b.graph.set_outputs({broadcast, promoted});

  fl::detail::simplify_algebra(b.graph);
  CHECK_FALSE(b.removed(broadcast));
  CHECK_FALSE(b.removed(promoted));
  CHECK(b.graph.outputs() == std::vector<ValueRef>{broadcast, promoted});
}

TEST_CASE("simplify_algebra removes double negation, same-dtype casts and nested reshapes") {
  Builder b;
  const ValueRef x = b.arg(fl::Shape{2, 3});
  const TensorMeta m23{fl::Shape{2, 3}, fl::f32};
  const ValueRef n1 = b.op("neg", {x}, m23);
  const ValueRef n2 = b.op("neg", {n1}, m23);
  const ValueRef same_cast = b.op("cast", {x}, m23);
  const ValueRef to_f64 = b.op("cast", {x}, TensorMeta{fl::Shape{2, 3}, fl::f64});
  // The pass reads reshape's output metas, not its attributes, so these nodes carry none.
  const ValueRef flat = b.op("reshape", {x}, TensorMeta{fl::Shape{6}, fl::f32});
  const ValueRef r32 = b.op("reshape", {flat}, TensorMeta{fl::Shape{3, 2}, fl::f32});
  const ValueRef back = b.op("reshape", {flat}, m23);
  b.graph.set_outputs({n2, same_cast, to_f64, r32, back});

  fl::detail::simplify_algebra(b.graph);
  b.graph.check_invariants();
  CHECK(b.removed(n2));
  CHECK_FALSE(b.removed(n1));  // unused now: prune's job
  CHECK(b.removed(same_cast));
  CHECK_FALSE(b.removed(to_f64));
  CHECK(b.node(r32).inputs == std::vector<ValueRef>{x});
  CHECK(b.removed(back));
  CHECK(b.graph.outputs() == std::vector<ValueRef>{x, x, to_f64, r32, x});
}

TEST_CASE("simplify_algebra removes a permute that undoes the one before it, and only that") {
  Builder b;
  const ValueRef x = b.arg(fl::Shape{4, 4, 4});  // equal lengths: shapes alone cannot tell perms apart
  const TensorMeta m{fl::Shape{4, 4, 4}, fl::f32};
  auto permute = [&](ValueRef in, std::vector<int64_t> perm) {
    // The library's permute: the pass knows it by identity and reads the permutation through its shape rule.
    return b.op(&fl::detail::permute_op, {in}, m, attrs(fl::detail::permute_op, fl::detail::PermuteAttrs{std::move(perm)}));
  };
  const ValueRef p = permute(x, {1, 2, 0});
  const ValueRef undone = permute(p, {2, 0, 1});
  const ValueRef twice = permute(p, {1, 2, 0});  // a 3-cycle applied twice is not the identity
  const ValueRef stateful = b.op(&fake_state_op, {x}, m);
  const ValueRef after_state = permute(permute(stateful, {1, 0, 2}), {1, 0, 2});
  b.graph.set_outputs({undone, twice, after_state});
  b.graph.set_effects({stateful.node});

  fl::detail::simplify_algebra(b.graph);
  b.graph.check_invariants();
  CHECK(b.removed(undone));
  CHECK_FALSE(b.removed(twice));
  CHECK(b.graph.outputs() == std::vector<ValueRef>{x, twice, stateful});
  CHECK_FALSE(b.removed(stateful));
}

TEST_CASE("simplify_algebra never rewrites stateful nodes or nodes that order others") {
  Builder b;
  const ValueRef x = b.arg(fl::Shape{3});
  const ValueRef one = b.constant(fl::scalar(1.0f));
  const ValueRef ordered = b.op("mul", {x, one}, kVec3);  // a control input: removing it drops an order
  const ValueRef effect = b.op(&fake_state_op, {x}, kVec3);
  b.graph.node(effect.node).control_inputs.push_back(ordered.node);
  b.graph.set_outputs({ordered});
  b.graph.set_effects({effect.node});

  fl::detail::simplify_algebra(b.graph);
  CHECK_FALSE(b.removed(ordered));
  CHECK_FALSE(b.removed(effect));
}

// ---------------------------------------------------------------------------------------------
// The pipeline

TEST_CASE("optimize runs the passes in order and leaves a compact graph") {
  Builder b;
  const ValueRef x = b.arg(fl::Shape{3});
  b.arg(fl::Shape{3});  // unused, kept
  const ValueRef two = b.constant(fl::scalar(2.0f));
  const ValueRef three = b.constant(fl::scalar(3.0f));
  const TensorMeta scalar{fl::Shape{}, fl::f32};
  const ValueRef five = b.op("add", {two, three}, scalar);
  const ValueRef five_again = b.op("add", {three, two}, scalar);  // folds to an equal constant, which merges
  const ValueRef six = b.constant(fl::scalar(6.0f));
  const ValueRef one = b.op("sub", {six, five}, scalar);  // folds to 1
  const ValueRef times_one = b.op("mul", {x, one}, kVec3);  // then x*1 -> x
  const ValueRef a = b.op("mul", {x, five}, kVec3);
  const ValueRef a_again = b.op("mul", {x, five_again}, kVec3);  // the same as `a` once the fives merge
  b.op("exp", {x}, kVec3);                                        // dead
  const ValueRef total = b.op("add", {a, a_again}, kVec3);
  b.graph.set_outputs({total, times_one});

  fl::detail::PassOptions options;
  options.fuse_elementwise = false;  // fusion has its own tests
  fl::detail::optimize(b.graph, options);
  b.graph.check_invariants();
  // Left: x, the unused argument, the constant 5, x*5, and the sum.
  REQUIRE(b.graph.num_nodes() == 5);
  CHECK(b.graph.node(1).kind == NodeKind::argument);
  const fl::Node& five_node = b.graph.node(2);
  REQUIRE(five_node.kind == NodeKind::constant);
  CHECK(five_node.value.item<float>() == 5.0f);
  CHECK(b.graph.node(3).op->name == "mul");
  CHECK(b.graph.node(3).inputs == std::vector<ValueRef>{{0, 0}, {2, 0}});
  CHECK(b.graph.node(4).op->name == "add");
  CHECK(b.graph.node(4).inputs == std::vector<ValueRef>{{3, 0}, {3, 0}});
  CHECK(b.graph.outputs() == std::vector<ValueRef>{{4, 0}, {0, 0}});
}

TEST_CASE("optimize rejects a dump folder with a NUL byte instead of writing to a shorter path") {
  fl::detail::PassOptions options;
  options.dump_dir = std::string("/tmp/flowlet_dump\0/elsewhere", 28);
  Builder b;
  const ValueRef x = b.arg(fl::Shape{3});
  b.graph.set_outputs({b.op("neg", {x}, kVec3)});
  check_throws<fl::InvalidArgument>([&] { fl::detail::optimize(b.graph, options); },
                                    {"optimize: the graph dump folder contains a NUL byte at offset 17"});
}

TEST_CASE("optimize writes DOT and JSON before and after every pass into the dump folder") {
  const auto dir = std::filesystem::temp_directory_path() /
                   fmt::format("flowlet_test_graph_{}", std::chrono::steady_clock::now().time_since_epoch().count());
  fl::detail::PassOptions options;
  options.dump_dir = (dir / "nested").string();  // created on demand
  for (int call = 0; call < 2; ++call) {
    Builder b;
    const ValueRef x = b.arg(fl::Shape{3});
    b.graph.set_outputs({b.op("neg", {x}, kVec3)});
    fl::detail::optimize(b.graph, options);
  }
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir / "nested")) {
    names.insert(entry.path().filename().string());
  }
  // 15 snapshots (traced + 14 passes) x 2 formats x 2 calls, none overwriting another.
  CHECK(names.size() == 60);
  std::set<std::string> sequences;
  for (const std::string& name : names) sequences.insert(name.substr(0, name.find('_')));
  CHECK(sequences.size() == 2);
  const std::string first = *sequences.begin();
  for (std::string_view step : {"_00_traced", "_01_prune", "_02_simplify_algebra", "_03_fold_constants",
                                "_04_eliminate_common_subexpressions", "_05_simplify_algebra",
                                "_06_place", "_07_fuse_convolutions", "_08_fuse_matmul_bias",
                                "_09_fuse_relu_bias_grad", "_10_fuse_cross_entropy_grad",
                                "_11_fuse_variable_updates", "_12_fuse_elementwise", "_13_prune",
                                "_14_insert_send_recv"}) {
    CHECK(names.count(first + std::string(step) + ".dot") == 1);
    CHECK(names.count(first + std::string(step) + ".json") == 1);
  }
  std::ifstream json(dir / "nested" / (first + "_14_insert_send_recv.json"));
  const std::string text((std::istreambuf_iterator<char>(json)), std::istreambuf_iterator<char>());
  CHECK(valid_json(text));
  CHECK(text.find("\"op\":\"neg\"") != std::string::npos);
  std::filesystem::remove_all(dir);
}

// ---------------------------------------------------------------------------------------------
// Rendering

TEST_CASE("to_dot draws every live node, data and control edges, and escapes quotes") {
  Builder b;
  const ValueRef x = b.arg(fl::Shape{2, 3});
  const ValueRef c = b.constant(fl::tensor({1.5f, -2.0f, 3.0f}));
  const TensorMeta m23{fl::Shape{2, 3}, fl::f32};
  const ValueRef sum = b.op(fl::find_op("add"), {x, c}, m23, nullptr, "say \"hi\"");
  const ValueRef scaled = b.op(&scale_op, {sum}, m23, attrs(scale_op, ScaleAttrs{0.25}));
  const ValueRef effect = b.op(&fake_state_op, {scaled}, m23);
  b.graph.node(effect.node).control_inputs.push_back(sum.node);
  const ValueRef gone = b.op("exp", {x}, m23);
  b.graph.node(gone.node).name = "gone_node";
  b.graph.node(gone.node).removed = true;
  b.graph.set_outputs({scaled});
  b.graph.set_effects({effect.node});

  const std::string dot = b.graph.to_dot();
  INFO(dot);
  CHECK(dot.rfind("digraph", 0) == 0);
  for (const fl::Node& n : b.graph.nodes()) {
    if (n.removed) continue;
    if (n.name.find('"') == std::string::npos) CHECK(dot.find(n.name) != std::string::npos);
  }
  CHECK(dot.find("say \\\"hi\\\"") != std::string::npos);
  CHECK(dot.find("gone_node") == std::string::npos);
  CHECK(dot.find("n0 -> n2 [label=\"[2, 3]\"]") != std::string::npos);
  CHECK(dot.find("n2 -> n4 [style=dashed]") != std::string::npos);
  CHECK(dot.find("shape=ellipse") != std::string::npos);  // the argument
  CHECK(dot.find("shape=note") != std::string::npos);     // the constant
  CHECK(dot.find("[1.5, -2, 3]") != std::string::npos);   // its values
  CHECK(dot.find("factor=0.25") != std::string::npos);
  CHECK(dot.find("[2, 3] f32 @ cpu:0") != std::string::npos);
  CHECK(dot.find("peripheries=2") != std::string::npos);  // the output
  CHECK(dot.find("style=bold") != std::string::npos);     // the effect
}

TEST_CASE("to_json is valid JSON listing nodes, edges, outputs and effects") {
  Builder b;
  const ValueRef x = b.arg(fl::Shape{2, 3});
  const ValueRef c = b.constant(fl::scalar(2.0f));
  const TensorMeta m23{fl::Shape{2, 3}, fl::f32};
  const ValueRef sum = b.op(fl::find_op("add"), {x, c}, m23, nullptr, "quote\"and\\slash");
  const ValueRef scaled = b.op(&scale_op, {sum}, m23, attrs(scale_op, ScaleAttrs{0.5}));
  const ValueRef effect = b.op(&fake_state_op, {scaled}, m23);
  b.graph.node(effect.node).control_inputs.push_back(sum.node);
  b.graph.set_outputs({scaled});
  b.graph.set_effects({effect.node});

  const std::string json = b.graph.to_json();
  INFO(json);
  CHECK(valid_json(json));
  CHECK_FALSE(valid_json(json.substr(0, json.size() - 1)));  // the checker does reject broken JSON
  CHECK(json.rfind("{\"nodes\":[", 0) == 0);
  CHECK(json.find("{\"id\":0,\"name\":\"arg_0\",\"kind\":\"argument\"") != std::string::npos);
  CHECK(json.find("\"kind\":\"constant\"") != std::string::npos);
  CHECK(json.find("\"name\":\"quote\\\"and\\\\slash\"") != std::string::npos);
  CHECK(json.find("\"op\":\"add\"") != std::string::npos);
  CHECK(json.find("\"attributes\":\"factor=0.5\"") != std::string::npos);
  CHECK(json.find("\"inputs\":[[0,0],[1,0]]") != std::string::npos);
  CHECK(json.find("\"control_inputs\":[2]") != std::string::npos);
  CHECK(json.find("\"outputs\":[{\"shape\":[2,3],\"dtype\":\"f32\"}]") != std::string::npos);
  CHECK(json.find("\"device\":\"cpu:0\"") != std::string::npos);
  CHECK(json.find("\"source\":") != std::string::npos);
  CHECK(json.find("],\"outputs\":[[3,0]],\"effects\":[4]}") != std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Invariants

TEST_CASE("check_invariants names a use of a later node, a removed node or a missing output") {
  {
    Builder b;
    const ValueRef x = b.arg(fl::Shape{3});
    const ValueRef y = b.op("neg", {x}, kVec3);
    b.graph.node(y.node).inputs[0] = ValueRef{y.node, 0};  // reads itself
    check_throws<fl::InvalidArgument>([&] { b.graph.check_invariants(); }, {"does not come earlier"});
  }
  {
    Builder b;
    const ValueRef x = b.arg(fl::Shape{3});
    const ValueRef y = b.op("neg", {x}, kVec3);
    b.graph.set_outputs({y});
    b.graph.node(y.node).removed = true;
    check_throws<fl::InvalidArgument>([&] { b.graph.check_invariants(); }, {"graph output", "removed"});
  }
  {
    Builder b;
    const ValueRef x = b.arg(fl::Shape{3});
    b.op("neg", {ValueRef{x.node, 1}}, kVec3);
    check_throws<fl::InvalidArgument>([&] { b.graph.check_invariants(); }, {"reads output 1", "1 outputs"});
    // optimize() dumps before it checks, so rendering must survive a broken graph.
    CHECK(b.graph.to_dot().find("n0 -> n1 [label=\"invalid\"]") != std::string::npos);
    CHECK(valid_json(b.graph.to_json()));
  }
}
