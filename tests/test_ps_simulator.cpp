// The mode simulator (flowlet/ps_simulator.hpp): cases whose answer is worked out by hand (constant
// compute, no latency: async throughput, sync with a straggler with and without a backup, bounded
// staleness 0 against sync, a saturated server), invariants on random ones (staleness bound, seeds),
// the table, and the errors.
#include <cmath>
#include <string>
#include <vector>

#include "flowlet/ps_simulator.hpp"
#include "support/reference.hpp"

namespace {

namespace ps = fl::ps;

ps::SimulationConfig constant(int workers, double t) {
  ps::SimulationConfig c;
  c.workers = workers;
  c.step_seconds = {t};
  return c;
}

// A spread of compute times (about 1 ms to 9 ms), as a measured distribution would be.
std::vector<double> spread() {
  std::vector<double> s;
  for (int i = 1; i <= 9; ++i) s.push_back(1e-3 * i);
  return s;
}

}  // namespace

TEST_CASE("simulator: async with constant compute and a free server applies W/t updates per second") {
  const double t = 0.01;
  for (int workers : {1, 5, 64}) {
    ps::SimulationConfig c = constant(workers, t);
    c.steps = 200;
    const ps::SimulationResult r = ps::simulate(c);
    CHECK(r.updates_applied == 200 * workers);
    CHECK(r.seconds == doctest::Approx(200 * t).epsilon(1e-12));
    CHECK(r.updates_per_second == doctest::Approx(workers / t).epsilon(1e-9));
    CHECK(r.versions_per_second == doctest::Approx(workers / t).epsilon(1e-9));
    CHECK(r.step_mean == doctest::Approx(t).epsilon(1e-9));
    CHECK(r.step_p50 == doctest::Approx(t).epsilon(1e-9));
    CHECK(r.step_p99 == doctest::Approx(t).epsilon(1e-9));
    CHECK(r.updates_dropped == 0);
    CHECK(r.server_utilization == 0);
    // Every worker reads right after its own push; the other W - 1 push before it pushes again.
    CHECK(r.max_staleness == workers - 1);
    CHECK(r.mean_staleness <= workers - 1);
    CHECK(r.mean_staleness >= (workers - 1) * 0.95);
  }
}

TEST_CASE("simulator: async with a 3x straggler applies (W - 1)/t + 1/(3t) updates per second") {
  const double t = 0.01;
  ps::SimulationConfig c = constant(4, t);
  c.slow_workers = {{2, 3.0}};
  c.steps = 300;  // the run ends at 4 x 300 = 1200 pushes
  const ps::SimulationResult r = ps::simulate(c);
  // 3 fast workers and one that pushes every 3t: 10 pushes per 3t; the run ends at 1200 pushes = 360 t.
  CHECK(r.updates_applied == 1200);
  CHECK(r.seconds == doctest::Approx(360 * t).epsilon(1e-9));
  CHECK(r.updates_per_second == doctest::Approx(3 / t + 1 / (3 * t)).epsilon(1e-9));
  CHECK(r.step_p50 == doctest::Approx(t));
  CHECK(r.step_p99 == doctest::Approx(3 * t));
}

TEST_CASE("simulator: sync without backups runs at the straggler's pace") {
  const double t = 0.01;
  ps::SimulationConfig c = constant(4, t);
  c.mode = fl::TrainingMode::sync;
  c.slow_workers = {{1, 3.0}};
  c.steps = 50;
  const ps::SimulationResult r = ps::simulate(c);
  CHECK(r.versions == 50);
  CHECK(r.updates_applied == 200);
  CHECK(r.updates_dropped == 0);
  CHECK(r.seconds == doctest::Approx(50 * 3 * t).epsilon(1e-9));
  CHECK(r.versions_per_second == doctest::Approx(1 / (3 * t)).epsilon(1e-9));
  CHECK(r.step_mean == doctest::Approx(3 * t).epsilon(1e-9));
  CHECK(r.step_p50 == doctest::Approx(3 * t).epsilon(1e-9));
  CHECK(r.step_p99 == doctest::Approx(3 * t).epsilon(1e-9));
  CHECK(r.max_staleness == 0);
  CHECK(r.mean_staleness == 0);
}

TEST_CASE("simulator: sync with one backup drops the straggler's pushes and runs at the others' pace") {
  const double t = 1.0 / 64;  // exact in binary: 3t and t + t + t are the same time
  ps::SimulationConfig c = constant(4, t);
  c.mode = fl::TrainingMode::sync;
  c.backup_workers = 1;
  c.slow_workers = {{3, 3.0}};
  c.steps = 300;
  const ps::SimulationResult r = ps::simulate(c);
  CHECK(r.versions == 300);
  CHECK(r.updates_applied == 900);
  CHECK(r.seconds == doctest::Approx(300 * t).epsilon(1e-9));
  CHECK(r.versions_per_second == doctest::Approx(1 / t).epsilon(1e-9));
  CHECK(r.step_p50 == doctest::Approx(t).epsilon(1e-9));
  // The straggler pushes every 3t, always after its step completed: one dropped push per 3 steps
  // (at 3t, 6t, ..., 300t), and it goes on from the newest version each time.
  CHECK(r.updates_dropped == 100);
  CHECK(r.dropped_fraction == doctest::Approx(0.1));
  CHECK(r.step_p99 == doctest::Approx(3 * t).epsilon(1e-9));
  CHECK(r.max_staleness == 0);
}

TEST_CASE("simulator: with equal workers and one backup, one push per step is dropped") {
  ps::SimulationConfig c = constant(5, 0.02);
  c.mode = fl::TrainingMode::sync;
  c.backup_workers = 1;
  c.steps = 40;
  const ps::SimulationResult r = ps::simulate(c);
  CHECK(r.updates_applied == 160);
  CHECK(r.updates_dropped == 40);
  CHECK(r.dropped_fraction == doctest::Approx(0.2));
  CHECK(r.step_mean == doctest::Approx(0.02).epsilon(1e-9));
}

TEST_CASE("simulator: bounded staleness 0 equals sync without backups") {
  for (uint64_t seed : {1u, 2u, 3u}) {
    ps::SimulationConfig c;
    c.workers = 7;
    c.step_seconds = spread();
    c.slow_workers = {{0, 2.5}};
    c.pull_seconds = 1e-4;
    c.push_seconds = 2e-4;
    c.server_seconds = 5e-5;
    c.steps = 80;
    c.seed = seed;
    c.mode = fl::TrainingMode::sync;
    const ps::SimulationResult sync = ps::simulate(c);
    c.mode = fl::TrainingMode::bounded_staleness;
    c.staleness = 0;
    const ps::SimulationResult bounded = ps::simulate(c);
    CHECK(bounded.seconds == sync.seconds);
    CHECK(bounded.updates_applied == sync.updates_applied);
    CHECK(bounded.versions == sync.versions);
    CHECK(bounded.step_mean == sync.step_mean);
    CHECK(bounded.step_p50 == sync.step_p50);
    CHECK(bounded.step_p99 == sync.step_p99);
    CHECK(bounded.server_utilization == sync.server_utilization);
    CHECK(bounded.max_staleness == 0);
    CHECK(sync.updates_dropped == 0);
  }
}

TEST_CASE("simulator: bounded staleness k never applies an update staler than k") {
  for (int k : {1, 2, 5}) {
    for (uint64_t seed : {11u, 12u}) {
      ps::SimulationConfig c;
      c.workers = 9;
      c.mode = fl::TrainingMode::bounded_staleness;
      c.staleness = k;
      c.step_seconds = spread();
      c.slow_workers = {{4, 3.0}};
      c.steps = 100;
      c.seed = seed;
      const ps::SimulationResult r = ps::simulate(c);
      CHECK(r.max_staleness <= k);
      CHECK(r.max_staleness >= 1);  // the straggler makes the others run ahead
      CHECK(r.updates_applied == 900);
      // Between sync (every step waits for the straggler) and async (nobody waits).
      c.mode = fl::TrainingMode::sync;
      c.staleness = 0;
      const double sync = ps::simulate(c).updates_per_second;
      c.mode = fl::TrainingMode::async;
      const double async = ps::simulate(c).updates_per_second;
      CHECK(r.updates_per_second > sync);
      CHECK(r.updates_per_second < async);
    }
  }
}

TEST_CASE("simulator: a server that takes s per push saturates at 1/s updates per second") {
  ps::SimulationConfig c = constant(10, 1.0);
  c.server_seconds = 0.5;  // W/t = 10 pushes offered per second, the server takes 2
  c.steps = 200;
  const ps::SimulationResult r = ps::simulate(c);
  // The first pushes arrive at t = 1, then the server never idles: 2000 pushes end at 1 + 1000 s.
  CHECK(r.seconds == doctest::Approx(1001).epsilon(1e-9));
  CHECK(r.updates_per_second == doctest::Approx(2.0).epsilon(0.002));
  CHECK(r.server_utilization == doctest::Approx(1.0).epsilon(0.002));
  // Each worker now waits for the other nine pushes: a step takes W s = 5 s.
  CHECK(r.step_p50 == doctest::Approx(5.0));

  // Below saturation each worker's step is t + s once the first pushes have spread out.
  ps::SimulationConfig light = constant(2, 1.0);
  light.server_seconds = 0.1;
  light.steps = 100;
  const ps::SimulationResult l = ps::simulate(light);
  CHECK(l.step_p50 == doctest::Approx(1.1));
  CHECK(l.updates_per_second == doctest::Approx(2 / 1.1).epsilon(0.002));
  CHECK(l.server_utilization == doctest::Approx(0.2 / 1.1).epsilon(0.002));
}

TEST_CASE("simulator: latencies add to every step") {
  ps::SimulationConfig c = constant(3, 0.01);
  c.pull_seconds = 0.002;
  c.push_seconds = 0.003;
  c.steps = 50;
  const ps::SimulationResult r = ps::simulate(c);
  CHECK(r.step_mean == doctest::Approx(0.015).epsilon(1e-9));
  CHECK(r.updates_per_second == doctest::Approx(3 / 0.015).epsilon(1e-9));
}

TEST_CASE("simulator: a seed gives one answer; another seed another") {
  ps::SimulationConfig c;
  c.workers = 12;
  c.mode = fl::TrainingMode::sync;
  c.backup_workers = 2;
  c.step_seconds = spread();
  c.steps = 60;
  c.seed = 42;
  const ps::SimulationResult a = ps::simulate(c), b = ps::simulate(c);
  CHECK(a.seconds == b.seconds);
  CHECK(a.step_p99 == b.step_p99);
  CHECK(a.updates_dropped == b.updates_dropped);
  c.seed = 43;
  CHECK(ps::simulate(c).seconds != a.seconds);
  // A sync step with 12 workers waits for the 10th fastest of 12 samples: slower than the mean sample.
  CHECK(a.seconds / static_cast<double>(a.versions) > 5e-3);
}

TEST_CASE("simulator: backups shorten sync steps under a spread of compute times") {
  ps::SimulationConfig c;
  c.workers = 20;
  c.mode = fl::TrainingMode::sync;
  c.step_seconds = spread();
  c.steps = 200;
  const double plain = ps::simulate(c).versions_per_second;
  c.backup_workers = 4;
  const ps::SimulationResult backed = ps::simulate(c);
  CHECK(backed.versions_per_second > plain);
  // At most the 4 last of every 20 pushes are dropped (a slow worker may miss more than one step).
  CHECK(backed.dropped_fraction > 0.1);
  CHECK(backed.dropped_fraction <= 0.2);
}

TEST_CASE("simulator: the table has one line per worker count and mode") {
  ps::SimulationConfig c;
  c.step_seconds = spread();
  c.slow_workers = {{0, 3.0}};
  c.server_seconds = 1e-5;
  c.steps = 20;
  const std::string table = ps::simulation_table(c, {10, 30});
  CHECK(std::count(table.begin(), table.end(), '\n') == 1 + 2 * 4);
  CHECK(table.find("sync+1 backup") != std::string::npos);
  CHECK(table.find("staleness 2") != std::string::npos);
  CHECK(table.find("updates/s") != std::string::npos);
  CHECK(ps::describe({fl::TrainingMode::async, 0, 0}) == "async");
  CHECK(ps::default_simulated_modes().size() == 4);
}

TEST_CASE("simulator: bad configs are InvalidArgument naming the field and value") {
  auto bad = [](auto change, std::vector<std::string> parts) {
    ps::SimulationConfig c = constant(4, 0.01);
    change(c);
    CHECK(test::check_op_throws<fl::InvalidArgument>("ps::simulate", [&] { ps::simulate(c); }, parts));
  };
  bad([](auto& c) { c.workers = 0; }, {"workers", "got 0"});
  bad([](auto& c) { c.step_seconds.clear(); }, {"step_seconds is empty"});
  bad([](auto& c) { c.step_seconds = {0.01, -1}; }, {"step_seconds[1] = -1"});
  bad([](auto& c) { c.step_seconds = {NAN}; }, {"step_seconds[0] = nan"});
  bad([](auto& c) { c.mode = fl::TrainingMode::sync, c.backup_workers = 4; }, {"backup_workers", "got 4 with 4 workers"});
  bad([](auto& c) { c.backup_workers = 1; }, {"sync only", "async"});
  bad([](auto& c) { c.mode = fl::TrainingMode::bounded_staleness, c.staleness = -1; }, {"staleness", "got -1"});
  bad([](auto& c) { c.slow_workers = {{1, 0.0}}; }, {"slow worker", "factor 0"});
  bad([](auto& c) { c.slow_workers = {{-1, 2.0}}; }, {"slow worker", "worker -1"});
  bad([](auto& c) { c.pull_seconds = -0.5; }, {"pull_seconds", "-0.5"});
  bad([](auto& c) { c.push_seconds = INFINITY; }, {"push_seconds", "inf"});
  bad([](auto& c) { c.server_seconds = -1; }, {"server_seconds"});
  bad([](auto& c) { c.steps = 0; }, {"steps", "got 0"});
  bad([](auto& c) { c.steps = int64_t{1} << 40; }, {"steps"});
  bad([](auto& c) { c.step_seconds = {0.0, 1.0}; }, {"could take no time"});
  // A zero compute time is fine when something else takes time.
  ps::SimulationConfig ok = constant(2, 0.0);
  ok.push_seconds = 0.001;
  CHECK(ps::simulate(ok).updates_per_second == doctest::Approx(2000).epsilon(1e-9));
}
