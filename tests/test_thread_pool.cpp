// The process-wide pool: parallel_for from many threads at once, scheduled tasks (alone, calling
// parallel_for, blocking every worker), chunk exceptions reaching their own caller, and matmul split
// over the pool against a naive loop and against one single-threaded BLAS call.
#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "exec/executor.hpp"
#include "runtime/thread_pool.hpp"
#include "support/reference.hpp"
#include "support/scoped_env.hpp"

using flowlet::detail::intra_op_threads;
using flowlet::detail::parallel_for;
using flowlet::detail::schedule;
using flowlet::detail::thread_budget;

namespace {

// At least three workers even on a 2-core machine, so that tasks and chunks really interleave. Set
// before the pool reads it (at its first use); a FLOWLET_NUM_THREADS from the environment wins.
const bool threads_configured = [] { return setenv("FLOWLET_NUM_THREADS", "4", /*overwrite=*/0) == 0; }();

constexpr auto kTimeout = std::chrono::seconds(30);

using test::ScopedEnv;

// A countdown with a timed wait (std::latch has none), so a lost task fails the test, not hangs it.
class Countdown {
 public:
  explicit Countdown(int count) : left_(count) {}
  void arrive() {
    std::lock_guard lock(mutex_);
    if (--left_ == 0) done_.notify_all();
  }
  bool wait() {
    std::unique_lock lock(mutex_);
    return done_.wait_for(lock, kTimeout, [&] { return left_ == 0; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_;
  int left_;
};

// Sum of [0, n) through parallel_for, each index added once.
int64_t parallel_sum(int64_t n, int64_t grain) {
  std::atomic<int64_t> total{0};
  parallel_for(n, grain, [&](int64_t begin, int64_t end) {
    int64_t part = 0;
    for (int64_t i = begin; i < end; ++i) part += i;
    total += part;
  });
  return total.load();
}

constexpr int64_t kN = int64_t{1} << 20;
constexpr int64_t kWant = kN * (kN - 1) / 2;

}  // namespace

TEST_CASE("the budget comes from FLOWLET_NUM_THREADS") {
  REQUIRE(threads_configured);
  const char* env = std::getenv("FLOWLET_NUM_THREADS");
  REQUIRE(env != nullptr);
  const int asked = std::atoi(env);  // not a positive number: all hardware threads
  CHECK(thread_budget() == (asked >= 1 ? asked : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))));
  CHECK(intra_op_threads() <= thread_budget());
}

TEST_CASE("parallel_for called from several threads at once gives every caller its own correct sum") {
  constexpr int kThreads = 6, kCalls = 50;
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCalls; ++i) {
        const int64_t n = kN - t * 1000 - i;  // a different range per call
        if (parallel_sum(n, 4096) != n * (n - 1) / 2) ++wrong;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(wrong.load() == 0);
}

TEST_CASE("a parallel_for nested inside a chunk runs inline on that chunk's thread") {
  std::atomic<int> elsewhere{0};
  parallel_for(64, 1, [&](int64_t, int64_t) {
    const std::thread::id outer = std::this_thread::get_id();
    parallel_for(kN, 1, [&](int64_t, int64_t) {
      if (std::this_thread::get_id() != outer) ++elsewhere;
    });
  });
  CHECK(elsewhere.load() == 0);
}

TEST_CASE("schedule runs every task exactly once") {
  constexpr int kTasks = 2000;
  struct State {
    std::vector<std::atomic<int>> runs = std::vector<std::atomic<int>>(kTasks);
    Countdown done{kTasks};
  } state;
  struct Arg {
    State* state;
    int index;
  };
  std::vector<Arg> args(kTasks);
  for (int i = 0; i < kTasks; ++i) {
    args[i] = {&state, i};
    schedule(
        [](void* p) noexcept {
          auto* arg = static_cast<Arg*>(p);
          arg->state->runs[arg->index]++;
          arg->state->done.arrive();
        },
        &args[i]);
  }
  REQUIRE(state.done.wait());
  int not_once = 0;
  for (const auto& r : state.runs) not_once += r.load() != 1;
  CHECK(not_once == 0);
}

TEST_CASE("tasks may call parallel_for and schedule further tasks") {
  constexpr int kTasks = 16;
  struct State {
    std::vector<int64_t> sums = std::vector<int64_t>(2 * kTasks, -1);
    Countdown done{2 * kTasks};
  } state;
  struct Arg {
    State* state;
    int index;
  };
  std::vector<Arg> args(2 * kTasks);
  for (int i = 0; i < 2 * kTasks; ++i) args[i] = {&state, i};
  // Each first-level task schedules its twin, then both sum into their own slots.
  auto first_task = [](void* p) noexcept {
    auto* arg = static_cast<Arg*>(p);
    schedule(
        [](void* q) noexcept {
          auto* twin = static_cast<Arg*>(q);
          twin->state->sums[twin->index] = parallel_sum(kN, 4096);
          twin->state->done.arrive();
        },
        arg + kTasks);
    arg->state->sums[arg->index] = parallel_sum(kN, 4096);
    arg->state->done.arrive();
  };
  for (int i = 0; i < kTasks; ++i) schedule(first_task, &args[i]);
  REQUIRE(state.done.wait());
  for (int i = 0; i < 2 * kTasks; ++i) CHECK(state.sums[i] == kWant);
}

TEST_CASE("with every worker blocked, a parallel_for caller runs all its chunks itself") {
  const int workers = thread_budget() - 1;
  if (workers == 0) {  // FLOWLET_NUM_THREADS=1: no worker, and schedule runs the task inline
    bool ran = false;
    schedule([](void* p) noexcept { *static_cast<bool*>(p) = true; }, &ran);
    CHECK(ran);
    return;
  }
  struct State {
    std::atomic<int> started{0};
    std::mutex mutex;
    std::condition_variable changed;
    bool release = false;
    std::unique_ptr<Countdown> done;
  } state;
  state.done = std::make_unique<Countdown>(workers);
  for (int i = 0; i < workers; ++i) {
    schedule(
        [](void* p) noexcept {
          auto* s = static_cast<State*>(p);
          std::unique_lock lock(s->mutex);
          ++s->started;
          s->changed.notify_all();
          s->changed.wait_for(lock, kTimeout, [&] { return s->release; });
          lock.unlock();
          s->done->arrive();
        },
        &state);
  }
  {
    std::unique_lock lock(state.mutex);
    REQUIRE(state.changed.wait_for(lock, kTimeout, [&] { return state.started == workers; }));
  }
  std::atomic<int> elsewhere{0};
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<int64_t> total{0};
  parallel_for(kN, 1024, [&](int64_t begin, int64_t end) {
    if (std::this_thread::get_id() != caller) ++elsewhere;
    int64_t part = 0;
    for (int64_t i = begin; i < end; ++i) part += i;
    total += part;
  });
  CHECK(total.load() == kWant);
  CHECK(elsewhere.load() == 0);
  {
    std::lock_guard lock(state.mutex);
    state.release = true;
  }
  state.changed.notify_all();
  REQUIRE(state.done->wait());
}

// The mode the executor chooses for a traced function's (optimized) graph.
flowlet::detail::RunMode plan_mode(const fl::Graph& graph) {
  return flowlet::detail::Plan(std::make_shared<const fl::Graph>(graph), /*dynamic_shapes=*/false).mode();
}

TEST_CASE("a plan overlaps independent big nodes only when one of them leaves threads idle") {
  using flowlet::detail::RunMode;
  if (thread_budget() == 1 || intra_op_threads() < thread_budget()) return;  // nothing to decide
  const ScopedEnv automatic("FLOWLET_EXECUTOR", nullptr);
  fl::TraceOptions options;
  options.fuse_elementwise = false;  // keep the two branches separate nodes
  // Two independent elementwise nodes, each big enough that its parallel_for has a chunk for every
  // thread (and over the "expensive" line): overlapping them cannot pay.
  const int64_t filling = std::max<int64_t>(flowlet::detail::kParallelGrain * thread_budget(), 1 << 18);
  auto branches = fl::trace([](fl::Tensor x) { return fl::exp(x) + fl::sqrt(x); }, options);
  const fl::Tensor big = fl::ones({filling});
  CHECK(plan_mode(branches.graph(big)) == RunMode::sequential);
  // Two independent GEMMs of 128 x 256 x 160 = 5.2M multiply-adds: more than one thread's share
  // (4.2M), less than two threads': each leaves threads idle, so they overlap.
  auto products = fl::trace([](fl::Tensor a, fl::Tensor b, fl::Tensor c) { return fl::matmul(a, b) + fl::matmul(c, b); },
                            options);
  const fl::Tensor a = fl::ones({128, 256}), b = fl::ones({256, 160}), c = fl::ones({128, 256});
  CHECK(plan_mode(products.graph(a, b, c)) == RunMode::concurrent);
  // The same GEMMs one after the other: nothing independent to overlap.
  auto chain = fl::trace([](fl::Tensor a, fl::Tensor b, fl::Tensor c) { return fl::matmul(fl::matmul(a, b), fl::transpose(b)) + c; },
                         options);
  CHECK(plan_mode(chain.graph(a, b, c)) == RunMode::sequential);
  // FLOWLET_EXECUTOR forces a mode, read whenever a plan is built.
  {
    const ScopedEnv forced("FLOWLET_EXECUTOR", "concurrent");
    CHECK(plan_mode(branches.graph(big)) == RunMode::concurrent);
  }
  {
    const ScopedEnv forced("FLOWLET_EXECUTOR", "sequential");
    CHECK(plan_mode(products.graph(a, b, c)) == RunMode::sequential);
  }
  {
    const ScopedEnv forced("FLOWLET_EXECUTOR", "dataflow");
    CHECK(plan_mode(products.graph(a, b, c)) == RunMode::dataflow);
    CHECK(plan_mode(branches.graph(big)) == RunMode::dataflow);
  }
  {
    const ScopedEnv unknown("FLOWLET_EXECUTOR", "fastest");  // not a mode: the plan chooses
    CHECK(plan_mode(branches.graph(big)) == RunMode::sequential);
  }
  // Both modes give the eager result.
  const std::vector<float> want = (fl::matmul(a, b) + fl::matmul(c, b)).to_vector<float>();
  CHECK(products(a, b, c).to_vector<float>() == want);
  CHECK(branches(big).to_vector<float>()[0] == doctest::Approx(std::exp(1.0f) + 1.0f));
}

TEST_CASE("the caller of a concurrent traced step runs the nodes it hands to the pool while it waits") {
  // Every worker is held by a task until the step has returned, so the nodes the plan hands to the
  // pool (q below: p and q are independent and big, and the plan is made concurrent) can only run on
  // the step's calling thread. A caller that slept in the step's wait would leave them queued until
  // the held tasks time out (issue 18: with FLOWLET_NUM_THREADS=2 the one worker then ran every
  // later node, and the caller idled).
  const int workers = thread_budget() - 1;
  if (workers == 0) return;  // FLOWLET_NUM_THREADS=1: the plan runs sequentially on the caller
  struct State {
    std::mutex mutex;
    std::condition_variable changed;
    int started = 0;
    bool release = false;
    int timed_out = 0;
    std::unique_ptr<Countdown> done;
  } state;
  state.done = std::make_unique<Countdown>(workers);
  auto hold = [](void* p) noexcept {
    auto* s = static_cast<State*>(p);
    std::unique_lock lock(s->mutex);
    ++s->started;
    s->changed.notify_all();
    if (!s->changed.wait_for(lock, std::chrono::seconds(5), [&] { return s->release; })) ++s->timed_out;
    lock.unlock();
    s->done->arrive();
  };
  std::mutex seen_mutex;
  std::vector<std::thread::id> seen;  // the threads the callbacks on p and q ran on
  auto record = [&](const std::vector<fl::Tensor>&) {
    std::lock_guard lock(seen_mutex);
    seen.push_back(std::this_thread::get_id());
  };
  fl::TraceOptions options;
  options.optimize = false;  // keep p and q separate nodes
  options.fuse_elementwise = false;
  // p and q each split over every thread, so left to itself the plan would run them in order
  // (fills_pool); this test is about the concurrent mode, so it asks for it (read as the plan is
  // built, at the first call below).
  const ScopedEnv concurrent("FLOWLET_EXECUTOR", "concurrent");
  auto f = fl::trace(
      [&](fl::Tensor x) {
        const fl::Tensor a = fl::exp(x * 0.001f);
        const fl::Tensor p = a * 2.0f, q = a * 3.0f;  // 2^19 elements each: worth a thread
        fl::host_callback(record, {p});
        fl::host_callback(record, {q});
        return p + q;
      },
      options);
  const fl::Tensor x = fl::ones({1 << 19});
  CHECK(f(x).to_vector<float>()[0] == doctest::Approx(5 * std::exp(0.001f)));  // traces, runs once
  seen.clear();
  for (int i = 0; i < workers; ++i) schedule(hold, &state);
  {
    std::unique_lock lock(state.mutex);
    REQUIRE(state.changed.wait_for(lock, kTimeout, [&] { return state.started == workers; }));
  }
  const std::vector<float> y = f(x).to_vector<float>();
  {
    std::lock_guard lock(state.mutex);
    state.release = true;
  }
  state.changed.notify_all();
  REQUIRE(state.done->wait());
  CHECK(state.timed_out == 0);  // the step finished while every worker was held
  CHECK(y[0] == doctest::Approx(5 * std::exp(0.001f)));
  CHECK(y[(1 << 19) - 1] == doctest::Approx(5 * std::exp(0.001f)));
  REQUIRE(seen.size() == 2);
  const std::thread::id caller = std::this_thread::get_id();
  CHECK(seen[0] == caller);
  CHECK(seen[1] == caller);
}

TEST_CASE("an exception from a chunk reaches its own caller after all of that call's chunks ran") {
  constexpr int kThreads = 4, kCalls = 30;
  const int64_t chunks = intra_op_threads();
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string mine = "from thread " + std::to_string(t);
      for (int i = 0; i < kCalls; ++i) {
        std::atomic<int64_t> ran{0};
        try {
          parallel_for(chunks, 1, [&](int64_t begin, int64_t) {
            ++ran;
            if (begin == i % chunks) throw std::runtime_error(mine);
          });
          ++wrong;  // nothing thrown
        } catch (const std::runtime_error& error) {
          if (error.what() != mine || ran.load() != chunks) ++wrong;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(wrong.load() == 0);
}

// matmul splits big products over the pool into single-threaded BLAS calls.
namespace {

// C = op(A) B by one single-threaded cblas call, the reference for "the same bits". `a` is stored
// as given: [m, k], or [k, m] when a_transposed (then op(A) = a^T, passed as a transpose flag).
template <class T>
std::vector<T> one_blas_call(const fl::Tensor& a, const fl::Tensor& b, bool a_transposed) {
  openblas_set_num_threads(1);  // what flowlet set at its first matmul; said again for clarity
  const fl::Tensor pa = a.contiguous(), pb = b.contiguous();
  const int m = static_cast<int>(a.shape()[a_transposed ? 1 : 0]), k = static_cast<int>(a.shape()[a_transposed ? 0 : 1]);
  const int n = static_cast<int>(b.shape()[1]);
  std::vector<T> c(static_cast<size_t>(m) * n);
  const CBLAS_TRANSPOSE ta = a_transposed ? CblasTrans : CblasNoTrans;
  const int lda = a_transposed ? m : k;
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta, CblasNoTrans, m, n, k, 1.0f, pa.data<float>(), lda, pb.data<float>(), n, 0.0f,
                c.data(), n);
  } else {
    cblas_dgemm(CblasRowMajor, ta, CblasNoTrans, m, n, k, 1.0, pa.data<double>(), lda, pb.data<double>(), n, 0.0,
                c.data(), n);
  }
  return c;
}

// The split product equals one call within rounding. Not bit for bit: which micro-kernel OpenBLAS
// picks (OPENBLAS_CORETYPE=Haswell on an AVX-512 machine, say) decides how a row block's edge is
// tiled, so a block may sum a few products in another order than the whole call does. A block
// placed wrongly (a row or column off) is off by O(1), far outside this bound.
template <class T>
bool matches_one_call(const fl::Tensor& got, const std::vector<T>& want) {
  const fl::Tensor g = got.contiguous();
  if (static_cast<size_t>(g.numel()) != want.size()) return false;
  double scale = 0;
  for (const T w : want) scale = std::max(scale, std::abs(static_cast<double>(w)));
  const T* values = g.data<T>();
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::abs(static_cast<double>(values[i]) - static_cast<double>(want[i])) > 1e-5 * scale) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("a big matmul split over the pool matches a naive loop and one BLAS call") {
  SUBCASE("tall f32: split by rows") {
    const fl::Tensor a = fl::randn(fl::Shape{517, 300}, 11), b = fl::randn(fl::Shape{300, 389}, 12);
    const fl::Tensor c = fl::matmul(a, b);
    CHECK(test::check_tensor(c, test::matmul_ref(test::host(a), test::host(b)).values, fl::Shape{517, 389}, fl::f32,
                             test::Tolerance{1e-4, 1e-3}));
    CHECK(matches_one_call(c, one_blas_call<float>(a, b, false)));
  }
  SUBCASE("wide f32 with a transposed view: split by columns") {
    const fl::Tensor at = fl::randn(fl::Shape{700, 96}, 13), b = fl::randn(fl::Shape{700, 901}, 14);
    const fl::Tensor c = fl::matmul(fl::transpose(at), b);  // a [96, 700] view: BLAS gets a transpose flag
    CHECK(test::check_tensor(c, test::matmul_ref(test::host(fl::transpose(at)), test::host(b)).values,
                             fl::Shape{96, 901}, fl::f32, test::Tolerance{1e-4, 1e-3}));
    CHECK(matches_one_call(c, one_blas_call<float>(at, b, true)));
  }
  SUBCASE("f64 within rounding of the naive loop") {
    // f64 is not compared bit for bit: OpenBLAS's f64 edge tiles may sum in another order.
    const fl::Tensor a = fl::randn(fl::Shape{400, 350}, 15).astype(fl::f64), b = fl::randn(fl::Shape{350, 410}, 16).astype(fl::f64);
    CHECK(test::check_tensor(fl::matmul(a, b), test::matmul_ref(test::host(a), test::host(b)).values, fl::Shape{400, 410},
                             fl::f64, test::Tolerance{1e-12, 1e-11}));
  }
  SUBCASE("batched f32: split over matrices (and rows when threads outnumber them)") {
    const fl::Tensor a = fl::randn(fl::Shape{6, 200, 300}, 17), b = fl::randn(fl::Shape{300, 250}, 18);
    const fl::Tensor c = fl::matmul(a, b);
    for (int64_t i = 0; i < 6; ++i) {
      const fl::Tensor ai = fl::reshape(fl::slice(a, 0, i, 1), fl::Shape{200, 300});
      CHECK(matches_one_call<float>(fl::slice(c, 0, i, 1), one_blas_call<float>(ai, b, false)));
    }
  }
}

TEST_CASE("matmuls from two threads at once give the results of running them one after the other") {
  const fl::Tensor a = fl::randn(fl::Shape{384, 384}, 21), b = fl::randn(fl::Shape{384, 384}, 22);
  const fl::Tensor d = fl::randn(fl::Shape{384, 384}, 23);
  const std::vector<float> ab = one_blas_call<float>(a, b, false);
  const std::vector<float> db = one_blas_call<float>(d, b, false);
  bool ok[2] = {false, false};
  std::thread first([&] { ok[0] = matches_one_call(fl::matmul(a, b), ab); });
  std::thread second([&] { ok[1] = matches_one_call(fl::matmul(d, b), db); });
  first.join();
  second.join();
  CHECK(ok[0]);
  CHECK(ok[1]);
}
