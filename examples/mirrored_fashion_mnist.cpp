// The demo's MLP (784-256-10, ReLU, Adam, global batch 128, lr 1e-3) trained data-parallel with
// MirroredStrategy: every replica holds a copy of the model, trains on its share of each global
// batch, and averages its gradients with the others (bucketed all-reduces that overlap the backward
// pass) before the update.
//
//   mpirun -np 2 build/release/examples/mirrored_fashion_mnist     # one replica per process
//   build/release/examples/mirrored_fashion_mnist --replicas 2     # 2 logical CPU devices, 1 process
//
//   mirrored_fashion_mnist [--replicas N] [--epochs N] [--steps N] [--batch-size B] [--lr X]
//                          [--seed S] [--bucket-mb X] [--data DIR] [--max-steps N]
//                          [--checkpoint-dir DIR [--checkpoint-every-steps N] [--checkpoint-every-seconds X]
//                           [--keep N] [--resume]]
//
// Prints throughput, the all-reduce time per step (and the share of it hidden under other nodes'
// computation, from the step's timeline) and the test accuracy after every epoch. Every process
// reads the same data and shuffles it with the same seed, so all see the same global batches.
//
// Checkpoints (examples/checkpoint_flags.hpp): with --checkpoint-dir the parameters, Adam's slots
// and step counter, and the data position (the epoch and the next batch in it) are saved every N
// steps or X seconds (default 30 s) and at the end; checkpoint S holds the state after S global
// steps. --resume restores the latest complete checkpoint and continues the same sequence of global
// batches, also on another number of processes or replicas (a job saved by `mpirun -np 2` resumes
// in one process). --max-steps N stops after N global steps in all, resumed ones included (as if
// the job had been stopped there). With a directory the run ends with a checksum of the model
// (the sum of its squared parameters) to compare an interrupted and resumed run with an
// uninterrupted one.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <flowlet/collective.hpp>
#include <flowlet/data/fashion_mnist.hpp>
#include <flowlet/flowlet.hpp>

#include "checkpoint_flags.hpp"
#include "collective_overlap.hpp"
#include "fashion_mnist_mlp.hpp"
#include "error_text.hpp"

namespace fl = flowlet;

namespace {

struct Options : examples::TrainingOptions {  // epochs, batch_size, lr, seed, data
  int replicas = 1;   // local replicas (logical CPU devices) per process
  int64_t steps = 0;  // steps per epoch (0: the whole epoch)
  double bucket_mb = 4;
  int64_t max_steps = 0;  // global steps in all, resumed ones included (0: no limit)
  examples::CheckpointFlags checkpoints;
};

Options parse(int argc, char** argv) {
  Options o;
  examples::parse_options(argc, argv, "mirrored_fashion_mnist", o, [&](const std::string& arg, auto& value) {
    if (arg == "--replicas") o.replicas = std::stoi(value());
    else if (arg == "--steps") o.steps = std::stoll(value());
    else if (arg == "--bucket-mb") o.bucket_mb = std::stod(value());
    else if (arg == "--max-steps") o.max_steps = examples::parse_integer("mirrored_fashion_mnist", arg, value());
    else return o.checkpoints.parse("mirrored_fashion_mnist", arg, value);
    return true;
  });
  if (o.replicas < 1 || o.epochs < 1 || o.batch_size < 1 || o.steps < 0 || !(o.bucket_mb > 0) || o.max_steps < 0) {
    throw fl::InvalidArgument(
        "mirrored_fashion_mnist: replicas, epochs and batch size must be >= 1, steps and max steps >= 0, bucket "
        "size > 0");
  }
  o.checkpoints.check("mirrored_fashion_mnist");
  return o;
}

using examples::accuracy;  // outside run(): the model reads replica 0's copies
using examples::seconds_since;

// Where the input pipeline is: the next global batch is `batch` of epoch `epoch` (1-based).
struct Position {
  int64_t epoch = 1, batch = 0;
};

// The sum of the model's squared parameters (replica 0's copies), in double: equal for equal models.
double checksum(const std::vector<fl::Variable>& params) {
  double sum = 0;
  for (const fl::Variable& p : params) {
    for (const float v : p.value().to_vector<float>()) sum += static_cast<double>(v) * v;
  }
  return sum;
}

// Restores the latest checkpoint into the model and optimizer (both added to `checkpoints`) and
// returns the global steps done and the data position it holds; a fresh start when there is none.
// A checkpoint saved with another batch size, seed or epoch length would continue another sequence
// of batches: refused.
std::pair<int64_t, Position> resume(fl::DistributedCheckpointManager& checkpoints, const Options& o,
                                    int64_t steps_per_epoch, const std::function<void(const std::string&)>& say) {
  const auto start = std::chrono::steady_clock::now();
  const std::optional<fl::RestoredCheckpoint> restored = checkpoints.restore_latest();
  const double seconds = seconds_since(start);
  if (!restored) {
    say(fmt::format("no checkpoint in {}: starting fresh\n", checkpoints.directory()));
    return {0, Position{}};
  }
  const std::string program = "mirrored_fashion_mnist";
  const int64_t batch_size = examples::metadata_value(*restored, "batch_size", program);
  const int64_t seed = examples::metadata_value(*restored, "seed", program);
  const int64_t saved_steps_per_epoch = examples::metadata_value(*restored, "steps_per_epoch", program);
  if (batch_size != o.batch_size || seed != static_cast<int64_t>(o.seed) || saved_steps_per_epoch != steps_per_epoch) {
    throw fl::InvalidArgument(fmt::format(
        "{}: checkpoint {} was saved with batch size {}, seed {} and {} steps per epoch; this run has {}, {} and {}: "
        "it would not continue the same sequence of batches",
        program, restored->path, batch_size, seed, saved_steps_per_epoch, o.batch_size, o.seed, steps_per_epoch));
  }
  const Position position{examples::metadata_value(*restored, "epoch", program),
                          examples::metadata_value(*restored, "batch", program)};
  if (position.epoch < 1 || position.batch < 0 || position.batch >= steps_per_epoch || restored->step < 0) {
    throw fl::InvalidArgument(fmt::format("{}: checkpoint {} holds no valid data position: step {}, epoch {}, batch {} "
                                          "of {}",
                                          program, restored->path, restored->step, position.epoch, position.batch,
                                          steps_per_epoch));
  }
  say(examples::describe_restore(*restored, fmt::format("epoch {}, batch {}", position.epoch, position.batch),
                                 seconds));
  return {restored->step, position};
}

int run(const Options& o) {
  if (o.replicas > 1) fl::set_logical_cpu_devices(o.replicas);
  std::vector<fl::Device> devices;
  for (int r = 0; r < o.replicas; ++r) devices.emplace_back(fl::DeviceKind::cpu, r);
  fl::MirroredOptions options;
  options.bucket_bytes = static_cast<int64_t>(o.bucket_mb * (1 << 20));
  options.trace_options.collect_step_stats = true;  // the all-reduce figures come from the timeline
  options.trace_options.name = "mirrored training step";
  fl::MirroredStrategy dp(devices, options);
  const bool leader = fl::process_index() == 0;
  auto say = [&](const std::string& text) {
    if (leader) std::fputs(text.c_str(), stdout), std::fflush(stdout);
  };
  say(fmt::format("{} replicas: {} process(es) x {} local ({}), global batch {}\n", dp.num_replicas(),
                  fl::process_count(), dp.num_local_replicas(), fmt::join(dp.local_devices(), ", "), o.batch_size));

  const fl::data::Dataset train = fl::data::load_fashion_mnist("train", o.data);
  const fl::data::Dataset test = fl::data::load_fashion_mnist("test", o.data);

  fl::nn::Sequential model;
  {
    auto scope = dp.scope();  // mirrored: every replica starts from replica 0's initial weights
    examples::build_model(model, o.seed);
  }
  const std::vector<fl::Variable> params = model.parameters();
  fl::optim::Adam optimizer(o.lr);
  auto step = examples::make_step(model, optimizer, params);  // its update averages over all replicas first

  fl::data::Batches batches(train, o.batch_size, o.seed);
  const int64_t steps_per_epoch = o.steps > 0 ? std::min(o.steps, batches.size()) : batches.size();

  // Checkpoints hold the parameters, Adam's slots and step counter (made now, mirrored like the
  // parameters, so that a restore has somewhere to go) and the data position.
  std::unique_ptr<fl::DistributedCheckpointManager> checkpoints;
  int64_t global_step = 0;  // global steps done, resumed ones included
  Position position;
  if (o.checkpoints.enabled()) {
    optimizer.build(params);
    checkpoints = std::make_unique<fl::DistributedCheckpointManager>(o.checkpoints.directory, o.checkpoints.options());
    checkpoints->add(params);
    checkpoints->add(optimizer.variables());
    say(fmt::format("checkpoints in {}: {}, the last {} kept\n", o.checkpoints.directory, o.checkpoints.rules(),
                    o.checkpoints.keep));
    if (o.checkpoints.resume) std::tie(global_step, position) = resume(*checkpoints, o, steps_per_epoch, say);
  }
  int64_t saves = 0, last_saved = o.checkpoints.resume ? global_step : -1;
  auto save_metadata = [&] {
    return std::map<std::string, int64_t>{{"epoch", position.epoch},
                                          {"batch", position.batch},
                                          {"batch_size", o.batch_size},
                                          {"seed", static_cast<int64_t>(o.seed)},
                                          {"steps_per_epoch", steps_per_epoch}};
  };

  const auto start = std::chrono::steady_clock::now();
  double final_accuracy = 0, all_reduce_ms = 0, hidden_share = 0;
  int64_t images = 0, sampled = 0;
  bool stop = o.max_steps > 0 && global_step >= o.max_steps;
  for (int epoch = static_cast<int>(position.epoch); epoch <= o.epochs && !stop; ++epoch) {
    const auto epoch_start = std::chrono::steady_clock::now();
    double loss_sum = 0;
    int64_t seen = 0, steps = 0, epoch_images = 0;
    batches.reshuffle(static_cast<uint64_t>(epoch));
    for (int64_t index = epoch == position.epoch ? position.batch : 0; index < steps_per_epoch; ++index) {
      if (o.max_steps > 0 && global_step >= o.max_steps) {
        stop = true;
        break;
      }
      const fl::data::Dataset batch = batches[index];
      const std::vector<fl::Tensor> losses = dp.run(step, batch.images, batch.labels);
      const int64_t n = batch.labels.shape()[0];
      epoch_images += n;
      // This process's replicas' mean losses, weighted by their rows.
      const int64_t base = n / dp.num_replicas(), extra = n % dp.num_replicas();
      for (int l = 0; l < dp.num_local_replicas(); ++l) {
        const int r = fl::process_index() * dp.num_local_replicas() + l;
        const int64_t rows = base + (r < extra ? 1 : 0);
        if (rows > 0) loss_sum += losses[static_cast<size_t>(l)].item<float>() * static_cast<double>(rows);
        seen += rows;
      }
      ++steps;
      ++global_step;
      position = index + 1 < steps_per_epoch ? Position{epoch, index + 1} : Position{epoch + 1, 0};
      if (checkpoints && checkpoints->maybe_save(global_step, save_metadata())) ++saves, last_saved = global_step;
      if (dp.num_replicas() > 1 && steps % 20 == 0) {  // sample the last step's timeline
        const examples::CollectiveOverlap overlap = examples::collective_overlap(dp.timeline_json(0));
        all_reduce_ms += overlap.collective_us / 1e3;
        hidden_share += overlap.hidden_share();
        ++sampled;
      }
    }
    if (steps == 0) continue;  // resumed at the end of an epoch, or stopped before this one
    images += epoch_images;
    const double seconds = seconds_since(epoch_start);
    final_accuracy = accuracy(model, test);
    say(fmt::format("epoch {}/{}: {} steps, loss {:.4f}, {:.0f} images/s (global), test accuracy {:.4f}\n", epoch,
                    o.epochs, steps, loss_sum / static_cast<double>(std::max<int64_t>(seen, 1)),
                    static_cast<double>(epoch_images) / seconds, final_accuracy));
  }
  const double total = seconds_since(start);
  if (sampled > 0) {
    say(fmt::format("all-reduce per step: {:.3f} ms ({} buckets of <= {} MB), {:.0f}% of it hidden under other "
                    "nodes (mean of {} sampled steps)\n",
                    all_reduce_ms / static_cast<double>(sampled),
                    examples::collective_overlap(dp.timeline_json(0)).collectives, o.bucket_mb,
                    100 * hidden_share / static_cast<double>(sampled), sampled));
  }
  if (images == 0) final_accuracy = accuracy(model, test);  // nothing left to train after a resume
  say(fmt::format("final: replicas={} test_accuracy={:.4f} epochs={} seconds={:.1f} images_per_second={:.0f}\n",
                  dp.num_replicas(), final_accuracy, o.epochs, total,
                  static_cast<double>(images) / std::max(total, 1e-9)));
  if (checkpoints) {
    // The end of the run is a checkpoint too (a stopped or finished job resumes where it ended).
    if (last_saved != global_step) checkpoints->save(global_step, save_metadata()), ++saves;
    checkpoints->wait();
    say(examples::describe_saves(saves, checkpoints->last_save_stats()));
    say(fmt::format("model checksum {:.9e} after {} global steps (epoch {}, batch {} next)\n", checksum(params),
                    global_step, position.epoch, position.batch));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return examples::run_reporting_errors("mirrored_fashion_mnist", [&] { return run(parse(argc, argv)); });
}
