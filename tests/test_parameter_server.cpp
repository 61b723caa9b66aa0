// ParameterServerStrategy in one process (servers and workers as threads on logical CPU devices):
// every training mode with exact accounting on a counter-like variable (SGD with lr = 1 and
// gradient 1 per push: the variable moves by exactly the updates the servers report), row-split
// and sparse variables (values worked by hand, bytes moved), stopped and failing workers, server
// optimizers (Adam, a user's subclass) training to known weights, traced steps against eager ones
// and against local training, optimizer state across runs, and the option and run errors.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fmt/ranges.h>

#include "flowlet/parameter_server.hpp"
#include "support/parameter_server.hpp"
#include "support/reference.hpp"
#include "support/replicas.hpp"

namespace {

using fl::TrainingMode;

// Servers and workers get a logical CPU device each when there are enough: every case asks for the
// same count (it is process-wide).
void ensure_devices() { test::ensure_cpu_devices(8); }

fl::ParameterServerOptions options_for(int servers, int workers, TrainingMode mode) {
  fl::ParameterServerOptions options;
  options.num_servers = servers;
  options.num_workers = workers;
  options.mode = mode;
  options.cluster = fl::ParameterServerOptions::Cluster::in_process;
  options.timeout_seconds = 20;  // a case that goes wrong fails in seconds, not 300
  return options;
}

using test::counter_worker;
using test::server_variable;
using test::sgd;

double scalar_of(const fl::Variable& v) { return test::values(v.value())[0]; }

int64_t histogram_total(const std::vector<int64_t>& histogram) {
  return std::accumulate(histogram.begin(), histogram.end(), int64_t{0});
}

int64_t total_steps(const fl::ParameterServerStats& stats) {
  int64_t steps = 0;
  for (const fl::WorkerStats& w : stats.workers) steps += w.steps;
  return steps;
}

// The counters that hold in every mode.
void check_consistent(const fl::ParameterServerStats& stats, int servers, int workers) {
  REQUIRE(stats.servers.size() == static_cast<size_t>(servers));
  REQUIRE(stats.workers.size() == static_cast<size_t>(workers));
  int64_t applied = 0, dropped = 0, max_staleness = 0;
  for (int s = 0; s < servers; ++s) {
    const fl::ServerStats& server = stats.servers[static_cast<size_t>(s)];
    CHECK(server.server == s);
    CHECK(histogram_total(server.staleness_histogram) == server.updates_applied);
    applied += server.updates_applied;
    dropped += server.updates_dropped;
    max_staleness = std::max(max_staleness, server.max_staleness);
  }
  for (int w = 0; w < workers; ++w) {
    const fl::WorkerStats& worker = stats.workers[static_cast<size_t>(w)];
    CHECK(worker.worker == w);
    CHECK(worker.step_seconds.size() == static_cast<size_t>(worker.steps));
  }
  CHECK(stats.updates_applied == applied);
  CHECK(stats.updates_dropped == dropped);
  CHECK(stats.max_staleness == max_staleness);
  CHECK(histogram_total(stats.staleness_histogram) == applied);
}

}  // namespace

TEST_CASE("parameter servers: async mode applies every push, none lost or applied twice") {
  ensure_devices();
  constexpr int kWorkers = 4, kSteps = 25;
  fl::ParameterServerStrategy ps(options_for(1, kWorkers, TrainingMode::async));
  CHECK(ps.in_process());
  CHECK_FALSE(ps.is_server());
  CHECK(ps.worker_index() == -1);
  fl::Variable c = server_variable(ps, fl::scalar(1000.0), "c");
  const fl::ParameterServerStats stats = ps.run(sgd(1.0), counter_worker(c, kSteps));
  check_consistent(stats, 1, kWorkers);
  CHECK(stats.mode == TrainingMode::async);
  CHECK(stats.updates_applied == kWorkers * kSteps);
  CHECK(stats.updates_dropped == 0);
  CHECK(stats.servers[0].version == kWorkers * kSteps);
  CHECK(stats.servers[0].steps == kWorkers * kSteps);
  for (const fl::WorkerStats& w : stats.workers) {
    CHECK(w.steps == kSteps);
    CHECK_FALSE(w.stopped);
    CHECK(w.error.empty());
    CHECK(w.messages_sent >= 2 * kSteps);  // a pull and a push per step
  }
  // Outside run() the variable is local again and holds the servers' final value.
  CHECK(scalar_of(c) == 1000.0 - stats.updates_applied);
  CHECK(stats.wall_seconds > 0);
  CHECK(ps.last_stats().updates_applied == stats.updates_applied);
  const std::string summary = stats.summary();
  CHECK(summary.find("async") != std::string::npos);
  CHECK(summary.find("applied 100") != std::string::npos);
}

TEST_CASE("parameter servers: sync with a backup worker drops the straggler's late pushes") {
  ensure_devices();
  constexpr int kWorkers = 3, kSteps = 12;
  fl::ParameterServerOptions options = options_for(1, kWorkers, TrainingMode::sync);
  options.backup_workers = 1;  // steps complete with the first 2 of 3 pushes
  options.faults.step_delay = fl::StepDelay::straggler(2, 8.0);
  fl::ParameterServerStrategy ps(options);
  fl::Variable c = server_variable(ps, fl::tensor(std::vector<double>{50, 60, 70, 80}, fl::Shape{4}), "c");
  const fl::ParameterServerStats stats = ps.run(sgd(1.0), counter_worker(c, kSteps, std::chrono::milliseconds(2)));
  check_consistent(stats, 1, kWorkers);
  const int64_t steps = stats.servers[0].steps;
  CHECK(steps == stats.servers[0].version);
  // Each step applied the mean of its pushes' ones: exactly 1 per element.
  CHECK(test::values(c.value()) == std::vector<double>{50.0 - steps, 60.0 - steps, 70.0 - steps, 80.0 - steps});
  // Every push went into a step or was dropped as late.
  CHECK(stats.updates_applied + stats.updates_dropped == kWorkers * kSteps);
  CHECK(stats.updates_dropped > 0);
  CHECK(stats.max_staleness == 0);
  CHECK(steps >= kSteps);  // the two fast workers alone complete kSteps steps
  CHECK(stats.updates_applied >= steps);
}

TEST_CASE("parameter servers: bounded staleness keeps every update within k versions") {
  ensure_devices();
  constexpr int kWorkers = 3, kSteps = 10;
  for (int k : {1, 2}) {
    CAPTURE(k);
    fl::ParameterServerOptions options = options_for(1, kWorkers, TrainingMode::bounded_staleness);
    options.staleness = k;
    options.faults.step_delay = fl::StepDelay::straggler(0, 6.0);
    fl::ParameterServerStrategy ps(options);
    fl::Variable c = server_variable(ps, fl::scalar(100.0), "c");
    const fl::ParameterServerStats stats = ps.run(sgd(1.0), counter_worker(c, kSteps, std::chrono::milliseconds(1)));
    check_consistent(stats, 1, kWorkers);
    CHECK(stats.max_staleness <= k);
    CHECK(stats.updates_applied == kWorkers * kSteps);
    CHECK(stats.updates_dropped == 0);
    CHECK(scalar_of(c) == 100.0 - stats.updates_applied);
  }
}

TEST_CASE("parameter servers: a row-split variable over 2 servers") {
  ensure_devices();
  constexpr int kWorkers = 2, kSteps = 5;
  fl::ParameterServerOptions options = options_for(2, kWorkers, TrainingMode::async);
  options.sharding.min_bytes_to_split = 64;
  fl::ParameterServerStrategy ps(options);
  std::vector<double> init(30);
  for (size_t i = 0; i < init.size(); ++i) init[i] = static_cast<double>(i) * 0.5;
  fl::Variable w = server_variable(ps, fl::tensor(init, fl::Shape{10, 3}), "w");
  fl::Variable b = server_variable(ps, fl::tensor(std::vector<double>{1, 2, 3}, fl::Shape{3}), "b");  // whole
  const auto w_shards = ps.placement(w);
  REQUIRE(w_shards.size() == 2);
  CHECK(w_shards[0].server == 0);
  CHECK(w_shards[0].row_begin == 0);
  CHECK(w_shards[0].row_end == 5);
  CHECK(w_shards[1].server == 1);
  CHECK(w_shards[1].row_begin == 5);
  CHECK(w_shards[1].row_end == 10);
  const auto b_shards = ps.placement(b);
  REQUIRE(b_shards.size() == 1);
  CHECK(b_shards[0].row_begin == 0);
  CHECK(b_shards[0].row_end == 3);
  REQUIRE(ps.variables().size() == 2);
  CHECK(same_variable(ps.variables()[0], w));

  // Gradient of row r: (r + 1) in every column; of b: (1, 1, 1).
  std::vector<double> g(30);
  for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<double>(i / 3 + 1);
  const fl::Tensor grad_w = fl::tensor(g, fl::Shape{10, 3});
  std::vector<std::vector<double>> first_reads(kWorkers);
  const auto stats = ps.run(sgd(0.25), [&](fl::ps::Worker& worker) {
    for (int i = 0; i < kSteps; ++i) {
      const fl::Tensor value = w.value();  // one pull per server, joined
      CHECK(value.shape() == fl::Shape{10, 3});
      CHECK(value.device() == worker.device());
      if (i == 0) first_reads[static_cast<size_t>(worker.index())] = test::values(value);
      worker.apply_gradients({grad_w, fl::ones_like(b.value())}, {w, b});
    }
  });
  check_consistent(stats, 2, kWorkers);
  // Each server takes one push per worker step (a step pushes to every server).
  CHECK(stats.servers[0].updates_applied == kWorkers * kSteps);
  CHECK(stats.servers[1].updates_applied == kWorkers * kSteps);
  std::vector<double> want(30);
  for (size_t i = 0; i < want.size(); ++i) want[i] = init[i] - 0.25 * kWorkers * kSteps * g[i];
  CHECK(test::check_values(test::values(w.value()), want, {1e-12, 1e-12}));
  const double moved = 0.25 * kWorkers * kSteps;
  CHECK(test::values(b.value()) == std::vector<double>{1 - moved, 2 - moved, 3 - moved});
  // A first read saw the initial rows, or rows moved by whole pushes of the other worker.
  for (const auto& read : first_reads) {
    REQUIRE(read.size() == 30);
    const double pushes = (init[3] - read[3]) / (0.25 * g[3]);
    CHECK(pushes == std::round(pushes));
    CHECK(pushes >= 0);
    CHECK(pushes <= kSteps);
  }
}

TEST_CASE("parameter servers: a sparse embedding moves only the looked-up rows") {
  ensure_devices();
  constexpr int64_t kRows = 1000, kCols = 8;
  constexpr int kSteps = 3;
  fl::ParameterServerOptions options = options_for(2, 1, TrainingMode::async);
  options.sharding.min_bytes_to_split = 1024;
  fl::ParameterServerStrategy ps(options);
  const fl::Tensor init = fl::randn({kRows, kCols}, /*seed=*/5);
  fl::Variable table = server_variable(ps, init, "table");
  REQUIRE(ps.placement(table).size() == 2);
  const std::vector<int64_t> ids = {3, 17, 499, 500, 501, 998, 0, 999, 250, 750, 42, 600, 123, 877, 333, 666};
  const fl::Tensor id_tensor = fl::tensor(ids, fl::Shape{16});
  // loss = sum(rows * weights): the gradient of row ids[i] is weights[i].
  std::vector<double> weights(16 * kCols);
  for (size_t i = 0; i < weights.size(); ++i) weights[i] = 0.1 * static_cast<double>(i % 13) - 0.5;
  const fl::Tensor weight_tensor = fl::tensor(test::convert_values<float>(weights), fl::Shape{16, kCols});
  std::vector<double> first_rows;
  const auto stats = ps.run(sgd(0.5), [&](fl::ps::Worker& worker) {
    for (int i = 0; i < kSteps; ++i) {
      fl::GradientTape tape;
      const fl::Tensor rows = fl::gather(table, id_tensor);
      CHECK(rows.shape() == fl::Shape{16, kCols});
      if (i == 0) first_rows = test::values(rows);
      const fl::Tensor loss = fl::sum(rows * weight_tensor);
      worker.apply_gradients(tape.gradient(loss, {table}), {table});
    }
  });
  check_consistent(stats, 2, 1);
  // The first lookup read the initial rows.
  const std::vector<double> init_values = test::values(init);
  std::vector<double> want_rows;
  for (int64_t id : ids) {
    for (int64_t c = 0; c < kCols; ++c) want_rows.push_back(init_values[static_cast<size_t>(id * kCols + c)]);
  }
  CHECK(first_rows == want_rows);
  // Touched rows moved by steps x lr x their weights; every other row kept its value exactly.
  std::vector<double> want = init_values;
  for (size_t i = 0; i < ids.size(); ++i) {
    for (int64_t c = 0; c < kCols; ++c) {
      const auto at = static_cast<size_t>(ids[i] * kCols + c);
      want[at] = static_cast<double>(static_cast<float>(init_values[at]));
      for (int s = 0; s < kSteps; ++s) {
        want[at] = static_cast<double>(static_cast<float>(want[at]) -
                                       0.5f * static_cast<float>(weights[i * kCols + static_cast<size_t>(c)]));
      }
    }
  }
  CHECK(test::check_values(test::values(table.value()), want, {1e-6, 1e-6}));
  // Bytes: 16 rows x 8 columns x 4 bytes = 512 each way per step, plus ids and headers; the table
  // is 32000 bytes.
  const fl::WorkerStats& worker = stats.workers[0];
  const double received = static_cast<double>(worker.bytes_received) / kSteps;
  const double sent = static_cast<double>(worker.bytes_sent) / kSteps;
  MESSAGE("sparse step: " << received << " bytes received, " << sent << " bytes sent (16 x 8 x 4 = 512)");
  CHECK(received >= 512);
  CHECK(received < 2 * 512);
  CHECK(sent >= 512 + 16 * 8);  // the rows' gradients and their ids
  CHECK(sent < 4 * 512);
  // One pull request per owning server per step, one push per server per step, and the goodbyes.
  CHECK(worker.messages_sent == kSteps * 4 + 2);
}

TEST_CASE("parameter servers: a worker stopped at step 3") {
  ensure_devices();
  constexpr int kSteps = 10;
  SUBCASE("async finishes without it") {
    fl::ParameterServerOptions options = options_for(1, 3, TrainingMode::async);
    options.faults.stop_worker_at_step = {{1, 3}};
    fl::ParameterServerStrategy ps(options);
    fl::Variable c = server_variable(ps, fl::scalar(0.0), "c");
    const auto stats = ps.run(sgd(1.0), counter_worker(c, kSteps));
    check_consistent(stats, 1, 3);
    CHECK(stats.workers[1].stopped);
    CHECK(stats.workers[1].error.empty());
    CHECK(stats.workers[1].steps == 2);
    CHECK_FALSE(stats.workers[0].stopped);
    CHECK(stats.workers[0].steps == kSteps);
    CHECK(stats.updates_applied == 2 * kSteps + 2);
    CHECK(scalar_of(c) == -static_cast<double>(stats.updates_applied));
    CHECK(stats.summary().find("stopped") != std::string::npos);
  }
  SUBCASE("sync with 1 backup finishes without it") {
    // Steps complete with the first push of 2, so the surviving worker goes on alone. (With 3
    // workers and 1 backup the two survivors complete steps together until one of them finishes:
    // the server cannot tell a crashed worker from a slow one, so the last one then waits for the
    // crashed one, as it should.)
    fl::ParameterServerOptions options = options_for(1, 2, TrainingMode::sync);
    options.backup_workers = 1;
    options.faults.stop_worker_at_step = {{1, 3}};
    fl::ParameterServerStrategy ps(options);
    fl::Variable c = server_variable(ps, fl::scalar(0.0), "c");
    const auto stats = ps.run(sgd(1.0), counter_worker(c, kSteps));
    check_consistent(stats, 1, 2);
    CHECK(stats.workers[1].stopped);
    CHECK(stats.workers[1].steps == 2);
    CHECK_FALSE(stats.workers[0].stopped);
    CHECK(stats.workers[0].steps == kSteps);
    CHECK(stats.updates_applied + stats.updates_dropped == kSteps + 2);
    CHECK(scalar_of(c) == -static_cast<double>(stats.servers[0].steps));
    CHECK(stats.servers[0].steps >= kSteps);
  }
  SUBCASE("plain sync reports it within the timeout") {
    fl::ParameterServerOptions options = options_for(1, 2, TrainingMode::sync);
    options.timeout_seconds = 1;
    options.faults.stop_worker_at_step = {{0, 3}};
    fl::ParameterServerStrategy ps(options);
    fl::Variable c = server_variable(ps, fl::scalar(0.0), "c");
    const auto started = std::chrono::steady_clock::now();
    test::check_throws<fl::DeadlineExceeded>([&] { ps.run(sgd(1.0), counter_worker(c, kSteps)); }, {"worker 0"});
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    CHECK(seconds >= 0.9);
    CHECK(seconds < 4.0);
    const auto& stats = ps.last_stats();
    REQUIRE(stats.workers.size() == 2);
    CHECK(stats.workers[0].stopped);
    CHECK(stats.workers[1].stopped);  // it failed
    CHECK_FALSE(stats.workers[1].error.empty());
    // The steps both workers pushed were applied and written back (once both workers had left, the
    // server may complete the step that held the surviving worker's last push).
    CHECK(stats.servers[0].steps >= 2);
    CHECK(stats.servers[0].steps <= 3);
    CHECK(scalar_of(c) == -static_cast<double>(stats.servers[0].steps));
  }
}

namespace {

// A user's optimizer from public ops alone (examples/custom_optimizer.cpp): momentum on the sign.
class SignMomentum : public fl::optim::Optimizer {
 public:
  SignMomentum(double lr, double beta) : Optimizer("sign_momentum"), lr_(lr), beta_(beta) {}

 protected:
  std::vector<std::string> slot_names() const override { return {"momentum"}; }
  void update(fl::Variable& var, const fl::Tensor& grad) override {
    fl::Variable& m = slot(var, "momentum");
    m.assign(beta_ * m.value() + (1.0 - beta_) * grad);
    const fl::Tensor zero = fl::zeros_like(grad);
    const fl::Tensor sign =
        fl::where(m.value() > zero, fl::ones_like(grad), zero) - fl::where(m.value() < zero, fl::ones_like(grad), zero);
    var.assign_sub(lr_ * sign);
  }

 private:
  double lr_, beta_;
};

// y = x w* with w* = (0.5, -1, 2): 4 async workers, each on its quarter of the rows, train w from 0.
std::vector<double> train_regression(const fl::ParameterServerStrategy::OptimizerFactory& factory, int steps) {
  fl::ParameterServerStrategy ps(options_for(1, 4, TrainingMode::async));
  const fl::Tensor x = fl::randn({64, 3}, /*seed=*/3);
  const fl::Tensor y = fl::matmul(x, fl::tensor(std::vector<float>{0.5f, -1.0f, 2.0f}, fl::Shape{3, 1}));
  fl::Variable w = server_variable(ps, fl::zeros({3, 1}), "w");
  const auto stats = ps.run(factory, [&](fl::ps::Worker& worker) {
    const fl::Tensor xs = fl::slice(x, 0, 16 * worker.index(), 16);
    const fl::Tensor ys = fl::slice(y, 0, 16 * worker.index(), 16);
    for (int i = 0; i < steps; ++i) {
      fl::GradientTape tape;
      const fl::Tensor loss = fl::mean(fl::square(fl::matmul(xs, w) - ys));
      worker.apply_gradients(tape.gradient(loss, {w}), {w});
    }
  });
  CHECK(stats.updates_applied == 4 * steps);
  MESSAGE(fmt::format("trained w = {}, max staleness {}", test::values(w.value()), stats.max_staleness));
  return test::values(w.value());
}

}  // namespace

TEST_CASE("parameter servers: Adam and a user's optimizer run on the servers and train") {
  ensure_devices();
  const std::vector<double> want = {0.5, -1.0, 2.0};
  SUBCASE("Adam") {
    const auto w = train_regression([] { return std::make_unique<fl::optim::Adam>(0.01); }, 400);
    CHECK(test::check_values(w, want, {0.0, 0.01}));
  }
  SUBCASE("a user's subclass") {
    // Sign steps of 0.005: 400 of the 800 updates reach w*, the rest oscillate around it.
    const auto w = train_regression([] { return std::make_unique<SignMomentum>(0.005, 0.9); }, 200);
    CHECK(test::check_values(w, want, {0.0, 0.06}));
  }
}

namespace {

// One sync worker trains y = x w + b for `steps` steps, eagerly or with a traced step.
std::vector<std::vector<double>> train_one_worker(bool traced, int steps) {
  fl::ParameterServerStrategy ps(options_for(1, 1, TrainingMode::sync));
  fl::Variable w = server_variable(ps, fl::randn({3, 2}, /*seed=*/7), "w");
  fl::Variable b = server_variable(ps, fl::zeros({2}), "b");
  const std::vector<fl::Variable> params = {w, b};
  const fl::Tensor x = fl::randn({8, 3}, /*seed=*/8);
  const fl::Tensor y = fl::randn({8, 2}, /*seed=*/9);
  ps.run(sgd(0.1), [&](fl::ps::Worker& worker) {
    auto step = [&](fl::Tensor xs, fl::Tensor ys) {
      fl::GradientTape tape;
      const fl::Tensor loss = fl::mean(fl::square(fl::matmul(xs, w) + b - ys));
      worker.apply_gradients(tape.gradient(loss, params), params);
      return loss;
    };
    if (traced) {
      auto traced_step = fl::trace(step);
      for (int i = 0; i < steps; ++i) traced_step(x, y);
    } else {
      for (int i = 0; i < steps; ++i) step(x, y);
    }
  });
  return {test::values(w.value()), test::values(b.value())};
}

}  // namespace

TEST_CASE("parameter servers: a traced worker step equals the eager one and local training") {
  ensure_devices();
  constexpr int kSteps = 6;
  const auto eager = train_one_worker(false, kSteps);
  const auto traced = train_one_worker(true, kSteps);
  // The same training without servers.
  fl::Variable w(fl::randn({3, 2}, /*seed=*/7), "w");
  fl::Variable b(fl::zeros({2}), "b");
  fl::optim::SGD optimizer(0.1);
  const fl::Tensor x = fl::randn({8, 3}, /*seed=*/8);
  const fl::Tensor y = fl::randn({8, 2}, /*seed=*/9);
  for (int i = 0; i < kSteps; ++i) {
    fl::GradientTape tape;
    const fl::Tensor loss = fl::mean(fl::square(fl::matmul(x, w) + b - y));
    optimizer.apply(tape.gradient(loss, {w, b}), {w, b});
  }
  const std::vector<double> local_w = test::values(w.value()), local_b = test::values(b.value());
  CHECK(test::check_values(eager[0], local_w, {1e-6, 1e-6}));
  CHECK(test::check_values(eager[1], local_b, {1e-6, 1e-6}));
  CHECK(test::check_values(traced[0], eager[0], {1e-6, 1e-6}));
  CHECK(test::check_values(traced[1], eager[1], {1e-6, 1e-6}));
  CHECK(eager[0] != test::values(fl::randn({3, 2}, /*seed=*/7)));  // it trained
}

TEST_CASE("parameter servers: runs are seeded from the local values and keep optimizer state") {
  ensure_devices();
  fl::ParameterServerOptions options = options_for(2, 2, TrainingMode::async);
  options.sharding.min_bytes_to_split = 16;
  fl::ParameterServerStrategy ps(options);
  fl::Variable w = server_variable(ps, fl::tensor(std::vector<double>{1, 2, 3, 4}, fl::Shape{4}), "w");
  fl::Variable c = server_variable(ps, fl::scalar(10.0), "c");
  CHECK(ps.placement(w).size() == 2);
  CHECK(ps.optimizers(w).empty());  // before the first run
  auto worker_fn = [&](int steps) {
    return [&, steps](fl::ps::Worker& worker) {
      for (int i = 0; i < steps; ++i) {
        const fl::Tensor wv = w.value();
        worker.apply_gradients({fl::ones_like(wv), fl::ones_like(c.value())}, {w, c});
      }
    };
  };
  auto adam = [] { return std::make_unique<fl::optim::Adam>(0.1); };
  ps.run(adam, worker_fn(5));
  auto optimizers = ps.optimizers(w);
  REQUIRE(optimizers.size() == 2);  // one per piece
  for (const fl::optim::Optimizer* o : optimizers) CHECK(o->iterations().value().item<int64_t>() == 10);
  const std::vector<double> after_first = test::values(w.value());
  // Between runs the variables are local: an assignment is what the next run starts from.
  c.assign(fl::scalar(500.0));
  ps.run(adam, worker_fn(3));
  optimizers = ps.optimizers(w);
  REQUIRE(optimizers.size() == 2);
  for (const fl::optim::Optimizer* o : optimizers) CHECK(o->iterations().value().item<int64_t>() == 16);
  REQUIRE(ps.optimizers(c).size() == 1);
  CHECK(ps.optimizers(c)[0]->iterations().value().item<int64_t>() == 16);
  // Adam with a constant gradient moves each element by about lr per step: 16 steps in all.
  const std::vector<double> after_second = test::values(w.value());
  for (size_t i = 0; i < 4; ++i) {
    CHECK(after_first[i] == doctest::Approx(static_cast<double>(i + 1) - 1.0).epsilon(0.02));
    CHECK(after_second[i] == doctest::Approx(static_cast<double>(i + 1) - 1.6).epsilon(0.02));
  }
  CHECK(scalar_of(c) == doctest::Approx(500.0 - 0.6).epsilon(1e-3));
  // A variable made after the first run cannot be served by the servers made then.
  fl::Variable late = server_variable(ps, fl::scalar(1.0), "late");
  test::check_throws<fl::InvalidArgument>([&] { ps.run(adam, worker_fn(1)); }, {"after the first run"});
}

TEST_CASE("parameter servers: run() inside scope() makes no server variables of the optimizers' state") {
  ensure_devices();
  fl::ParameterServerStrategy ps(options_for(1, 2, TrainingMode::async));
  auto scope = ps.scope();
  fl::Variable c(fl::scalar(0.0), "c");
  ps.run([] { return std::make_unique<fl::optim::Adam>(0.1); }, counter_worker(c, 3));
  REQUIRE(ps.variables().size() == 1);
  CHECK(same_variable(ps.variables()[0], c));
  CHECK(ps.optimizers(c).size() == 1);
  // Variables a worker function makes are its own (the scope belongs to the thread that made it).
  ps.run(sgd(1.0), [&](fl::ps::Worker& worker) {
    fl::Variable scratch(fl::scalar(1.0), "scratch");
    worker.apply_gradients({fl::ones_like(c.value())}, {c});
  });
  CHECK(ps.variables().size() == 1);
}

TEST_CASE("parameter servers: worker identity, devices and a stop request") {
  ensure_devices();
  fl::ParameterServerStrategy ps(options_for(2, 3, TrainingMode::async));
  CHECK(ps.num_servers() == 2);
  CHECK(ps.num_workers() == 3);
  REQUIRE(ps.options().server_devices.size() == 2);
  CHECK(ps.options().server_devices[1] == fl::Device("cpu:1"));
  CHECK(ps.options().worker_devices[2] == fl::Device("cpu:4"));
  fl::Variable c = server_variable(ps, fl::scalar(0.0), "c");
  std::mutex mutex;
  std::set<int> seen;
  std::vector<fl::Device> devices(3);
  std::atomic<bool> miscounted{false};
  const auto stats = ps.run(sgd(1.0), [&](fl::ps::Worker& worker) {
    {
      std::lock_guard lock(mutex);
      seen.insert(worker.index());
      devices[static_cast<size_t>(worker.index())] = worker.device();
    }
    CHECK(worker.num_workers() == 3);
    CHECK(fl::zeros({2}).device() == worker.device());  // ops run on the worker's device
    for (int i = 0; i < 100000 && !worker.should_stop(); ++i) {
      worker.apply_gradients({fl::ones_like(c.value())}, {c});
      if (worker.steps() != i + 1) miscounted = true;
      if (worker.index() == 1 && worker.steps() == 5) worker.request_stop();
    }
  });
  CHECK_FALSE(miscounted);
  CHECK(seen == std::set<int>{0, 1, 2});
  CHECK(devices == std::vector<fl::Device>{fl::Device("cpu:2"), fl::Device("cpu:3"), fl::Device("cpu:4")});
  CHECK(stats.workers[1].steps == 5);
  CHECK(total_steps(stats) < 100000);
  CHECK(scalar_of(c) == -static_cast<double>(total_steps(stats)));
}

TEST_CASE("parameter servers: injected step and message delays") {
  ensure_devices();
  SUBCASE("a constant step delay shows in every step time") {
    fl::ParameterServerOptions options = options_for(1, 2, TrainingMode::async);
    options.faults.step_delay = fl::StepDelay::constant(0.005);
    fl::ParameterServerStrategy ps(options);
    fl::Variable c = server_variable(ps, fl::scalar(0.0), "c");
    const auto stats = ps.run(sgd(1.0), counter_worker(c, 4));
    check_consistent(stats, 1, 2);
    for (const fl::WorkerStats& w : stats.workers) {
      REQUIRE(w.step_seconds.size() == 4);
      for (double t : w.step_seconds) CHECK(t >= 0.005);
    }
    CHECK(scalar_of(c) == -8.0);
  }
  SUBCASE("a message delay: every pull waits for two deliveries, nothing is lost") {
    fl::ParameterServerOptions options = options_for(2, 2, TrainingMode::async);
    options.faults.message_delay_seconds = 0.004;
    fl::ParameterServerStrategy ps(options);
    fl::Variable c = server_variable(ps, fl::scalar(0.0), "c");
    fl::Variable d = server_variable(ps, fl::scalar(0.0), "d");  // on the other server
    CHECK(ps.placement(d)[0].server == 1);
    const auto started = std::chrono::steady_clock::now();
    const auto stats = ps.run(sgd(1.0), [&](fl::ps::Worker& worker) {
      for (int i = 0; i < 5; ++i) {
        const fl::Tensor cv = c.value(), dv = d.value();
        worker.apply_gradients({fl::ones_like(cv), fl::ones_like(dv)}, {c, d});
      }
    });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    check_consistent(stats, 2, 2);
    CHECK(seconds >= 5 * 2 * 2 * 0.004);  // 5 steps x 2 pulls x (request + reply)
    CHECK(scalar_of(c) == -10.0);
    CHECK(scalar_of(d) == -10.0);
  }
  SUBCASE("without enough logical devices everything runs on cpu:0") {
    fl::ParameterServerStrategy ps(options_for(3, 6, TrainingMode::async));
    CHECK(ps.options().server_devices == std::vector<fl::Device>(3, fl::Device("cpu:0")));
    CHECK(ps.options().worker_devices == std::vector<fl::Device>(6, fl::Device("cpu:0")));
  }
}

TEST_CASE("parameter servers: failing workers") {
  ensure_devices();
  fl::ParameterServerStrategy ps(options_for(1, 3, TrainingMode::async));
  fl::Variable c = server_variable(ps, fl::scalar(0.0), "c");
  SUBCASE("an exception is rethrown after the others finished, and the applied pushes are kept") {
    test::check_throws<std::runtime_error>(
        [&] {
          ps.run(sgd(1.0), [&](fl::ps::Worker& worker) {
            for (int i = 0; i < 4; ++i) {
              if (worker.index() == 2 && i == 1) throw std::runtime_error("worker two gives up");
              worker.apply_gradients({fl::ones_like(c.value())}, {c});
            }
          });
        },
        {"worker two gives up"});
    const auto& stats = ps.last_stats();
    CHECK(stats.workers[2].error == "worker two gives up");
    CHECK(stats.workers[2].stopped);
    CHECK(stats.workers[2].steps == 1);
    CHECK(stats.workers[0].steps == 4);
    CHECK(stats.updates_applied == 9);
    CHECK(scalar_of(c) == -9.0);
  }
  SUBCASE("assigning a server variable inside run()") {
    test::check_throws<fl::InvalidArgument>(
        [&] { ps.run(sgd(1.0), [&](fl::ps::Worker&) { c.assign(fl::scalar(3.0)); }); }, {"'c'", "apply_gradients"});
    CHECK(scalar_of(c) == 0.0);
  }
  SUBCASE("a gradient of the wrong shape") {
    test::check_throws<fl::ShapeError>(
        [&] { ps.run(sgd(1.0), [&](fl::ps::Worker& w) { w.apply_gradients({fl::ones({2}, fl::f64)}, {c}); }); });
    CHECK(scalar_of(c) == 0.0);
  }
  SUBCASE("sync: after a worker failed (and so said goodbye) the others go on without it") {
    fl::ParameterServerStrategy sync_ps(options_for(1, 3, TrainingMode::sync));
    fl::Variable s = server_variable(sync_ps, fl::scalar(0.0), "s");
    test::check_throws<fl::OutOfRange>(
        [&] {
          sync_ps.run(sgd(1.0), [&](fl::ps::Worker& worker) {
            for (int i = 0; i < 6; ++i) {
              if (worker.index() == 0 && i == 2) throw fl::OutOfRange("worker zero ran out of data");
              worker.apply_gradients({fl::ones_like(s.value())}, {s});
            }
          });
        },
        {"worker zero ran out of data"});
    const auto& stats = sync_ps.last_stats();
    CHECK(stats.workers[1].steps == 6);
    CHECK(stats.workers[2].steps == 6);
    CHECK(stats.servers[0].steps == 6);
    CHECK(stats.updates_applied == 2 + 6 + 6);
    CHECK(scalar_of(s) == -6.0);
  }
  SUBCASE("asking for the optimizers during the run") {
    test::check_throws<fl::InvalidArgument>([&] { ps.run(sgd(1.0), [&](fl::ps::Worker&) { ps.optimizers(c); }); },
                                            {"optimizers", "in progress"});
  }
  SUBCASE("a variable of no server") {
    fl::Variable local(fl::scalar(1.0), "local");
    test::check_throws<fl::InvalidArgument>(
        [&] { ps.run(sgd(1.0), [&](fl::ps::Worker& w) { w.apply_gradients({fl::scalar(1.0)}, {local}); }); },
        {"local"});
  }
}

TEST_CASE("parameter servers: option and argument errors") {
  ensure_devices();
  auto options = [] { return options_for(1, 2, TrainingMode::async); };
  auto rejects = [](const fl::ParameterServerOptions& o, const std::vector<std::string>& parts) {
    return test::check_throws<fl::InvalidArgument>([&] { fl::ParameterServerStrategy ps(o); }, parts);
  };
  fl::ParameterServerOptions o = options();
  o.num_servers = 0;
  CHECK(rejects(o, {"num_servers", "got 0"}));
  o = options();
  o.num_workers = 0;
  CHECK(rejects(o, {"num_workers", "got 0"}));
  o = options();
  o.mode = TrainingMode::sync;
  o.backup_workers = 2;
  CHECK(rejects(o, {"backup_workers", "got 2"}));
  o = options();
  o.backup_workers = 1;
  CHECK(rejects(o, {"backup_workers", "async"}));
  o = options();
  o.mode = TrainingMode::bounded_staleness;
  o.staleness = -1;
  CHECK(rejects(o, {"staleness", "got -1"}));
  o = options();
  o.timeout_seconds = std::nan("");
  CHECK(rejects(o, {"timeout_seconds"}));
  o = options();
  o.faults.step_delay = fl::StepDelay::straggler(5, 2.0);
  CHECK(rejects(o, {"straggler", "worker 5"}));
  o = options();
  o.faults.step_delay = fl::StepDelay::straggler(1, 0.5);
  CHECK(rejects(o, {"factor", "0.5"}));
  o = options();
  o.faults.stop_worker_at_step = {{1, 0}};
  CHECK(rejects(o, {"stop_worker_at_step", "got 0"}));
  o = options();
  o.faults.message_delay_seconds = -1;
  CHECK(rejects(o, {"message_delay_seconds", "-1"}));
  o = options();
  o.server_devices = {fl::Device("cpu:0"), fl::Device("cpu:1")};
  CHECK(rejects(o, {"server_devices", "2 devices for 1"}));
  o = options();
  o.sharding.max_shards = -2;
  CHECK(rejects(o, {"max_shards", "-2"}));
  o = options();
  o.cluster = fl::ParameterServerOptions::Cluster::processes;
  CHECK(rejects(o, {"1 processes", "mpirun"}));

  // The timeout: FLOWLET_PS_TIMEOUT when the option is <= 0, else 300.
  o = options();
  o.timeout_seconds = 0;
  ::unsetenv("FLOWLET_PS_TIMEOUT");
  CHECK(fl::ParameterServerStrategy(o).options().timeout_seconds == 300);
  ::setenv("FLOWLET_PS_TIMEOUT", "7.5", 1);
  CHECK(fl::ParameterServerStrategy(o).options().timeout_seconds == 7.5);
  ::setenv("FLOWLET_PS_TIMEOUT", "soon", 1);
  CHECK(rejects(o, {"FLOWLET_PS_TIMEOUT", "soon"}));
  ::unsetenv("FLOWLET_PS_TIMEOUT");
  o.timeout_seconds = 3;
  CHECK(fl::ParameterServerStrategy(o).options().timeout_seconds == 3);

  // run() and placement().
  fl::ParameterServerStrategy ps(options());
  fl::Variable c = server_variable(ps, fl::scalar(1.0), "c");
  fl::Variable local(fl::scalar(1.0), "local");
  test::check_throws<fl::InvalidArgument>([&] { ps.placement(local); }, {"'local'", "not a server variable"});
  test::check_throws<fl::InvalidArgument>([&] { ps.placement(fl::Variable()); }, {"empty"});
  test::check_throws<fl::InvalidArgument>([&] { ps.run(nullptr, [](fl::ps::Worker&) {}); }, {"make_optimizer"});
  test::check_throws<fl::InvalidArgument>([&] { ps.run(sgd(1.0), nullptr); }, {"worker_fn"});
  test::check_throws<fl::InvalidArgument>(
      [&] { ps.run([] { return std::unique_ptr<fl::optim::Optimizer>(); }, [](fl::ps::Worker&) {}); }, {"null"});
  test::check_throws<fl::InvalidArgument>(
      [&] { ps.run(sgd(1.0), [&](fl::ps::Worker&) { ps.run(sgd(1.0), [](fl::ps::Worker&) {}); }); },
      {"inside a worker function"});
  // Non-floating variables cannot live on the servers.
  test::check_throws<fl::InvalidArgument>([&] { server_variable(ps, fl::scalar(int64_t{3}), "count"); });
  // None of these changed anything.
  CHECK(scalar_of(c) == 1.0);
  CHECK(ps.variables().size() == 1);
}
