// Variables: named mutable state read as tensors, with checked updates that change nothing on error.
#include <thread>

#include "support/reference.hpp"

TEST_CASE("a variable reads as its initial value and converts to a tensor in ops") {
  const fl::Variable v(fl::tensor({1.0f, 2.0f, 3.0f}), "v");
  CHECK(v.name() == "v");
  CHECK(v.shape() == fl::Shape{3});
  CHECK(v.dtype() == fl::f32);
  CHECK(v.device() == fl::Device("cpu"));
  CHECK(v.value().to_vector<float>() == std::vector<float>{1, 2, 3});
  const fl::Tensor doubled = fl::mul(v, fl::tensor({2.0f, 2.0f, 2.0f}));
  CHECK(doubled.to_vector<float>() == std::vector<float>{2, 4, 6});
  CHECK((v + v).to_vector<float>() == std::vector<float>{2, 4, 6});
}

TEST_CASE("a variable owns a copy of its initial value") {
  fl::Tensor initial = fl::tensor({1.0f, 2.0f});
  const fl::Variable v(initial);
  static_cast<float*>(initial.raw_data())[0] = 100.0f;  // the caller's buffer changes later
  CHECK(v.value().to_vector<float>() == std::vector<float>{1, 2});
  CHECK(v.value().storage().get() != initial.storage().get());
}

TEST_CASE("assign, assign_add and assign_sub update every handle and leave earlier reads unchanged") {
  fl::Variable v(fl::tensor({1.0, 2.0}), "w");
  const fl::Variable alias = v;
  const fl::Tensor before = v.value();
  v.assign_add(fl::tensor({10.0, 20.0}));
  CHECK(alias.value().to_vector<double>() == std::vector<double>{11, 22});
  v.assign_sub(fl::tensor({1.0, 2.0}));
  CHECK(v.value().to_vector<double>() == std::vector<double>{10, 20});
  v.assign(fl::tensor({-1.0, -2.0}));
  CHECK(alias.value().to_vector<double>() == std::vector<double>{-1, -2});
  CHECK(before.to_vector<double>() == std::vector<double>{1, 2});
  CHECK(same_variable(v, alias));
  CHECK_FALSE(same_variable(v, fl::Variable(fl::tensor({0.0}))));
}

TEST_CASE("an update with the wrong shape, dtype or an empty tensor throws and changes nothing") {
  fl::Variable v(fl::tensor({1.0f, 2.0f}), "bias");
  test::check_throws<fl::ShapeError>([&] { v.assign(fl::tensor({1.0f, 2.0f, 3.0f})); },
                                     {"assign:", "bias", "[3]", "[2]"});
  test::check_throws<fl::DTypeError>([&] { v.assign_add(fl::tensor({1.0, 2.0})); }, {"assign_add:", "bias", "f64", "f32"});
  test::check_throws<fl::ShapeError>([&] { v.assign_sub(fl::zeros({2, 1})); }, {"assign_sub:", "bias"});
  test::check_throws<fl::InvalidArgument>([&] { v.assign(fl::Tensor()); }, {"assign:", "empty Tensor handle"});
  CHECK(v.value().to_vector<float>() == std::vector<float>{1, 2});
}

TEST_CASE("empty variable handles and empty initial values are rejected") {
  const fl::Variable empty;
  CHECK_FALSE(empty.defined());
  test::check_throws<fl::InvalidArgument>([&] { (void)empty.value(); }, {"empty Variable handle"});
  test::check_throws<fl::InvalidArgument>([] { fl::Variable v(fl::Tensor(), "x"); }, {"Variable:", "empty Tensor handle", "x"});
}

TEST_CASE("concurrent updates from several threads are all applied") {
  fl::Variable counter(fl::zeros({4}, fl::i64), "counter");
  constexpr int kThreads = 4, kUpdates = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kUpdates; ++i) {
        counter.assign_add(fl::ones({4}, fl::i64));
        (void)fl::sum(counter.value());  // reads race with updates; each read sees a whole value
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(counter.value().to_vector<int64_t>() == std::vector<int64_t>(4, kThreads * kUpdates));
}

TEST_CASE("a tape differentiates with respect to braced lists of variables or tensors") {
  fl::Variable w(fl::tensor({2.0}), "w");
  const fl::Tensor x = fl::tensor({3.0});
  fl::GradientTape tape(/*persistent=*/true);
  tape.watch(x);
  const fl::Tensor y = w * x;
  CHECK(tape.gradient(y, {w})[0].item<double>() == 3.0);
  CHECK(tape.gradient(y, {x})[0].item<double>() == 2.0);
}

TEST_CASE("scaled updates add or subtract scale * t, in place only when nobody else holds the value") {
  fl::Variable w(fl::tensor({1.0f, 2.0f, 4.0f}), "w");
  const void* buffer = w.value().raw_data();  // the read's handle is gone after this line
  w.assign_sub(fl::tensor({2.0f, 2.0f, 2.0f}), 0.5);
  CHECK(w.value().to_vector<float>() == std::vector<float>{0, 1, 3});
  CHECK(w.value().raw_data() == buffer);  // updated in place: no reader could see the change
  const fl::Tensor kept = w.value();
  w.assign_add(fl::tensor({1.0f, 1.0f, 1.0f}), 3.0);
  CHECK(w.value().to_vector<float>() == std::vector<float>{3, 4, 6});
  CHECK(kept.to_vector<float>() == std::vector<float>{0, 1, 3});  // a reader keeps the old values
  CHECK(w.value().raw_data() != kept.raw_data());
  fl::Variable d(fl::tensor({1.0, 1.0}), "d");
  d.assign_add(fl::tensor({0.25, -0.5}), -4.0);
  CHECK(d.value().to_vector<double>() == std::vector<double>{0, 3});
  test::check_throws<fl::InvalidArgument>([&] { w.assign_sub(fl::ones({3}), std::nan("")); }, {"assign_sub:", "finite", "w"});
  test::check_throws<fl::ShapeError>([&] { w.assign_sub(fl::ones({2}), 1.0); }, {"assign_sub:", "w"});
  CHECK(w.value().to_vector<float>() == std::vector<float>{3, 4, 6});
}

namespace {
const fl::Node* only_node(const fl::Graph& g, std::string_view op) {
  const fl::Node* found = nullptr;
  for (const fl::Node& n : g.nodes()) {
    if (n.removed || n.op == nullptr || n.op->name != op) continue;
    CHECK_MESSAGE(found == nullptr, "more than one '" << op << "' node");
    found = &n;
  }
  REQUIRE_MESSAGE(found != nullptr, "no '" << op << "' node");
  return found;
}
int32_t id_of(const fl::Graph& g, const fl::Node* n) { return static_cast<int32_t>(n - g.nodes().data()); }
}  // namespace

TEST_CASE("a traced read and update of a variable are named after it, ordered on it, and only the update keeps the scope") {
  fl::Variable w(fl::tensor({1.0f, 2.0f}), "w");
  auto step = fl::trace([&](fl::Tensor x) {
    fl::DeviceScope scope(fl::Device("cpu:0"));
    const fl::Tensor y = w.value() * x;
    w.assign_sub(y, 0.5);
    return y;
  });
  const fl::Tensor x = fl::tensor({3.0f, 5.0f});
  CHECK(step(x).to_vector<float>() == std::vector<float>{3.0f, 10.0f});
  CHECK(w.value().to_vector<float>() == std::vector<float>{-0.5f, -3.0f});  // w - 0.5 * w * x

  const fl::Graph& g = step.graph(x);
  const fl::Node* read = only_node(g, "read_variable");
  const fl::Node* update = only_node(g, "assign_variable");
  CHECK(read->name == fmt::format("read_w_{}", id_of(g, read)));
  CHECK(update->name == fmt::format("assign_sub_w_{}", id_of(g, update)));
  // The write waits for the read of the same variable; the graph runs the write even though no
  // output needs it.
  CHECK(std::count(update->control_inputs.begin(), update->control_inputs.end(), id_of(g, read)) == 1);
  CHECK(std::count(g.effects().begin(), g.effects().end(), id_of(g, update)) == 1);
  // A read runs where the variable lives (kRunsAtResource); the scope's request stays on the others.
  CHECK_FALSE(read->requested_device.has_value());
  int requesting = 0;  // the update and the product (fused or not)
  for (const fl::Node& n : g.nodes()) {
    if (n.removed || n.op == nullptr || &n == read) continue;
    CAPTURE(n.name);
    REQUIRE(n.requested_device.has_value());
    CHECK(*n.requested_device == fl::Device("cpu:0"));
    ++requesting;
  }
  CHECK(requesting >= 2);
}

TEST_CASE("a traced update keeps the variable's own error messages, checked when it is recorded") {
  fl::Variable w(fl::zeros({2}), "w");
  auto wrong_shape = fl::trace([&](fl::Tensor x) {
    w.assign_add(x);
    return x;
  });
  test::check_throws<fl::ShapeError>([&] { wrong_shape(fl::zeros({3})); }, {"assign_add", "'w'", "[3]"});
  auto empty = fl::trace([&](fl::Tensor x) {
    w.assign(fl::Tensor());
    return x;
  });
  test::check_throws<fl::InvalidArgument>([&] { empty(fl::zeros({2})); }, {"assign: update is an empty Tensor handle"});
  CHECK(w.value().to_vector<float>() == std::vector<float>{0.0f, 0.0f});
}
