// bench_trace_adam: the MLP 784-256-10 step with Adam, eager against traced, interleaved (one eager
// round, one traced round, repeated), median of the rounds' per-step times. Run it with the thread
// budget under test, e.g. FLOWLET_NUM_THREADS=2 ./bench_trace_adam 1024 128 (issue 18, goal 3:
// traced is never slower than eager).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../mlp_step.hpp"

namespace fl = flowlet;
using namespace flowlet_bench::mlp;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class Step>
double round_us(Step& step, const Batch& data, int steps) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) (void)step(data.x, data.labels).template item<float>();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / steps;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> batches;
  for (int i = 1; i < argc; ++i) batches.push_back(std::atoll(argv[i]));
  if (batches.empty()) batches = {1024, 128};
  for (int64_t batch : batches) {
    const Batch data(batch);
    FlowletMlp eager_model, traced_model;
    fl::optim::Adam eager_adam(1e-3), traced_adam(1e-3);
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
    const int steps = batch >= 512 ? 5 : 20;
    for (int i = 0; i < 3; ++i) {  // warm-up (and the trace)
      round_us(eager, data, 1);
      round_us(traced, data, 1);
    }
    std::vector<double> e, t;
    for (int r = 0; r < 15; ++r) {
      e.push_back(round_us(eager, data, steps));
      t.push_back(round_us(traced, data, steps));
    }
    std::printf("batch %lld: eager %.0f us, traced %.0f us (median of 15 interleaved rounds of %d steps), traced/eager %.2f\n",
                static_cast<long long>(batch), median(e), median(t), steps, median(t) / median(e));
  }
}
