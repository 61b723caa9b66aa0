// The process-wide thread pool: parallel_for chunks (intra-op) and scheduled tasks (inter-op) share
// one set of workers, and matmul keeps OpenBLAS single-threaded, so flowlet work runs on at most
// FLOWLET_NUM_THREADS threads at once (unless more threads than that call it at once).
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

namespace flowlet::detail {

// A non-owning reference to a callable (no allocation, unlike std::function).
template <class Signature>
class FunctionRef;
template <class R, class... Args>
class FunctionRef<R(Args...)> {
 public:
  template <class F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, FunctionRef>)
  FunctionRef(F& f) : object_(&f), call_([](void* o, Args... a) -> R { return (*static_cast<F*>(o))(a...); }) {}
  R operator()(Args... args) const { return call_(object_, args...); }

 private:
  void* object_;
  R (*call_)(void*, Args...);
};

// The thread budget (FLOWLET_NUM_THREADS, default all hardware threads; read once). The pool starts
// budget - 1 workers, and a worker starts a chunk or a task only while fewer than budget threads
// run: callers inside run_chunks count, busy workers count, threads blocked elsewhere do not.
int thread_budget();
// The most threads one op splits over (FLOWLET_INTRA_OP_THREADS, at most the budget, default the
// budget; read once). 1 keeps every op on one thread while independent graph nodes and device
// partitions still run at once, up to the budget.
int intra_op_threads();

// Runs body(chunk) for every chunk in [0, chunks), the caller taking part; idle workers help while
// the budget has room, else the caller runs every chunk itself. Callable from any number of
// threads at once, scheduled tasks included; it waits only for chunks a worker has already
// started. Rethrows the first exception a chunk threw, after every chunk has finished.
void run_chunks(int64_t chunks, FunctionRef<void(int64_t)> body);

// Runs fn(arg) soon on a pool worker and returns at once (the executor's ready nodes):
//   schedule([](void* p) noexcept { static_cast<Node*>(p)->run(); }, &node);
// Tasks start in the order scheduled, after any parallel_for chunks waiting for a worker; a task
// may call parallel_for and schedule, but must not block until another task runs (with every
// worker so blocked, nothing would run it). fn must not throw: catch inside it and report through
// arg (debug builds assert). With a budget of 1 there is no worker and fn runs inline, before
// schedule returns, so a caller that needs concurrency schedules only when thread_budget() > 1.
void schedule(void (*fn)(void*), void* arg);

// Lends the calling thread to the pool until done() is true: it runs parallel_for chunks and
// scheduled tasks (within the budget, as a worker would) instead of sleeping, and parks only when
// there is none to take. For a thread that waits for work it has handed to the pool (a traced
// step's caller): with a budget of 2 and one worker, a caller that slept would leave every later
// node, and every parallel_for split, to the one worker. done() is called with the pool's mutex
// held, so it must only read an atomic; whoever makes it true then calls wake_helpers(). Returns
// false, having done nothing, where helping is not allowed (inside a chunk, or a budget of 1): the
// caller then waits its own way. On return the caller counts as it did before the call.
bool help_until(FunctionRef<bool()> done);
// Wakes threads parked in help_until so that they check done() again.
void wake_helpers();

// Calls body(begin, end) over [0, n) in pieces of at least `grain` elements, in parallel when n is
// large enough to pay for waking a thread. Nested calls from inside a chunk run inline.
template <class Body>
void parallel_for(int64_t n, int64_t grain, Body&& body) {
  if (n <= 0) return;
  const int64_t threads = intra_op_threads();
  int64_t chunks = grain > 0 ? (n + grain - 1) / grain : threads;
  if (chunks > threads) chunks = threads;
  if (chunks <= 1) {
    body(int64_t{0}, n);
    return;
  }
  auto run_one = [&](int64_t chunk) {
    const int64_t begin = n * chunk / chunks;
    const int64_t end = n * (chunk + 1) / chunks;
    body(begin, end);
  };
  run_chunks(chunks, FunctionRef<void(int64_t)>(run_one));
}

// Elements above which an elementwise kernel splits its work across threads.
inline constexpr int64_t kParallelGrain = 1 << 16;

}  // namespace flowlet::detail
