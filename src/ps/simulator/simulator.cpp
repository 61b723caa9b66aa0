// The discrete-event model of the training modes (flowlet/ps_simulator.hpp states the model): one
// event queue ordered by (time, sequence number), so that simultaneous events run in the order
// they were scheduled and a seed gives one answer; workers, one server queue, and the three
// modes' rules for when a worker may read again.
#include "flowlet/ps_simulator.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <limits>
#include <queue>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/check.hpp"
#include "flowlet/core/error.hpp"

namespace flowlet::ps {

namespace {

constexpr std::string_view kOp = "ps::simulate";
constexpr int64_t kMaxUpdates = int64_t{100'000'000};  // about a minute of simulation; more is a mistake
constexpr int kMaxWorkers = 1'000'000;

bool finite_non_negative(double x) { return std::isfinite(x) && x >= 0; }

void check_config(const SimulationConfig& c) {
  if (c.workers < 1 || c.workers > kMaxWorkers) {
    detail::fail<InvalidArgument>("{}: workers must be in [1, {}]; got {}", kOp, kMaxWorkers, c.workers);
  }
  if (c.backup_workers != 0 && c.mode != TrainingMode::sync) {
    detail::fail<InvalidArgument>("{}: backup_workers apply to sync only; got {} in mode {}", kOp, c.backup_workers,
                                  to_string(c.mode));
  }
  if (c.backup_workers < 0 || c.backup_workers >= c.workers) {
    detail::fail<InvalidArgument>("{}: backup_workers must be in [0, workers); got {} with {} workers", kOp,
                                  c.backup_workers, c.workers);
  }
  if (c.staleness < 0) detail::fail<InvalidArgument>("{}: staleness must be >= 0; got {}", kOp, c.staleness);
  if (c.step_seconds.empty()) detail::fail<InvalidArgument>("{}: step_seconds is empty (no compute times)", kOp);
  for (size_t i = 0; i < c.step_seconds.size(); ++i) {
    if (!finite_non_negative(c.step_seconds[i])) {
      detail::fail<InvalidArgument>("{}: step_seconds must be finite and >= 0; got step_seconds[{}] = {}", kOp, i,
                                    c.step_seconds[i]);
    }
  }
  for (const SlowWorker& slow : c.slow_workers) {
    if (slow.worker < 0 || !std::isfinite(slow.factor) || slow.factor <= 0) {
      detail::fail<InvalidArgument>("{}: a slow worker needs an index >= 0 and a finite factor > 0; got worker {} "
                                    "factor {}",
                                    kOp, slow.worker, slow.factor);
    }
  }
  for (auto [name, value] : {std::pair{"pull_seconds", c.pull_seconds}, std::pair{"push_seconds", c.push_seconds},
                             std::pair{"server_seconds", c.server_seconds}}) {
    if (!finite_non_negative(value)) detail::fail<InvalidArgument>("{}: {} must be finite and >= 0; got {}", kOp, name, value);
  }
  const int64_t per_step = c.mode == TrainingMode::sync ? c.workers - c.backup_workers : c.workers;
  if (c.steps < 1 || c.steps > kMaxUpdates / per_step) {
    detail::fail<InvalidArgument>("{}: steps must be in [1, {}] for {} pushes per step; got {}", kOp,
                                  kMaxUpdates / per_step, per_step, c.steps);
  }
  double min_factor = 1;
  for (const SlowWorker& slow : c.slow_workers) {
    if (slow.worker < c.workers) min_factor = std::min(min_factor, slow.factor);
  }
  const double min_compute = *std::min_element(c.step_seconds.begin(), c.step_seconds.end());
  if (c.pull_seconds + c.push_seconds + c.server_seconds + min_compute * min_factor <= 0) {
    detail::fail<InvalidArgument>("{}: a step could take no time (every latency is 0 and the fastest compute time is "
                                  "{}): the model would never advance its clock",
                                  kOp, min_compute);
  }
}

// splitmix64: small, fast, and the same sequence on every platform (std distributions are not).
class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return static_cast<size_t>((static_cast<unsigned __int128>(next()) * n) >> 64); }

 private:
  uint64_t state_;
};

enum class EventKind : uint8_t { pull_done, push_arrives, service_done };

struct Event {
  double time;
  uint64_t sequence;
  EventKind kind;
  int worker;
  bool operator>(const Event& other) const {
    return time != other.time ? time > other.time : sequence > other.sequence;
  }
};

struct WorkerState {
  double factor = 1;
  double step_start = -1;  // < 0: no step started yet
  int64_t read_version = 0;
  int64_t applied = 0;  // bounded staleness: this worker's pushes applied
};

class Simulation {
 public:
  explicit Simulation(const SimulationConfig& c)
      : c_(c), random_(c.seed), workers_(static_cast<size_t>(c.workers)) {
    for (const SlowWorker& slow : c.slow_workers) {
      if (slow.worker < c.workers) workers_[static_cast<size_t>(slow.worker)].factor *= slow.factor;
    }
    needed_ = c.workers - c.backup_workers;
    target_ = c.steps * (c.mode == TrainingMode::sync ? needed_ : c.workers);
    at_count_.assign(1, c.workers);  // bounded staleness: every worker has 0 pushes applied
  }

  SimulationResult run() {
    for (int w = 0; w < c_.workers; ++w) start_step(w, 0);
    double now = 0;
    while (applied_ < target_) {
      // Every step takes time and every worker keeps stepping or waits for one that does, so the
      // queue is never empty before the target is reached; if it were, say so instead of reading it.
      if (events_.empty()) {
        detail::fail<Error>("{}: no event left after {} of {} updates (a bug of the model)", kOp, applied_, target_);
      }
      const Event event = events_.top();
      events_.pop();
      now = event.time;
      switch (event.kind) {
        case EventKind::pull_done: {
          const double compute = c_.step_seconds[random_.below(c_.step_seconds.size())] * worker(event.worker).factor;
          schedule(now + compute + c_.push_seconds, EventKind::push_arrives, event.worker);
          break;
        }
        case EventKind::push_arrives:
          server_queue_.push_back(event.worker);
          serve(now);
          break;
        case EventKind::service_done:
          busy_ = false;
          applied_push(event.worker, now);
          serve(now);
          break;
      }
    }
    return result(now);
  }

 private:
  WorkerState& worker(int w) { return workers_[static_cast<size_t>(w)]; }

  void schedule(double time, EventKind kind, int w) { events_.push(Event{time, sequence_++, kind, w}); }

  void start_step(int w, double now) {
    WorkerState& state = worker(w);
    if (state.step_start >= 0) step_times_.push_back(now - state.step_start);
    state.step_start = now;
    state.read_version = version_;
    schedule(now + c_.pull_seconds, EventKind::pull_done, w);
  }

  // Starts serving the next push if the server is idle; sync drops stale pushes at the queue's head.
  void serve(double now) {
    while (!busy_ && !server_queue_.empty()) {
      const int w = server_queue_.front();
      server_queue_.pop_front();
      if (c_.mode == TrainingMode::sync && worker(w).read_version < version_) {
        ++dropped_;
        start_step(w, now);  // goes on from the newest version
        continue;
      }
      busy_ = true;
      busy_seconds_ += c_.server_seconds;
      schedule(now + c_.server_seconds, EventKind::service_done, w);
    }
  }

  void record_staleness(int64_t staleness, int64_t count) {
    staleness_sum_ += staleness * count;
    max_staleness_ = std::max(max_staleness_, staleness);
  }

  void applied_push(int w, double now) {
    WorkerState& state = worker(w);
    switch (c_.mode) {
      case TrainingMode::async:
        record_staleness(version_ - state.read_version, 1);
        ++version_;
        ++applied_;
        start_step(w, now);
        break;
      case TrainingMode::sync:
        in_step_.push_back(w);
        if (static_cast<int>(in_step_.size()) == needed_) {
          record_staleness(0, needed_);
          applied_ += needed_;
          ++version_;
          std::vector<int> released;
          released.swap(in_step_);
          for (int r : released) start_step(r, now);
        }
        break;
      case TrainingMode::bounded_staleness: {
        record_staleness(version_ - state.read_version, 1);
        ++applied_;
        // Move the worker up one count; the version is the lowest count any worker has.
        const auto from = static_cast<size_t>(state.applied - version_);
        ++state.applied;
        --at_count_[from];
        if (from + 1 == at_count_.size()) at_count_.push_back(0);
        ++at_count_[from + 1];
        while (at_count_.front() == 0) {
          at_count_.pop_front();
          ++version_;
        }
        // Released in the order they started waiting (as sync releases a step's workers), so that
        // staleness 0 replays sync exactly.
        waiting_.emplace(state.applied - c_.staleness, sequence_++, w);
        while (!waiting_.empty() && std::get<0>(waiting_.top()) <= version_) {
          const int r = std::get<2>(waiting_.top());
          waiting_.pop();
          start_step(r, now);
        }
        break;
      }
    }
  }

  SimulationResult result(double now) {
    SimulationResult r;
    r.mode = c_.mode;
    r.workers = c_.workers;
    r.backup_workers = c_.backup_workers;
    r.staleness = c_.staleness;
    r.seconds = now;
    r.updates_applied = applied_;
    r.updates_dropped = dropped_;
    r.versions = version_;
    if (now > 0) {
      r.updates_per_second = static_cast<double>(applied_) / now;
      r.versions_per_second = static_cast<double>(version_) / now;
      r.server_utilization = std::min(1.0, busy_seconds_ / now);
    }
    r.worker_steps = static_cast<int64_t>(step_times_.size());
    if (!step_times_.empty()) {
      double sum = 0;
      for (double t : step_times_) sum += t;
      r.step_mean = sum / static_cast<double>(step_times_.size());
      std::sort(step_times_.begin(), step_times_.end());
      auto percentile = [&](double p) {  // nearest rank
        const auto rank = static_cast<size_t>(std::ceil(p * static_cast<double>(step_times_.size())));
        return step_times_[std::clamp<size_t>(rank, 1, step_times_.size()) - 1];
      };
      r.step_p50 = percentile(0.50);
      r.step_p99 = percentile(0.99);
    }
    const int64_t pushes = applied_ + dropped_;
    r.dropped_fraction = pushes > 0 ? static_cast<double>(dropped_) / static_cast<double>(pushes) : 0;
    r.mean_staleness = applied_ > 0 ? static_cast<double>(staleness_sum_) / static_cast<double>(applied_) : 0;
    r.max_staleness = max_staleness_;
    return r;
  }

  const SimulationConfig& c_;
  Random random_;
  std::vector<WorkerState> workers_;
  int needed_ = 0;        // sync: pushes per step
  int64_t target_ = 0;    // the run ends at this many applied updates
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  uint64_t sequence_ = 0;
  std::deque<int> server_queue_;
  bool busy_ = false;
  double busy_seconds_ = 0;
  int64_t version_ = 0, applied_ = 0, dropped_ = 0;
  int64_t staleness_sum_ = 0, max_staleness_ = 0;
  std::vector<int> in_step_;  // sync: workers whose push went into the current step
  std::deque<int> at_count_;  // bounded staleness: at_count_[i] workers have version_ + i pushes applied
  // bounded staleness: (count every worker must reach, order of arrival, worker) for workers waiting to read.
  using Waiting = std::tuple<int64_t, uint64_t, int>;
  std::priority_queue<Waiting, std::vector<Waiting>, std::greater<>> waiting_;
  std::vector<double> step_times_;
};

}  // namespace

SimulationResult simulate(const SimulationConfig& config) {
  check_config(config);
  return Simulation(config).run();
}

std::vector<SimulatedMode> default_simulated_modes() {
  return {{TrainingMode::async, 0, 0},
          {TrainingMode::sync, 0, 0},
          {TrainingMode::sync, 1, 0},
          {TrainingMode::bounded_staleness, 0, 2}};
}

std::string describe(const SimulatedMode& mode) {
  switch (mode.mode) {
    case TrainingMode::async:
      return "async";
    case TrainingMode::sync:
      return mode.backup_workers == 0 ? "sync" : fmt::format("sync+{} backup", mode.backup_workers);
    case TrainingMode::bounded_staleness:
      return fmt::format("staleness {}", mode.staleness);
  }
  return fmt::format("mode {}", static_cast<int>(mode.mode));
}

std::string simulation_table(const SimulationConfig& base, const std::vector<int>& workers,
                             const std::vector<SimulatedMode>& modes) {
  std::string table = fmt::format("{:>7} {:<14} {:>10} {:>10} {:>10} {:>11} {:>10} {:>8} {:>14} {:>7}\n", "workers",
                                  "mode", "step ms", "p50 ms", "p99 ms", "updates/s", "steps/s", "dropped",
                                  "stale mean/max", "server");
  for (int w : workers) {
    for (const SimulatedMode& mode : modes) {
      SimulationConfig config = base;
      config.workers = w;
      config.mode = mode.mode;
      config.backup_workers = mode.backup_workers;
      config.staleness = mode.staleness;
      const SimulationResult r = simulate(config);
      table += fmt::format("{:>7} {:<14} {:>10.3f} {:>10.3f} {:>10.3f} {:>11.1f} {:>10.2f} {:>7.1f}% {:>14} {:>6.1f}%\n",
                           w, describe(mode), r.step_mean * 1e3, r.step_p50 * 1e3, r.step_p99 * 1e3,
                           r.updates_per_second, r.versions_per_second, 100 * r.dropped_fraction,
                           fmt::format("{:.2f}/{}", r.mean_staleness, r.max_staleness), 100 * r.server_utilization);
    }
  }
  return table;
}

}  // namespace flowlet::ps
