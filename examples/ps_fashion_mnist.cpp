// The paper's comparison of the parameter-server modes: the demo's MLP (784-256-10, ReLU, Adam) on
// Fashion-MNIST, trained with ParameterServerStrategy in four modes — async, sync, sync with one
// backup worker, bounded staleness 2 — with one worker injected 3x slower than it measures
// (StepDelay::straggler). Every mode processes the same number of batches; training runs in segments
// (run() calls), and between them the test accuracy is evaluated and recorded against the wall time
// spent training so far (evaluation not counted).
//
//   build/release/examples/ps_fashion_mnist                     # 1 server + 4 workers, one process
//   mpirun -np 5 build/release/examples/ps_fashion_mnist        # the same as 5 processes
//
//   ps_fashion_mnist [--modes async,sync,sync-backup,staleness] [--workers W] [--epochs N]
//                    [--segments N] [--straggler-factor X] [--target A] [--out-dir DIR] [--quick]
//                    [--min-accuracy A] [--batch-size B] [--lr X] [--seed S] [--data DIR]
//
// Writes DIR/ps_fashion_mnist.csv (mode, seconds, accuracy), DIR/ps_fashion_mnist.svg (test
// accuracy against wall time, one curve per mode) and DIR/ps_step_times.csv (every worker's measured
// step times: mode, worker, step, seconds, for the simulator, flowlet/ps_simulator.hpp), and prints
// the time each mode took to reach --target test accuracy and its counters.
//
// In one process, sync with a backup runs W + 1 workers (the first W pushes of a step count) and the
// workers of a segment take batches from one shared counter, so a fast worker takes more of them
// than the straggler. Under mpirun the workers are the processes that do not serve (W = np - 1 in
// every mode; sync-backup makes one of them the backup), and worker w of W takes every W-th batch.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <flowlet/collective.hpp>
#include <flowlet/data/fashion_mnist.hpp>
#include <flowlet/flowlet.hpp>
#include <flowlet/parameter_server.hpp>

#include "fashion_mnist_mlp.hpp"
#include "svg_chart.hpp"
#include "error_text.hpp"

namespace fl = flowlet;

namespace {

struct Options : examples::TrainingOptions {  // epochs, batch_size, lr, seed, data
  std::vector<std::string> modes{"async", "sync", "sync-backup", "staleness"};
  int workers = 4;
  int segments = 5;  // evaluations per epoch
  double straggler_factor = 3;
  double target = 0.85;
  std::string out_dir = "build/ps_fashion_mnist";
  bool quick = false;  // a short run for tests: 60 batches per mode in 3 segments, a 2,000-image test set
  double min_accuracy = 0;  // exit 1 when a mode ends below this test accuracy (the test run's check)
};

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ',');) {
    if (!part.empty()) parts.push_back(part);
  }
  return parts;
}

Options parse(int argc, char** argv) {
  Options o;
  o.epochs = 3;
  examples::parse_options(argc, argv, "ps_fashion_mnist", o, [&](const std::string& arg, auto& value) {
    if (arg == "--modes") o.modes = split(value());
    else if (arg == "--workers") o.workers = std::stoi(value());
    else if (arg == "--segments") o.segments = std::stoi(value());
    else if (arg == "--straggler-factor") o.straggler_factor = std::stod(value());
    else if (arg == "--target") o.target = std::stod(value());
    else if (arg == "--out-dir") o.out_dir = value();
    else if (arg == "--quick") o.quick = true;
    else if (arg == "--min-accuracy") o.min_accuracy = std::stod(value());
    else return false;
    return true;
  });
  if (o.epochs < 1 || o.batch_size < 1 || o.workers < 1 || o.segments < 1 || !(o.straggler_factor >= 1) ||
      o.modes.empty()) {
    throw fl::InvalidArgument(fmt::format(
        "ps_fashion_mnist: epochs, batch size, workers, segments must be >= 1, straggler factor >= 1, modes "
        "non-empty; got {}, {}, {}, {}, {}, {} modes",
        o.epochs, o.batch_size, o.workers, o.segments, o.straggler_factor, o.modes.size()));
  }
  for (const std::string& mode : o.modes) {
    if (mode != "async" && mode != "sync" && mode != "sync-backup" && mode != "staleness") {
      throw fl::InvalidArgument("ps_fashion_mnist: --modes takes async, sync, sync-backup, staleness; got " + mode);
    }
  }
  return o;
}

fl::ParameterServerOptions strategy_options(const Options& o, const std::string& mode) {
  fl::ParameterServerOptions options;
  options.num_servers = 1;
  const bool processes = fl::process_count() > 1;
  options.num_workers = processes ? fl::process_count() - 1 : o.workers;
  if (mode == "async") {
    options.mode = fl::TrainingMode::async;
  } else if (mode == "sync") {
    options.mode = fl::TrainingMode::sync;
  } else if (mode == "sync-backup") {
    options.mode = fl::TrainingMode::sync;
    options.backup_workers = 1;
    if (!processes) options.num_workers += 1;  // W pushes count, one more worker runs
  } else {
    options.mode = fl::TrainingMode::bounded_staleness;
    options.staleness = 2;
  }
  options.faults.step_delay = fl::StepDelay::straggler(/*worker=*/0, o.straggler_factor);
  return options;
}

std::string label(const std::string& mode) {
  if (mode == "sync-backup") return "sync + 1 backup";
  if (mode == "staleness") return "staleness 2";
  return mode;
}

// The counters of one mode, summed over its segments' runs.
struct ModeTotals {
  int64_t applied = 0, dropped = 0, max_staleness = 0;
  std::vector<int64_t> staleness_histogram;
  std::vector<int64_t> worker_steps;
  std::vector<std::vector<double>> worker_step_seconds;

  void add(const fl::ParameterServerStats& stats) {
    applied += stats.updates_applied;
    dropped += stats.updates_dropped;
    max_staleness = std::max(max_staleness, stats.max_staleness);
    if (staleness_histogram.size() < stats.staleness_histogram.size()) {
      staleness_histogram.resize(stats.staleness_histogram.size());
    }
    for (size_t s = 0; s < stats.staleness_histogram.size(); ++s) staleness_histogram[s] += stats.staleness_histogram[s];
    for (const fl::WorkerStats& w : stats.workers) {
      const auto i = static_cast<size_t>(w.worker);
      if (worker_steps.size() <= i) worker_steps.resize(i + 1), worker_step_seconds.resize(i + 1);
      worker_steps[i] += w.steps;
      worker_step_seconds[i].insert(worker_step_seconds[i].end(), w.step_seconds.begin(), w.step_seconds.end());
    }
  }

  std::string text() const {
    std::vector<int64_t> histogram = staleness_histogram;
    while (!histogram.empty() && histogram.back() == 0) histogram.pop_back();
    std::string out = fmt::format("  updates applied {}, dropped {} ({:.1f}%), max staleness {}, staleness histogram [{}]\n",
                                  applied, dropped, applied + dropped > 0 ? 100.0 * dropped / (applied + dropped) : 0.0,
                                  max_staleness, fmt::join(histogram, " "));
    for (size_t w = 0; w < worker_steps.size(); ++w) {
      const auto& s = worker_step_seconds[w];
      double mean = 0;
      for (double x : s) mean += x;
      mean = s.empty() ? 0 : mean / static_cast<double>(s.size());
      out += fmt::format("  worker {}{}: {} steps, mean step {:.2f} ms\n", w, w == 0 ? " (straggler)" : "",
                         worker_steps[w], mean * 1e3);
    }
    return out;
  }
};

struct Curve {
  std::string mode;
  std::vector<double> seconds, accuracy;
  std::optional<double> time_to_target;
  double training_seconds = 0;
};

int run(const Options& o) {
  const bool leader = fl::process_index() == 0;
  auto say = [&](const std::string& text) {
    if (leader) std::fputs(text.c_str(), stdout), std::fflush(stdout);
  };
  const fl::data::Dataset train = fl::data::load_fashion_mnist("train", o.data);
  fl::data::Dataset test = fl::data::load_fashion_mnist("test", o.data);
  if (o.quick) test = {fl::slice(test.images, 0, 0, 2000), fl::slice(test.labels, 0, 0, 2000)};
  fl::data::Batches batches(train, o.batch_size, o.seed, /*drop_last=*/true);

  // The segments every mode runs: [begin, end) batch ranges of one epoch each.
  struct Segment {
    int epoch;
    int64_t begin, end;
  };
  std::vector<Segment> segments;
  if (o.quick) {
    for (int s = 0; s < 3; ++s) segments.push_back({0, s * 20, (s + 1) * 20});
  } else {
    for (int e = 0; e < o.epochs; ++e) {
      for (int s = 0; s < o.segments; ++s) {
        segments.push_back({e, batches.size() * s / o.segments, batches.size() * (s + 1) / o.segments});
      }
    }
  }
  int64_t total_batches = 0;
  for (const Segment& segment : segments) total_batches += segment.end - segment.begin;
  say(fmt::format("{} modes, {} batches of {} each ({} segments), worker 0 {}x slower; {}\n", o.modes.size(),
                  total_batches, o.batch_size, segments.size(), o.straggler_factor,
                  fl::process_count() > 1 ? fmt::format("{} processes: 1 server + {} workers", fl::process_count(),
                                                        fl::process_count() - 1)
                                          : fmt::format("one process: 1 server + {} worker threads", o.workers)));

  std::filesystem::create_directories(o.out_dir);
  std::ofstream csv, steps_csv;
  if (leader) {
    csv.open(o.out_dir + "/ps_fashion_mnist.csv");
    csv << "mode,seconds,accuracy\n";
    steps_csv.open(o.out_dir + "/ps_step_times.csv");
    steps_csv << "mode,worker,step,seconds\n";
  }
  std::vector<Curve> curves;
  for (const std::string& mode : o.modes) {
    fl::ParameterServerStrategy ps(strategy_options(o, mode));
    fl::nn::Sequential model;
    {
      auto scope = ps.scope();
      examples::build_model(model, o.seed);  // the same initial weights in every mode
    }
    const std::vector<fl::Variable> params = model.parameters();
    say(fmt::format("\n{}: {} workers{}\n", label(mode), ps.num_workers(),
                    mode == "sync-backup" ? fmt::format(" (steps complete with the first {})", ps.num_workers() - 1) : ""));

    Curve curve{mode, {0.0}, {examples::accuracy(model, test)}, std::nullopt, 0};
    ModeTotals totals;
    int shuffled_epoch = -1;
    for (const Segment& segment : segments) {
      if (segment.epoch != shuffled_epoch) batches.reshuffle(static_cast<uint64_t>(segment.epoch)), shuffled_epoch = segment.epoch;
      std::atomic<int64_t> next{segment.begin};  // in one process: the workers share the segment's batches
      const auto start = std::chrono::steady_clock::now();
      const fl::ParameterServerStats stats = ps.run(
          [&] { return std::make_unique<fl::optim::Adam>(o.lr); },
          [&](fl::ps::Worker& worker) {
            auto step = fl::trace([&](fl::Tensor images, fl::Tensor labels) {
              fl::GradientTape tape;
              const fl::Tensor loss = fl::mean(fl::softmax_cross_entropy(model(images), labels));
              worker.apply_gradients(tape.gradient(loss, params), params);
              return loss;
            });
            const bool shared = ps.in_process();
            for (int64_t k = 0; !worker.should_stop(); ++k) {
              const int64_t i = shared ? next.fetch_add(1) : segment.begin + worker.index() + k * worker.num_workers();
              if (i >= segment.end) break;
              const fl::data::Dataset batch = batches[i];
              (void)step(batch.images, batch.labels);
            }
          });
      curve.training_seconds += examples::seconds_since(start);
      totals.add(stats);
      const double accuracy = examples::accuracy(model, test);  // the servers' values, copied back by run()
      curve.seconds.push_back(curve.training_seconds);
      curve.accuracy.push_back(accuracy);
      if (!curve.time_to_target && accuracy >= o.target) curve.time_to_target = curve.training_seconds;
      say(fmt::format("  {:7.2f} s  epoch {} batches [{}, {})  test accuracy {:.4f}\n", curve.training_seconds,
                      segment.epoch + 1, segment.begin, segment.end, accuracy));
      if (leader) {
        csv << fmt::format("{},{:.3f},{:.4f}\n", mode, curve.training_seconds, accuracy);
        for (const fl::WorkerStats& w : stats.workers) {
          for (size_t k = 0; k < w.step_seconds.size(); ++k) {
            steps_csv << fmt::format("{},{},{},{:.6f}\n", mode, w.worker, k, w.step_seconds[k]);
          }
        }
      }
    }
    say(totals.text());
    curves.push_back(std::move(curve));
  }

  if (leader) {
    const std::vector<std::string> colors{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e"};
    std::vector<examples::XYSeries> series;
    for (size_t c = 0; c < curves.size(); ++c) {
      // From the first evaluation after training started: the untrained model's accuracy (in the
      // CSV at 0 s) would squeeze the curves into the top of the chart.
      const Curve& curve = curves[c];
      series.push_back({label(curve.mode), colors[c % colors.size()], {curve.seconds.begin() + 1, curve.seconds.end()},
                        {curve.accuracy.begin() + 1, curve.accuracy.end()}});
    }
    examples::write_svg_xy_chart(
        o.out_dir + "/ps_fashion_mnist.svg",
        fmt::format("Fashion-MNIST MLP, parameter servers: {} workers, worker 0 {}x slower",
                    fl::process_count() > 1 ? fl::process_count() - 1 : o.workers, o.straggler_factor),
        "training wall time (s)", "test accuracy", series, o.target);
  }
  say(fmt::format("\ntime to {:.2f} test accuracy (training wall time; evaluations not counted):\n", o.target));
  for (const Curve& c : curves) {
    say(fmt::format("  {:<16} {}   (all {} batches: {:.2f} s, final accuracy {:.4f})\n", label(c.mode),
                    c.time_to_target ? fmt::format("{:7.2f} s", *c.time_to_target) : std::string("not reached"),
                    total_batches, c.training_seconds, c.accuracy.back()));
  }
  say(fmt::format("curves: {0}/ps_fashion_mnist.csv, {0}/ps_fashion_mnist.svg; step times: {0}/ps_step_times.csv\n",
                  o.out_dir));
  for (const Curve& c : curves) {
    if (c.accuracy.back() < o.min_accuracy) {
      std::fprintf(stderr, "ps_fashion_mnist: %s ended at test accuracy %.4f, below --min-accuracy %.4f\n",
                   label(c.mode).c_str(), c.accuracy.back(), o.min_accuracy);
      return 1;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return examples::run_reporting_errors("ps_fashion_mnist", [&] {
    const Options options = parse(argc, argv);
    return run(options);
  });
}
