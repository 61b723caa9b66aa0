// A click-through-style model trained with ParameterServerStrategy: four categorical features with
// ids in large vocabularies, one embedding table for all of them split by rows over the servers, a
// small MLP on the concatenated embeddings, and Adagrad (a user optimizer, written below from public
// ops, that runs on the servers beside each shard). Each worker's step is traced; gather() on the
// table pulls only the rows of the batch's unique ids and pushes their gradients back as rows.
//
// The data come from a known ground-truth model (a hidden embedding table and a logistic layer;
// labels drawn as Bernoulli of its probability), so the test accuracy and AUC can be compared with
// the ground truth's own on the same test set: the best any model can do.
//
//   build/release/examples/ps_embedding                         # 2 servers + 4 workers, one process
//   mpirun -np 6 build/release/examples/ps_embedding            # the same as 6 processes
//
//   ps_embedding [--servers S] [--workers W] [--mode async|sync|sync-backup|staleness] [--staleness K]
//                [--steps N] [--batch-size B] [--vocab V] [--dim D] [--lr X] [--seed S] [--min-auc A]
//                [--checkpoint-dir DIR [--checkpoint-every-steps N] [--checkpoint-every-seconds X]
//                 [--keep N] [--resume]]
//
// Checkpoints (examples/checkpoint_flags.hpp): with --checkpoint-dir the job runs in chunks, each
// one run() of the strategy in which every worker takes up to N more steps (or until X seconds,
// default 30, have passed: the first worker past it stops them all); between chunks, with the
// servers quiet, the table, the MLP, the servers' Adagrad accumulators and every worker's next step
// are saved. Checkpoint S holds the state after S worker steps in all. --resume restores the latest
// complete checkpoint and continues each worker's own sequence of batches (worker w's step i always
// reads batch (w, i)); it works with another number of servers (rows re-sharded), while another
// number of workers is refused (their data positions would not map). --steps counts each worker's
// steps in all, resumed ones included.
//
// Ids are Zipf-distributed (a few ids are frequent, most are rare), as in click logs; rare ids are
// seen too seldom to learn, which is part of the gap to the ground truth.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include <flowlet/collective.hpp>
#include <flowlet/flowlet.hpp>
#include <flowlet/parameter_server.hpp>

#include "checkpoint_flags.hpp"
#include "error_text.hpp"

namespace fl = flowlet;

namespace {

constexpr int kFeatures = 4;
constexpr int kTrueDim = 4;

struct Options {
  int servers = 2;
  int workers = 4;  // in one process; under mpirun the processes that do not serve
  std::string mode = "async";
  int staleness = 2;
  int64_t steps = 1000;  // per worker
  int64_t batch_size = 256;
  int64_t vocab = 100'000;  // per feature
  int64_t dim = 8;          // learned embedding width
  double lr = 0.1;
  uint64_t seed = 1;
  double min_auc = 0;  // exit 1 below this test AUC (the test run's check that it learned)
  examples::CheckpointFlags checkpoints;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw fl::InvalidArgument("ps_embedding: " + arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--servers") o.servers = std::stoi(value());
    else if (arg == "--workers") o.workers = std::stoi(value());
    else if (arg == "--mode") o.mode = value();
    else if (arg == "--staleness") o.staleness = std::stoi(value());
    else if (arg == "--steps") o.steps = std::stoll(value());
    else if (arg == "--batch-size") o.batch_size = std::stoll(value());
    else if (arg == "--vocab") o.vocab = std::stoll(value());
    else if (arg == "--dim") o.dim = std::stoll(value());
    else if (arg == "--lr") o.lr = std::stod(value());
    else if (arg == "--seed") o.seed = std::stoull(value());
    else if (arg == "--min-auc") o.min_auc = std::stod(value());
    else if (!o.checkpoints.parse("ps_embedding", arg, value))
      throw fl::InvalidArgument("ps_embedding: unknown option " + arg);
  }
  if (o.servers < 1 || o.workers < 1 || o.steps < 1 || o.batch_size < 1 || o.vocab < 2 || o.dim < 1 || !(o.lr > 0) ||
      o.staleness < 0) {
    throw fl::InvalidArgument(fmt::format(
        "ps_embedding: servers, workers, steps, batch size, dim must be >= 1, vocab >= 2, lr > 0, staleness >= 0; "
        "got {} {} {} {} {}, {}, {}, {}",
        o.servers, o.workers, o.steps, o.batch_size, o.dim, o.vocab, o.lr, o.staleness));
  }
  o.checkpoints.check("ps_embedding");
  return o;
}

// Adagrad: acc += g^2; w -= lr g / (sqrt(acc) + eps). Written from public ops, as a user would;
// on the servers a sparse push runs it on the pushed rows of the shard and of `acc` only.
class Adagrad : public fl::optim::Optimizer {
 public:
  explicit Adagrad(double lr, double eps = 1e-7) : Optimizer("adagrad"), lr_(lr), eps_(eps) {}

 protected:
  std::vector<std::string> slot_names() const override { return {"accumulator"}; }
  void update(fl::Variable& var, const fl::Tensor& grad) override {
    fl::Variable& acc = slot(var, "accumulator");
    acc.assign_add(fl::square(grad));
    var.assign_sub(lr_ * grad / (fl::sqrt(acc.value()) + eps_));
  }

 private:
  double lr_, eps_;
};

// splitmix64: the same numbers on every platform and process (every process builds the same data).
struct Random {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53; }  // in (0, 1)
  double normal() { return std::sqrt(-2 * std::log(uniform())) * std::cos(6.283185307179586 * uniform()); }
};

// The ground truth: a hidden table of kTrueDim numbers per id and a logistic layer on their
// concatenation. Rows of feature f's id k are f * vocab + k, in the true and in the learned table.
struct GroundTruth {
  int64_t vocab;
  std::vector<float> table;  // [kFeatures * vocab, kTrueDim]
  std::vector<double> weights;
  double bias = 0.3;

  GroundTruth(int64_t vocab_size, uint64_t seed) : vocab(vocab_size) {
    Random random{seed * 7919 + 17};
    table.resize(static_cast<size_t>(kFeatures * vocab * kTrueDim));
    for (float& v : table) v = static_cast<float>(random.normal());
    weights.resize(kFeatures * kTrueDim);
    const double scale = 2.5 / std::sqrt(static_cast<double>(weights.size()));  // logits of spread 2.5
    for (double& w : weights) w = random.normal() * scale;
  }

  // A Zipf-distributed id (P(k) ~ 1/(k+1)), scattered over the vocabulary by a multiplication
  // modulo vocab (2654435761 is prime, so it permutes) so that frequent ids land on every shard.
  int64_t draw_id(Random& random) const {
    const auto rank = static_cast<int64_t>(std::exp(random.uniform() * std::log(static_cast<double>(vocab) + 1)) - 1);
    const auto k = static_cast<unsigned __int128>(std::clamp<int64_t>(rank, 0, vocab - 1));
    return static_cast<int64_t>((k * 2654435761u) % static_cast<unsigned __int128>(vocab));
  }

  double probability(const int64_t* rows) const {
    double logit = bias;
    for (int f = 0; f < kFeatures; ++f) {
      const float* e = &table[static_cast<size_t>(rows[f] * kTrueDim)];
      for (int d = 0; d < kTrueDim; ++d) logit += weights[static_cast<size_t>(f * kTrueDim + d)] * e[d];
    }
    return 1 / (1 + std::exp(-logit));
  }

  struct Batch {
    fl::Tensor ids;     // i64 [n, kFeatures]: rows of the table
    fl::Tensor labels;  // i64 [n]
    std::vector<double> true_probability;
    std::vector<int64_t> label_values;
  };
  Batch sample(int64_t n, uint64_t stream) const {
    Random random{stream * 0x2545f4914f6cdd1dULL + 1};
    std::vector<int64_t> ids(static_cast<size_t>(n * kFeatures)), labels(static_cast<size_t>(n));
    Batch batch;
    batch.true_probability.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      int64_t* row = &ids[static_cast<size_t>(i * kFeatures)];
      for (int f = 0; f < kFeatures; ++f) row[f] = f * vocab + draw_id(random);
      const double p = probability(row);
      batch.true_probability[static_cast<size_t>(i)] = p;
      labels[static_cast<size_t>(i)] = random.uniform() < p ? 1 : 0;
    }
    batch.ids = fl::tensor(ids, fl::Shape{n, kFeatures});
    batch.labels = fl::tensor(labels, fl::Shape{n});
    batch.label_values = std::move(labels);
    return batch;
  }
};

// Area under the ROC curve: the chance that a random positive scores above a random negative (ties
// count half), from the rank sum of the positives.
double auc(const std::vector<double>& scores, const std::vector<int64_t>& labels) {
  std::vector<size_t> order(scores.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  double positive_rank_sum = 0;
  int64_t positives = 0;
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j < order.size() && scores[order[j]] == scores[order[i]]) ++j;
    const double mean_rank = (static_cast<double>(i) + static_cast<double>(j - 1)) / 2 + 1;  // ties share
    for (size_t k = i; k < j; ++k) {
      if (labels[order[k]] == 1) positive_rank_sum += mean_rank, ++positives;
    }
    i = j;
  }
  const auto negatives = static_cast<int64_t>(scores.size()) - positives;
  if (positives == 0 || negatives == 0) return 0.5;
  const double p = static_cast<double>(positives), q = static_cast<double>(negatives);
  return (positive_rank_sum - p * (p + 1) / 2) / (p * q);
}

double accuracy(const std::vector<double>& scores, const std::vector<int64_t>& labels) {
  int64_t correct = 0;
  for (size_t i = 0; i < scores.size(); ++i) correct += (scores[i] > 0.5) == (labels[i] == 1);
  return static_cast<double>(correct) / static_cast<double>(scores.size());
}

fl::ParameterServerOptions strategy_options(const Options& o) {
  fl::ParameterServerOptions options;
  options.num_servers = o.servers;
  // Under mpirun every process that does not serve works; in one process, o.workers threads.
  options.num_workers = fl::process_count() > 1 ? fl::process_count() - o.servers : o.workers;
  if (o.mode == "async") {
    options.mode = fl::TrainingMode::async;
  } else if (o.mode == "sync") {
    options.mode = fl::TrainingMode::sync;
  } else if (o.mode == "sync-backup") {
    options.mode = fl::TrainingMode::sync;
    options.backup_workers = 1;
  } else if (o.mode == "staleness") {
    options.mode = fl::TrainingMode::bounded_staleness;
    options.staleness = o.staleness;
  } else {
    throw fl::InvalidArgument("ps_embedding: --mode must be async, sync, sync-backup or staleness; got " + o.mode);
  }
  return options;
}

// Restores the latest checkpoint into the strategy's variables and servers (added to
// `checkpoints`) and sets every worker's next step from it; a fresh start when there is none. A
// checkpoint saved with another batch size or seed would continue other sequences: refused.
void resume(fl::DistributedCheckpointManager& checkpoints, const Options& o, int workers,
            std::vector<int64_t>& next_step, const std::function<void(const std::string&)>& say) {
  const auto start = std::chrono::steady_clock::now();
  const std::optional<fl::RestoredCheckpoint> restored = checkpoints.restore_latest();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!restored) {
    say(fmt::format("no checkpoint in {}: starting fresh\n", checkpoints.directory()));
    return;
  }
  const std::string program = "ps_embedding";
  const int64_t saved_workers = examples::metadata_value(*restored, "workers", program);
  const int64_t batch_size = examples::metadata_value(*restored, "batch_size", program);
  const int64_t seed = examples::metadata_value(*restored, "seed", program);
  if (saved_workers != workers || batch_size != o.batch_size || seed != static_cast<int64_t>(o.seed)) {
    throw fl::InvalidArgument(fmt::format(
        "{}: checkpoint {} was saved by {} workers with batch size {} and seed {}; this run has {}, {} and {}: it "
        "would not continue the same sequences of batches",
        program, restored->path, saved_workers, batch_size, seed, workers, o.batch_size, o.seed));
  }
  for (size_t w = 0; w < next_step.size(); ++w) {
    next_step[w] = examples::metadata_value(*restored, fmt::format("next_step.worker{}", w), program);
    if (next_step[w] < 0) {
      throw fl::InvalidArgument(fmt::format("{}: checkpoint {} gives worker {} the next step {}", program,
                                            restored->path, w, next_step[w]));
    }
  }
  say(examples::describe_restore(*restored, fmt::format("next step of workers 0..{}: {}", workers - 1,
                                                        fmt::join(next_step, ", ")),
                                 seconds));
}

int run(const Options& o) {
  fl::ParameterServerStrategy ps(strategy_options(o));
  const bool leader = fl::process_index() == 0;
  auto say = [&](const std::string& text) {
    if (leader) std::fputs(text.c_str(), stdout), std::fflush(stdout);
  };
  say(fmt::format("{} servers + {} workers ({}), mode {}{}{}\n", ps.num_servers(), ps.num_workers(),
                  ps.in_process() ? "threads of one process" : "processes under mpirun", o.mode,
                  o.mode == "sync-backup" ? " (1 backup worker)" : "",
                  o.mode == "staleness" ? fmt::format(" (k = {})", o.staleness) : ""));

  const GroundTruth truth(o.vocab, o.seed);
  const int64_t rows = kFeatures * o.vocab;
  fl::Variable table;
  fl::nn::Sequential mlp;
  {
    auto scope = ps.scope();  // these variables live on the servers
    table = fl::Variable(fl::randn({rows, o.dim}, o.seed) * 0.05f, "embeddings");
    mlp.add<fl::nn::Linear>(kFeatures * o.dim, 32, o.seed + 1, "hidden");
    mlp.add([](const fl::Tensor& x) { return fl::relu(x); });
    mlp.add<fl::nn::Linear>(32, 2, o.seed + 2, "logits");
  }
  std::vector<fl::Variable> params{table};
  for (const fl::Variable& v : mlp.parameters()) params.push_back(v);
  std::string placement;
  for (const auto& shard : ps.placement(table)) {
    placement += fmt::format(" server {} rows [{}, {})", shard.server, shard.row_begin, shard.row_end);
  }
  say(fmt::format("embedding table {} x {} ({:.1f} MB):{}; MLP {} -> 32 -> 2 placed whole\n", rows, o.dim,
                  static_cast<double>(rows * o.dim * 4) / 1e6, placement, kFeatures * o.dim));

  // With checkpoints the job runs in chunks (see the top of this file); without, in one run().
  std::unique_ptr<fl::DistributedCheckpointManager> checkpoints;
  std::vector<int64_t> next_step(static_cast<size_t>(ps.num_workers()), 0);  // each worker's next batch
  auto steps_done = [&] { return std::accumulate(next_step.begin(), next_step.end(), int64_t{0}); };
  auto save_metadata = [&] {
    std::map<std::string, int64_t> metadata{
        {"workers", ps.num_workers()}, {"batch_size", o.batch_size}, {"seed", static_cast<int64_t>(o.seed)}};
    for (size_t w = 0; w < next_step.size(); ++w) metadata[fmt::format("next_step.worker{}", w)] = next_step[w];
    return metadata;
  };
  if (o.checkpoints.enabled()) {
    checkpoints = std::make_unique<fl::DistributedCheckpointManager>(o.checkpoints.directory, o.checkpoints.options());
    checkpoints->add(ps);  // the table and the MLP (server variables) and the servers' Adagrad state
    say(fmt::format("checkpoints in {}: {}, the last {} kept\n", o.checkpoints.directory, o.checkpoints.rules(),
                    o.checkpoints.keep));
    if (o.checkpoints.resume) resume(*checkpoints, o, ps.num_workers(), next_step, say);
  }

  const int64_t batch = o.batch_size;
  const int64_t chunk_steps = checkpoints && o.checkpoints.every_steps > 0 ? o.checkpoints.every_steps : o.steps;
  const double chunk_seconds = checkpoints ? o.checkpoints.seconds() : 0;
  const auto start = std::chrono::steady_clock::now();
  int64_t worker_steps = 0, worker_bytes = 0, saves = 0;
  auto unfinished = [&] {
    return std::any_of(next_step.begin(), next_step.end(), [&](int64_t next) { return next < o.steps; });
  };
  while (unfinished()) {
    const auto chunk_start = std::chrono::steady_clock::now();
    const fl::ParameterServerStats chunk = ps.run(
        [&] { return std::make_unique<Adagrad>(o.lr); },
        [&](fl::ps::Worker& worker) {
          auto step = fl::trace([&](fl::Tensor ids, fl::Tensor labels) {
            fl::GradientTape tape;
            const int64_t n = ids.shape()[0];
            const fl::Tensor embedded = fl::gather(table, fl::reshape(ids, fl::Shape{n * kFeatures}));  // pulls rows
            const fl::Tensor logits = mlp(fl::reshape(embedded, fl::Shape{n, kFeatures * o.dim}));
            const fl::Tensor loss = fl::mean(fl::softmax_cross_entropy(logits, labels));
            worker.apply_gradients(tape.gradient(loss, params), params);  // the table's as (ids, rows)
            return loss;
          });
          // next_step is only written between runs, so the worker threads read it safely.
          const int64_t first = next_step[static_cast<size_t>(worker.index())];
          const int64_t end = std::min(o.steps, first + chunk_steps);
          for (int64_t i = first; i < end && !worker.should_stop(); ++i) {
            const auto data = truth.sample(batch, o.seed * 1'000'003 + static_cast<uint64_t>(worker.index()) * 100'003 +
                                                      static_cast<uint64_t>(i) + 1);
            (void)step(data.ids, data.labels);
            if (chunk_seconds > 0 &&
                std::chrono::duration<double>(std::chrono::steady_clock::now() - chunk_start).count() >=
                    chunk_seconds) {
              worker.request_stop();  // time for a checkpoint: every worker ends its chunk
            }
          }
        });
    // Every process has every worker's counters (one step = one push), so all agree on next_step.
    int64_t progress = 0;
    for (const fl::WorkerStats& w : chunk.workers) {
      next_step[static_cast<size_t>(w.worker)] += w.steps;
      progress += w.steps;
      worker_bytes += w.bytes_sent + w.bytes_received;
    }
    worker_steps += progress;
    if (!checkpoints) break;  // one run() of o.steps per worker: the whole job
    if (progress == 0) {
      throw fl::Error(fmt::format("ps_embedding: a chunk of training made no progress (next steps {})",
                                  fmt::join(next_step, ", ")));
    }
    checkpoints->save(steps_done(), save_metadata());
    ++saves;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const fl::ParameterServerStats& stats = ps.last_stats();  // the last chunk's
  if (checkpoints) {
    checkpoints->wait();
    say(examples::describe_saves(saves, checkpoints->last_save_stats()));
  }

  // After run() every process holds the servers' values: evaluate locally (an ordinary gather).
  const GroundTruth::Batch test = truth.sample(20'000, /*stream=*/o.seed + 0x7e57);
  const int64_t n = test.ids.shape()[0];
  const fl::Tensor logits = mlp(
      fl::reshape(fl::gather(table, fl::reshape(test.ids, fl::Shape{n * kFeatures})), fl::Shape{n, kFeatures * o.dim}));
  const std::vector<float> l = logits.to_vector<float>();
  std::vector<double> score(static_cast<size_t>(n));
  for (size_t i = 0; i < score.size(); ++i) score[i] = 1 / (1 + std::exp(double{l[2 * i]} - double{l[2 * i + 1]}));
  const double positives =
      static_cast<double>(std::count(test.label_values.begin(), test.label_values.end(), 1)) / static_cast<double>(n);

  say(stats.summary());
  say(fmt::format("{} worker steps in {:.2f} s ({:.0f} steps/s, {:.0f} examples/s)\n", worker_steps, seconds,
                  static_cast<double>(worker_steps) / seconds,
                  static_cast<double>(worker_steps * batch) / seconds));
  say(fmt::format(
      "bytes moved per worker step (pulls and pushes, both ways): {:.1f} kB; the table alone is {:.1f} MB\n",
      static_cast<double>(worker_bytes) / static_cast<double>(std::max<int64_t>(worker_steps, 1)) / 1e3,
      static_cast<double>(rows * o.dim * 4) / 1e6));
  say(fmt::format("test set of {}: accuracy {:.4f} (ground truth {:.4f}, majority class {:.4f}), AUC {:.4f} "
                  "(ground truth {:.4f})\n",
                  n, accuracy(score, test.label_values), accuracy(test.true_probability, test.label_values),
                  std::max(positives, 1 - positives), auc(score, test.label_values),
                  auc(test.true_probability, test.label_values)));
  const double learned_auc = auc(score, test.label_values);
  if (learned_auc < o.min_auc) {
    std::fprintf(stderr, "ps_embedding: test AUC %.4f is below --min-auc %.4f\n", learned_auc, o.min_auc);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return examples::run_reporting_errors("ps_embedding", [&] { return run(parse(argc, argv)); });
}
