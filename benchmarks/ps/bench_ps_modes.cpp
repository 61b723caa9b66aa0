// bench_ps_modes: the parameter-server modes measured on the in-process cluster and predicted by the
// mode simulator (flowlet/ps_simulator.hpp).
//   1. The server's work per push: an SGD update of the 256 x 256 variable, timed locally.
//   2. For 2, 4 and 8 workers and each mode (async, sync, sync + 1 backup, staleness 2): a traced
//      step with a fixed matmul workload (3 layers of [64, 256] x [256, 256] and their gradients),
//      worker 0 injected 3x slower (StepDelay::straggler). Worker 1 stops the run after --steps steps
//      (request_stop), so every run lasts about as long as one fast worker's steps. Measured: the
//      workers' step times (push to push, first two of each worker left out) and updates/s.
//   3. The simulator fed with the measured step times of async's fast workers at the same worker
//      count (less the server's time, which it models itself): predicted step time and updates/s for
//      every mode beside the measured ones, with the error.
//   4. The simulator's table for 10 ... 1,000 workers from the 8-worker distribution.
// Every worker thread shares this machine's cores: the more workers, the slower each one's compute,
// which the simulator does not model (it takes the measured times as they are).
//
//   bench_ps_modes [--steps N] [--workers 2,4,8]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <flowlet/flowlet.hpp>
#include <flowlet/parameter_server.hpp>
#include <flowlet/ps_simulator.hpp>

namespace fl = flowlet;

namespace {

constexpr int64_t kRows = 64, kWidth = 256, kLayers = 3;
constexpr double kStraggler = 3;

struct Options {
  int64_t steps = 40;
  std::vector<int> workers{2, 4, 8};
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) throw fl::InvalidArgument("bench_ps_modes: " + arg + " needs a value");
    const std::string value = argv[++i];
    if (arg == "--steps") {
      o.steps = std::stoll(value);
    } else if (arg == "--workers") {
      o.workers.clear();
      std::stringstream in(value);
      for (std::string part; std::getline(in, part, ',');) o.workers.push_back(std::stoi(part));
    } else {
      throw fl::InvalidArgument("bench_ps_modes: unknown option " + arg);
    }
  }
  if (o.steps < 3 || o.workers.empty() || *std::min_element(o.workers.begin(), o.workers.end()) < 2) {
    throw fl::InvalidArgument("bench_ps_modes: --steps must be >= 3 and every worker count >= 2");
  }
  return o;
}

double mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0 : sum / static_cast<double>(v.size());
}
double percentile(std::vector<double> v, double p) {  // nearest rank, as the simulator's
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

fl::ParameterServerOptions options_for(int workers, const fl::ps::SimulatedMode& mode, bool straggler) {
  fl::ParameterServerOptions options;
  options.num_servers = 1;
  options.num_workers = workers;
  options.mode = mode.mode;
  options.backup_workers = mode.backup_workers;
  options.staleness = mode.staleness;
  options.timeout_seconds = 120;
  if (straggler) options.faults.step_delay = fl::StepDelay::straggler(0, kStraggler);
  return options;
}

// 1. The server's work per push: one SGD update of the 256 x 256 variable, timed locally (a push's
// decode and the reply are left out: the in-process transport moves pointers).
double server_seconds_per_push() {
  fl::Variable w(fl::randn({kWidth, kWidth}, 1) * 0.05f, "w");
  const fl::Tensor gradient = fl::full({kWidth, kWidth}, 1e-3f);
  fl::optim::SGD sgd(1e-3);
  for (int i = 0; i < 50; ++i) sgd.apply({gradient}, {w});  // warm-up
  std::vector<double> samples;
  for (int s = 0; s < 7; ++s) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 200; ++i) sgd.apply({gradient}, {w});
    samples.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / 200);
  }
  const double median = percentile(samples, 0.5);
  fmt::print("1. server work per push (an SGD update of a {}x{} f32 variable, timed locally, median of 7 x 200): "
             "{:.1f} us\n",
             kWidth, kWidth, median * 1e6);
  return median;
}

struct Measured {
  std::vector<double> all_steps;           // every worker's, pooled
  std::vector<double> fast_steps;          // workers other than the straggler
  double updates_per_second = 0, versions_per_second = 0, dropped_fraction = 0;
  int64_t applied = 0;
  int64_t max_staleness = 0;
};

// 2. One measured run.
Measured measure(int workers, const fl::ps::SimulatedMode& mode, int64_t steps) {
  fl::ParameterServerStrategy ps(options_for(workers, mode, /*straggler=*/true));
  fl::Variable w;
  {
    auto scope = ps.scope();
    w = fl::Variable(fl::randn({kWidth, kWidth}, 2) * (1.0f / 16), "w");
  }
  const fl::Tensor x = fl::randn({kRows, kWidth}, 3);
  const auto stats = ps.run([] { return std::make_unique<fl::optim::SGD>(1e-3); },
                            [&](fl::ps::Worker& worker) {
                              auto step = fl::trace([&](fl::Tensor input) {
                                fl::GradientTape tape;
                                fl::Tensor h = input;
                                for (int l = 0; l < kLayers; ++l) h = fl::tanh(fl::matmul(h, w));
                                const fl::Tensor loss = fl::mean(fl::square(h));
                                worker.apply_gradients(tape.gradient(loss, {w}), {w});
                                return loss;
                              });
                              for (int64_t i = 0; !worker.should_stop(); ++i) {
                                (void)step(x);
                                if (worker.index() == 1 && i + 1 >= steps) worker.request_stop();
                              }
                            });
  Measured m;
  for (const fl::WorkerStats& ws : stats.workers) {
    for (size_t k = 2; k < ws.step_seconds.size(); ++k) {  // the first steps trace and warm up
      m.all_steps.push_back(ws.step_seconds[k]);
      if (ws.worker != 0) m.fast_steps.push_back(ws.step_seconds[k]);
    }
  }
  m.applied = stats.updates_applied;
  m.updates_per_second = static_cast<double>(stats.updates_applied) / stats.wall_seconds;
  int64_t versions = 0;
  for (const fl::ServerStats& s : stats.servers) versions = std::max(versions, s.version);
  m.versions_per_second = static_cast<double>(versions) / stats.wall_seconds;
  const int64_t pushes = stats.updates_applied + stats.updates_dropped;
  m.dropped_fraction = pushes > 0 ? static_cast<double>(stats.updates_dropped) / static_cast<double>(pushes) : 0;
  m.max_staleness = stats.max_staleness;
  return m;
}

std::string error(double predicted, double measured) {
  return measured > 0 ? fmt::format("{:+.0f}%", 100 * (predicted - measured) / measured) : "-";
}

int run(const Options& o) {
  const double server_seconds = server_seconds_per_push();
  const std::vector<fl::ps::SimulatedMode> modes = fl::ps::default_simulated_modes();
  fmt::print("\n2-3. measured (in-process cluster, 1 server, worker 0 {}x slower, worker 1 stops the run after {} "
             "steps) against the simulator fed with async's fast-worker step times\n",
             kStraggler, o.steps);
  fmt::print("{:>7} {:<14} | {:>9} {:>9} {:>10} {:>8} {:>6} | {:>9} {:>9} {:>10} {:>8} | {:>6} {:>6} {:>7}\n", "workers",
             "mode", "step ms", "p50 ms", "updates/s", "dropped", "stale", "step ms", "p50 ms", "updates/s", "dropped",
             "err st", "err 50", "err u/s");
  std::vector<double> largest_distribution;
  std::vector<double> abs_errors;
  for (int workers : o.workers) {
    std::vector<double> compute;  // async's fast workers at this count, less the server's time
    for (const fl::ps::SimulatedMode& mode : modes) {
      const Measured m = measure(workers, mode, o.steps);
      if (mode.mode == fl::TrainingMode::async) {
        for (double s : m.fast_steps) compute.push_back(std::max(0.0, s - server_seconds));
        largest_distribution = compute;
      }
      fl::ps::SimulationConfig config;
      config.workers = workers;
      config.mode = mode.mode;
      config.backup_workers = mode.backup_workers;
      config.staleness = mode.staleness;
      config.step_seconds = compute;
      config.slow_workers = {{0, kStraggler}};
      config.server_seconds = server_seconds;
      config.steps = 200;
      const fl::ps::SimulationResult p = fl::ps::simulate(config);
      const double measured_mean = mean(m.all_steps), measured_p50 = percentile(m.all_steps, 0.5);
      fmt::print("{:>7} {:<14} | {:>9.2f} {:>9.2f} {:>10.1f} {:>7.1f}% {:>6} | {:>9.2f} {:>9.2f} {:>10.1f} {:>7.1f}% | "
                 "{:>6} {:>6} {:>7}\n",
                 workers, fl::ps::describe(mode), measured_mean * 1e3, measured_p50 * 1e3, m.updates_per_second,
                 100 * m.dropped_fraction, m.max_staleness, p.step_mean * 1e3, p.step_p50 * 1e3, p.updates_per_second,
                 100 * p.dropped_fraction, error(p.step_mean, measured_mean), error(p.step_p50, measured_p50),
                 error(p.updates_per_second, m.updates_per_second));
      if (mode.mode != fl::TrainingMode::async) {
        abs_errors.push_back(std::abs(p.updates_per_second - m.updates_per_second) / m.updates_per_second);
      }
      std::fflush(stdout);
    }
  }
  fmt::print("mean |error| of the predicted updates/s over the non-async runs: {:.0f}% (async is the calibration)\n",
             100 * mean(abs_errors));

  fl::ps::SimulationConfig base;
  base.step_seconds = largest_distribution;
  base.slow_workers = {{0, kStraggler}};
  base.server_seconds = server_seconds;
  base.steps = 100;
  fmt::print("\n4. simulated: the {}-worker step-time distribution ({} samples, mean {:.2f} ms), worker 0 {}x slower, "
             "{:.1f} us per push on one server\n",
             o.workers.back(), largest_distribution.size(), mean(largest_distribution) * 1e3, kStraggler,
             server_seconds * 1e6);
  const auto start = std::chrono::steady_clock::now();
  fmt::print("{}", fl::ps::simulation_table(base));
  fmt::print("(simulated in {:.2f} s)\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options options = parse(argc, argv);
    return run(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\nbench_ps_modes: %s\n", e.what());
    return 1;
  }
}
