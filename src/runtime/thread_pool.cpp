// The one pool of workers for the process: parallel_for jobs and scheduled tasks share them. A job
// lives on its caller's stack; workers join it under the pool mutex, take chunk numbers from an
// atomic counter, and the caller removes the job and waits until no worker is inside it before
// returning (so no worker touches a dead job). Chunks never block (nested calls run inline), so a
// caller waits only for work that is already running and cannot deadlock on a busy worker.
// The budget counts running threads, callers inside parallel_for included: a worker starts work
// only while fewer than budget threads run, so two threads' GEMMs at once do not oversubscribe.
#include "runtime/thread_pool.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <immintrin.h>
#include <cassert>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace flowlet::detail {
namespace {

// True while this thread runs a chunk: a nested parallel_for then runs inline. A task is not a
// chunk, so a task (or a worker between jobs) may still spread its own parallel_for.
thread_local bool inside_chunk = false;
thread_local bool pool_worker = false;  // a worker is counted as running while it has work

struct Job {
  Job(FunctionRef<void(int64_t)> body_, int64_t chunks_) : body(body_), chunks(chunks_) {}

  FunctionRef<void(int64_t)> body;
  int64_t chunks;
  std::atomic<int64_t> next{0};
  int active_workers = 0;    // guarded by the pool mutex
  std::atomic<int> active_workers_atomic{0};  // a copy of it that a waiting caller may poll unlocked
  std::exception_ptr error;  // guarded by the pool mutex

  bool has_chunks_left() const { return next.load(std::memory_order_relaxed) < chunks; }

  // Runs chunks until none is left; returns the first exception thrown, if any.
  std::exception_ptr work() {
    std::exception_ptr first;
    inside_chunk = true;
    for (int64_t c; (c = next.fetch_add(1, std::memory_order_relaxed)) < chunks;) {
      try {
        body(c);
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    inside_chunk = false;
    return first;
  }
};

struct Task {
  void (*fn)(void*);
  void* arg;
};

void run_task(Task task) {
#ifdef NDEBUG
  task.fn(task.arg);
#else
  try {
    task.fn(task.arg);
  } catch (...) {
    assert(!"schedule: a task threw; tasks must catch their own exceptions");
  }
#endif
}

class ThreadPool {
 public:
  explicit ThreadPool(int threads) : budget_(threads) {
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
  }
  ~ThreadPool() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_workers_.notify_all();
    for (auto& w : workers_) w.join();
  }

  void run(Job& job) {
    const bool counted = !pool_worker;  // a worker calling from a task is counted already
    bool room;
    {
      std::lock_guard lock(mutex_);
      if (counted) ++running_;
      jobs_.push_back(&job);
      room = running_ < budget_;
      posted_.fetch_add(1, std::memory_order_release);
    }
    if (room) wake_workers_.notify_all();
    std::exception_ptr error = job.work();
    std::unique_lock lock(mutex_);
    jobs_.erase(std::find(jobs_.begin(), jobs_.end(), &job));
    // While it waits the caller does not run: a worker may start other work in its place.
    if (counted && --running_ < budget_ && (open_job() || !tasks_.empty())) wake_workers_.notify_one();
    if (job.active_workers != 0) {
      // A worker is finishing its last chunk, usually within microseconds: poll briefly before
      // sleeping, since a futex sleep and wake-up costs more than a short chunk.
      lock.unlock();
      spin_until([&] { return job.active_workers_atomic.load(std::memory_order_acquire) == 0; });
      lock.lock();
    }
    job_done_.wait(lock, [&] { return job.active_workers == 0; });
    if (!error) error = job.error;
    if (error) std::rethrow_exception(error);
  }

  void help(FunctionRef<bool()> done) {
    // A worker calling from a task counts as running; while it helps it counts only while it runs
    // something, like any worker, and counts again when it returns to its task.
    const bool was_worker = pool_worker;
    pool_worker = true;  // what it runs below is counted here, not again by run()
    std::unique_lock lock(mutex_);
    if (was_worker) --running_;
    ++helpers_;
    for (;;) {
      Job* job = nullptr;
      bool finished = false;
      auto ready = [&] {
        finished = done();
        return finished || (running_ < budget_ && ((job = open_job()) != nullptr || !tasks_.empty()));
      };
      if (!ready()) {
        // As a worker does: poll briefly before sleeping, since the node a worker runs posts its
        // parallel_for jobs back to back.
        const uint64_t seen = posted_.load(std::memory_order_acquire);
        lock.unlock();
        spin_until([&] { return posted_.load(std::memory_order_acquire) != seen || done(); });
        lock.lock();
      }
      wake_workers_.wait(lock, ready);  // woken by posts (as workers are) and by wake_helpers()
      if (finished) break;
      run_one(lock, job);
    }
    --helpers_;
    // A post's notify_one may have woken this thread just as its step finished: pass it on, or the
    // work would wait for the next post while a worker sleeps.
    if (running_ < budget_ && (open_job() != nullptr || !tasks_.empty())) wake_workers_.notify_one();
    if (was_worker) ++running_;
    pool_worker = was_worker;
  }

  void wake_helpers() {
    std::lock_guard lock(mutex_);
    if (helpers_ > 0) wake_workers_.notify_all();
  }

  void schedule(Task task) {
    bool room;
    {
      std::lock_guard lock(mutex_);
      tasks_.push_back(task);
      room = running_ < budget_;
      posted_.fetch_add(1, std::memory_order_release);
    }
    if (room) wake_workers_.notify_one();
  }

 private:
  // The oldest job with chunks nobody has taken yet; called under the mutex.
  Job* open_job() const {
    auto it = std::find_if(jobs_.begin(), jobs_.end(), [](const Job* j) { return j->has_chunks_left(); });
    return it == jobs_.end() ? nullptr : *it;
  }

  void worker_loop() {
    pool_worker = true;
    std::unique_lock lock(mutex_);
    for (;;) {
      Job* job = nullptr;
      auto has_work = [&] {
        return stopping_ || (running_ < budget_ && ((job = open_job()) != nullptr || !tasks_.empty()));
      };
      if (has_work()) {
        if (stopping_) return;
        run_one(lock, job);
        continue;
      }
      // Poll for new work before sleeping (worker_poll). Eager code and bursts of split GEMMs post
      // jobs back to back, and a worker that sleeps pays a wake-up each time: on a VM an idle vCPU
      // woke in 30 us to over 1 ms, and with the other core busy the kernel woke the worker onto
      // its caller's core, where the two shared one CPU (docs/notes19/gemm.md).
      const uint64_t seen = posted_.load(std::memory_order_acquire);
      lock.unlock();
      worker_poll([&] { return posted_.load(std::memory_order_acquire) != seen; });
      lock.lock();
      if (has_work()) continue;
      wake_workers_.wait(lock);  // one sleep; a spurious wake-up only polls again
    }
  }

  // Polls `done` for kSpinMicroseconds with pauses, then up to worker_poll_microseconds() yielding the
  // core between polls: a yielding poller gives its core to any other runnable thread (its own
  // caller included, when the kernel put both on one core), yet stays runnable, so the load
  // balancer keeps it on a core of its own, as OpenBLAS's threads are kept.
  //
  // Except while the cores are contended: a yield that comes back after kContendedYieldMicroseconds
  // means another thread (another process's build, or the caller) had the core, and then this
  // worker sleeps instead, and polls only the paused part for the next kContendedBackoffMs. Polling
  // on a shared machine cost more than it saved: the poller's CPU time ranks it last, so the chunk
  // it grabs runs late while its caller waits for it; at load 4.5-5.7 (two cores) the batch-1 MLP
  // step took 350-600 us with the 2 ms poll against 170-270 us without (docs/notes20/exec.md).
  template <class Done>
  static void worker_poll(Done done) {
    using Clock = std::chrono::steady_clock;
    thread_local Clock::time_point contended_until{};  // per worker: poll only the paused part before it
    const auto start = Clock::now();
    const auto pause_until = start + std::chrono::microseconds(kSpinMicroseconds);
    const auto deadline = start < contended_until ? pause_until
                                                  : start + std::chrono::microseconds(worker_poll_microseconds());
    while (!done()) {
      const auto now = Clock::now();
      if (now > deadline) return;
      if (now < pause_until) {
        for (int i = 0; i < 16; ++i) _mm_pause();
        continue;
      }
      std::this_thread::yield();
      const auto back = Clock::now();
      if (back - now > std::chrono::microseconds(kContendedYieldMicroseconds)) {
        contended_until = back + std::chrono::milliseconds(kContendedBackoffMs);
        return;
      }
    }
  }
  static constexpr int kContendedYieldMicroseconds = 100;
  static constexpr int kContendedBackoffMs = 50;

  // Runs one piece of work as one of the budget's threads, with `lock` held on entry and exit:
  // chunks of `job` when there is one (chunks first: their caller is waiting, and they are short),
  // else the oldest task. What the workers and a helping caller (help_until) both do.
  void run_one(std::unique_lock<std::mutex>& lock, Job* job) {
    ++running_;
    if (job) {
      ++job->active_workers;
      job->active_workers_atomic.store(job->active_workers, std::memory_order_release);
      lock.unlock();
      std::exception_ptr error = job->work();
      lock.lock();
      if (error && !job->error) job->error = error;
      if (--job->active_workers == 0) job_done_.notify_all();
      job->active_workers_atomic.store(job->active_workers, std::memory_order_release);
    } else {
      const Task task = tasks_.front();
      tasks_.pop_front();
      lock.unlock();
      run_task(task);
      lock.lock();
    }
    --running_;
  }

  // Polls `done` for up to kSpinMicroseconds, pausing between polls.
  template <class Done>
  static void spin_until(Done done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinMicroseconds);
    while (!done()) {
      for (int i = 0; i < 16; ++i) _mm_pause();
      if (std::chrono::steady_clock::now() > deadline) return;
    }
  }
  static constexpr int kSpinMicroseconds = 50;
  // How long an idle worker polls before it sleeps (worker_poll): 2 ms, or FLOWLET_POOL_POLL_US
  // (read once; 50 or less polls only the paused first part, as the pool did before round 19).
  static int worker_poll_microseconds() {
    static const int us = [] {
      const char* env = std::getenv("FLOWLET_POOL_POLL_US");
      return env != nullptr && *env != '\0' ? std::max(0, std::atoi(env)) : 2000;
    }();
    return us;
  }

  std::atomic<uint64_t> posted_{0};  // jobs and tasks posted so far, for spinning workers
  std::mutex mutex_;
  std::condition_variable wake_workers_;
  std::condition_variable job_done_;
  std::vector<Job*> jobs_;  // parallel_for calls in flight, oldest first
  std::deque<Task> tasks_;
  const int budget_;
  int running_ = 0;  // callers inside run() plus workers and helpers with work; guarded by the mutex
  int helpers_ = 0;  // threads inside help(); guarded by the mutex
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

int env_threads(const char* name, int fallback) {
  if (const char* env = std::getenv(name)) {
    const int n = std::atoi(env);
    if (n >= 1) return n;
  }
  return fallback;
}

ThreadPool& pool() {
  // Never destroyed: kernels may still run from static destructors of user code.
  static ThreadPool* instance = new ThreadPool(thread_budget());
  return *instance;
}

}  // namespace

int thread_budget() {
  static const int threads =
      env_threads("FLOWLET_NUM_THREADS", static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  return threads;
}

int intra_op_threads() {
  static const int threads = std::min(thread_budget(), env_threads("FLOWLET_INTRA_OP_THREADS", thread_budget()));
  return threads;
}

void run_chunks(int64_t chunks, FunctionRef<void(int64_t)> body) {
  if (inside_chunk || intra_op_threads() == 1) {
    for (int64_t c = 0; c < chunks; ++c) body(c);
    return;
  }
  Job job(body, chunks);
  pool().run(job);
}

bool help_until(FunctionRef<bool()> done) {
  // Inside a chunk the caller must not take other chunks (Job::work would clear inside_chunk); with
  // a budget of 1 there is no pool work to take.
  if (inside_chunk || thread_budget() == 1) return false;
  pool().help(done);
  return true;
}

void wake_helpers() {
  if (thread_budget() > 1) pool().wake_helpers();
}

void schedule(void (*fn)(void*), void* arg) {
  if (thread_budget() == 1) {
    run_task({fn, arg});
    return;
  }
  pool().schedule({fn, arg});
}

}  // namespace flowlet::detail
