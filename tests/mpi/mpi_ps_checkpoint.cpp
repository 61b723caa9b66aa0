// Checkpoints of ParameterServerStrategy jobs across processes, under `mpirun -np N`
// (tests/meson.build runs N = 3: 1 server and 2 workers, and N = 4: 2 servers and 2 workers).
// Every process runs every case in file order (strategies, managers, saves and restores are
// collective) and checks on its own:
//   - a save after a run: the server processes wrote one shard file each ("server-<s>"), the
//     workers none, and the manifest names them;
//   - training on, then restoring that checkpoint: every process holds the saved values, and the
//     next steps give exactly the values of the uninterrupted continuation (the optimizer state
//     went back to the servers: Adam's moments and step counts decide those values);
//   - a fresh strategy restoring before its first run (the state waits for run()'s optimizers)
//     continues the same way;
//   - a job of another number of workers is refused on every process and changes nothing;
//   - every process ends with the same values and the same counters.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <flowlet/collective.hpp>
#include <flowlet/distributed_checkpoint.hpp>
#include <flowlet/flowlet.hpp>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "support/reference.hpp"

namespace {

using fl::TrainingMode;

constexpr int kWorkers = 2;

int servers() { return fl::process_count() - kWorkers; }

// A directory every process agrees on (the job's processes share /tmp): process 0 draws a number.
const std::filesystem::path& directory() {
  static const std::filesystem::path path = [] {
    const auto mine = static_cast<int64_t>(fl::process_index() == 0 ? std::random_device()() % 1000000000 : 0);
    const int64_t drawn =
        fl::all_reduce(fl::tensor(std::vector<int64_t>{mine}, fl::Shape{1}), fl::ReduceOp::max).to_vector<int64_t>()[0];
    return std::filesystem::temp_directory_path() / fmt::format("mpi_ps_ckpt_np{}_{}", fl::process_count(), drawn);
  }();
  return path;
}

struct Model {
  explicit Model(int num_servers = servers()) : ps(options(num_servers)) {
    auto scope = ps.scope();
    w = fl::Variable(fl::randn({6, 3}, /*seed=*/7), "w");
    b = fl::Variable(fl::zeros({3}), "b");
    table = fl::Variable(fl::randn({10, 4}, /*seed=*/5), "table");
  }
  static fl::ParameterServerOptions options(int num_servers) {
    fl::ParameterServerOptions o;
    o.num_servers = num_servers;
    o.mode = TrainingMode::sync;  // two pushes averaged per step: the same sum whatever their order
    o.sharding.min_bytes_to_split = 0;
    o.timeout_seconds = 20;
    return o;
  }
  std::vector<fl::Variable> params() const { return {w, b, table}; }
  std::vector<double> values() const {
    std::vector<double> all;
    for (const fl::Variable& v : params()) {
      const std::vector<double> x = test::values(v.value());
      all.insert(all.end(), x.begin(), x.end());
    }
    return all;
  }

  fl::ParameterServerStrategy ps;
  fl::Variable w, b, table;
};

// Steps [first, first + steps): worker k's batch of step i is seeded by (i, k); the table rows it
// looks up differ by worker and step, so the table's pieces take different numbers of updates.
void train(Model& m, int first, int steps) {
  m.ps.run([] { return std::make_unique<fl::optim::Adam>(0.05); },
           [&](fl::ps::Worker& worker) {
             for (int i = first; i < first + steps; ++i) {
               const uint64_t seed = static_cast<uint64_t>(i * 10 + worker.index());
               const fl::Tensor x = fl::randn({4, 6}, 100 + seed);
               const fl::Tensor y = fl::randn({4, 3}, 200 + seed);
               const std::vector<int64_t> rows = {(i + worker.index()) % 4, 1};
               fl::GradientTape tape;
               const fl::Tensor looked_up = fl::gather(m.table, fl::tensor(rows, fl::Shape{2}));
               const fl::Tensor loss =
                   fl::mean(fl::square(fl::matmul(x, m.w) + m.b - y)) + fl::sum(fl::square(looked_up));
               const std::vector<fl::Variable> params = m.params();
               worker.apply_gradients(tape.gradient(loss, params), params);
             }
           });
}

// Passes on every process when every process holds the same `values`.
void check_same_everywhere(const std::vector<double>& values, const char* what) {
  CAPTURE(what);
  const fl::Tensor mine = fl::tensor(values, fl::Shape{static_cast<int64_t>(values.size())});
  CHECK(test::values(fl::all_reduce(mine, fl::ReduceOp::max)) == values);
  CHECK(test::values(fl::all_reduce(mine, fl::ReduceOp::min)) == values);
}

// The run's counters (not the servers' versions: they count every step the strategy served, a
// clock of the strategy that a checkpoint of the model does not hold).
std::vector<double> counters(const fl::ParameterServerStats& s) {
  std::vector<double> f = {static_cast<double>(s.updates_applied), static_cast<double>(s.updates_dropped)};
  for (const fl::ServerStats& v : s.servers) {
    f.push_back(static_cast<double>(v.steps));
    f.push_back(static_cast<double>(v.updates_applied));
  }
  for (const fl::WorkerStats& w : s.workers) f.push_back(static_cast<double>(w.steps));
  return f;
}

fl::DistributedCheckpointOptions synchronous() {
  fl::DistributedCheckpointOptions options;
  options.background = false;
  return options;
}

std::string text_of(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Shared by the cases, in file order: the state saved at step 4 and the values 3 steps later.
std::vector<double> g_saved, g_continued;
std::vector<double> g_continued_counters;

}  // namespace

TEST_CASE("mpi ps checkpoint: servers write their shards; a restore continues as the uninterrupted job") {
  REQUIRE(servers() >= 1);
  Model m;
  fl::DistributedCheckpointManager checkpoints(directory().string(), synchronous());
  checkpoints.add(m.ps);
  train(m, 0, 4);
  g_saved = m.values();
  check_same_everywhere(g_saved, "values after the first run");
  checkpoints.save(4, {{"batch", 4}});

  // The server processes wrote one file each, the workers none; the manifest names them.
  const std::optional<std::string> latest = checkpoints.latest();
  REQUIRE(latest.has_value());
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(*latest)) files.push_back(entry.path().filename());
  std::sort(files.begin(), files.end());
  CAPTURE(files.size());
  REQUIRE(files.size() == static_cast<size_t>(servers()) + 1);
  CHECK(files.front() == "manifest.json");
  const std::string manifest = text_of(std::filesystem::path(*latest) / "manifest.json");
  for (int s = 0; s < servers(); ++s) {
    CHECK(files[static_cast<size_t>(s) + 1].starts_with(fmt::format("server-{}.", s)));
    CHECK(manifest.find(fmt::format("server-{}", s)) != std::string::npos);
  }
  CHECK(manifest.find("parameter_server") != std::string::npos);

  train(m, 4, 3);
  g_continued = m.values();
  g_continued_counters = counters(m.ps.last_stats());
  check_same_everywhere(g_continued, "values of the uninterrupted continuation");
  check_same_everywhere(g_continued_counters, "counters of the uninterrupted continuation");

  // Back to step 4 (every process), then the same three steps: the same values, exactly.
  const fl::RestoredCheckpoint restored = checkpoints.restore(*latest);
  CHECK(restored.step == 4);
  CHECK(restored.metadata.at("batch") == 4);
  CHECK(m.values() == g_saved);
  train(m, 4, 3);
  CHECK(m.values() == g_continued);
  CHECK(counters(m.ps.last_stats()) == g_continued_counters);
  check_same_everywhere(m.values(), "values after the restore");
}

TEST_CASE("mpi ps checkpoint: a fresh job restores before its first run and continues the same") {
  Model m;
  fl::DistributedCheckpointManager checkpoints(directory().string(), synchronous());
  checkpoints.add(m.ps);
  const std::optional<fl::RestoredCheckpoint> restored = checkpoints.restore_latest();
  REQUIRE(restored.has_value());
  CHECK(restored->step == 4);
  CHECK(restored->saved_processes == fl::process_count());
  CHECK(m.values() == g_saved);
  train(m, 4, 3);
  CHECK(m.values() == g_continued);
  check_same_everywhere(m.values(), "values of the fresh job");
}

TEST_CASE("mpi ps checkpoint: a job of another number of workers is refused everywhere") {
  if (servers() < 2) return;  // with 2 servers of 4 processes, 1 server leaves 3 workers
  Model m(1);
  REQUIRE(m.ps.num_workers() == 3);
  fl::DistributedCheckpointManager checkpoints(directory().string(), synchronous());
  checkpoints.add(m.ps);
  const std::vector<double> before = m.values();
  CHECK_THROWS_WITH_AS(checkpoints.restore_latest(), doctest::Contains("job of 2 workers; this job has 3"),
                       fl::InvalidArgument);
  CHECK(m.values() == before);
}

TEST_CASE("mpi ps checkpoint: clean up") {
  fl::barrier();  // every process is done with the directory
  if (fl::process_index() == 0) {
    std::error_code ignored;
    std::filesystem::remove_all(directory(), ignored);
  }
  fl::barrier();
}
