// bench_trace_adam: the MLP 784-256-10 step with Adam (lr 1e-3), flowlet eager against traced,
// interleaved (one eager round, one traced round, repeated; which goes first alternates), median of the rounds' per-step times;
// beside them TensorFlow's eager, tf.function and XLA steps with Keras' Adam on the same model
// (benchmarks/peers/tf_peer.py mlp_step --optimizer adam, measured between flowlet's first and
// second half of rounds, same thread count). Issue 18, goal 2 (the traced batch-1 step <= 0.8x
// XLA's) and goal 3 (traced never slower than eager). Usage:
//   FLOWLET_NUM_THREADS=2 FLOWLET_TF_PYTHON=/work/venvs/tf/bin/python ./bench_trace_adam 1 64 128 1024
// Options: --no-tf (flowlet only), --rounds R (default 15), --tf-samples S (default 7), --unfused
// (also times Adam's per-op update(), a subclass apply() does not fuse, in the same rounds: the
// fused optimizer_update against what it replaced), --no-dense-too (also times the traced step
// traced with FLOWLET_DENSE_FUSION=0 in the same rounds: what the dense-layer and cross-entropy
// fusions save, matmul_bias, relu_bias_grad and softmax_cross_entropy_grad), --sequential-too and
// --concurrent-too (also time the traced step with FLOWLET_EXECUTOR=sequential / concurrent: what
// the executor's choice of mode is worth).
#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "../mlp_step.hpp"
#include "../round_order.hpp"
#include "../tf_peer.hpp"

namespace fl = flowlet;
using namespace flowlet_bench::mlp;

namespace {

// Adam through update(), one elementwise op at a time: apply() fuses only the built-in classes.
struct UnfusedAdam : fl::optim::Adam {
  using Adam::Adam;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The median over rounds of num[i] / den[i]: each ratio compares two contenders timed back to back
// in one round, so load that changes between rounds (other processes' builds) mostly cancels.
double median_ratio(const std::vector<double>& num, const std::vector<double>& den) {
  std::vector<double> ratios;
  for (size_t i = 0; i < num.size() && i < den.size(); ++i) ratios.push_back(num[i] / den[i]);
  return ratios.empty() ? NAN : median(ratios);
}

double process_cpu_us() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e6 + static_cast<double>(t.tv_nsec) / 1e3;
}

// Per-step wall time of `steps` calls; adds their per-step process CPU time (all threads) to *cpu_us.
template <class Step>
double round_us(Step& step, const Batch& data, int steps, std::vector<double>* cpu_us = nullptr) {
  const double cpu_start = process_cpu_us();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) (void)step(data.x, data.labels).template item<float>();
  const double wall = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / steps;
  if (cpu_us != nullptr) cpu_us->push_back((process_cpu_us() - cpu_start) / steps);
  return wall;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> batches;
  bool with_tf = true, unfused = false;
  // Traced steps traced under an environment setting (read as the step is first optimized and
  // planned), timed in the same rounds as the others on request.
  struct Variant {
    const char* option;
    const char* variable;
    const char* value;
    const char* what;
    bool on = false;
  };
  Variant variants[] = {
      {"--no-dense-too", "FLOWLET_DENSE_FUSION", "0", "without the dense-layer and cross-entropy fusions"},
      {"--sequential-too", "FLOWLET_EXECUTOR", "sequential", "with the sequential executor"},
      {"--concurrent-too", "FLOWLET_EXECUTOR", "concurrent", "with the concurrent executor"},
  };
  int rounds = 15, tf_samples = 7;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--no-tf") == 0) {
      with_tf = false;
    } else if (std::strcmp(argv[i], "--unfused") == 0) {
      unfused = true;
    } else if (Variant* v = std::find_if(std::begin(variants), std::end(variants),
                                         [&](const Variant& x) { return std::strcmp(argv[i], x.option) == 0; });
               v != std::end(variants)) {
      v->on = true;
    } else if (std::strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
      rounds = std::max(2, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--tf-samples") == 0 && i + 1 < argc) {
      tf_samples = std::max(3, std::atoi(argv[++i]));
    } else {
      batches.push_back(std::atoll(argv[i]));
    }
  }
  if (batches.empty()) batches = {1024, 128};
  // TensorFlow gets flowlet's thread budget (intra- and inter-op).
  const char* budget = std::getenv("FLOWLET_NUM_THREADS");
  const int threads = budget != nullptr ? std::max(1, std::atoi(budget)) : static_cast<int>(std::thread::hardware_concurrency());
  if (with_tf) with_tf = flowlet_bench::print_tf_setup();
  for (int64_t batch : batches) {
    const Batch data(batch);
    FlowletMlp eager_model, traced_model, eager_unfused_model, traced_unfused_model;
    fl::optim::Adam eager_adam(1e-3), traced_adam(1e-3);
    UnfusedAdam eager_unfused_adam(1e-3), traced_unfused_adam(1e-3);
    auto make = [](FlowletMlp& m, fl::optim::Adam& adam) {
      return [&m, &adam](fl::Tensor x, fl::Tensor labels) {
        fl::GradientTape tape;
        fl::Tensor l = m.loss(x, labels);
        adam.apply(tape.gradient(l, m.params), m.params);
        return l;
      };
    };
    auto eager = make(eager_model, eager_adam);
    auto traced = fl::trace(make(traced_model, traced_adam));
    auto eager_unfused = make(eager_unfused_model, eager_unfused_adam);
    auto traced_unfused = fl::trace(make(traced_unfused_model, traced_unfused_adam));
    // One model, optimizer, traced step and samples per variant asked for (stable addresses).
    struct VariantRun {
      const Variant* variant;
      FlowletMlp model;
      fl::optim::Adam adam{1e-3};
      std::function<fl::Tensor(fl::Tensor, fl::Tensor)> step;
      std::vector<double> wall, cpu;
    };
    std::vector<std::unique_ptr<VariantRun>> variant_runs;
    for (const Variant& v : variants) {
      if (!v.on) continue;
      auto run = std::make_unique<VariantRun>();
      run->variant = &v;
      auto traced_variant = fl::trace(make(run->model, run->adam));
      const char* before = std::getenv(v.variable);
      const std::string saved = before != nullptr ? before : "";
      setenv(v.variable, v.value, 1);
      (void)traced_variant(data.x, data.labels).item<float>();  // optimized and planned under the setting
      if (before != nullptr) {
        setenv(v.variable, saved.c_str(), 1);
      } else {
        unsetenv(v.variable);
      }
      run->step = std::move(traced_variant);
      variant_runs.push_back(std::move(run));
    }
    const int steps = batch >= 512 ? 5 : 20;
    // The contenders of a round: eager and traced always; the others on request.
    std::vector<double> e, t, eu, tu, e_cpu, t_cpu;
    struct Contender {
      std::function<double()> round;
      std::vector<double>* samples;
    };
    std::vector<Contender> contenders = {{[&] { return round_us(eager, data, steps, &e_cpu); }, &e},
                                         {[&] { return round_us(traced, data, steps, &t_cpu); }, &t}};
    if (unfused) {
      contenders.push_back({[&] { return round_us(eager_unfused, data, steps); }, &eu});
      contenders.push_back({[&] { return round_us(traced_unfused, data, steps); }, &tu});
    }
    for (auto& run : variant_runs) {
      contenders.push_back({[&data, steps, r = run.get()] { return round_us(r->step, data, steps, &r->cpu); }, &run->wall});
    }
    for (int i = 0; i < 3; ++i) {  // warm-up (and the trace)
      round_us(eager, data, 1);
      round_us(traced, data, 1);
      if (unfused) {
        round_us(eager_unfused, data, 1);
        round_us(traced_unfused, data, 1);
      }
      for (auto& run : variant_runs) round_us(run->step, data, 1);
    }
    // Each round times every contender once, in a balanced order (round_order.hpp): eager first in
    // one round, traced first in the next, so neither always runs in the other's wake.
    int round = 0;
    auto measure_rounds = [&](int count) {
      for (int r = 0; r < count; ++r, ++round) {
        for (const size_t which : flowlet_bench::round_order(contenders.size(), round)) {
          contenders[which].samples->push_back(contenders[which].round());
        }
      }
    };
    measure_rounds(rounds / 2);
    std::optional<flowlet_bench::TfRecord> tf;
    std::string why;
    if (with_tf) {
      tf = flowlet_bench::run_tf_peer({"mlp_step", "--batch", std::to_string(batch), "--threads", std::to_string(threads),
                                       "--optimizer", "adam", "--samples", std::to_string(tf_samples)},
                                      &why);
    }
    measure_rounds(rounds - rounds / 2);
    const double eager_us = median(e), traced_us = median(t);
    std::printf("batch %lld: eager %.0f us, traced %.0f us (median of %d interleaved rounds of %d steps), traced/eager %.2f\n",
                static_cast<long long>(batch), eager_us, traced_us, rounds, steps, traced_us / eager_us);
    // Process CPU time per step (every thread; a polling pool worker counts too): with
    // FLOWLET_NUM_THREADS=1 the work each step does, which load moves far less than wall time.
    std::printf("   cpu per step: eager %.0f us, traced %.0f us, traced/eager %.2f\n", median(e_cpu), median(t_cpu),
                median(t_cpu) / median(e_cpu));
    std::printf("   median of the per-round ratios traced/eager: wall %.3f, cpu %.3f\n", median_ratio(t, e),
                median_ratio(t_cpu, e_cpu));
    for (const auto& run : variant_runs) {
      std::printf("   traced %s in the same rounds: %.0f us (cpu %.0f us); traced/this %.3f (cpu %.3f), per-round "
                  "median %.3f (cpu %.3f)\n",
                  run->variant->what, median(run->wall), median(run->cpu), traced_us / median(run->wall),
                  median(t_cpu) / median(run->cpu), median_ratio(t, run->wall), median_ratio(t_cpu, run->cpu));
    }
    if (unfused) {
      std::printf("   per-op Adam update() in the same rounds: eager %.0f us, traced %.0f us; fused/per-op: eager %.2f, "
                  "traced %.2f\n",
                  median(eu), median(tu), eager_us / median(eu), traced_us / median(tu));
    }
    if (!with_tf) continue;
    if (!tf) {
      std::printf("   TensorFlow: not available (%s)\n", why.c_str());
      continue;
    }
    auto us = [&](const char* mode) { return tf->number(std::string(mode) + "_s").value_or(NAN) * 1e6; };
    std::printf("   TensorFlow %d threads (median of %d samples): eager %.0f us, tf.function %.0f us, XLA %.0f us; "
                "flowlet traced/XLA %.2f, traced/tf.function %.2f\n",
                threads, tf_samples, us("eager"), us("function"), us("xla"), traced_us / us("xla"),
                traced_us / us("function"));
  }
}
