// MirroredStrategy on logical CPU devices: mirrored variables, run() (splitting, per-replica traces,
// results), training that equals single-device full-batch training, replicas that stay identical,
// gradient buckets, the equality check, and the errors.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <optional>
#include <tuple>
#include <cstring>
#include <string>

#include "collective/mirrored/gradient_averaging.hpp"
#include "collective/replica_context.hpp"
#include "flowlet/mirrored.hpp"
#include "support/reference.hpp"
#include "support/replicas.hpp"

namespace {

using test::make_step;

// The device count is process-wide and doctest does not promise an order: every case calls this.
void ensure_devices() { test::ensure_cpu_devices(4); }

std::vector<fl::Device> first_devices(int n) { return test::cpu_devices(n); }

// Short timeouts: a test that goes wrong fails in seconds instead of waiting 300 s.
fl::MirroredOptions quick_options() {
  fl::MirroredOptions options;
  options.collective_timeout_seconds = 20;
  return options;
}

// The test MLP: 6 -> 8 (relu) -> 3, seeded, so two builds start equal.
void build_mlp(fl::nn::Sequential& model) {
  model.add<fl::nn::Linear>(6, 8, /*seed=*/11, "hidden");
  model.add([](const fl::Tensor& x) { return fl::relu(x); });
  model.add<fl::nn::Linear>(8, 3, /*seed=*/12, "logits");
}

// The test MLP with its variables mirrored by `dp`.
void build_mirrored_mlp(const fl::MirroredStrategy& dp, fl::nn::Sequential& model) {
  auto scope = dp.scope();
  build_mlp(model);
}

// Batch k of `rows` rows: inputs and integer labels, the same for every run.
std::pair<fl::Tensor, fl::Tensor> batch(int k, int64_t rows) {
  fl::Tensor x = fl::randn({rows, 6}, /*seed=*/100 + static_cast<uint64_t>(k));
  fl::Tensor y = fl::argmax(fl::randn({rows, 3}, /*seed=*/500 + static_cast<uint64_t>(k)), 1);
  return {x, y};
}

// Trains the MLP for `steps` steps on one device (the full batch each step, the step traced) and
// returns its parameters' final values and the losses.
template <class Optimizer>
std::pair<std::vector<std::vector<double>>, std::vector<double>> single_device(Optimizer optimizer, int steps,
                                                                                 int64_t rows) {
  fl::nn::Sequential model;
  build_mlp(model);
  auto step = fl::trace(make_step(model, optimizer));
  std::vector<double> losses;
  for (int k = 0; k < steps; ++k) {
    auto [x, y] = batch(k, rows);
    losses.push_back(step(x, y).template item<float>());
  }
  std::vector<std::vector<double>> params;
  for (const fl::Variable& v : model.parameters()) params.push_back(test::values(v.value()));
  return {params, losses};
}

// The same training with MirroredStrategy over `replicas` local devices.
template <class Optimizer>
std::pair<std::vector<std::vector<double>>, std::vector<double>> mirrored(
    Optimizer optimizer, int steps, int64_t rows, int replicas, fl::MirroredOptions options = quick_options()) {
  options.check_replicas_equal = true;  // every step: the copies stay bit-identical
  fl::MirroredStrategy dp(first_devices(replicas), options);
  fl::nn::Sequential model;
  build_mirrored_mlp(dp, model);
  auto step = make_step(model, optimizer);
  std::vector<double> losses;
  for (int k = 0; k < steps; ++k) {
    auto [x, y] = batch(k, rows);
    const std::vector<fl::Tensor> replica_losses = dp.run(step, x, y);
    REQUIRE(replica_losses.size() == static_cast<size_t>(replicas));
    // The full batch's mean loss from the replicas' means, weighted by their rows.
    double loss = 0;
    for (int r = 0; r < replicas; ++r) {
      const int64_t n = rows / replicas + (r < rows % replicas ? 1 : 0);
      CHECK(replica_losses[static_cast<size_t>(r)].device() == fl::Device(fl::DeviceKind::cpu, r));
      if (n > 0) loss += static_cast<double>(n) * replica_losses[static_cast<size_t>(r)].item<float>();
    }
    losses.push_back(loss / static_cast<double>(rows));
  }
  std::vector<std::vector<double>> params;
  for (const fl::Variable& v : model.parameters()) params.push_back(test::values(v.value()));
  return {params, losses};
}

void check_close(const std::vector<std::vector<double>>& got, const std::vector<std::vector<double>>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(test::check_values(got[i], want[i], test::Tolerance{2e-5, 2e-5}));
  }
}

void check_close(const std::vector<double>& got, const std::vector<double>& want) {
  CHECK(test::check_values(got, want, test::Tolerance{2e-5, 2e-5}));
}

}  // namespace

TEST_CASE("a variable made in scope() is mirrored: one copy per replica, reads and updates per replica") {
  ensure_devices();
  fl::MirroredStrategy dp(first_devices(2), quick_options());
  CHECK(dp.num_replicas() == 2);
  CHECK(dp.num_local_replicas() == 2);
  fl::Variable w;
  {
    auto scope = dp.scope();
    w = fl::Variable(test::make({1, 2, 3}), "w");
  }
  fl::Variable plain(test::make({5}), "plain");  // after the scope: not mirrored
  CHECK(w.device() == fl::Device("cpu:0"));
  CHECK(test::values(w.value()) == std::vector<double>{1, 2, 3});

  // Inside run() each replica reads its own copy, on its device.
  auto read = [&](fl::Tensor x) { return w.value() + fl::sum(x) * 0.0f; };
  std::vector<fl::Tensor> copies = dp.run(read, test::make({1, 1}, {2, 1}));
  REQUIRE(copies.size() == 2);
  CHECK(copies[0].device() == fl::Device("cpu:0"));
  CHECK(copies[1].device() == fl::Device("cpu:1"));
  CHECK(test::values(copies[1]) == std::vector<double>{1, 2, 3});

  // Outside run() an update applies to every copy.
  w.assign(test::make({7, 8, 9}));
  copies = dp.run(read, test::make({1, 1}, {2, 1}));
  CHECK(test::values(copies[0]) == std::vector<double>{7, 8, 9});
  CHECK(test::values(copies[1]) == std::vector<double>{7, 8, 9});

  // Inside run() an update changes the running replica's copy only: each adds its row.
  auto add_rows = [&](fl::Tensor x) {
    w.assign_add(fl::reshape(x, {3}));
    return w.value();
  };
  copies = dp.run(add_rows, test::make({1, 1, 1, 10, 10, 10}, {2, 3}));
  CHECK(test::values(copies[0]) == std::vector<double>{8, 9, 10});
  CHECK(test::values(copies[1]) == std::vector<double>{17, 18, 19});
  CHECK(test::values(w.value()) == std::vector<double>{8, 9, 10});  // outside: replica 0's copy
  test::check_throws<fl::InvalidArgument>([&] { dp.check_replicas_equal(); }, {"'w'", "replica 0", "replica 1"});
  w.assign(test::make({0, 0, 0}));  // outside run(): every copy again
  dp.check_replicas_equal();
  CHECK(test::values(plain.value()) == std::vector<double>{5});
}

TEST_CASE("run() splits each batch over the replicas: the first B mod R replicas get one more row") {
  ensure_devices();
  fl::MirroredStrategy dp(first_devices(4), quick_options());
  auto rows_of = [](fl::Tensor x, fl::Tensor y) { return std::vector<fl::Tensor>{x, y}; };
  // 10 rows over 4 replicas: 3, 3, 2, 2, in order.
  const fl::Tensor x = fl::reshape(fl::arange(20, fl::f32), {10, 2});
  const fl::Tensor y = fl::arange(10, fl::i64);
  const std::vector<std::vector<fl::Tensor>> parts = dp.run(rows_of, x, y);
  REQUIRE(parts.size() == 4);
  const std::vector<int64_t> rows{3, 3, 2, 2};
  int64_t start = 0;
  for (size_t r = 0; r < 4; ++r) {
    CHECK(parts[r][0].shape() == fl::Shape{rows[r], 2});
    CHECK(parts[r][0].device() == fl::Device(fl::DeviceKind::cpu, static_cast<int>(r)));
    std::vector<double> want;
    for (int64_t i = start; i < start + rows[r]; ++i) want.push_back(static_cast<double>(i));
    CHECK(test::values(parts[r][1]) == want);
    start += rows[r];
  }
  // 3 rows over 4 replicas: the last gets none (and still runs).
  const std::vector<std::vector<fl::Tensor>> small = dp.run(rows_of, fl::slice(x, 0, 0, 3), fl::slice(y, 0, 0, 3));
  CHECK(small[3][0].shape() == fl::Shape{0, 2});
  CHECK(small[0][0].shape() == fl::Shape{1, 2});
}

TEST_CASE("run() traces fn once per replica and signature, and reuses the traces") {
  ensure_devices();
  fl::MirroredStrategy dp(first_devices(2), quick_options());
  std::atomic<int> traced{0};
  auto fn = [&](fl::Tensor x) {
    ++traced;
    return x * 2.0f;
  };
  for (int i = 0; i < 3; ++i) (void)dp.run(fn, fl::ones({4, 2}));
  CHECK(traced == 2);  // one trace per replica
  (void)dp.run(fn, fl::ones({6, 2}));
  CHECK(traced == 4);  // a new shape traces again
  const std::vector<fl::Tensor> out = dp.run(fn, fl::ones({4, 2}));
  CHECK(traced == 4);
  CHECK(test::values(out[1]) == std::vector<double>(4, 2.0));
  // One lambda expression whose captured value changes: each value gets its own traces (never the
  // first call's graph with the old value baked in).
  for (int k = 1; k <= 3; ++k) {
    auto scaled = [k](fl::Tensor x) { return x * static_cast<float>(k); };
    const std::vector<fl::Tensor> scaled_out = dp.run(scaled, fl::ones({2, 1}));
    CHECK(test::values(scaled_out[0]) == std::vector<double>{static_cast<double>(k)});
    CHECK(test::values(scaled_out[1]) == std::vector<double>{static_cast<double>(k)});
  }
  // The same with a captured tensor (not trivially copyable): each tensor gets its own traces.
  for (int k = 1; k <= 3; ++k) {
    const fl::Tensor offset = fl::full({1}, static_cast<double>(k), fl::f32);
    auto shifted = [offset](fl::Tensor x) { return x + offset; };
    const std::vector<fl::Tensor> shifted_out = dp.run(shifted, fl::ones({2, 1}));
    CHECK(test::values(shifted_out[0]) == std::vector<double>{1.0 + k});
    CHECK(test::values(shifted_out[1]) == std::vector<double>{1.0 + k});
  }
}

TEST_CASE("20 SGD steps (momentum) on 2 and 4 replicas equal one device on the full batch; replicas stay identical") {
  ensure_devices();
  const auto [want_params, want_losses] = single_device(fl::optim::SGD(0.1, 0.9), 20, 16);
  for (int replicas : {2, 4}) {
    CAPTURE(replicas);
    const auto [params, losses] = mirrored(fl::optim::SGD(0.1, 0.9), 20, 16, replicas);
    check_close(params, want_params);
    check_close(losses, want_losses);
  }
}

TEST_CASE("20 Adam steps on 2 and 4 replicas equal one device on the full batch") {
  ensure_devices();
  const auto [want_params, want_losses] = single_device(fl::optim::Adam(0.01), 20, 16);
  for (int replicas : {2, 4}) {
    CAPTURE(replicas);
    const auto [params, losses] = mirrored(fl::optim::Adam(0.01), 20, 16, replicas);
    check_close(params, want_params);
    check_close(losses, want_losses);
  }
}

TEST_CASE("uneven batches: 14 rows over 4 replicas, and 3 rows over 4 (one replica empty) equal the full batch") {
  ensure_devices();
  for (int64_t rows : {14, 3}) {
    CAPTURE(rows);
    const auto [want_params, want_losses] = single_device(fl::optim::Adam(0.01), 6, rows);
    const auto [params, losses] = mirrored(fl::optim::Adam(0.01), 6, rows, 4);
    check_close(params, want_params);
    check_close(losses, want_losses);
  }
}

TEST_CASE("tiny buckets (one gradient each, and split across dtypes) give the same training") {
  ensure_devices();
  const auto [want_params, want_losses] = single_device(fl::optim::SGD(0.05), 5, 8);
  fl::MirroredOptions options = quick_options();
  options.bucket_bytes = 16;
  const auto [params, losses] = mirrored(fl::optim::SGD(0.05), 5, 8, 2, options);
  check_close(params, want_params);
  check_close(losses, want_losses);
}

TEST_CASE("gradient buckets: reverse order, about bucket_bytes each, a new bucket per dtype") {
  const std::vector<fl::Tensor> grads{fl::zeros({4}), fl::zeros({4}), fl::Tensor(), fl::zeros({8}),
                                      fl::zeros({2}, fl::f64), fl::zeros({3})};
  // f32 bytes: 16, 16, -, 32; f64: 16; f32: 12. Buckets of 32 bytes, from the last gradient back.
  const auto buckets = fl::detail::gradient_buckets(grads, 32);
  const std::vector<std::vector<size_t>> want{{5}, {4}, {3}, {1, 0}};
  CHECK(buckets == want);
  CHECK(fl::detail::gradient_buckets(grads, 1 << 20) == std::vector<std::vector<size_t>>{{5}, {4}, {3, 1, 0}});
  CHECK(fl::detail::gradient_buckets({}, 32).empty());
}

TEST_CASE("one all_reduce per bucket in each replica's trace, and the timeline shows them") {
  ensure_devices();
  fl::MirroredOptions options = quick_options();
  options.trace_options.collect_step_stats = true;
  options.bucket_bytes = 8 * 3 * 4 + 3 * 4;  // the logits layer's weight and bias: one bucket
  fl::MirroredStrategy dp(first_devices(2), options);
  fl::nn::Sequential model;
  build_mirrored_mlp(dp, model);
  fl::optim::SGD sgd(0.1);
  auto step = make_step(model, sgd);
  auto [x, y] = batch(0, 8);
  (void)dp.run(step, x, y);
  auto all_reduce_nodes = [](const std::string& timeline) {
    size_t count = 0;
    const std::string event = "\"cat\":\"all_reduce\"";
    for (size_t at = timeline.find(event); at != std::string::npos; at = timeline.find(event, at + 1)) ++count;
    return count;
  };
  // Buckets, from the last gradient back: {logits bias, logits weight} (12 + 96 bytes), {hidden
  // bias} (32: the bucket is full), {hidden weight} (6 * 8 * 4 = 192 bytes, alone).
  CHECK(all_reduce_nodes(dp.timeline_json(1)) == 3);
  CHECK(all_reduce_nodes(dp.timeline_json(0)) == 3);

  // Overlap, structurally: the first bucket's all_reduce does not wait for the hidden layer's weight
  // gradient (a [6, 8] matmul, the last gradient backward computes), so it can run while that does.
  const fl::Graph& graph = dp.graph(1);
  auto ancestors = [&](int32_t id) {
    std::vector<bool> seen(graph.nodes().size(), false);
    std::vector<int32_t> stack{id};
    auto visit = [&](int32_t node) {
      if (seen[static_cast<size_t>(node)]) return;
      seen[static_cast<size_t>(node)] = true;
      stack.push_back(node);
    };
    while (!stack.empty()) {
      const fl::Node& n = graph.node(stack.back());
      stack.pop_back();
      for (const fl::ValueRef& input : n.inputs) visit(input.node);
      for (int32_t control : n.control_inputs) visit(control);
    }
    return seen;
  };
  std::vector<int32_t> reduces;
  int32_t hidden_weight_gradient = -1;
  for (size_t i = 0; i < graph.nodes().size(); ++i) {
    const fl::Node& n = graph.nodes()[i];
    if (n.removed || n.kind != fl::NodeKind::op) continue;
    if (n.op->name == "all_reduce") reduces.push_back(static_cast<int32_t>(i));
    if (n.op->name == "matmul" && n.outputs[0].shape == fl::Shape{6, 8}) {
      hidden_weight_gradient = static_cast<int32_t>(i);
    }
  }
  REQUIRE(reduces.size() == 3);
  REQUIRE(hidden_weight_gradient >= 0);
  CHECK(graph.node(reduces[0]).outputs[0].shape == fl::Shape{27});  // logits bias and weight: 3 + 24
  CHECK(graph.node(reduces[2]).outputs[0].shape == fl::Shape{48});  // hidden weight: 6 * 8
  CHECK_FALSE(ancestors(reduces[0])[static_cast<size_t>(hidden_weight_gradient)]);
  CHECK_FALSE(ancestors(reduces[1])[static_cast<size_t>(hidden_weight_gradient)]);
  CHECK(ancestors(reduces[2])[static_cast<size_t>(hidden_weight_gradient)]);
  test::check_throws<fl::InvalidArgument>([&] { (void)dp.timeline_json(2); }, {"timeline_json", "got 2"});
}

TEST_CASE("the replica equality check names the first variable that diverged and the replicas") {
  ensure_devices();
  fl::MirroredOptions options = quick_options();
  options.check_replicas_equal = true;
  fl::MirroredStrategy dp(first_devices(2), options);
  fl::Variable a, b;
  {
    auto scope = dp.scope();
    a = fl::Variable(fl::zeros({3}), "a");
    b = fl::Variable(fl::zeros({2}), "b");
  }
  auto same = [&](fl::Tensor x) { a.assign_add(fl::sum(x, {0})); };
  dp.run(same, fl::ones({4, 3}));
  CHECK(test::values(a.value()) == std::vector<double>{2, 2, 2});
  // Replica 1 alone changes b: a bug the check must catch.
  auto diverge = [&](fl::Tensor x) {
    if (fl::detail::current_replica()->local == 1) b.assign_add(fl::sum(x, {0}));
  };
  test::check_throws<fl::InvalidArgument>([&] { dp.run(diverge, fl::ones({4, 2})); },
                                          {"replicas diverged", "'b'", "replica 0", "replica 1", "cpu:1"});
}

TEST_CASE("an optimizer's slots and step counter are mirrored with their variables") {
  ensure_devices();
  fl::MirroredStrategy dp(first_devices(2), quick_options());
  fl::Variable w;
  {
    auto scope = dp.scope();
    w = fl::Variable(test::make({1, 2}), "w");
  }
  fl::optim::Adam adam(0.1);
  auto step = [&](fl::Tensor x) {
    fl::GradientTape tape;
    fl::Tensor loss = fl::mean(fl::matmul(x, fl::reshape(w.value(), {2, 1})));
    adam.apply(tape.gradient(loss, {w}), {w});
    return adam.iterations().value();
  };
  for (int i = 0; i < 3; ++i) {
    const std::vector<fl::Tensor> counters = dp.run(step, fl::ones({2, 2}));
    CHECK(counters[0].item<int64_t>() == i + 1);
    CHECK(counters[1].item<int64_t>() == i + 1);
    CHECK(counters[1].device() == fl::Device("cpu:1"));
  }
  CHECK(adam.iterations().value().item<int64_t>() == 3);  // outside run(): replica 0's counter
  CHECK(adam.variables().size() == 3);                     // counter, m, v: once each, not per replica
  dp.check_replicas_equal();
}

TEST_CASE("MirroredStrategy errors: devices, options, batches, plain variables, failures in a replica") {
  ensure_devices();
  test::check_throws<fl::InvalidArgument>([] { fl::MirroredStrategy dp({fl::Device("cpu:1"), fl::Device("cpu:1")}); },
                                          {"MirroredStrategy", "distinct", "cpu:1"});
  test::check_throws<fl::DeviceError>([] { fl::MirroredStrategy dp({fl::Device("cpu:9")}); }, {"cpu:9"});
  fl::MirroredOptions bad;
  bad.bucket_bytes = 0;
  test::check_throws<fl::InvalidArgument>([&] { fl::MirroredStrategy dp({}, bad); }, {"bucket_bytes", "got 0"});

  fl::MirroredStrategy dp(first_devices(2), quick_options());
  test::check_throws<fl::InvalidArgument>([&] { (void)dp.graph(0); }, {"MirroredStrategy::graph", "has not run"});
  test::check_throws<fl::InvalidArgument>([&] { (void)dp.graph(-1); }, {"MirroredStrategy::graph", "got -1"});
  CHECK(dp.timeline_json(0).empty());
  auto identity = [](fl::Tensor x) { return x; };
  test::check_throws<fl::ShapeError>([&] { (void)dp.run(identity, fl::scalar(1.0f)); },
                                     {"MirroredStrategy::run", "scalar"});
  auto two = [](fl::Tensor x, fl::Tensor y) { return x + fl::sum(y); };
  test::check_throws<fl::ShapeError>([&] { (void)dp.run(two, fl::ones({4, 2}), fl::ones({5})); },
                                     {"MirroredStrategy::run", "[4, 2]", "[5]"});
  test::check_throws<fl::InvalidArgument>([&] { (void)dp.run(identity, fl::Tensor()); }, {"batch 0", "empty"});

  // A variable made outside scope() cannot be trained inside run(): every replica would update it.
  fl::Variable plain(fl::ones({2, 1}), "plain");
  fl::optim::SGD sgd(0.1);
  auto train_plain = [&](fl::Tensor x) {
    fl::GradientTape tape;
    fl::Tensor loss = fl::mean(fl::matmul(x, plain.value()));
    sgd.apply(tape.gradient(loss, {plain}), {plain});
    return loss;
  };
  test::check_throws<fl::InvalidArgument>([&] { (void)dp.run(train_plain, fl::ones({4, 2})); },
                                          {"sgd.apply", "'plain'", "not mirrored", "scope()"});

  // An exception while one replica traces fails run() (after every replica stopped) with that error.
  auto fail_on_one = [](fl::Tensor x) {
    if (fl::detail::current_replica()->local == 1) throw fl::InvalidArgument("replica 1 failed on purpose");
    return x;
  };
  test::check_throws<fl::InvalidArgument>([&] { (void)dp.run(fail_on_one, fl::ones({2, 2})); },
                                          {"replica 1 failed on purpose"});
  // The strategy still works afterwards.
  CHECK(test::values(dp.run(identity, fl::ones({2, 1}))[1]) == std::vector<double>{1});

  // run() inside a traced function, and inside run().
  auto outer = fl::trace([&](fl::Tensor x) { return dp.run(identity, x)[0]; });
  test::check_throws<fl::InvalidArgument>([&] { (void)outer(fl::ones({2, 1})); }, {"MirroredStrategy::run", "traced"});
}

TEST_CASE("a checkpoint saves replica 0's copy and a restore sets every copy") {
  ensure_devices();
  fl::MirroredStrategy dp(first_devices(2), quick_options());
  fl::Variable w;
  {
    auto scope = dp.scope();
    w = fl::Variable(test::make({1, 2}), "w");
  }
  const std::string path =
      (std::filesystem::temp_directory_path() / fmt::format("flowlet_mirrored_{}.safetensors", ::getpid())).string();
  fl::save_checkpoint(path, {w}, 5);
  w.assign(test::make({9, 9}));
  CHECK(fl::restore_checkpoint(path, {w}) == 5);
  std::filesystem::remove(path);
  auto read = [&](fl::Tensor x) { return w.value() + fl::sum(x) * 0.0f; };
  for (const fl::Tensor& copy : dp.run(read, fl::ones({2, 1}))) CHECK(test::values(copy) == std::vector<double>{1, 2});
  dp.check_replicas_equal();
}

TEST_CASE("outside run(), a traced function reads replica 0's copy and its updates reach every copy") {
  ensure_devices();
  fl::MirroredStrategy dp(first_devices(2), quick_options());
  fl::Variable w;
  {
    auto scope = dp.scope();
    w = fl::Variable(test::make({1, 2}), "w");
  }
  auto bump = fl::trace([&](fl::Tensor x) {
    w.assign_add(x);
    return w.value();
  });
  CHECK(test::values(bump(test::make({10, 20}))) == std::vector<double>{11, 22});
  // An update from another device moves to each copy's device.
  w.assign_sub(test::make({1, 1}).to(fl::Device("cpu:1")));
  auto read = [&](fl::Tensor x) { return w.value() + fl::sum(x) * 0.0f; };
  for (const fl::Tensor& copy : dp.run(read, fl::ones({2, 1}))) {
    CHECK(test::values(copy) == std::vector<double>{10, 21});
  }
  // A bad update changes no copy.
  test::check_throws<fl::ShapeError>([&] { w.assign(test::make({1, 2, 3})); }, {"assign", "'w'"});
  dp.check_replicas_equal();
}

TEST_CASE("mirrored training equals eager single-device training too") {
  ensure_devices();
  fl::nn::Sequential model;
  build_mlp(model);
  fl::optim::SGD sgd(0.1, 0.9);
  auto step = make_step(model, sgd);  // eager: not traced
  for (int k = 0; k < 10; ++k) {
    auto [x, y] = batch(k, 12);
    (void)step(x, y);
  }
  std::vector<std::vector<double>> want;
  for (const fl::Variable& v : model.parameters()) want.push_back(test::values(v.value()));
  const auto [params, losses] = mirrored(fl::optim::SGD(0.1, 0.9), 10, 12, 3);
  check_close(params, want);
}

TEST_CASE("a replica that fails while running: run() rethrows its error, never hangs, and the strategy recovers") {
  ensure_devices();
  fl::MirroredOptions options = quick_options();
  options.collective_timeout_seconds = 60;  // replica 1's failure aborts replica 0's all_reduce at once
  options.check_replicas_equal = true;
  fl::MirroredStrategy dp(first_devices(2), options);
  fl::nn::Sequential model;
  build_mirrored_mlp(dp, model);
  fl::optim::SGD sgd(0.1);
  auto step = make_step(model, sgd);
  auto [x, y] = batch(0, 8);
  const std::vector<double> before = test::values(model.parameters()[0].value());
  // Row 6 (replica 1's share) has a label outside [0, 3): replica 1's loss fails when it runs.
  const fl::Tensor bad_labels =
      fl::concat({fl::slice(y, 0, 0, 6), fl::full({1}, int64_t{7}, fl::i64), fl::slice(y, 0, 7, 1)}, 0);
  const auto start = std::chrono::steady_clock::now();
  test::check_throws<fl::OutOfRange>([&] { (void)dp.run(step, x, bad_labels); }, {"softmax_cross_entropy"});
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
  // No replica applied an update (replica 0's waited for the all-reduce that failed).
  CHECK(test::values(model.parameters()[0].value()) == before);
  dp.check_replicas_equal();
  // The next step runs normally (a new communicator, new traces) and equals one device.
  (void)dp.run(step, x, y);
  fl::nn::Sequential reference;
  build_mlp(reference);
  fl::optim::SGD reference_sgd(0.1);
  (void)make_step(reference, reference_sgd)(x, y);
  CHECK(test::check_values(test::values(model.parameters()[0].value()),
                           test::values(reference.parameters()[0].value()), test::Tolerance{2e-5, 2e-5}));
}

TEST_CASE("f32 and f64 variables in one model: a bucket per dtype, training equals one device") {
  ensure_devices();
  auto train = [](fl::MirroredStrategy* dp, int steps) {
    std::optional<fl::MirroredStrategy::Scope> scope;
    if (dp != nullptr) scope.emplace(dp->scope());
    fl::Variable w32(fl::randn({4, 2}, 1) * 0.5f, "w32");
    fl::Variable w64(fl::randn({4, 2}, 2, fl::f64) * 0.5, "w64");
    scope.reset();
    fl::optim::Adam adam(0.05);
    auto step = [&](fl::Tensor x) {
      fl::GradientTape tape;
      fl::Tensor loss32 = fl::mean(fl::square(fl::tanh(fl::matmul(x, w32.value())) - 0.25f));
      fl::Tensor loss64 = fl::mean(fl::square(fl::matmul(fl::cast(x, fl::f64), w64.value()) - 1.0));
      fl::Tensor loss = loss64 + fl::cast(loss32, fl::f64);
      adam.apply(tape.gradient(loss, {w32, w64}), {w32, w64});
      return std::make_tuple(loss32, loss64);
    };
    for (int k = 0; k < steps; ++k) {
      const fl::Tensor x = fl::randn({10, 4}, 40 + static_cast<uint64_t>(k));
      if (dp == nullptr) {
        (void)fl::trace(step)(x);
      } else {
        const std::vector<std::tuple<fl::Tensor, fl::Tensor>> losses = dp->run(step, x);
        CHECK(std::get<1>(losses[1]).dtype() == fl::f64);
      }
    }
    return std::make_pair(test::values(w32.value()), test::values(w64.value()));
  };
  fl::MirroredOptions options = quick_options();
  options.check_replicas_equal = true;
  fl::MirroredStrategy dp(first_devices(4), options);
  const auto [want32, want64] = train(nullptr, 8);
  const auto [got32, got64] = train(&dp, 8);
  CHECK(test::check_values(got32, want32, test::Tolerance{2e-5, 2e-5}));
  CHECK(test::check_values(got64, want64, test::Tolerance{1e-10, 1e-10}));
}

TEST_CASE("a new model made in scope() is traced anew, even by a step lambda at the same address") {
  ensure_devices();
  fl::MirroredStrategy dp(first_devices(2), quick_options());
  const auto [want_params, want_losses] = single_device(fl::optim::SGD(0.1, 0.9), 3, 8);
  for (int round = 0; round < 2; ++round) {
    CAPTURE(round);
    // Each round's model, optimizer and lambda are new objects, most likely at the last round's
    // addresses: the lambda's bytes repeat, and only the new variables tell the rounds apart.
    fl::nn::Sequential model;
    build_mirrored_mlp(dp, model);
    fl::optim::SGD sgd(0.1, 0.9);  // momentum: slots that must start at zero each round
    auto step = make_step(model, sgd);
    for (int k = 0; k < 3; ++k) {
      auto [x, y] = batch(k, 8);
      (void)dp.run(step, x, y);
    }
    std::vector<std::vector<double>> params;
    for (const fl::Variable& v : model.parameters()) params.push_back(test::values(v.value()));
    check_close(params, want_params);
    CHECK(sgd.iterations().value().item<int64_t>() == 3);
  }
  // A new optimizer for the same model (most likely at the old one's address) is used too.
  fl::nn::Sequential model;
  build_mirrored_mlp(dp, model);
  for (int round = 0; round < 2; ++round) {
    fl::optim::SGD sgd(0.1, 0.9);
    auto step = make_step(model, sgd);
    auto [x, y] = batch(round, 8);
    (void)dp.run(step, x, y);
    CHECK(sgd.iterations().value().item<int64_t>() == 1);
  }
}

TEST_CASE("a scope keeps its strategy's state: it may outlive the strategy, and scopes nest") {
  ensure_devices();
  std::optional<fl::MirroredStrategy::Scope> scope;
  {
    fl::MirroredStrategy dp(first_devices(2), quick_options());
    scope.emplace(dp.scope());
  }
  fl::Variable late(fl::ones({2}), "late");  // mirrored over the ended strategy's devices
  CHECK(test::values(late.value()) == std::vector<double>{1, 1});
  late.assign(fl::zeros({2}));
  scope.reset();
  fl::Variable plain(fl::ones({1}), "plain");
  // Nested scopes: the inner strategy's, then the outer's again.
  fl::MirroredStrategy outer(first_devices(2), quick_options());
  fl::MirroredStrategy inner(first_devices(3), quick_options());
  fl::Variable a, b, c;
  {
    auto outer_scope = outer.scope();
    a = fl::Variable(fl::ones({1}), "a");
    {
      auto inner_scope = inner.scope();
      b = fl::Variable(fl::ones({1}), "b");
    }
    c = fl::Variable(fl::ones({1}), "c");
  }
  auto devices_seen = [](fl::MirroredStrategy& dp, fl::Variable& v) {
    auto read = [&](fl::Tensor x) { return v.value() + fl::sum(x) * 0.0f; };
    std::vector<std::string> devices;
    for (const fl::Tensor& t : dp.run(read, fl::ones({dp.num_replicas(), 1}))) devices.push_back(t.device().str());
    return devices;
  };
  CHECK(devices_seen(outer, a) == std::vector<std::string>{"cpu:0", "cpu:1"});
  CHECK(devices_seen(inner, b) == std::vector<std::string>{"cpu:0", "cpu:1", "cpu:2"});
  CHECK(devices_seen(outer, c) == std::vector<std::string>{"cpu:0", "cpu:1"});
}
