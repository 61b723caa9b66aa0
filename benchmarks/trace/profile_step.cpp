// profile_step: where a traced training step spends its time, op by op, next to the eager step.
// Runs the demo's CNN step (batch 128, Adam) or the Adam MLP step (784-256-10) at a given batch,
// traced with TraceOptions::collect_step_stats, and sums the timeline of the last --steps calls per
// op name: calls, node time, and how much of it overlapped another node (two nodes on two threads
// at once). Prints the step's wall time, the node time, the gap (executor overhead and waiting),
// and, timed in interleaved rounds in the same process (balanced order, round_order.hpp; each
// contender's first call of a round untimed), the eager step, the traced step without statistics
// and the traced step with the concurrent and with the dataflow executor forced: median wall time
// and median process CPU time (all threads) per call, each against eager's. For issue 18's goal 3
// (why is traced not faster than eager?).
//
//   FLOWLET_NUM_THREADS=2 profile_step cnn [--steps N] [--rounds R] [--calls C]
//   FLOWLET_NUM_THREADS=2 profile_step mlp 1024 [--steps N] [--rounds R]
//   profile_step cnn --only eager|traced N     (N calls of one step and nothing else: for perf record)
// FLOWLET_EXECUTOR=sequential|dataflow|concurrent forces the executor's mode of the profiled and the
// plain traced step (the other two traced steps always run with the mode they name).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <flowlet/flowlet.hpp>

#include "../../examples/fashion_mnist_cnn.hpp"
#include "../../examples/fashion_mnist_mlp.hpp"
#include "../mlp_step.hpp"
#include "../round_order.hpp"

namespace fl = flowlet;

namespace {

struct Event {
  std::string op;
  double ts = 0, dur = 0;
  int tid = 0;
};

// The "X" events of timeline_json(): {"name":..,"cat":op,"ph":"X","ts":..,"dur":..,"pid":..,"tid":..}.
std::vector<Event> parse_events(const std::string& json) {
  std::vector<Event> events;
  auto field = [&](size_t from, size_t to, std::string_view key) -> std::string {
    const std::string pattern = "\"" + std::string(key) + "\":";
    size_t at = json.find(pattern, from);
    if (at == std::string::npos || at > to) return {};
    at += pattern.size();
    if (json[at] == '"') {
      const size_t end = json.find('"', at + 1);
      return json.substr(at + 1, end - at - 1);
    }
    size_t end = at;
    while (end < json.size() && json[end] != ',' && json[end] != '}') ++end;
    return json.substr(at, end - at);
  };
  for (size_t at = json.find("{\"name\""); at != std::string::npos; at = json.find("{\"name\"", at + 1)) {
    const size_t end = json.find('}', at);
    if (field(at, end, "ph") != "X") continue;
    Event e;
    e.op = field(at, end, "cat");
    e.ts = std::atof(field(at, end, "ts").c_str());
    e.dur = std::atof(field(at, end, "dur").c_str());
    e.tid = std::atoi(field(at, end, "tid").c_str());
    events.push_back(e);
  }
  return events;
}

struct OpTotal {
  int64_t calls = 0;
  double us = 0;
  double overlapped_us = 0;  // of us, the time another node ran at the same moment
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Contender {
  std::string name;
  std::function<void()> step;
  std::vector<double> ms;
  std::vector<double> cpu_ms;  // the process's CPU time (all threads) per call
};

double process_cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) / 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = argc > 1 ? argv[1] : "cnn";
  int64_t batch = model == "cnn" ? 128 : 1024;
  int steps = 5, rounds = 7;
  std::string only;  // --only eager|traced N: just N calls of that step (for perf record), no report
  int only_calls = 0;
  int calls_asked = 0;  // --calls N: timed calls per contender and round
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--only") == 0 && i + 2 < argc) {
      only = argv[++i];
      only_calls = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--calls") == 0 && i + 1 < argc) {
      calls_asked = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) steps = std::max(1, std::atoi(argv[++i]));
    else if (std::strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) rounds = std::max(0, std::atoi(argv[++i]));
    else batch = std::atoll(argv[i]);
  }
  using StepFn = std::function<fl::Tensor(fl::Tensor, fl::Tensor)>;
  fl::Tensor x, labels;
  std::vector<std::shared_ptr<void>> keep;
  // Four copies of the model: one traced with statistics, one traced without, one traced with the
  // concurrent executor forced, one eager.
  std::vector<StepFn> steps_of;
  for (int copy = 0; copy < 5; ++copy) {
    if (model == "cnn") {
      auto m = std::make_shared<fl::nn::Sequential>();
      examples::build_cnn(*m, 1);
      auto params = m->parameters();
      auto adam = std::make_shared<fl::optim::Adam>(1e-3);
      adam->build(params);
      keep.push_back(m);
      keep.push_back(adam);
      steps_of.push_back(examples::make_step(*m, *adam, params));
    } else {
      auto m = std::make_shared<flowlet_bench::mlp::FlowletMlp>();
      auto adam = std::make_shared<fl::optim::Adam>(1e-3);
      keep.push_back(m);
      keep.push_back(adam);
      steps_of.push_back([m, adam](fl::Tensor images, fl::Tensor y) {
        fl::GradientTape tape;
        fl::Tensor l = m->loss(images, y);
        adam->apply(tape.gradient(l, m->params), m->params);
        return l;
      });
    }
  }
  if (model == "cnn") {
    x = fl::uniform(fl::Shape{batch, 784}, 0.0, 1.0, 7);
  } else {
    x = fl::randn(fl::Shape{batch, 784}, 42);
  }
  labels = fl::tensor(flowlet_bench::mlp::label_values(batch), fl::Shape{batch});

  fl::TraceOptions with_stats;
  with_stats.collect_step_stats = true;
  auto profiled = fl::trace(steps_of[0], with_stats);
  auto traced = fl::trace(steps_of[1]);
  auto concurrent = fl::trace(steps_of[2]);
  auto dataflow = fl::trace(steps_of[3]);
  StepFn& eager = steps_of[4];
  {
    // The executor reads FLOWLET_EXECUTOR as it builds a plan: at the first call.
    const char* before = std::getenv("FLOWLET_EXECUTOR");
    const std::string saved = before ? before : "";
    setenv("FLOWLET_EXECUTOR", "concurrent", 1);
    (void)concurrent(x, labels).item<float>();
    setenv("FLOWLET_EXECUTOR", "dataflow", 1);
    (void)dataflow(x, labels).item<float>();
    if (before) {
      setenv("FLOWLET_EXECUTOR", saved.c_str(), 1);
    } else {
      unsetenv("FLOWLET_EXECUTOR");
    }
  }

  if (!only.empty()) {
    for (int i = 0; i < only_calls; ++i) {
      (void)(only == "eager" ? eager(x, labels) : traced(x, labels)).item<float>();
    }
    return 0;
  }
  for (int i = 0; i < 3; ++i) (void)profiled(x, labels).item<float>();
  std::map<std::string, OpTotal> totals;
  double wall_us = 0, node_us = 0, overlapped_us = 0;
  std::map<int, double> thread_us;
  int64_t nodes = 0;
  for (int s = 0; s < steps; ++s) {
    const auto start = std::chrono::steady_clock::now();
    (void)profiled(x, labels).item<float>();
    wall_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    const std::vector<Event> events = parse_events(profiled.timeline_json());
    for (const Event& e : events) {
      double overlap = 0;
      for (const Event& o : events) {
        if (&o == &e || o.tid == e.tid) continue;
        overlap += std::max(0.0, std::min(e.ts + e.dur, o.ts + o.dur) - std::max(e.ts, o.ts));
      }
      overlap = std::min(overlap, e.dur);
      OpTotal& t = totals[e.op];
      ++t.calls;
      t.us += e.dur;
      t.overlapped_us += overlap;
      node_us += e.dur;
      overlapped_us += overlap;
      thread_us[e.tid] += e.dur;
      ++nodes;
    }
  }
  const char* mode = std::getenv("FLOWLET_EXECUTOR");
  const char* threads = std::getenv("FLOWLET_NUM_THREADS");
  std::printf("%s step, batch %lld, FLOWLET_NUM_THREADS=%s, executor %s: %lld nodes per step\n", model.c_str(),
              static_cast<long long>(batch), threads ? threads : "unset", mode ? mode : "default",
              static_cast<long long>(nodes / steps));
  std::printf("per step: wall %.0f us, node time %.0f us (overlapped %.0f), threads:", wall_us / steps, node_us / steps,
              overlapped_us / steps);
  for (const auto& [tid, us] : thread_us) std::printf(" t%d %.0f us", tid, us / steps);
  std::printf("\n");
  std::vector<std::pair<std::string, OpTotal>> sorted(totals.begin(), totals.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second.us > b.second.us; });
  std::printf("%-32s %6s %10s %10s %10s\n", "op", "calls", "us/step", "us/call", "overlap");
  for (const auto& [op, t] : sorted) {
    std::printf("%-32s %6.1f %10.0f %10.1f %10.0f\n", op.c_str(), static_cast<double>(t.calls) / steps, t.us / steps,
                t.us / static_cast<double>(t.calls), t.overlapped_us / steps);
  }
  if (rounds == 0) return 0;
  const int calls = calls_asked > 0 ? calls_asked : model == "cnn" || batch >= 512 ? 3 : 20;
  std::vector<Contender> contenders = {
      {"traced", [&] { (void)traced(x, labels).item<float>(); }, {}},
      {"eager", [&] { (void)eager(x, labels).item<float>(); }, {}},
      {"traced, concurrent executor forced", [&] { (void)concurrent(x, labels).item<float>(); }, {}},
      {"traced, dataflow executor forced", [&] { (void)dataflow(x, labels).item<float>(); }, {}},
  };
  for (Contender& c : contenders) c.step();
  for (int r = 0; r < rounds; ++r) {
    for (const size_t j : flowlet_bench::round_order(contenders.size(), r)) {
      Contender& c = contenders[j];
      c.step();  // untimed: the first call after another contender
      const double cpu_start = process_cpu_ms();
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < calls; ++i) c.step();
      c.ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / calls);
      c.cpu_ms.push_back((process_cpu_ms() - cpu_start) / calls);
    }
  }
  std::printf("interleaved, %d rounds of 1 untimed + %d timed calls (balanced order), medians:\n", rounds, calls);
  for (const Contender& c : contenders) {
    std::printf("   %-36s %9.3f ms  (/ eager %.3f)   cpu %9.3f ms  (/ eager %.3f)\n", c.name.c_str(), median(c.ms),
                median(c.ms) / median(contenders[1].ms), median(c.cpu_ms), median(c.cpu_ms) / median(contenders[1].cpu_ms));
  }
  return 0;
}
