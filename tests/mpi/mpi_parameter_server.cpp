// ParameterServerStrategy across processes, under `mpirun -np N` (tests/meson.build runs N = 3:
// 1 server and 2 workers, and N = 4: 2 servers and 2 workers). Every process runs every case in
// file order (strategies are made and runs made collectively), and checks on its own:
//   - async and sync-with-a-backup accounting as in the in-process tests (SGD lr = 1, gradient 1
//     per push: the variable moves by exactly what the servers report);
//   - a sparse table over the servers: only the looked-up rows change, by hand-computed amounts,
//     and a step moves about the rows' bytes;
//   - a worker stopped by fault injection: the others finish;
//   - every process ends with the same values and the same counters (compared with all_reduce).
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include <flowlet/collective.hpp>
#include <flowlet/flowlet.hpp>

#include "support/parameter_server.hpp"
#include "support/reference.hpp"

namespace {

using fl::TrainingMode;

constexpr int kWorkers = 2;

int servers() { return fl::process_count() - kWorkers; }

fl::ParameterServerOptions options_for(TrainingMode mode) {
  fl::ParameterServerOptions options;
  options.num_servers = servers();
  options.mode = mode;
  options.timeout_seconds = 20;
  options.sharding.min_bytes_to_split = 16;  // the [4] counter is split when there are 2 servers
  return options;
}

using test::counter_worker;
using test::server_variable;
using test::sgd;

// Passes on every process when every process holds the same `values`.
void check_same_everywhere(const std::vector<double>& values, const char* what) {
  CAPTURE(what);
  const fl::Tensor mine = fl::tensor(values, fl::Shape{static_cast<int64_t>(values.size())});
  CHECK(test::values(fl::all_reduce(mine, fl::ReduceOp::max)) == values);
  CHECK(test::values(fl::all_reduce(mine, fl::ReduceOp::min)) == values);
}

// Every counter of the run as numbers (the step times too), to compare across processes.
std::vector<double> fingerprint(const fl::ParameterServerStats& s) {
  std::vector<double> f = {static_cast<double>(static_cast<int>(s.mode)),
                           static_cast<double>(s.updates_applied),
                           static_cast<double>(s.updates_dropped),
                           static_cast<double>(s.max_staleness),
                           s.wall_seconds,
                           static_cast<double>(s.servers.size()),
                           static_cast<double>(s.workers.size())};
  for (int64_t h : s.staleness_histogram) f.push_back(static_cast<double>(h));
  for (const fl::ServerStats& v : s.servers) {
    for (int64_t x : {int64_t{v.server}, v.version, v.updates_applied, v.updates_dropped, v.steps, v.max_staleness,
                      v.bytes_received, v.bytes_sent, v.messages_received, v.messages_sent}) {
      f.push_back(static_cast<double>(x));
    }
  }
  for (const fl::WorkerStats& w : s.workers) {
    for (int64_t x : {int64_t{w.worker}, w.steps, int64_t{w.stopped}, static_cast<int64_t>(w.error.size()),
                      w.bytes_received, w.bytes_sent, w.messages_received, w.messages_sent}) {
      f.push_back(static_cast<double>(x));
    }
    for (double t : w.step_seconds) f.push_back(t);
  }
  return f;
}

void check_roles(const fl::ParameterServerStrategy& ps) {
  CHECK_FALSE(ps.in_process());
  CHECK(ps.num_servers() == servers());
  CHECK(ps.num_workers() == kWorkers);
  const int me = fl::process_index();
  CHECK(ps.is_server() == (me < servers()));
  CHECK(ps.worker_index() == (me < servers() ? -1 : me - servers()));
}

}  // namespace

TEST_CASE("mpi parameter servers: async accounting across processes") {
  constexpr int kSteps = 20;
  fl::ParameterServerStrategy ps(options_for(TrainingMode::async));
  check_roles(ps);
  fl::Variable c = server_variable(ps, fl::tensor(std::vector<double>{100, 200, 300, 400}, fl::Shape{4}), "c");
  CHECK(ps.placement(c).size() == static_cast<size_t>(servers()));
  bool ran_worker_fn = false;
  const auto stats = ps.run(sgd(1.0), [&](fl::ps::Worker& worker) {
    ran_worker_fn = true;
    CHECK(worker.index() == ps.worker_index());
    counter_worker(c, kSteps)(worker);
  });
  CHECK(ran_worker_fn == !ps.is_server());
  REQUIRE(stats.servers.size() == static_cast<size_t>(servers()));
  REQUIRE(stats.workers.size() == static_cast<size_t>(kWorkers));
  for (const fl::ServerStats& s : stats.servers) {
    CHECK(s.updates_applied == kWorkers * kSteps);  // every step pushes to every server
    CHECK(s.updates_dropped == 0);
  }
  for (const fl::WorkerStats& w : stats.workers) {
    CHECK(w.steps == kSteps);
    CHECK(w.step_seconds.size() == static_cast<size_t>(kSteps));
  }
  CHECK(stats.updates_applied == servers() * kWorkers * kSteps);
  const double moved = kWorkers * kSteps;
  CHECK(test::values(c.value()) == std::vector<double>{100 - moved, 200 - moved, 300 - moved, 400 - moved});
  check_same_everywhere(test::values(c.value()), "c");
  check_same_everywhere(fingerprint(stats), "stats");
}

TEST_CASE("mpi parameter servers: sync with a backup worker across processes") {
  constexpr int kSteps = 10;
  fl::ParameterServerOptions options = options_for(TrainingMode::sync);
  options.backup_workers = 1;  // steps complete with the first push of 2
  options.faults.step_delay = fl::StepDelay::straggler(1, 8.0);
  fl::ParameterServerStrategy ps(options);
  fl::Variable c = server_variable(ps, fl::tensor(std::vector<double>{0, 0, 0, 0}, fl::Shape{4}), "c");
  const auto stats = ps.run(sgd(1.0), counter_worker(c, kSteps, std::chrono::milliseconds(2)));
  REQUIRE(stats.servers.size() == static_cast<size_t>(servers()));
  const std::vector<double> value = test::values(c.value());
  for (const fl::ServerStats& s : stats.servers) {
    CHECK(s.updates_applied + s.updates_dropped == kWorkers * kSteps);
    CHECK(s.max_staleness == 0);
    // This server's rows moved by one per step (the mean of ones).
    for (const auto& shard : ps.placement(c)) {
      if (shard.server != s.server) continue;
      for (int64_t r = shard.row_begin; r < shard.row_end; ++r) {
        CHECK(value[static_cast<size_t>(r)] == -static_cast<double>(s.steps));
      }
    }
  }
  CHECK(stats.updates_dropped > 0);
  check_same_everywhere(value, "c");
  check_same_everywhere(fingerprint(stats), "stats");
}

TEST_CASE("mpi parameter servers: a sparse table across processes") {
  constexpr int64_t kRows = 1000, kCols = 8;
  constexpr int kSteps = 3;
  fl::ParameterServerOptions options = options_for(TrainingMode::async);
  options.sharding.min_bytes_to_split = 1024;
  fl::ParameterServerStrategy ps(options);
  const fl::Tensor init = fl::randn({kRows, kCols}, /*seed=*/5);
  fl::Variable table = server_variable(ps, init, "table");
  // Worker w looks up 16 rows of its own (spread over the table, so over every server).
  auto ids_of = [](int worker) {
    std::vector<int64_t> ids;
    for (int i = 0; i < 16; ++i) ids.push_back(i * 61 + worker * 7);
    return ids;
  };
  auto weight_of = [](int i, int64_t c) { return 0.125 * static_cast<double>((i + c) % 5) - 0.25; };
  const auto stats = ps.run(sgd(0.5), [&](fl::ps::Worker& worker) {
    const std::vector<int64_t> ids = ids_of(worker.index());
    std::vector<float> weights;
    for (int i = 0; i < 16; ++i) {
      for (int64_t c = 0; c < kCols; ++c) weights.push_back(static_cast<float>(weight_of(i, c)));
    }
    const fl::Tensor id_tensor = fl::tensor(ids, fl::Shape{16});
    const fl::Tensor weight_tensor = fl::tensor(weights, fl::Shape{16, kCols});
    for (int step = 0; step < kSteps; ++step) {
      fl::GradientTape tape;
      const fl::Tensor loss = fl::sum(fl::gather(table, id_tensor) * weight_tensor);
      worker.apply_gradients(tape.gradient(loss, {table}), {table});
    }
  });
  const std::vector<double> init_values = test::values(init);
  std::vector<double> want = init_values;
  for (int w = 0; w < kWorkers; ++w) {
    const std::vector<int64_t> ids = ids_of(w);
    for (int i = 0; i < 16; ++i) {
      for (int64_t c = 0; c < kCols; ++c) {
        const auto at = static_cast<size_t>(ids[static_cast<size_t>(i)] * kCols + c);
        want[at] -= kSteps * 0.5 * weight_of(i, c);
      }
    }
  }
  const std::vector<double> got = test::values(table.value());
  CHECK(test::check_values(got, want, {1e-6, 1e-6}));
  size_t unchanged = 0;
  for (size_t i = 0; i < got.size(); ++i) unchanged += got[i] == init_values[i] ? 1 : 0;
  CHECK(unchanged >= got.size() - 2 * 16 * kCols);
  for (const fl::WorkerStats& w : stats.workers) {
    // 16 rows x 8 columns x 4 bytes = 512 bytes each way per step, plus ids and headers.
    const double received = static_cast<double>(w.bytes_received) / kSteps;
    const double sent = static_cast<double>(w.bytes_sent) / kSteps;
    CHECK(received >= 512);
    CHECK(received < 2 * 512);
    CHECK(sent >= 512 + 16 * 8);
    CHECK(sent < 4 * 512);
  }
  check_same_everywhere(got, "table");
  check_same_everywhere(fingerprint(stats), "stats");
}

TEST_CASE("mpi parameter servers: a worker stopped at step 3") {
  constexpr int kSteps = 8;
  fl::ParameterServerOptions options = options_for(TrainingMode::async);
  options.faults.stop_worker_at_step = {{1, 3}};
  fl::ParameterServerStrategy ps(options);
  fl::Variable c = server_variable(ps, fl::scalar(0.0), "c");
  const auto stats = ps.run(sgd(1.0), counter_worker(c, kSteps));
  REQUIRE(stats.workers.size() == 2);
  CHECK(stats.workers[1].stopped);
  CHECK(stats.workers[1].steps == 2);
  CHECK_FALSE(stats.workers[0].stopped);
  CHECK(stats.workers[0].steps == kSteps);
  const int holder = ps.placement(c)[0].server;
  CHECK(stats.servers[static_cast<size_t>(holder)].updates_applied == kSteps + 2);
  CHECK(test::values(c.value())[0] == -static_cast<double>(kSteps + 2));
  check_same_everywhere(test::values(c.value()), "c");
  check_same_everywhere(fingerprint(stats), "stats");
  // A second run goes on from the written-back value, with the same servers.
  const auto again = ps.run(sgd(1.0), counter_worker(c, 2));
  CHECK(again.workers[1].steps == 2);  // stops at its 3rd push again: it never reaches it
  CHECK(test::values(c.value())[0] == -static_cast<double>(kSteps + 2 + 4));
  check_same_everywhere(fingerprint(again), "second run's stats");
}

TEST_CASE("mpi parameter servers: a failing worker fails run() on every process, with the same error") {
  fl::ParameterServerStrategy ps(options_for(TrainingMode::async));
  fl::Variable c = server_variable(ps, fl::scalar(0.0), "c");
  const bool threw = test::check_throws<fl::OutOfRange>(
      [&] {
        ps.run(sgd(1.0), [&](fl::ps::Worker& worker) {
          worker.apply_gradients({fl::ones_like(c.value())}, {c});
          if (worker.index() == 1) throw fl::OutOfRange("worker one ran out of data");
          worker.apply_gradients({fl::ones_like(c.value())}, {c});
        });
      },
      {"worker one ran out of data"});
  CHECK(threw);
  const auto& stats = ps.last_stats();
  REQUIRE(stats.workers.size() == 2);
  CHECK(stats.workers[1].error == "worker one ran out of data");
  CHECK(stats.workers[1].stopped);
  CHECK(stats.workers[0].steps == 2);
  // What the servers applied is kept, on every process.
  CHECK(test::values(c.value())[0] == -3.0);
  check_same_everywhere(fingerprint(stats), "stats");
}

TEST_CASE("mpi parameter servers: processes that disagree on the variables are refused") {
  fl::ParameterServerStrategy ps(options_for(TrainingMode::async));
  fl::Variable c = server_variable(ps, fl::scalar(0.0), "c");
  // Process 0 makes one variable more than the others.
  fl::Variable extra = fl::process_index() == 0 ? server_variable(ps, fl::scalar(1.0), "extra") : fl::Variable();
  CHECK(test::check_throws<fl::InvalidArgument>([&] { ps.run(sgd(1.0), counter_worker(c, 1)); },
                                                {"disagree", "server variables"}));
  CHECK(test::values(c.value())[0] == 0.0);
}

TEST_CASE("mpi parameter servers: options.server_processes picks the serving processes") {
  // The last processes serve; the first two work, in process order.
  fl::ParameterServerOptions options = options_for(TrainingMode::async);
  for (int s = 0; s < servers(); ++s) options.server_processes.push_back(kWorkers + s);
  fl::ParameterServerStrategy ps(options);
  const int me = fl::process_index();
  CHECK(ps.is_server() == (me >= kWorkers));
  CHECK(ps.worker_index() == (me >= kWorkers ? -1 : me));
  fl::Variable c = server_variable(ps, fl::tensor(std::vector<double>{5, 6, 7, 8}, fl::Shape{4}), "c");
  int ran_as = -1;
  const auto stats = ps.run(sgd(1.0), [&](fl::ps::Worker& worker) {
    ran_as = worker.index();
    counter_worker(c, 3)(worker);
  });
  CHECK(ran_as == ps.worker_index());
  CHECK(test::values(c.value()) == std::vector<double>{-1, 0, 1, 2});
  check_same_everywhere(fingerprint(stats), "stats");
}
