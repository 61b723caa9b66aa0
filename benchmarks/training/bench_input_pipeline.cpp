// The demo's input pipeline on its own, per batch of 128 Fashion-MNIST images (784 f32 each):
// Batches[i] (rows copied with memcpy on the calling thread), the same batch built with the
// public ops as Batches did before (an index tensor, then the gather op for images and labels,
// which splits a batch over the thread pool), and a Prefetcher drained with no training step (its
// queue and thread hand-off added). Each figure is the median over interleaved rounds of one epoch
// (469 batches), as wall time and as CPU time of all the process's threads; the load average is
// printed. Information only: how much of a training step
// (about 1.3 ms at 2 threads) the pipeline costs, and what the thread pool is spared.
//
//   bench_input_pipeline [--rounds 7] [--data DIR]     (FLOWLET_NUM_THREADS as for the demo)
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include <fmt/core.h>

#include <flowlet/data/fashion_mnist.hpp>
#include <flowlet/data/pipeline.hpp>
#include <flowlet/flowlet.hpp>

#include "../harness.hpp"

namespace fl = flowlet;

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// CPU seconds of the whole process (every thread: the pool's and the prefetcher's included), which
// a loaded machine inflates less than wall time, and which is what the 2-thread budget pays.
double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// A batch as Batches built it before: an i64 index tensor and the gather op.
fl::data::Dataset gather_op_batch(const fl::data::Dataset& data, const std::vector<int64_t>& order, int64_t i,
                                  int64_t batch_size) {
  const int64_t begin = i * batch_size;
  const int64_t end = std::min<int64_t>(begin + batch_size, static_cast<int64_t>(order.size()));
  const std::vector<int64_t> rows(order.begin() + begin, order.begin() + end);
  const fl::Tensor indices = fl::tensor(rows, fl::Shape{end - begin});
  return {fl::gather(data.images, indices), fl::gather(data.labels, indices)};
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 7;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i];
    if (arg == "--rounds") rounds = std::max(1, std::atoi(argv[i + 1]));
    else if (arg == "--data") data_dir = argv[i + 1];
  }
  flowlet_bench::print_header("input pipeline: a batch of 128 Fashion-MNIST images, per batch");
  try {
    const fl::data::Dataset train = fl::data::load_fashion_mnist("train", data_dir);
    constexpr int64_t kBatch = 128;
    fl::data::Batches batches(train, kBatch, /*seed=*/1);
    const int64_t count = batches.size();
    // Same rows both ways before timing.
    const fl::data::Dataset a = batches[3], b = gather_op_batch(train, batches.order(), 3, kBatch);
    if (a.images.to_vector<float>() != b.images.to_vector<float>() ||
        a.labels.to_vector<int64_t>() != b.labels.to_vector<int64_t>())
      fmt::print("   WARNING: Batches[3] differs from the gather op's batch\n");

    struct Figure {
      std::vector<double> wall_us, cpu_us;
    };
    Figure by_memcpy, by_gather, by_prefetch;
    auto timed = [&](Figure& figure, auto&& epoch) {
      const auto start = std::chrono::steady_clock::now();
      const double cpu_start = process_cpu_seconds();
      epoch();
      figure.cpu_us.push_back((process_cpu_seconds() - cpu_start) / static_cast<double>(count) * 1e6);
      figure.wall_us.push_back(seconds_since(start) / static_cast<double>(count) * 1e6);
    };
    for (int round = 0; round < rounds; ++round) {
      batches.reshuffle(static_cast<uint64_t>(round));
      timed(by_memcpy, [&] {
        for (int64_t i = 0; i < count; ++i) flowlet_bench::do_not_optimize(batches[i]);
      });
      timed(by_gather, [&] {
        for (int64_t i = 0; i < count; ++i)
          flowlet_bench::do_not_optimize(gather_op_batch(train, batches.order(), i, kBatch));
      });
      timed(by_prefetch, [&] {
        fl::data::Prefetcher prefetch(batches, {.depth = 4, .epochs = 1, .first_epoch = static_cast<uint64_t>(round)});
        while (std::optional<fl::data::Dataset> batch = prefetch.next()) flowlet_bench::do_not_optimize(*batch);
      });
    }
    fmt::print("   {} rounds of one epoch ({} batches), median per batch: wall us, CPU us (all threads)\n", rounds, count);
    auto row = [&](const char* what, const Figure& f) {
      fmt::print("   {:<46} {:8.1f} {:8.1f}\n", what, median(f.wall_us), median(f.cpu_us));
    };
    row("Batches[i] (memcpy rows, calling thread)", by_memcpy);
    row("tensor(indices) + gather op (thread pool)", by_gather);
    row("Prefetcher (depth 4) drained, no step", by_prefetch);
    fmt::print("   Batches[i] / gather op: wall {:.2f}, CPU {:.2f}\n", median(by_memcpy.wall_us) / median(by_gather.wall_us),
               median(by_memcpy.cpu_us) / median(by_gather.cpu_us));
  } catch (const std::exception& error) {
    fmt::print("bench_input_pipeline: stopped early: {}\n", error.what());
  }
  return 0;
}
