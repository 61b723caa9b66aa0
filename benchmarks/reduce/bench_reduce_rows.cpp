// Reductions at training shapes beside libtorch: sum, mean and max over the last axis and over
// axis 0 of [N, 10], [N, 256], [N, 784] (N 64 .. 65536), f32 and f64, and argmax over the last
// axis as accuracy code uses it. Each case runs flowlet, libtorch and a plain one-thread C++ loop
// (the floor: what the same reduction costs written naively, f32/f64 accumulators in T) in paced
// interleaved rounds (benchmarks/paced_rounds.hpp: before each sample the process goes quiet,
// then the contender warms up alone); the figure per case is the median over rounds of the
// per-round ratio libtorch time / flowlet time (>= 1.0: flowlet at least as fast). flowlet has
// no min reduction (min is -max(-x) for a user), so min is not listed.
//   FLOWLET_NUM_THREADS=2 bench_reduce_rows [--rounds 8] [--warm-ms 5] [--sample-ms 10] [--no-quiet]
//                                           [--filter TEXT] [--all]
// Without --all a smaller set runs (under 2 minutes); --filter keeps cases whose name contains TEXT.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <flowlet/flowlet.hpp>

#include "../harness.hpp"
#include "../paced_rounds.hpp"
#include "../torch_peer.hpp"
#include "runtime/thread_pool.hpp"

namespace fl = flowlet;
namespace bench = flowlet_bench;

namespace {

enum class Kind { sum, mean, max, argmax };
const char* kind_name(Kind k) {
  switch (k) {
    case Kind::sum: return "sum";
    case Kind::mean: return "mean";
    case Kind::max: return "max";
    case Kind::argmax: return "argmax";
  }
  return "?";
}

struct Case {
  Kind kind;
  int64_t axis;  // 0 or 1 (the last)
  int64_t rows, cols;
  fl::DType dtype;
  std::string name() const {
    return fmt::format("{} axis {} of [{}, {}] {}", kind_name(kind), axis, rows, cols, dtype == fl::f32 ? "f32" : "f64");
  }
};

// The floor: the reduction as a plain one-thread loop, accumulating in T.
template <class T>
void plain_loop(const Case& c, const T* x, std::vector<T>& out) {
  const int64_t n = c.rows, m = c.cols;
  if (c.axis == 1) {
    out.resize(static_cast<size_t>(n));
    for (int64_t r = 0; r < n; ++r) {
      const T* row = x + r * m;
      T acc = c.kind == Kind::sum || c.kind == Kind::mean ? T{0} : row[0];
      int64_t best = 0;
      for (int64_t j = 0; j < m; ++j) {
        if (c.kind == Kind::sum || c.kind == Kind::mean) acc += row[j];
        else if (row[j] > acc) acc = row[j], best = j;
      }
      if (c.kind == Kind::mean) acc /= static_cast<T>(m);
      out[static_cast<size_t>(r)] = c.kind == Kind::argmax ? static_cast<T>(best) : acc;
    }
    return;
  }
  out.assign(x, x + m);
  for (int64_t r = 1; r < n; ++r) {
    const T* row = x + r * m;
    for (int64_t j = 0; j < m; ++j) {
      if (c.kind == Kind::max) out[static_cast<size_t>(j)] = std::max(out[static_cast<size_t>(j)], row[j]);
      else out[static_cast<size_t>(j)] += row[j];
    }
  }
  if (c.kind == Kind::mean)
    for (T& v : out) v /= static_cast<T>(n);
}

fl::Tensor flowlet_op(const Case& c, const fl::Tensor& x) {
  switch (c.kind) {
    case Kind::sum: return fl::sum(x, {c.axis});
    case Kind::mean: return fl::mean(x, {c.axis});
    case Kind::max: return fl::max(x, {c.axis});
    case Kind::argmax: return fl::argmax(x, c.axis);
  }
  return x;
}

#ifdef FLOWLET_BENCH_HAVE_TORCH
at::Tensor torch_op(const Case& c, const at::Tensor& x) {
  switch (c.kind) {
    case Kind::sum: return at::sum(x, at::IntArrayRef{c.axis});
    case Kind::mean: return at::mean(x, at::IntArrayRef{c.axis});
    case Kind::max: return std::get<0>(at::max(x, c.axis));
    case Kind::argmax: return at::argmax(x, c.axis);
  }
  return x;
}
#endif

std::vector<Case> all_cases(bool all) {
  std::vector<Case> cases;
  const std::vector<int64_t> widths = {10, 256, 784};
  for (fl::DType dt : {fl::f32, fl::f64}) {
    for (int64_t cols : widths) {
      std::vector<int64_t> ns = all ? std::vector<int64_t>{64, 1024, 4096, 16384, 65536} : std::vector<int64_t>{64, 4096};
      if (cols == 10) ns = all ? std::vector<int64_t>{64, 1024, 4096, 16384, 65536} : std::vector<int64_t>{64, 65536};
      for (int64_t n : ns) {
        if (n * cols > (int64_t{1} << 24)) continue;  // at most 16M elements
        for (Kind k : {Kind::sum, Kind::mean, Kind::max}) {
          for (int64_t axis : {int64_t{1}, int64_t{0}}) {
            if (!all && dt == fl::f64 && k == Kind::max) continue;
            cases.push_back({k, axis, n, cols, dt});
          }
        }
        if (cols == 10 || all) cases.push_back({Kind::argmax, 1, n, cols, dt});
      }
    }
  }
  // The shapes of issue 18's table, first.
  std::vector<Case> front = {{Kind::sum, 1, 4096, 256, fl::f32}, {Kind::sum, 1, 65536, 10, fl::f32},
                             {Kind::mean, 0, 1024, 256, fl::f32}};
  for (const Case& c : cases)
    if (c.name() != front[0].name() && c.name() != front[1].name() && c.name() != front[2].name()) front.push_back(c);
  return front;
}

struct Row {
  std::string name;
  double flowlet_us, torch_us, loop_us, ratio, ratio_min, ratio_max;
};

Row run_case(const Case& c, bench::Pacing pacing) {
  const fl::Tensor x = fl::uniform(fl::Shape{c.rows, c.cols}, -1.0, 1.0, /*seed=*/5, c.dtype);
  std::vector<bench::PacedContender> all;
  all.emplace_back("flowlet", [&] { bench::do_not_optimize(flowlet_op(c, x)); });
  std::vector<float> out32;
  std::vector<double> out64;
  all.emplace_back("loop", [&] {
    if (c.dtype == fl::f32) plain_loop(c, x.data<float>(), out32), bench::do_not_optimize(out32.data());
    else plain_loop(c, x.data<double>(), out64), bench::do_not_optimize(out64.data());
  });
#ifdef FLOWLET_BENCH_HAVE_TORCH
  at::Tensor tx = at::from_blob(const_cast<void*>(x.raw_data()), {c.rows, c.cols},
                                c.dtype == fl::f32 ? at::kFloat : at::kDouble);
  all.emplace_back("libtorch", [&] { bench::do_not_optimize(torch_op(c, tx)); });
#endif
  bench::run_paced_rounds(all, pacing);
  Row row{c.name(), all[0].median_ns() / 1e3, 0, all[1].median_ns() / 1e3, 0, 0, 0};
#ifdef FLOWLET_BENCH_HAVE_TORCH
  std::vector<double> ratios;
  for (size_t r = 0; r < all[0].per_call_ns.size(); ++r) ratios.push_back(all[2].per_call_ns[r] / all[0].per_call_ns[r]);
  row.torch_us = all[2].median_ns() / 1e3;
  row.ratio = bench::median_of(ratios);
  row.ratio_min = *std::min_element(ratios.begin(), ratios.end());
  row.ratio_max = *std::max_element(ratios.begin(), ratios.end());
#endif
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  bench::Pacing pacing{.rounds = 8, .warm_ms = 5, .sample_ms = 10};
  std::string filter;
  bool all = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (bench::parse_pacing_option(argc, argv, i, pacing)) continue;
    if (arg == "--filter" && i + 1 < argc) filter = argv[++i];
    else if (arg == "--all") all = true;
    else {
      fmt::print(stderr, "usage: bench_reduce_rows [--rounds N] [--warm-ms MS] [--sample-ms MS] [--no-quiet] [--filter TEXT] "
                         "[--all]\n");
      return 2;
    }
  }
#ifdef FLOWLET_BENCH_HAVE_TORCH
  at::set_num_threads(fl::detail::intra_op_threads());
  at::NoGradGuard no_grad;
#endif
  return bench::run_benchmark("bench_reduce_rows", "reductions at training shapes", /*torch_uses_all_threads=*/false, [&] {
    fmt::print("\n-- paced interleaved rounds: {} rounds, {} ms warm-up per contender, ~{} ms samples; flowlet {} "
               "threads, libtorch {} ({}, {}); load average {}\n",
               pacing.rounds, pacing.warm_ms, pacing.sample_ms, fl::detail::intra_op_threads(),
#ifdef FLOWLET_BENCH_HAVE_TORCH
               at::get_num_threads(),
#else
               "n/a",
#endif
               bench::env_or_unset("GOMP_SPINCOUNT"), bench::env_or_unset("OMP_WAIT_POLICY"), bench::load_average());
    fmt::print("   {:<34} {:>11} {:>11} {:>11}   {}\n", "case", "flowlet us", "libtorch us", "1-thr loop",
               "libtorch/flowlet per-round median (range), target >= 1.0");
    int met = 0, total = 0;
    for (const Case& c : all_cases(all)) {
      if (!filter.empty() && c.name().find(filter) == std::string::npos) continue;
      const Row r = run_case(c, pacing);
      ++total;
      met += r.ratio >= 1.0;
      fmt::print("   {:<34} {:>11.2f} {:>11.2f} {:>11.2f}   {:.2f} ({:.2f} .. {:.2f}) {}\n", r.name, r.flowlet_us,
                 r.torch_us, r.loop_us, r.ratio, r.ratio_min, r.ratio_max, r.ratio >= 1.0 ? "met" : "MISSED");
      std::fflush(stdout);
    }
    fmt::print("   {} of {} cases at least as fast as libtorch; load average after {}\n", met, total, bench::load_average());
  });
}
