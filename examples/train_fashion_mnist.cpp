// The main job of `make demo`: an MLP (784-256-10, ReLU, Adam) trained on Fashion-MNIST with a
// GradientTape, the whole step (forward, backward, update) traced into one graph (--eager runs it
// eagerly instead; before training, both are timed on a scratch model), evaluated after every
// epoch, checkpointed every epoch (resumable with --resume), with per-epoch figures written to a
// CSV and drawn as an SVG. --model cnn trains the small CNN of fashion_mnist_cnn.hpp instead (two
// conv/pool blocks + dense; 8 epochs by default), evaluated by a graph traced in inference mode.
// Both print the first epoch whose test accuracy reaches --target (0.91 for the CNN, 0.88 for the
// MLP) with the wall seconds since training started (evaluations included).
//
//   train_fashion_mnist [--model mlp|cnn] [--epochs N] [--batch-size B] [--lr X] [--seed S]
//                       [--resume] [--eager] [--compare-steps N] [--max-steps N] [--target A]
//                       [--test-examples N] [--stop-at-target] [--prefetch N] [--out DIR] [--data DIR]
// --max-steps: at most N steps per epoch; --test-examples: evaluate on the first N test images
// (short runs: the example's test, examples/demo_cnn_check.py); --prefetch: batches built ahead on
// a background thread (default 4; 0 builds each batch on the training thread, same order).
// The "training:" line splits the seconds as benchmarks/training/time_to_accuracy.sh compares
// them: training loops without evaluations, the first step of each epoch and batch shape apart.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <flowlet/data/fashion_mnist.hpp>
#include <flowlet/flowlet.hpp>

#include "fashion_mnist_cnn.hpp"
#include "fashion_mnist_mlp.hpp"
#include "svg_chart.hpp"
#include "error_text.hpp"

namespace fl = flowlet;

namespace {

struct Options : examples::TrainingOptions {  // epochs, batch_size, lr, seed, data
  std::string model = "mlp";  // or "cnn"
  bool resume = false;
  int64_t max_steps = 0;      // steps per epoch at most (0: all)
  int64_t test_examples = 0;  // evaluate on the first N test images (0: all)
  bool stop_at_target = false;  // end after the first epoch at the target (time-to-accuracy runs)
  double target = 0.0;        // 0: the model's default (cnn 0.91, mlp 0.88)
  bool eager = false;       // --eager: run the training step eagerly instead of as a traced graph
  int compare_steps = -1;   // steps timed both ways on a scratch model before training (0: skip; default mlp 100, cnn 20)
  int64_t prefetch = 4;  // batches built ahead on a background thread (0: built by the training thread)
  std::string out;  // default build/demo (mlp) or build/demo-cnn (cnn)
  bool cnn() const { return model == "cnn"; }
};

Options parse(int argc, char** argv) {
  Options o;
  bool explicit_epochs = false;
  for (int i = 1; i < argc; ++i) explicit_epochs = explicit_epochs || std::string(argv[i]) == "--epochs";
  examples::parse_options(argc, argv, "train_fashion_mnist", o, [&](const std::string& arg, auto& value) {
    if (arg == "--model") o.model = value();
    else if (arg == "--max-steps") o.max_steps = std::stoll(value());
    else if (arg == "--target") o.target = std::stod(value());
    else if (arg == "--test-examples") o.test_examples = std::stoll(value());
    else if (arg == "--stop-at-target") o.stop_at_target = true;
    else if (arg == "--resume") o.resume = true;
    else if (arg == "--eager") o.eager = true;
    else if (arg == "--compare-steps") o.compare_steps = std::stoi(value());
    else if (arg == "--out") o.out = value();
    else if (arg == "--prefetch") o.prefetch = std::stoll(value());
    else return false;
    return true;
  });
  if (o.model != "mlp" && o.model != "cnn") {
    throw fl::InvalidArgument("train_fashion_mnist: --model takes mlp or cnn; got '" + o.model + "'");
  }
  if (!explicit_epochs && o.cnn()) o.epochs = 8;
  if (o.epochs < 1 || o.batch_size < 1) throw fl::InvalidArgument("train_fashion_mnist: epochs and batch size must be >= 1");
  if (o.max_steps < 0 || o.test_examples < 0 || o.prefetch < 0) {
    throw fl::InvalidArgument("train_fashion_mnist: --max-steps, --test-examples and --prefetch must be >= 0");
  }
  if (o.out.empty()) o.out = o.cnn() ? "build/demo-cnn" : "build/demo";
  if (o.compare_steps < 0) o.compare_steps = o.cnn() ? 20 : 100;
  if (o.target <= 0.0) o.target = o.cnn() ? 0.91 : 0.88;
  return o;
}

using examples::make_step;
using examples::seconds_since;

void build(fl::nn::Sequential& model, const Options& o) {
  if (o.cnn()) {
    examples::build_cnn(model, o.seed);
  } else {
    examples::build_model(model, o.seed);
  }
}

void progress(int epoch, int epochs, int64_t done, int64_t total, double loss, double images_per_second) {
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(kWidth * done / std::max<int64_t>(total, 1));
  std::fprintf(stdout, "\repoch %d/%d [%s%s] %lld/%lld  loss %.4f  %.0f images/s", epoch, epochs,
               std::string(filled, '#').c_str(), std::string(kWidth - filled, '.').c_str(),
               static_cast<long long>(done), static_cast<long long>(total), loss, images_per_second);
  std::fflush(stdout);
}

// Times the training step eagerly and traced, each on a scratch model of its own (the real one is
// untouched), in interleaved rounds (eager then traced, then traced then eager, ...) so that a
// load change on a shared machine hits both modes alike, and prints each mode's median per-step
// time over the rounds with the range of the rounds.
void compare_eager_and_traced(const fl::data::Dataset& train, const Options& o, int64_t steps_per_epoch) {
  struct Contender {
    fl::nn::Sequential model;
    std::unique_ptr<fl::optim::Adam> optimizer;
    std::function<fl::Tensor(fl::Tensor, fl::Tensor)> step;
    std::vector<double> round_seconds;  // per step, one entry per round
  };
  auto make_contender = [&](bool traced) {
    auto c = std::make_unique<Contender>();
    build(c->model, o);
    c->optimizer = std::make_unique<fl::optim::Adam>(o.lr);
    auto step = make_step(c->model, *c->optimizer, c->model.parameters());
    if (traced) {
      c->step = fl::trace(step);
    } else {
      c->step = step;
    }
    return c;
  };
  const std::unique_ptr<Contender> eager = make_contender(false), traced = make_contender(true);
  fl::data::Batches batches(train, o.batch_size, o.seed);
  auto it = batches.begin();
  auto next_batch = [&] {  // cycles through the epoch's batches
    if (it == batches.end()) it = batches.begin();
    fl::data::Dataset batch = *it;
    ++it;
    return batch;
  };
  auto run_steps = [&](Contender& c, int steps) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) {
      const fl::data::Dataset b = next_batch();
      (void)c.step(b.images, b.labels).item<float>();
    }
    return seconds_since(start) / steps;
  };
  run_steps(*eager, 1);  // warm-up; the traced contender's first call traces
  run_steps(*traced, 1);
  const int rounds = std::min(5, o.compare_steps);
  const int steps_per_round = std::max(1, o.compare_steps / rounds);
  for (int round = 0; round < rounds; ++round) {
    Contender& first = round % 2 == 0 ? *eager : *traced;
    Contender& second = round % 2 == 0 ? *traced : *eager;
    first.round_seconds.push_back(run_steps(first, steps_per_round));
    second.round_seconds.push_back(run_steps(second, steps_per_round));
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 == 1 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  };
  const auto& e = eager->round_seconds;
  const auto& t = traced->round_seconds;
  const double eager_step = median(e), traced_step = median(t);
  fmt::print("step time over {} steps ({} interleaved rounds of {}, median): eager {:.2f} ms, traced {:.2f} ms "
             "({:.2f}x; rounds eager {:.2f}-{:.2f}, traced {:.2f}-{:.2f} ms); an epoch of {} steps: eager {:.1f} s, "
             "traced {:.1f} s\n",
             rounds * steps_per_round, rounds, steps_per_round, eager_step * 1e3, traced_step * 1e3,
             eager_step / traced_step, *std::min_element(e.begin(), e.end()) * 1e3,
             *std::max_element(e.begin(), e.end()) * 1e3, *std::min_element(t.begin(), t.end()) * 1e3,
             *std::max_element(t.begin(), t.end()) * 1e3, steps_per_epoch,
             eager_step * static_cast<double>(steps_per_epoch), traced_step * static_cast<double>(steps_per_epoch));
}

int run(const Options& o) {
  const fl::data::Dataset train = fl::data::load_fashion_mnist("train", o.data);
  fl::data::Dataset test = fl::data::load_fashion_mnist("test", o.data);
  if (o.test_examples > 0 && o.test_examples < test.labels.shape()[0]) {
    test = {fl::slice(test.images, 0, 0, o.test_examples), fl::slice(test.labels, 0, 0, o.test_examples)};
  }

  fl::nn::Sequential model;
  build(model, o);
  const std::vector<fl::Variable> params = model.parameters();
  fl::optim::Adam optimizer(o.lr);
  optimizer.build(params);

  std::vector<fl::Variable> state = model.variables();  // everything a checkpoint holds: parameters, buffers
  const auto slots = optimizer.variables();
  state.insert(state.end(), slots.begin(), slots.end());
  std::filesystem::create_directories(o.out);
  fl::CheckpointManager checkpoints(o.out + "/checkpoints", /*max_to_keep=*/3);
  int first_epoch = 1;
  if (o.resume) {
    const int64_t step = checkpoints.restore_latest(state);
    if (step >= 0) first_epoch = static_cast<int>(step) + 1;
    fmt::print("resumed from epoch {} ({})\n", first_epoch - 1, step >= 0 ? *checkpoints.latest() : "no checkpoint");
  }

  fl::data::Batches batches(train, o.batch_size, o.seed);
  if (o.compare_steps > 0) compare_eager_and_traced(train, o, batches.size());
  // Traced by default: the first batch of each shape traces the step into a graph (a smaller last
  // batch traces once more), later batches run the cached graph.
  auto eager_step = make_step(model, optimizer, params);
  fl::TraceOptions trace_options;
  trace_options.name = "training step";
  auto traced_step = fl::trace(eager_step, trace_options);
  examples::TracedAccuracy accuracy(model);  // traced in inference mode at its first call
  fmt::print("model: {}\n", o.cnn() ? "CNN conv5x5(32)-bn-relu-pool-conv5x5(64)-bn-relu-pool-dense(10)" : "MLP 784-256-10");
  fmt::print("training step: {}\n", o.eager ? "eager (--eager)" : "traced into a graph (--eager to compare)");
  std::vector<examples::Series> curves{{"train loss", "#d62728", {}}, {"test accuracy", "#1f77b4", {}}};
  const std::string stem = o.out + (o.cnn() ? "/fashion_mnist_cnn" : "/fashion_mnist");
  std::ofstream csv(stem + ".csv");
  csv << "epoch,train_loss,test_accuracy,seconds,images_per_second\n";
  const auto start = std::chrono::steady_clock::now();
  double final_accuracy = 0.0;
  int64_t images = 0;
  std::optional<std::pair<int, double>> reached;  // first epoch at the target, seconds since start
  // Time to accuracy split as time_to_accuracy.sh compares it: the training loops without the
  // evaluations, and the first step of each epoch and of each batch shape apart.
  double train_seconds = 0.0, first_step_seconds = 0.0, eval_seconds = 0.0;
  std::set<int64_t> traced_batch_sizes;
  for (int epoch = first_epoch; epoch <= o.epochs; ++epoch) {
    const auto epoch_start = std::chrono::steady_clock::now();
    double loss_sum = 0.0;
    int64_t seen = 0, step = 0;
    // A background thread shuffles and batches (epoch e's order is batches.reshuffle(e)) into a
    // queue of depth 4 while the step trains: batching overlaps training, and when training is the
    // slower side the full queue holds the producer back.
    std::optional<fl::data::Prefetcher> prefetch;
    if (o.prefetch > 0) {
      prefetch.emplace(batches, fl::data::PrefetchOptions{.depth = o.prefetch, .epochs = 1,
                                                          .first_epoch = static_cast<uint64_t>(epoch)});
    } else {
      batches.reshuffle(static_cast<uint64_t>(epoch));
    }
    const int64_t steps = o.max_steps > 0 ? std::min(o.max_steps, batches.size()) : batches.size();
    while (step < steps) {
      const std::optional<fl::data::Dataset> next = prefetch ? prefetch->next() : std::optional(batches[step]);
      if (!next) break;
      const fl::data::Dataset& batch = *next;
      const int64_t n = batch.labels.shape()[0];
      // Timed apart: the first step of a batch shape (traced there) and of an epoch (after the
      // evaluation), the steps where the compiling peers compile or recompile.
      const bool first_of_shape = traced_batch_sizes.insert(n).second || step == 0;
      const auto step_start = std::chrono::steady_clock::now();
      const fl::Tensor loss = o.eager ? eager_step(batch.images, batch.labels) : traced_step(batch.images, batch.labels);
      loss_sum += loss.item<float>() * static_cast<double>(n);
      if (first_of_shape) first_step_seconds += seconds_since(step_start);
      seen += n;
      if (++step % 50 == 0 || step == steps) {
        progress(epoch, o.epochs, seen, train.labels.shape()[0], loss_sum / static_cast<double>(seen),
                 static_cast<double>(seen) / seconds_since(epoch_start));
      }
    }
    images += seen;
    const double epoch_seconds = seconds_since(epoch_start);
    train_seconds += epoch_seconds;
    const auto eval_start = std::chrono::steady_clock::now();
    final_accuracy = accuracy(test);
    eval_seconds += seconds_since(eval_start);
    if (!reached && final_accuracy >= o.target) reached = {{epoch, seconds_since(start)}};
    const double train_loss = loss_sum / static_cast<double>(seen);
    fmt::print("  test accuracy {:.4f}  ({:.1f} s)\n", final_accuracy, epoch_seconds);
    csv << fmt::format("{},{:.6f},{:.6f},{:.3f},{:.0f}\n", epoch, train_loss, final_accuracy, epoch_seconds,
                       static_cast<double>(seen) / epoch_seconds);
    csv.flush();
    curves[0].values.push_back(train_loss);
    curves[1].values.push_back(final_accuracy);
    checkpoints.save(state, epoch);
    if (o.stop_at_target && reached) break;
  }
  const double total = seconds_since(start);
  examples::write_svg_chart(stem + ".svg",
                            o.cnn() ? "flowlet: CNN on Fashion-MNIST (Adam)" : "flowlet: MLP 784-256-10 on Fashion-MNIST (Adam)",
                            curves);
  if (first_epoch > o.epochs) final_accuracy = accuracy(test);
  fmt::print("curves: {0}.csv and {0}.svg\n", stem);
  if (reached) {
    fmt::print("time to {:.2f}: epoch {} after {:.1f} s\n", o.target, reached->first, reached->second);
  } else {
    fmt::print("time to {:.2f}: not reached in this run\n", o.target);
  }
  fmt::print("training: {:.3f} s without evaluations and first steps; first step of each epoch and batch shape {:.3f} s; "
             "evaluations {:.3f} s\n",
             train_seconds - first_step_seconds, first_step_seconds, eval_seconds);
  fmt::print("final: test_accuracy={:.4f} epochs={} seconds={:.1f} images_per_second={:.0f}\n", final_accuracy,
             o.epochs, total, total > 0 ? static_cast<double>(images) / total : 0.0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return examples::run_reporting_errors("train_fashion_mnist", [&] { return run(parse(argc, argv)); });
}
