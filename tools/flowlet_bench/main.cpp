// flowlet-bench: times one op of flowlet's registry by name as Google Benchmark rows (eager,
// traced, traced + fused, libtorch), with bytes/s, FLOP/s and the percent of this machine's
// roofline. `flowlet-bench --help` documents the options; README.md shows a session.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "flowlet/flowlet.hpp"
#include "flowlet/op.hpp"
#include "flowlet/trace.hpp"
#include "op_table.hpp"
#include "options.hpp"
#include "roofline.hpp"
#include "runtime/thread_pool.hpp"  // thread_budget(): the threads the roofline and libtorch get
#include "torch_peer.hpp"

namespace fl = flowlet;
using namespace flowlet_bench;

namespace {

constexpr int kUsageStatus = 2;

int64_t bytes_of(const std::vector<fl::Tensor>& tensors) {
  int64_t bytes = 0;
  for (const fl::Tensor& t : tensors) bytes += t.numel() * static_cast<int64_t>(fl::dtype_size(t.dtype()));
  return bytes;
}

std::string join_dtypes(const std::vector<fl::DType>& dtypes) {
  std::vector<std::string_view> names;
  for (fl::DType d : dtypes) names.push_back(fl::dtype_name(d));
  return fmt::format("{}", fmt::join(names, ","));
}

// Whether `op` runs on cpu with `dtype`: one small call with probe_shapes(op).
bool probe(const fl::Op& op, fl::DType dtype) {
  try {
    const auto shapes = probe_shapes(op);
    const PreparedOp prepared = prepare_op(op, Attributes(), shapes.size(), dtype);
    std::vector<fl::Tensor> inputs;
    for (size_t i = 0; i < shapes.size(); ++i) {
      inputs.push_back(make_input(shapes[i], prepared.input_dtypes[i], prepared.index_inputs[i], fl::Device(), i + 1));
    }
    prepared.call(inputs);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

int list_ops() {
  fmt::print("{:<24} {:<34} {:<10} {}\n", "op", "dtypes (cpu, probed)", "devices", "inputs");
  for (const fl::Op* op : fl::all_ops()) {
    std::vector<std::string> devices;
    if (op->runs_on(fl::DeviceKind::cpu)) devices.push_back("cpu");
    if (op->runs_on(fl::DeviceKind::cuda)) devices.push_back("cuda");
    const std::string inputs = op->max_inputs < 0 ? fmt::format("{}+", op->min_inputs)
                               : op->min_inputs == op->max_inputs ? fmt::format("{}", op->min_inputs)
                                                                  : fmt::format("{}-{}", op->min_inputs, op->max_inputs);
    const std::string reason = unsupported_reason(*op);
    std::string dtypes;
    if (reason.empty()) {
      std::vector<fl::DType> ok;
      for (int i = 0; i < fl::kNumDTypes; ++i) {
        if (probe(*op, static_cast<fl::DType>(i))) ok.push_back(static_cast<fl::DType>(i));
      }
      dtypes = ok.empty() ? "-" : join_dtypes(ok);
    } else {
      dtypes = "(not benchmarkable)";
    }
    fmt::print("{:<24} {:<34} {:<10} {}{}\n", op->name, dtypes, fmt::format("{}", fmt::join(devices, ",")), inputs,
               reason.empty() ? "" : "  -- it " + reason);
  }
  return 0;
}

// One benchmark case: inputs made and the op run once (the error check), its figures.
struct Case {
  std::string name;  // op[attrs]/dtype/device/shapes
  fl::Device device;
  std::vector<fl::Tensor> inputs;
  OpCallFn call;
  int64_t bytes = 0;
  double flops = 0;
  double bound_seconds = 0;  // the roofline's lower bound on one call's time (0: no roofline)
};

using Clock = std::chrono::steady_clock;

// bytes_per_second and flops (rates over the real time, as the rows use real time) and
// roofline_pct: the roofline's time for the iterations over the loop's wall time, in percent.
void set_counters(benchmark::State& state, const Case& c, Clock::time_point loop_start) {
  const double elapsed = std::chrono::duration<double>(Clock::now() - loop_start).count();
  const auto iterations = static_cast<double>(state.iterations());
  state.SetBytesProcessed(state.iterations() * c.bytes);
  if (c.flops > 0) state.counters["flops"] = benchmark::Counter(iterations * c.flops, benchmark::Counter::kIsRate);
  if (c.bound_seconds > 0 && elapsed > 0) state.counters["roofline_pct"] = 100.0 * iterations * c.bound_seconds / elapsed;
}

void register_rows(const Case& c, const Options& options, const Attributes& attributes, const std::string& op_name) {
  auto shared = std::make_shared<Case>(c);
  const bool sync = c.device.kind() != fl::DeviceKind::cpu;
  for (Mode mode : options.modes) {
    const std::string row = c.name + "/" + mode_name(mode);
    benchmark::internal::Benchmark* b = nullptr;
    if (mode == Mode::eager) {
      b = benchmark::RegisterBenchmark(row.c_str(), [shared, sync](benchmark::State& state) {
        Clock::time_point start;
        bool first = true;
        for (auto _ : state) {
          if (first) start = Clock::now(), first = false;  // at the first iteration, as GB's own clock
          auto out = shared->call(shared->inputs);
          if (sync) fl::synchronize(shared->device);
          benchmark::DoNotOptimize(out);
        }
        set_counters(state, *shared, start);
      });
    } else if (mode == Mode::traced || mode == Mode::fused) {
      fl::TraceOptions trace_options;
      trace_options.name = "flowlet-bench " + c.name;
      trace_options.optimize = mode == Mode::fused;  // traced: no graph passes (fusion off); fused: all of them
      auto call = shared->call;
      auto traced = fl::trace([call](std::vector<fl::Tensor> xs) { return call(xs); }, trace_options);
      traced(shared->inputs);  // trace now, not inside the timing
      b = benchmark::RegisterBenchmark(row.c_str(), [shared, sync, traced](benchmark::State& state) mutable {
        Clock::time_point start;
        bool first = true;
        for (auto _ : state) {
          if (first) start = Clock::now(), first = false;
          auto out = traced(shared->inputs);
          if (sync) fl::synchronize(shared->device);
          benchmark::DoNotOptimize(out);
        }
        set_counters(state, *shared, start);
      });
    } else {
      std::function<void()> peer = torch_runner(op_name, attributes, shared->inputs);
      if (!peer) {
        if (options.modes_given) {
          fmt::print(stderr, "flowlet-bench: no libtorch row for {} ({})\n", row, setup_torch(fl::detail::thread_budget()));
        }
        continue;
      }
      peer();  // warm up (libtorch's first call allocates its thread pool)
      b = benchmark::RegisterBenchmark(row.c_str(), [shared, peer](benchmark::State& state) {
        Clock::time_point start;
        bool first = true;
        for (auto _ : state) {
          if (first) start = Clock::now(), first = false;
          peer();
        }
        set_counters(state, *shared, start);
      });
    }
    b->UseRealTime();  // ops run on the pool's threads: wall time is what the caller waits
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  try {
    options = parse_options(argc, argv);
  } catch (const UsageError& e) {
    fmt::print(stderr, "flowlet-bench: {}\n(flowlet-bench --help shows the options)\n", e.what());
    return kUsageStatus;
  }
  if (options.help) {
    fmt::print("{}", usage_text());
    return 0;
  }
  if (options.list) return list_ops();

  const fl::Op* op = fl::find_op(options.op);
  if (op == nullptr) {
    fmt::print(stderr, "flowlet-bench: unknown op '{}'; flowlet-bench --list shows the {} ops of the registry\n",
               options.op, fl::all_ops().size());
    return kUsageStatus;
  }
  if (options.shape_groups.empty()) {
    fmt::print(stderr, "flowlet-bench: {} needs --shapes (its inputs' shapes, e.g. --shapes 64x64,64x64)\n", op->name);
    return kUsageStatus;
  }

  const int threads = fl::detail::thread_budget();
  const bool any_cpu = std::any_of(options.devices.begin(), options.devices.end(),
                                   [](fl::Device d) { return d.kind() == fl::DeviceKind::cpu; });
  Roofline roofline;
  if (any_cpu) roofline = load_or_measure_roofline(threads, options.recalibrate);
  // libtorch loads (about a second) only when its rows are wanted, after the first case checked out.
  const bool want_torch = std::find(options.modes.begin(), options.modes.end(), Mode::torch) != options.modes.end();
  std::string torch = "libtorch: not asked for (--modes)";

  const std::string attrs = options.attributes.empty() ? "" : "[" + options.attributes.text() + "]";
  for (fl::DType dtype : options.dtypes) {
    for (fl::Device device : options.devices) {
      for (size_t g = 0; g < options.shape_groups.size(); ++g) {
        const auto& shapes = options.shape_groups[g];
        Case c;
        c.name = fmt::format("{}{}/{}/{}/{}", op->name, attrs, fl::dtype_name(dtype), device.str(), options.shape_texts[g]);
        c.device = device;
        std::vector<fl::Tensor> outputs;
        try {
          const PreparedOp prepared = prepare_op(*op, options.attributes, shapes.size(), dtype);
          c.call = prepared.call;
          for (size_t i = 0; i < shapes.size(); ++i) {
            c.inputs.push_back(make_input(shapes[i], prepared.input_dtypes[i], prepared.index_inputs[i], device, i + 1));
          }
          outputs = c.call(c.inputs);  // the op's own checks (infer) run here, before any timing
          fl::synchronize(device);
        } catch (const UsageError& e) {
          fmt::print(stderr, "flowlet-bench: {}\n", e.what());
          return kUsageStatus;
        } catch (const fl::Error& e) {
          fmt::print(stderr, "flowlet-bench: {} with shapes {} ({}, {}): {}\n", op->name, options.shape_texts[g],
                     fl::dtype_name(dtype), device.str(), e.what());
          return kUsageStatus;
        }
        c.bytes = bytes_of(c.inputs) + bytes_of(outputs);
        c.flops = flop_count(*op, c.inputs, outputs);
        if (device.kind() == fl::DeviceKind::cpu && roofline.bytes_per_second > 0) {
          const double peak = dtype == fl::f64 ? roofline.dgemm_flops : roofline.sgemm_flops;
          c.bound_seconds = std::max(static_cast<double>(c.bytes) / roofline.bytes_per_second, c.flops / peak);
        }
        if (want_torch && g == 0 && dtype == options.dtypes[0] && device == options.devices[0]) torch = setup_torch(threads);
        register_rows(c, options, options.attributes, std::string(op->name));
      }
    }
  }

  benchmark::AddCustomContext("flowlet_threads", std::to_string(threads));
  benchmark::AddCustomContext("peer", torch);
  if (want_torch) {
    // libtorch's OpenMP threads spin at barriers by default; on a loaded machine that costs it
    // 100x on small ops (see docs/notes15/interop.md), so say which policy the run had.
    const char* policy = std::getenv("OMP_WAIT_POLICY");
    benchmark::AddCustomContext("OMP_WAIT_POLICY", policy != nullptr ? policy : "(unset: OpenMP default, spins)");
  }
  if (any_cpu) {
    benchmark::AddCustomContext("roofline_bandwidth_GBps", fmt::format("{:.2f}", roofline.bytes_per_second / 1e9));
    benchmark::AddCustomContext("roofline_f32_GFLOPs", fmt::format("{:.2f}", roofline.sgemm_flops / 1e9));
    benchmark::AddCustomContext("roofline_f64_GFLOPs", fmt::format("{:.2f}", roofline.dgemm_flops / 1e9));
    benchmark::AddCustomContext("roofline_source", roofline.from_cache ? "cache " + roofline.cache_path : "measured now");
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return kUsageStatus;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
