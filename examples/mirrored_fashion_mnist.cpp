// The demo's MLP (784-256-10, ReLU, Adam, global batch 128, lr 1e-3) trained data-parallel with
// MirroredStrategy: every replica holds a copy of the model, trains on its share of each global
// batch, and averages its gradients with the others (bucketed all-reduces that overlap the backward
// pass) before the update.
//
//   mpirun -np 2 build/release/examples/mirrored_fashion_mnist     # one replica per process
//   build/release/examples/mirrored_fashion_mnist --replicas 2     # 2 logical CPU devices, 1 process
//
//   mirrored_fashion_mnist [--replicas N] [--epochs N] [--steps N] [--batch-size B] [--lr X]
//                          [--seed S] [--bucket-mb X] [--data DIR]
//
// Prints throughput, the all-reduce time per step (and the share of it hidden under other nodes'
// computation, from the step's timeline) and the test accuracy after every epoch. Every process
// reads the same data and shuffles it with the same seed, so all see the same global batches.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <flowlet/collective.hpp>
#include <flowlet/data/fashion_mnist.hpp>
#include <flowlet/flowlet.hpp>

#include "collective_overlap.hpp"
#include "fashion_mnist_mlp.hpp"

namespace fl = flowlet;

namespace {

struct Options : examples::TrainingOptions {  // epochs, batch_size, lr, seed, data
  int replicas = 1;   // local replicas (logical CPU devices) per process
  int64_t steps = 0;  // steps per epoch (0: the whole epoch)
  double bucket_mb = 4;
};

Options parse(int argc, char** argv) {
  Options o;
  examples::parse_options(argc, argv, "mirrored_fashion_mnist", o, [&](const std::string& arg, auto& value) {
    if (arg == "--replicas") o.replicas = std::stoi(value());
    else if (arg == "--steps") o.steps = std::stoll(value());
    else if (arg == "--bucket-mb") o.bucket_mb = std::stod(value());
    else return false;
    return true;
  });
  if (o.replicas < 1 || o.epochs < 1 || o.batch_size < 1 || o.steps < 0 || !(o.bucket_mb > 0)) {
    throw fl::InvalidArgument(
        "mirrored_fashion_mnist: replicas, epochs and batch size must be >= 1, steps >= 0, bucket size > 0");
  }
  return o;
}

using examples::accuracy;  // outside run(): the model reads replica 0's copies
using examples::seconds_since;

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
  const auto start = std::chrono::steady_clock::now();
  double final_accuracy = 0, all_reduce_ms = 0, hidden_share = 0;
  int64_t images = 0, sampled = 0;
  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    const auto epoch_start = std::chrono::steady_clock::now();
    double loss_sum = 0;
    int64_t seen = 0, steps = 0, epoch_images = 0;
    batches.reshuffle(static_cast<uint64_t>(epoch));
    for (const fl::data::Dataset& batch : batches) {
      if (o.steps > 0 && steps >= o.steps) break;
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
      if (dp.num_replicas() > 1 && steps % 20 == 0) {  // sample the last step's timeline
        const examples::CollectiveOverlap overlap = examples::collective_overlap(dp.timeline_json(0));
        all_reduce_ms += overlap.collective_us / 1e3;
        hidden_share += overlap.hidden_share();
        ++sampled;
      }
    }
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
  say(fmt::format("final: replicas={} test_accuracy={:.4f} epochs={} seconds={:.1f} images_per_second={:.0f}\n",
                  dp.num_replicas(), final_accuracy, o.epochs, total, static_cast<double>(images) / total));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\nmirrored_fashion_mnist: %s\n", e.what());
    return 1;
  }
}
