// Partitioned graphs on logical CPU devices, two problems (FLOWLET_NUM_THREADS=2 and
// FLOWLET_INTRA_OP_THREADS=1, set before any flowlet call: the pool reads them once):
//   1. Send/Recv of a 16 MiB f32 tensor from cpu:0 to cpu:1 against a plain memcpy of 16 MiB. Between
//      logical CPU devices the transfer is zero-copy (the Recv yields a view of the sender's buffer
//      labelled cpu:1), so what is measured is the cost of a step with a Send/Recv round: the traced
//      `reshape(x, {-1})` run on cpu:1 with x fed on cpu:0, beside the same graph on cpu:0 alone.
//      Target: the step moves 16 MiB at >= 0.8x memcpy's rate (it does no copy at all).
//   2. Two independent chains of 512 x 512 matmuls (about 10-50 ms each), one on cpu:0 and one on
//      cpu:1, against the same work on cpu:0 one chain after the other. Target: <= 0.65x. Measured
//      twice, with either chain recorded first (the recording order sets the order in which cpu:0's
//      partition meets its ready nodes, the Sends of cpu:1's inputs among them). The same two chains
//      in one graph on cpu:0 are shown too: the executor overlaps independent big nodes on one device
//      as well, so that row is for information; so are the same chains by hand (cblas_sgemm on two
//      std::threads and on one), which show what the machine allows. One step of each two-device
//      variant is written as Chrome trace-event JSON, whose events tell whether the devices overlapped.
//
//   bench_partition [--out DIR]   (timelines: DIR/partition_timeline{,_cpu1_first}.json; default DIR .)
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <flowlet/flowlet.hpp>

#include "../harness.hpp"

namespace fl = flowlet;
namespace bench = flowlet_bench;

namespace {

const fl::Device kCpu0("cpu:0"), kCpu1("cpu:1");

double max_abs_diff(const fl::Tensor& a, const fl::Tensor& b) {
  const std::vector<float> x = a.to_vector<float>(), y = b.to_vector<float>();
  if (x.size() != y.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(static_cast<double>(x[i]) - y[i]));
  return worst;
}

// --- 1. one Send/Recv of 16 MiB against memcpy ---

constexpr int64_t kTransferElements = int64_t{4} << 20;  // 16 MiB of f32
constexpr double kTransferBytes = kTransferElements * 4.0;

void compare_transfer() {
  const fl::Tensor x = fl::randn({4096, 1024}, /*seed=*/1);  // on cpu:0
  // reshape is a view: on one device the step copies nothing, so any extra cost on two devices is
  // the partitioning (the Send, the Recv, the second partition's start and the step's join).
  auto two_devices = fl::trace([](fl::Tensor t) {
    fl::DeviceScope on_1(kCpu1);
    return fl::reshape(t, {-1});
  });
  auto one_device = fl::trace([](fl::Tensor t) { return fl::reshape(t, {-1}); });

  const fl::Tensor received = two_devices(x);
  const fl::TransferStats moved = two_devices.last_transfer_stats();
  const bool zero_copy = received.raw_data() == x.raw_data();
  fmt::print("   check: result on {} ({} elements), {} transfer(s) of {} bytes per step; the Recv {}\n",
             received.device(), received.numel(), moved.transfers, moved.bytes,
             zero_copy ? "is ZERO-COPY: a view of the sender's buffer, labelled cpu:1 (same address)"
                       : "COPIED the tensor (its address differs from the sender's)");
  if (received.device() != kCpu1 || moved.transfers != 1 || moved.bytes != static_cast<int64_t>(kTransferBytes)) {
    fmt::print("   WARNING: expected one transfer of {} bytes arriving on cpu:1\n",
               static_cast<int64_t>(kTransferBytes));
  }

  std::vector<float> source(static_cast<size_t>(kTransferElements), 1.0f), target(source.size());
  bench::Section section("send/recv 16 MiB", bench::Metric::rate("GB/s", kTransferBytes / 1e9),
                         "16 MiB f32 from cpu:0 to cpu:1; a traced step's rate counts the 16 MiB it delivers");
  const bench::Result step2 =
      section.run("traced step, Send/Recv 0->1", [&] { bench::do_not_optimize(two_devices(x)); });
  const bench::Result step1 =
      section.run("same graph on cpu:0 (no Send)", [&] { bench::do_not_optimize(one_device(x)); });
  const bench::Result copy = section.run("memcpy 16 MiB", [&] {
    std::memcpy(target.data(), source.data(), static_cast<size_t>(kTransferBytes));
    bench::do_not_optimize(target.data());
  });
  const bench::Result to_device =
      section.run("eager x.to(cpu:1) (copies)", [&] { bench::do_not_optimize(x.to(kCpu1)); });
  if (step2.stats && step1.stats) {
    fmt::print("   the Send/Recv round itself (step on 2 devices - step on 1): {} per transfer\n",
               bench::format_time_ns(step2.stats->median_ns - step1.stats->median_ns));
  }
  section.compare(step2, copy, bench::Target::at_least(0.8, "zero-copy between logical CPU devices"));
  section.compare(to_device, copy, std::nullopt);
}

// --- 2. two independent branches on two devices ---

constexpr int64_t kSize = 512;
constexpr int kChain = 4;  // matmuls per branch

fl::Tensor chain(fl::Tensor t, const fl::Tensor& w) {
  for (int i = 0; i < kChain; ++i) t = fl::matmul(t, w);
  return t;
}

// The peer: the same chain with cblas_sgemm on preallocated buffers (`t` holds the input and, after
// an even number of products, the result; `scratch` the other half of each product).
void cblas_chain(std::vector<float>& t, std::vector<float>& scratch, const std::vector<float>& w) {
  for (int i = 0; i < kChain; ++i) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, kSize, kSize, kSize, 1.0f, t.data(), kSize, w.data(),
                kSize, 0.0f, scratch.data(), kSize);
    std::swap(t, scratch);
  }
}

// One trace-event object of timeline_json() (a flat object; a metadata event's "args" holds the
// device name of its pid).
struct Event {
  std::string name, phase, device_name;
  double ts = 0, dur = 0;
  int pid = 0;
};

std::string string_field(std::string_view object, std::string_view key) {
  const std::string quoted = fmt::format("\"{}\":\"", key);
  const size_t at = object.find(quoted);
  if (at == std::string_view::npos) return "";
  const size_t start = at + quoted.size();
  return std::string(object.substr(start, object.find('"', start) - start));
}

double number_field(std::string_view object, std::string_view key) {
  const std::string quoted = fmt::format("\"{}\":", key);
  const size_t at = object.find(quoted);
  return at == std::string_view::npos ? 0.0 : std::strtod(object.data() + at + quoted.size(), nullptr);
}

// Enough JSON for timeline_json()'s output: objects of the traceEvents array, nested at most once.
std::vector<Event> parse_events(std::string_view json) {
  std::vector<Event> events;
  size_t i = json.find('[', json.find("\"traceEvents\""));
  int depth = 0;
  size_t begin = 0;
  for (; i < json.size() && json[i] != ']'; ++i) {
    if (json[i] == '"') {  // skip strings: node names may hold braces
      for (++i; i < json.size() && json[i] != '"'; ++i) i += json[i] == '\\';
    } else if (json[i] == '{' && depth++ == 0) {
      begin = i;
    } else if (json[i] == '}' && --depth == 0) {
      const std::string_view object = json.substr(begin, i + 1 - begin);
      Event e;
      e.phase = string_field(object, "ph");
      e.name = e.phase == "M" ? "" : string_field(object, "name");
      const size_t args = object.find("\"args\":");
      if (args != std::string_view::npos) e.device_name = string_field(object.substr(args + 7), "name");
      e.ts = number_field(object, "ts");
      e.dur = number_field(object, "dur");
      e.pid = static_cast<int>(number_field(object, "pid"));
      events.push_back(std::move(e));
    }
  }
  return events;
}

// What one two-device step's timeline shows: each device's busy time (op runs merged; Send and Recv
// left out, since a Recv's span is mostly waiting), the time both devices ran ops at once, and when
// cpu:1's last Recv finished (its inputs arrived).
struct TimelineSummary {
  std::map<std::string, double> busy_us;
  double both_us = 0;
  double cpu1_inputs_at_us = 0;
};

TimelineSummary summarize(const std::vector<Event>& events) {
  std::map<int, std::string> device_of;
  for (const Event& e : events) {
    if (e.phase == "M") device_of[e.pid] = e.device_name;
  }
  TimelineSummary summary;
  std::map<std::string, std::vector<std::pair<double, double>>> spans;
  for (const Event& e : events) {
    if (e.phase != "X") continue;
    const std::string& device = device_of[e.pid];
    if (e.name.starts_with("recv") && device == "cpu:1") {
      summary.cpu1_inputs_at_us = std::max(summary.cpu1_inputs_at_us, e.ts + e.dur);
    }
    if (!e.name.starts_with("send") && !e.name.starts_with("recv")) spans[device].emplace_back(e.ts, e.ts + e.dur);
  }
  // Merge each device's spans into disjoint intervals, then intersect the two devices' lists.
  std::map<std::string, std::vector<std::pair<double, double>>> merged;
  for (auto& [device, list] : spans) {
    std::sort(list.begin(), list.end());
    auto& out = merged[device];
    for (const auto& span : list) {
      if (!out.empty() && span.first <= out.back().second) out.back().second = std::max(out.back().second, span.second);
      else out.push_back(span);
    }
    for (const auto& [start, end] : out) summary.busy_us[device] += end - start;
  }
  const auto& a = merged["cpu:0"];
  const auto& b = merged["cpu:1"];
  for (size_t i = 0, j = 0; i < a.size() && j < b.size();) {
    summary.both_us += std::max(0.0, std::min(a[i].second, b[j].second) - std::max(a[i].first, b[j].first));
    (a[i].second < b[j].second) ? ++i : ++j;
  }
  return summary;
}

// The two chains, each in a DeviceScope. The order they are recorded in is the only difference
// between the two variants: it decides the order of the graph's nodes, and with it the order in
// which cpu:0's partition meets its ready nodes (the Sends of cpu:1's inputs among them).
auto two_device_step(bool cpu1_recorded_first) {
  return [cpu1_recorded_first](fl::Tensor x, fl::Tensor y, fl::Tensor v) {
    fl::Tensor left, right;
    auto left_chain = [&] {
      fl::DeviceScope on_0(kCpu0);
      left = chain(x, v);
    };
    auto right_chain = [&] {
      fl::DeviceScope on_1(kCpu1);  // y and v are sent over; the chain runs in cpu:1's partition
      right = chain(y, v);
    };
    if (cpu1_recorded_first) right_chain(), left_chain();
    else left_chain(), right_chain();
    return std::vector<fl::Tensor>{left, right};
  };
}

// Records one two-device step (in a function of its own, so timed calls record nothing), writes its
// timeline and prints what it shows.
void write_and_check_timeline(bool cpu1_recorded_first, const fl::Tensor& a, const fl::Tensor& b, const fl::Tensor& w,
                              const std::string& out_dir) {
  fl::TraceOptions trace_options;
  trace_options.collect_step_stats = true;
  auto recorded = fl::trace(two_device_step(cpu1_recorded_first), trace_options);
  for (int i = 0; i < 3; ++i) recorded(a, b, w);  // the first call traces; keep the last step
  const std::string json = recorded.timeline_json();
  const std::string file = cpu1_recorded_first ? "partition_timeline_cpu1_first.json" : "partition_timeline.json";
  const std::string path = (std::filesystem::path(out_dir) / file).string();
  std::ofstream(path) << json << '\n';
  const TimelineSummary summary = summarize(parse_events(json));
  const double busy0 = summary.busy_us.count("cpu:0") ? summary.busy_us.at("cpu:0") : 0.0;
  const double busy1 = summary.busy_us.count("cpu:1") ? summary.busy_us.at("cpu:1") : 0.0;
  const double shorter = std::min(busy0, busy1);
  const double share = shorter > 0 ? summary.both_us / shorter : 0.0;
  fmt::print("   timeline, {} recorded first: {} (open in ui.perfetto.dev)\n", cpu1_recorded_first ? "cpu:1" : "cpu:0",
             path);
  fmt::print("     cpu:1's inputs arrived at {:.2f} ms; busy cpu:0 {:.2f} ms, cpu:1 {:.2f} ms; both at once {:.2f} ms "
             "= {:.0f}% of the shorter: overlap {}\n",
             summary.cpu1_inputs_at_us / 1e3, busy0 / 1e3, busy1 / 1e3, summary.both_us / 1e3, 100 * share,
             share >= 0.5 ? "YES" : "NO");
}

void compare_branches(const std::string& out_dir) {
  const fl::Tensor a = fl::randn({kSize, kSize}, /*seed=*/2);
  const fl::Tensor b = fl::randn({kSize, kSize}, /*seed=*/3);
  const fl::Tensor w = fl::randn({kSize, kSize}, /*seed=*/4) * static_cast<float>(1.0 / std::sqrt(kSize));
  auto two = fl::trace(two_device_step(/*cpu1_recorded_first=*/false));
  auto two_swapped = fl::trace(two_device_step(/*cpu1_recorded_first=*/true));
  auto one = fl::trace([](fl::Tensor x, fl::Tensor y, fl::Tensor v) {
    return std::vector<fl::Tensor>{chain(x, v), chain(y, v)};
  });
  auto single_chain = fl::trace([](fl::Tensor x, fl::Tensor v) { return chain(x, v); });

  const std::vector<fl::Tensor> expected{chain(a, w), chain(b, w)};
  double diff = 0;
  for (auto* f : {&two, &two_swapped}) {
    const std::vector<fl::Tensor> got = (*f)(a, b, w);
    diff = std::max({diff, max_abs_diff(got[0], expected[0]), max_abs_diff(got[1], expected[1])});
  }
  const std::vector<fl::Tensor> got_one = one(a, b, w);
  diff = std::max({diff, max_abs_diff(got_one[0], expected[0]), max_abs_diff(got_one[1], expected[1])});
  fmt::print("   check: max |traced - eager| {:.2e}{}; a two-device step moves {} bytes in {} transfers\n", diff,
             diff <= 1e-3 ? "" : "  WARNING: over 1e-3", two.last_transfer_stats().bytes,
             two.last_transfer_stats().transfers);

  bench::Options options;
  options.sample_seconds = 0.1;  // a call takes tens of ms: a few calls per sample
  options.warmup_seconds = 0.2;
  bench::Section section(
      "two branches", bench::Metric::time(),
      fmt::format("two independent chains of {} matmuls {}x{} f32, time per call", kChain, kSize, kSize));
  const bench::Result parted =
      section.run("2 devices, cpu:0's chain first", [&] { bench::do_not_optimize(two(a, b, w)); }, options);
  const bench::Result swapped =
      section.run("2 devices, cpu:1's chain first", [&] { bench::do_not_optimize(two_swapped(a, b, w)); }, options);
  const bench::Result serial = section.run("cpu:0, one chain after the other", [&] {
    bench::do_not_optimize(single_chain(a, w));
    bench::do_not_optimize(single_chain(b, w));
  }, options);
  const bench::Result merged =
      section.run("cpu:0, both chains in one graph", [&] { bench::do_not_optimize(one(a, b, w)); }, options);
  section.run("one chain alone on cpu:0", [&] { bench::do_not_optimize(single_chain(a, w)); }, options);
  // What the machine allows: the two chains by hand, on two std::threads and on one.
  const std::vector<float> wv = w.to_vector<float>();
  std::vector<float> av = a.to_vector<float>(), bv = b.to_vector<float>(), scratch_a(av.size()), scratch_b(bv.size());
  const bench::Result peer_two = section.run("peer: cblas on 2 std::threads", [&] {
    std::thread other([&] { cblas_chain(bv, scratch_b, wv); });
    cblas_chain(av, scratch_a, wv);
    other.join();
    bench::do_not_optimize(av.data());
  }, options);
  const bench::Result peer_one = section.run("peer: cblas, one after the other", [&] {
    cblas_chain(av, scratch_a, wv);
    cblas_chain(bv, scratch_b, wv);
    bench::do_not_optimize(av.data());
  }, options);
  section.compare(parted, serial, bench::Target::at_most(0.65));
  section.compare(swapped, serial, bench::Target::at_most(0.65));
  section.compare(parted, merged, std::nullopt);
  section.compare(swapped, merged, std::nullopt);
  section.compare(peer_two, peer_one, std::nullopt);  // the most two threads gain here

  std::filesystem::create_directories(out_dir);
  write_and_check_timeline(/*cpu1_recorded_first=*/false, a, b, w, out_dir);
  write_and_check_timeline(/*cpu1_recorded_first=*/true, a, b, w, out_dir);
}

}  // namespace

int main(int argc, char** argv) {
  // Before any flowlet call: the thread pool reads these once.
  setenv("FLOWLET_NUM_THREADS", "2", /*overwrite=*/1);
  setenv("FLOWLET_INTRA_OP_THREADS", "1", /*overwrite=*/1);
  openblas_set_num_threads(1);
  std::string out_dir = ".";
  if (argc == 3 && std::string_view(argv[1]) == "--out") out_dir = argv[2];
  else if (argc != 1) {
    fmt::print(stderr, "usage: bench_partition [--out DIR]\n");
    return 2;
  }
  bench::print_header("partitioned graphs on logical CPU devices (f32)");
  fmt::print("   threads: {} {} {}, openblas {}\n", bench::env_or_unset("FLOWLET_NUM_THREADS"),
             bench::env_or_unset("FLOWLET_INTRA_OP_THREADS"), bench::env_or_unset("FLOWLET_EXECUTOR"),
             openblas_get_num_threads());
  try {
    fl::set_logical_cpu_devices(2);
    compare_transfer();
    compare_branches(out_dir);
  } catch (const std::exception& error) {
    fmt::print("bench_partition: stopped early: {}\n", error.what());
  }
  return 0;  // benchmarks never gate
}
