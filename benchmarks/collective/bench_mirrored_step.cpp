// bench_mirrored_step: MirroredStrategy on logical CPU devices in one process.
//   1. The data-parallel step of the demo's MLP (784-256-10, Adam, global batch 128): 2 replicas
//      against 1 (both through MirroredStrategy; 2 replicas share this machine's cores), and the
//      share of the all-reduce time that ran while other nodes computed (from the step timeline,
//      with buckets small enough to give several).
//   2. Bucketing, eager on 2 replicas: 100 gradients of 40 KB averaged through the buckets (flatten,
//      concatenate, one all_reduce per 4 MB bucket, split back) against one raw all_reduce of the
//      same 4 MB (target: the buckets reach >= 0.8x the raw call's throughput).
// Under `mpirun -np N` it runs the bucketing alone, one replica per process (all_reduce over MPI).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <barrier>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <flowlet/collective.hpp>
#include <flowlet/flowlet.hpp>

#include "../../examples/collective_overlap.hpp"
#include "../harness.hpp"
#include "collective/communicator.hpp"
#include "collective/mirrored/gradient_averaging.hpp"
#include "collective/replica_context.hpp"

namespace fl = flowlet;
namespace bench = flowlet_bench;

namespace {

std::vector<fl::Device> cpu_devices(int n) {
  std::vector<fl::Device> devices;
  for (int i = 0; i < n; ++i) devices.emplace_back(fl::DeviceKind::cpu, i);
  return devices;
}

// The demo's model, mirrored over `dp`, and its training step.
struct MlpStep {
  explicit MlpStep(fl::MirroredStrategy& dp) : optimizer(1e-3) {
    auto scope = dp.scope();
    model.add<fl::nn::Linear>(784, 256, 1, "hidden");
    model.add([](const fl::Tensor& x) { return fl::relu(x); });
    model.add<fl::nn::Linear>(256, 10, 2, "logits");
    params = model.parameters();
  }
  auto step() {
    return [this](fl::Tensor images, fl::Tensor labels) {
      fl::GradientTape tape;
      fl::Tensor loss = fl::mean(fl::softmax_cross_entropy(model(images), labels));
      optimizer.apply(tape.gradient(loss, params), params);
      return loss;
    };
  }
  fl::nn::Sequential model;
  std::vector<fl::Variable> params;
  fl::optim::Adam optimizer;
};

void mlp_step(const fl::Tensor& images, const fl::Tensor& labels) {
  bench::Section section("DP MLP step", bench::Metric::rate("images/s", 128.0),
                         "784-256-10 Adam, global batch 128 split over the replicas (time per global step)");
  std::vector<bench::Result> results;
  {
    // The same step traced plainly (no strategy): what run()'s splitting, threads and lookups cost.
    fl::MirroredStrategy unused(cpu_devices(1));
    fl::nn::Sequential model;
    model.add<fl::nn::Linear>(784, 256, 1, "hidden");
    model.add([](const fl::Tensor& x) { return fl::relu(x); });
    model.add<fl::nn::Linear>(256, 10, 2, "logits");
    const std::vector<fl::Variable> params = model.parameters();
    fl::optim::Adam optimizer(1e-3);
    auto step = fl::trace([&](fl::Tensor x, fl::Tensor y) {
      fl::GradientTape tape;
      fl::Tensor loss = fl::mean(fl::softmax_cross_entropy(model(x), y));
      optimizer.apply(tape.gradient(loss, params), params);
      return loss;
    });
    results.push_back(section.run("trace (no strategy)", [&] { bench::do_not_optimize(step(images, labels)); }));
  }
  for (int replicas : {1, 2}) {
    fl::MirroredStrategy dp(cpu_devices(replicas));
    MlpStep mlp(dp);
    auto step = mlp.step();
    results.push_back(section.run(fmt::format("{} replica{}", replicas, replicas > 1 ? "s" : ""),
                                  [&] { bench::do_not_optimize(dp.run(step, images, labels)); }));
  }
  section.compare(results[1], results[0], std::nullopt);
  section.compare(results[2], results[1], std::nullopt);

  // The hidden share: several buckets (the hidden layer's weight gradient, 784 x 256 x 4 bytes, is
  // computed last and goes alone), sampled over steps.
  fl::MirroredOptions options;
  options.bucket_bytes = 64 << 10;
  options.trace_options.collect_step_stats = true;
  fl::MirroredStrategy dp(cpu_devices(2), options);
  MlpStep mlp(dp);
  auto step = mlp.step();
  double collective_us = 0, hidden_us = 0;
  int buckets = 0;
  constexpr int kSamples = 50;
  for (int i = 0; i < kSamples + 5; ++i) {
    (void)dp.run(step, images, labels);
    if (i < 5) continue;
    const examples::CollectiveOverlap overlap = examples::collective_overlap(dp.timeline_json(0));
    collective_us += overlap.collective_us;
    hidden_us += overlap.hidden_us;
    buckets = overlap.collectives;
  }
  fmt::print("   all-reduce per step with 64 KB buckets ({} buckets): {:.3f} ms, {:.0f}% of it while other nodes "
             "ran (mean of {} steps)\n",
             buckets, collective_us / kSamples / 1e3, collective_us > 0 ? 100 * hidden_us / collective_us : 0.0,
             kSamples);
}

// Runs work(l) for every local replica at once: local replica 0 on the calling thread, the others
// on helper threads that wait for each call (eager collectives need every participant calling).
class LocalReplicas {
 public:
  LocalReplicas(int count, std::function<void(int)> work)
      : work_(std::move(work)), start_(count), end_(count) {
    for (int l = 1; l < count; ++l) {
      helpers_.emplace_back([this, l] {
        for (;;) {
          start_.arrive_and_wait();
          if (stop_) return;
          work_(l);
          end_.arrive_and_wait();
        }
      });
    }
  }
  ~LocalReplicas() {
    stop_ = true;
    start_.arrive_and_wait();
    for (std::thread& t : helpers_) t.join();
  }
  void operator()() {
    start_.arrive_and_wait();
    work_(0);
    end_.arrive_and_wait();
  }

 private:
  std::function<void(int)> work_;
  std::barrier<> start_, end_;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> helpers_;
};

// Median seconds per call of `body` over 7 rounds of `calls` calls: a fixed count, so that every
// process of an MPI job makes the same collectives (the harness scales its counts by time).
double fixed_count_seconds(const std::function<void()>& body, int calls) {
  for (int i = 0; i < 3; ++i) body();
  std::vector<double> rounds;
  for (int r = 0; r < 7; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) body();
    rounds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / calls);
  }
  std::sort(rounds.begin(), rounds.end());
  return rounds[rounds.size() / 2];
}

// 100 gradients of 40 KB through the buckets vs one 4 MB all_reduce, eager, on `local` devices of
// every process (2 logical devices in one process, or 1 per process under mpirun).
void bucketing(int local) {
  constexpr int kGradients = 100;
  constexpr int64_t kElements = 10 * 1024;  // 40 KB of f32 each, 4 MB in all
  constexpr double kBytes = kGradients * kElements * 4.0;
  const std::vector<fl::Device> devices = cpu_devices(local);
  const auto communicator = fl::detail::make_communicator(devices);
  std::vector<fl::detail::ReplicaContext> contexts;
  std::vector<std::vector<fl::Tensor>> grads(static_cast<size_t>(local));
  std::vector<fl::Tensor> whole(static_cast<size_t>(local));
  for (int r = 0; r < local; ++r) {
    const int global = communicator->rank_of(r);
    contexts.push_back(fl::detail::ReplicaContext{communicator, r, nullptr});
    for (int i = 0; i < kGradients; ++i) {
      grads[r].push_back(fl::randn({kElements}, 1000 * global + i, fl::f32, devices[r]));
    }
    whole[r] = fl::randn({kGradients * kElements}, 10 + global, fl::f32, devices[r]);
  }
  LocalReplicas bucketed(local, [&](int r) {
    fl::detail::ReplicaScope replica(&contexts[r]);
    bench::do_not_optimize(fl::detail::average_gradients(grads[r]));
  });
  LocalReplicas raw(local, [&](int r) {
    fl::detail::ReplicaScope replica(&contexts[r]);
    bench::do_not_optimize(fl::all_reduce(whole[r], fl::ReduceOp::mean));
  });
  const std::string where = fmt::format("{} process(es) x {} local", fl::process_count(), local);
  if (fl::process_count() == 1) {
    bench::Section section("bucketing", bench::Metric::rate("GB/s", kBytes / 1e9),
                           "eager, " + where + ": 100 gradients of 40 KB averaged through 4 MB buckets (flatten, "
                           "concatenate, all_reduce, split) vs one all_reduce of 4 MB; bytes per replica");
    const bench::Result ours = section.run("buckets", [&] { bucketed(); });
    const bench::Result peer = section.run("one all_reduce", [&] { raw(); });
    section.compare(ours, peer, bench::Target::at_least(0.8));
    return;
  }
  const double ours = fixed_count_seconds([&] { bucketed(); }, 20);
  const double peer = fixed_count_seconds([&] { raw(); }, 20);
  fmt::print("\n-- bucketing: eager, {}: 100 gradients of 40 KB through 4 MB buckets vs one 4 MB all_reduce "
             "(median of 7 rounds of 20 calls)\n   buckets {:.2f} GB/s ({:.3f} ms)  one all_reduce {:.2f} GB/s "
             "({:.3f} ms)  ratio {:.2f} (target >= 0.80: {})\n",
             where, kBytes / ours / 1e9, ours * 1e3, kBytes / peer / 1e9, peer * 1e3, peer / ours,
             peer / ours >= 0.8 ? "met" : "MISSED");
}

}  // namespace

int main() {
  if (fl::process_count() > 1) {
    // Under mpirun: the bucketing across processes (one replica each), printed by process 0.
    if (fl::process_index() != 0) std::freopen("/dev/null", "w", stdout);
    bench::print_header(fmt::format("bench_mirrored_step across {} processes", fl::process_count()));
    bucketing(1);
    return 0;
  }
  fl::set_logical_cpu_devices(2);
  bench::print_header("bench_mirrored_step (MirroredStrategy on logical CPU devices)");
  const fl::Tensor images = fl::uniform({128, 784}, 0.0, 1.0, 3);
  const fl::Tensor labels = fl::argmax(fl::randn({128, 10}, 4), 1);
  mlp_step(images, labels);
  bucketing(2);
  return 0;
}
