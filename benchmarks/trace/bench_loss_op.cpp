// bench_loss_op: softmax_cross_entropy's forward alone (the eager op call, which is also the traced
// step's forward loss node), f32 logits [N, C] with i64 labels, per-call median of the harness's
// samples and the process CPU time per call. Before/after comparisons run this one binary against
// two builds of libflowlet.so (LD_LIBRARY_PATH), alternating processes. Usage:
//   FLOWLET_NUM_THREADS=2 ./bench_loss_op [N ...] [--classes C] (default 1 64 128 1024, C = 10)
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include <flowlet/flowlet.hpp>

#include "../harness.hpp"

namespace fl = flowlet;
namespace bench = flowlet_bench;

namespace {

double process_cpu_ns() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e9 + static_cast<double>(t.tv_nsec);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> batches;
  int64_t classes = 10;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--classes" && i + 1 < argc) {
      classes = std::atoll(argv[++i]);
    } else {
      batches.push_back(std::atoll(arg.c_str()));
    }
  }
  if (batches.empty()) batches = {1, 64, 128, 1024};
  bench::print_header("softmax_cross_entropy forward, f32 [N, C], eager op call");
  for (int64_t n : batches) {
    const fl::Tensor logits = fl::randn(fl::Shape{n, classes}, 7, fl::f32) * 3.0;
    std::vector<int64_t> label_values(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) label_values[static_cast<size_t>(i)] = i % classes;
    const fl::Tensor labels = fl::tensor(label_values, fl::Shape{n});
    int64_t calls = 0;
    const auto body = [&] {
      bench::do_not_optimize(fl::softmax_cross_entropy(logits, labels));
      ++calls;
    };
    const double cpu_start = process_cpu_ns();
    const bench::Stats stats = bench::measure(body, {.samples = 21});
    const double cpu_per_call = (process_cpu_ns() - cpu_start) / static_cast<double>(calls);
    std::printf("N=%-5lld C=%-4lld median %9.2f us  [p10 %.2f, p90 %.2f]  cpu %9.2f us/call  (%lld calls/sample)\n",
                static_cast<long long>(n), static_cast<long long>(classes), stats.median_ns / 1e3, stats.p10_ns / 1e3,
                stats.p90_ns / 1e3, cpu_per_call / 1e3, static_cast<long long>(stats.iterations));
  }
  return 0;
}
