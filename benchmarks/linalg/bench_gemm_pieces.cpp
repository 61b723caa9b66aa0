// bench_gemm_pieces: where the time of a product split over the pool goes (issue 18 goal 1,
// docs/notes20/gemm.md). For one f32 product it times, in interleaved rounds of back-to-back calls
// after a warm-up (as bench_gemm_shapes samples), the whole product on one thread, the same split
// flowlet's driver makes (two single-threaded OpenBLAS pieces of rows or of columns, starting at
// multiples of 16, through the pool's parallel_for) with each piece's start and duration, a split
// of k into two partial products summed afterwards, threaded OpenBLAS, flowlet's matmul, flowlet's
// gemm_into into a kept C (matmul without dispatch and output allocation), oneDNN's sgemm and our
// packed-panel driver (kernels/gemm_packed.hpp) on one thread and on the budget's.
// A piece that takes longer than half the one-thread call shows repacking or a shared core; a late
// start shows wake-up; unequal pieces show the split's balance.
//   FLOWLET_NUM_THREADS=2 bench_gemm_pieces [--rounds 7] [--calls 20] [--shape M K N nn|tn|nt|tt]...
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <thread>
#include <vector>

#include <flowlet/flowlet.hpp>

#include "gemm_contenders.hpp"
#include "kernels/gemm_packed.hpp"
#include "ops/gemm.hpp"
#include "runtime/thread_pool.hpp"

namespace fl = flowlet;
namespace bench = flowlet_bench;
using flowlet_bench::gemm::Clock;
using flowlet_bench::gemm::median;
using flowlet_bench::gemm::us_since;
using flowlet_bench::gemm::wait_until_process_idle;
using Product = flowlet_bench::gemm::Product<float>;

namespace {

struct Spec {
  int64_t m, k, n;
  bool a_t, b_t;
};

// How one variant's calls went: per call the total, and per piece (0 = first chunk) its start
// after the call began, its duration, and whether the calling thread ran it.
struct Record {
  Record(std::string n, std::function<void()> c, bool s = false) : name(std::move(n)), call(std::move(c)), split(s) {}
  std::string name;
  std::function<void()> call;
  bool split = false;  // split_call records its own times
  std::vector<double> total_us, start_us[2], piece_us[2];
  std::vector<double> round_us;  // per round, the median of its calls
  int by_worker[2] = {0, 0};
};

enum class Split { rows, columns, depth };

// C = op(A) op(B) as two single-threaded cblas_sgemm pieces over the pool, as flowlet's driver
// splits (rows or columns at a multiple of 16), or over k (two partial products, the second into
// `scratch`, summed after).
void split_call(Product& p, Split split, std::vector<float>& scratch, Record& rec) {
  const auto t0 = Clock::now();
  const auto caller = std::this_thread::get_id();
  const int64_t extent = split == Split::rows ? p.m : split == Split::columns ? p.n : p.k;
  const int64_t edge = extent / 2 / 16 * 16;
  const int lda = p.lda(), ldb = p.ldb(), ldc = static_cast<int>(p.n);
  const CBLAS_TRANSPOSE ta = p.a_t ? CblasTrans : CblasNoTrans, tb = p.b_t ? CblasTrans : CblasNoTrans;
  Clock::time_point start[2], end[2];
  bool by_caller[2] = {true, true};
  fl::detail::parallel_for(2, 1, [&](int64_t begin, int64_t stop) {
    for (int64_t q = begin; q < stop; ++q) {
      start[q] = Clock::now();
      const int64_t lo = q == 0 ? 0 : edge, hi = q == 0 ? edge : extent;
      const float* a = p.pa();
      const float* b = p.pb();
      float* c = p.c.data();
      int M = static_cast<int>(p.m), N = static_cast<int>(p.n), K = static_cast<int>(p.k);
      if (split == Split::rows) {
        a += p.a_t ? lo : lo * lda;
        c += lo * p.n;
        M = static_cast<int>(hi - lo);
      } else if (split == Split::columns) {
        b += p.b_t ? lo * ldb : lo;
        c += lo;
        N = static_cast<int>(hi - lo);
      } else {
        a += p.a_t ? lo * lda : lo;
        b += p.b_t ? lo : lo * ldb;
        if (q == 1) c = scratch.data();
        K = static_cast<int>(hi - lo);
      }
      cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
      end[q] = Clock::now();
      by_caller[q] = std::this_thread::get_id() == caller;
    }
  });
  if (split == Split::depth) {  // the two partial products summed, rows split over the pool
    float* c = p.c.data();
    const float* other = scratch.data();
    fl::detail::parallel_for(p.m * p.n, 1 << 15, [&](int64_t begin, int64_t stop) {
      for (int64_t i = begin; i < stop; ++i) c[i] += other[i];
    });
  }
  rec.total_us.push_back(us_since(t0, Clock::now()));
  for (int q = 0; q < 2; ++q) {
    rec.start_us[q].push_back(us_since(t0, start[q]));
    rec.piece_us[q].push_back(us_since(start[q], end[q]));
    rec.by_worker[q] += by_caller[q] ? 0 : 1;
  }
}

void run(const Spec& s, int rounds, int calls, int budget) {
  Product p(s.m, s.k, s.n, s.a_t, s.b_t);
  std::vector<float> scratch(static_cast<size_t>(s.m * s.n));
  std::vector<Record> all;
  Record* current = nullptr;
  all.emplace_back("OpenBLAS 1t, whole", [&] { p.openblas(1); });
  all.emplace_back("split rows", [&] { split_call(p, Split::rows, scratch, *current); }, true);
  all.emplace_back("split columns", [&] { split_call(p, Split::columns, scratch, *current); }, true);
  all.emplace_back("split k, summed", [&] { split_call(p, Split::depth, scratch, *current); }, true);
  all.emplace_back(fmt::format("OpenBLAS {}t", budget), [&] { p.openblas(budget); });
  all.emplace_back("flowlet matmul", [&] { p.flowlet_matmul(); });
  // The same product into a C kept across calls (no dispatch, no output allocation): matmul minus
  // this is the op's own cost; this minus the bare oneDNN / OpenBLAS call is the driver's.
  fl::Tensor kept = fl::Tensor::empty(fl::Shape{s.m, s.n}, fl::f32);
  all.emplace_back("flowlet gemm_into", [&] { fl::detail::gemm_into(p.a, p.b, kept, 1.0, 0.0); });
#ifdef FLOWLET_HAVE_DNNL
  all.emplace_back("oneDNN 1t", [&] { p.onednn(); });
#endif
  // Our packed-panel driver (kernels/gemm_packed.hpp) bare, on one thread and on the budget's.
  if (fl::detail::packed_sgemm_supported()) {
    for (int threads : {1, budget}) {
      if (threads == 1 && budget == 1 && all.back().name == "packed 1t") continue;
      all.emplace_back(fmt::format("packed {}t", threads), [&p, threads] {
        fl::detail::packed_sgemm(p.a_t, p.b_t, p.m, p.n, p.k, 1.0f, p.pa(), p.lda(), p.pb(), p.ldb(), 0.0f, p.c.data(),
                                 p.n, threads);
      });
    }
  }
  for (int r = 0; r < rounds; ++r) {
    for (size_t j = 0; j < all.size(); ++j) {
      Record& rec = all[(j + static_cast<size_t>(r)) % all.size()];
      current = &rec;
      wait_until_process_idle();
      Record warm(rec.name, rec.call, rec.split);
      current = &warm;
      const auto until = Clock::now() + std::chrono::milliseconds(20);
      do rec.call();
      while (Clock::now() < until);
      current = &rec;
      const size_t before = rec.total_us.size();
      for (int i = 0; i < calls; ++i) {
        const auto t0 = Clock::now();
        rec.call();
        if (!rec.split) rec.total_us.push_back(us_since(t0, Clock::now()));
      }
      rec.round_us.push_back(median(std::vector<double>(rec.total_us.begin() + static_cast<std::ptrdiff_t>(before), rec.total_us.end())));
    }
  }
  const double flops = p.flops();
  fmt::print("\n-- {}x{}x{}{}{}: medians of {} calls ({} rounds of {})\n", s.m, s.k, s.n, s.a_t ? " A^T" : "",
             s.b_t ? " B^T" : "", rounds * calls, rounds, calls);
  // Per round, each variant's time over flowlet gemm_into's (the current driver) in that round
  // (a few ms apart, so both saw the same load): the median over rounds, with the lowest and highest.
  const Record* current_driver = nullptr;
  for (const Record& rec : all) {
    if (rec.name == "flowlet gemm_into") current_driver = &rec;
  }
  auto versus_driver = [&](const Record& rec) {
    std::vector<double> ratio;
    for (size_t r = 0; r < rec.round_us.size(); ++r) ratio.push_back(rec.round_us[r] / current_driver->round_us[r]);
    const auto [lo, hi] = std::minmax_element(ratio.begin(), ratio.end());
    return fmt::format("{:>5.2f} [{:.2f}-{:.2f}]", median(ratio), *lo, *hi);
  };
  fmt::print("   {:<22} {:>9} {:>8}  {:>17}   {:>9} {:>9} {:>9} {:>9} {:>10}\n", "variant", "total us", "GFLOP/s",
             "t / gemm_into", "1st start", "1st us", "2nd start", "2nd us", "2nd worker");
  for (Record& rec : all) {
    const double total = median(rec.total_us);
    std::string line = fmt::format("   {:<22} {:>9.1f} {:>8.1f}  {:>17}", rec.name, total, flops / (total * 1e3),
                                   versus_driver(rec));
    if (!rec.start_us[0].empty()) {
      line += fmt::format("   {:>9.1f} {:>9.1f} {:>9.1f} {:>9.1f} {:>6}/{}", median(rec.start_us[0]), median(rec.piece_us[0]),
                          median(rec.start_us[1]), median(rec.piece_us[1]), rec.by_worker[1], rec.total_us.size());
    }
    fmt::print("{}\n", line);
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 7, calls = 20;
  std::vector<Spec> shapes;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--rounds" && i + 1 < argc) rounds = std::atoi(argv[++i]);
    else if (arg == "--calls" && i + 1 < argc) calls = std::atoi(argv[++i]);
    else if (arg == "--shape" && i + 4 < argc) {
      const std::string flags = argv[i + 4];
      shapes.push_back({std::atoll(argv[i + 1]), std::atoll(argv[i + 2]), std::atoll(argv[i + 3]), flags.starts_with('t'),
                        flags.ends_with('t')});
      i += 4;
    } else {
      fmt::print(stderr, "usage: bench_gemm_pieces [--rounds N] [--calls N] [--shape M K N nn|tn|nt|tt]...\n");
      return 2;
    }
  }
  if (shapes.empty()) {
    shapes = {{128, 784, 256, false, false}, {784, 128, 256, true, false}, {1024, 784, 256, false, false},
              {784, 1024, 256, true, false}, {512, 512, 512, false, false}};
  }
  const int budget = fl::detail::thread_budget();
  bench::print_header("bench_gemm_pieces");
  fmt::print("   budget {} threads\n", budget);
  openblas_set_num_threads(1);
#ifdef FLOWLET_BENCH_HAVE_TORCH
  at::set_num_threads(budget);
#endif
  for (const Spec& s : shapes) run(s, rounds, calls, budget);
  return 0;
}
