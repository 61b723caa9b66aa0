// A fixed pool of intra-op workers. A job lives on its caller's stack; workers join it under the
// pool mutex, take chunk numbers from an atomic counter, and the caller removes the job and waits
// until no worker is inside it before returning (so no worker touches a dead job).
#include "exec/thread_pool.hpp"

#include <algorithm>
#include <cstdint>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace flowlet::detail {
namespace {

thread_local bool inside_worker = false;

struct Job {
  Job(FunctionRef<void(int64_t)> body_, int64_t chunks_) : body(body_), chunks(chunks_) {}

  FunctionRef<void(int64_t)> body;
  int64_t chunks;
  uint64_t sequence = 0;   // set under the pool mutex; tells jobs apart even at one stack address
  std::atomic<int64_t> next{0};
  int active_workers = 0;  // guarded by the pool mutex
  std::exception_ptr error;  // guarded by the pool mutex

  // Runs chunks until none is left; returns the first exception thrown, if any.
  std::exception_ptr work() {
    std::exception_ptr first;
    for (int64_t c; (c = next.fetch_add(1, std::memory_order_relaxed)) < chunks;) {
      try {
        body(c);
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    return first;
  }
};

class ThreadPool {
 public:
  explicit ThreadPool(int threads) {
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
    {
      std::lock_guard lock(mutex_);
      job.sequence = ++jobs_started_;
      queue_.push_back(&job);
    }
    wake_workers_.notify_all();
    std::exception_ptr error = job.work();
    std::unique_lock lock(mutex_);
    queue_.erase(std::find(queue_.begin(), queue_.end(), &job));
    job_done_.wait(lock, [&] { return job.active_workers == 0; });
    if (!error) error = job.error;
    if (error) std::rethrow_exception(error);
  }

 private:
  void worker_loop() {
    inside_worker = true;
    uint64_t exhausted = 0;  // sequence of the last job this worker found with nothing left
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_workers_.wait(lock, [&] { return stopping_ || (!queue_.empty() && queue_.front()->sequence != exhausted); });
      if (stopping_) return;
      Job* job = queue_.front();
      if (job->next.load(std::memory_order_relaxed) >= job->chunks) {
        exhausted = job->sequence;  // let its caller retire it; wait for another
        continue;
      }
      ++job->active_workers;
      lock.unlock();
      std::exception_ptr error = job->work();
      lock.lock();
      if (error && !job->error) job->error = error;
      if (--job->active_workers == 0) job_done_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_workers_;
  std::condition_variable job_done_;
  std::deque<Job*> queue_;
  bool stopping_ = false;
  uint64_t jobs_started_ = 0;
  std::vector<std::thread> workers_;
};

int configured_threads() {
  if (const char* env = std::getenv("FLOWLET_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n >= 1) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

ThreadPool& pool() {
  // Never destroyed: kernels may still run from static destructors of user code.
  static ThreadPool* instance = new ThreadPool(intra_op_threads());
  return *instance;
}

}  // namespace

int intra_op_threads() {
  static const int threads = configured_threads();
  return threads;
}

void run_chunks(int64_t chunks, FunctionRef<void(int64_t)> body) {
  if (inside_worker || intra_op_threads() == 1) {
    for (int64_t c = 0; c < chunks; ++c) body(c);
    return;
  }
  Job job(body, chunks);
  pool().run(job);
}

}  // namespace flowlet::detail
