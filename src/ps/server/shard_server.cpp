// One parameter server (shard_server.hpp): its pieces and their optimizers, the mode's rules, the
// parked pulls and the counters. The transport's handler only decodes and queues; everything else
// happens on the server's own thread, in arrival order. That thread keeps its working state to
// itself and publishes the counters and liveness under a mutex after every message; replies are
// sent with no lock held (a transport may run the receiver's handler inside send()).
#include "ps/server/shard_server.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>

#include "core/check.hpp"
#include "flowlet/eager_scope.hpp"
#include "flowlet/ops/shape.hpp"
#include "ps/server/optimizer_access.hpp"
#include "ps/server/request_checks.hpp"
#include "ps/server/step_gradients.hpp"
#include "state/mirrored_variable.hpp"
#include "state/remote_variable.hpp"

namespace flowlet::detail::ps {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kWakeInterval = std::chrono::milliseconds(50);  // parked pulls expire at least this often
constexpr size_t kStalenessBuckets = 64;

// "worker 2", "workers 1, 3", "no worker".
std::string workers_text(const std::vector<int>& workers) {
  if (workers.empty()) return "no worker";
  return fmt::format("{} {}", workers.size() == 1 ? "worker" : "workers", fmt::join(workers, ", "));
}

// Variables the server makes (pieces, optimizer state) are plain local ones, whatever strategy
// scope the calling thread is in.
class LocalCreation {
 public:
  LocalCreation()
      : mirrored_(exchange_mirrored_creation(nullptr)), remote_(exchange_remote_creation(nullptr)) {}
  ~LocalCreation() {
    exchange_mirrored_creation(mirrored_);
    exchange_remote_creation(remote_);
  }
  LocalCreation(const LocalCreation&) = delete;
  LocalCreation& operator=(const LocalCreation&) = delete;

 private:
  const MirrorPolicy* mirrored_;
  const RemoteCreation* remote_;
};

struct Piece {
  size_t index = 0;  // in the placements
  HeldPiece held;
  Variable var;
  std::unique_ptr<optim::Optimizer> optimizer;
};

// A message as the handler queued it: decoded, or why it could not be.
struct Incoming {
  int from = 0;
  std::optional<Message> message;
  std::string problem;
};

// A pull the mode does not allow yet.
struct Parked {
  int from = 0;
  uint64_t request_id = 0;
  int worker = 0;
  int64_t clock = 0;
  int32_t var_id = 0;
  int64_t min_version = 0;
  Tensor rows;  // a sparse pull's rows; an empty handle for a dense pull
  Clock::time_point arrived;
};

}  // namespace

struct ShardServer::State {
  State(ServerConfig c, std::vector<VariablePlacement> p, Transport& t)
      : config(std::move(c)), placements(std::move(p)), transport(t) {}

  const ServerConfig config;
  const std::vector<VariablePlacement> placements;
  Transport& transport;
  std::vector<Piece> pieces;
  std::unordered_map<int32_t, size_t> piece_of_var;  // var_id -> index in pieces

  // The caller's side (seed, start, finish): no lock, one caller thread at a time.
  bool seeded = false;   // seed() since the last start()
  bool running = false;  // start() .. finish()
  std::thread thread;

  // The handler's queue.
  std::mutex queue_mutex;
  std::condition_variable queue_ready;
  std::deque<Incoming> queue;
  bool stopping = false;

  // The server thread's own state (the caller touches it only while no thread runs).
  ServerStats work;
  std::vector<bool> live;
  std::vector<int64_t> clocks;         // steps each worker pushed in this run
  int64_t version_base = 0;            // bounded staleness: the version when the run began
  std::map<int, Push> step;            // sync: the pushes of step `work.version`, by worker
  std::vector<Parked> parked;          // in arrival order
  // Replies of the message being handled, encoded at once (a reply never shares a tensor that a
  // later update could change in place before it is sent).
  std::vector<std::pair<int, Bytes>> outbox;
  std::exception_ptr failure;          // the first internal failure of the run

  // Published for the caller after every message.
  mutable std::mutex mutex;
  std::condition_variable published_changed;
  ServerStats published;
  std::vector<bool> published_live;
  bool thread_done = false;
  std::exception_ptr published_failure;

  // --- naming -------------------------------------------------------------------------------

  // "parameter server 1 (sync, 1 backup worker)": how every message of this server begins.
  std::string who() const {
    std::string mode = to_string(config.mode);
    if (config.mode == TrainingMode::sync && config.backup_workers > 0) {
      mode += fmt::format(", {} backup worker{}", config.backup_workers, config.backup_workers == 1 ? "" : "s");
    }
    if (config.mode == TrainingMode::bounded_staleness) mode += fmt::format(" k = {}", config.staleness);
    return fmt::format("parameter server {} ({})", config.server, mode);
  }
  int num_workers() const { return config.num_workers; }
  // The worker at endpoint `from`, or -1 for a server endpoint or one out of range.
  int worker_at(int from) const {
    const int w = from - config.num_servers;
    return w >= 0 && w < config.num_workers ? w : -1;
  }
  const std::string& var_name(int32_t var_id) const {
    return placements[pieces[piece_of_var.at(var_id)].index].name;
  }

  // --- counting and replying ------------------------------------------------------------------

  void reply(int to, const Message& message) { outbox.emplace_back(to, encode(message)); }
  void reply_error(int to, uint64_t request_id, ErrorCode code, std::string message) {
    if (worker_at(to) >= 0) reply(to, ErrorReply{request_id, code, std::move(message)});
  }
  void drop(int from, std::string message) {
    ++work.updates_dropped;
    reply_error(from, 0, ErrorCode::invalid_argument, std::move(message));
  }
  void keep_failure(std::exception_ptr error) noexcept {
    if (!failure) failure = std::move(error);
  }
  void record_applied(int64_t staleness, int64_t count = 1) {
    work.updates_applied += count;
    const auto bucket = static_cast<size_t>(std::clamp<int64_t>(staleness, 0, kStalenessBuckets - 1));
    work.staleness_histogram[bucket] += count;
    work.max_staleness = std::max(work.max_staleness, staleness);
  }

  void flush() {
    bool live_changed = false;
    {
      std::lock_guard lock(mutex);
      published = work;
      if (published_live != live) {
        published_live = live;
        live_changed = true;
      }
      if (failure && !published_failure) published_failure = failure;
    }
    // finish() waits for liveness (or the thread's end, notified there): waking it for every
    // message only to find the same workers live cost its process two context switches each.
    if (live_changed) published_changed.notify_all();
    std::vector<std::pair<int, Bytes>> sending;
    sending.swap(outbox);
    for (auto& [to, bytes] : sending) {
      try {
        transport.send(config.server, to, std::move(bytes));
      } catch (...) {
        keep_failure(std::current_exception());
      }
    }
  }

  // --- the mode's rules ---------------------------------------------------------------------

  // The fewest steps any live worker has pushed (max when none is live).
  int64_t slowest_clock() const {
    int64_t slowest = std::numeric_limits<int64_t>::max();
    for (int w = 0; w < num_workers(); ++w) {
      if (live[static_cast<size_t>(w)]) slowest = std::min(slowest, clocks[static_cast<size_t>(w)]);
    }
    return slowest;
  }
  // Bounded staleness: the version is the run's base plus the slowest live worker's steps (it never
  // goes back, and stays put once no worker is live).
  void refresh_bounded_version() {
    const int64_t slowest = slowest_clock();
    if (slowest == std::numeric_limits<int64_t>::max()) return;
    int64_t version = 0;  // saturates: a hostile clock must not overflow it
    if (__builtin_add_overflow(version_base, slowest, &version)) version = std::numeric_limits<int64_t>::max();
    work.version = std::max(work.version, version);
  }
  bool readable(const Parked& pull) const {
    switch (config.mode) {
      case TrainingMode::async:
        return true;
      case TrainingMode::sync:
        return work.version >= pull.min_version;
      case TrainingMode::bounded_staleness: {
        const int64_t slowest = slowest_clock();
        return slowest == std::numeric_limits<int64_t>::max() || pull.clock - slowest <= config.staleness;
      }
    }
    return true;
  }
  // The workers a parked pull waits for: those whose push the step or the bound still needs.
  std::vector<int> awaited(const Parked& pull) const {
    std::vector<int> workers;
    for (int w = 0; w < num_workers(); ++w) {
      if (!live[static_cast<size_t>(w)]) continue;
      const bool needed = config.mode == TrainingMode::sync
                              ? step.count(w) == 0
                              : clocks[static_cast<size_t>(w)] < pull.clock - config.staleness;
      if (needed) workers.push_back(w);
    }
    return workers;
  }

  // --- pulls --------------------------------------------------------------------------------

  void answer(const Parked& pull) {
    const Piece& piece = pieces[piece_of_var.at(pull.var_id)];
    const Device host;
    try {
      Tensor value = piece.var.value();
      if (pull.rows.defined()) {
        value = gather(value, value.device() == pull.rows.device() ? pull.rows : pull.rows.to(value.device()));
      }
      if (value.device().kind() != DeviceKind::cpu) value = value.to(host);
      reply(pull.from, PullReply{pull.request_id, work.version, std::move(value)});
    } catch (const std::exception& e) {
      keep_failure(std::current_exception());
      reply_error(pull.from, pull.request_id, ErrorCode::internal,
                  fmt::format("{}: pull of '{}' by worker {} failed: {}", who(), var_name(pull.var_id), pull.worker,
                              e.what()));
    }
  }

  void on_pull(int from, uint64_t request_id, int32_t worker, int64_t clock, int32_t var_id, int64_t min_version,
               const Tensor* rows) {
    const char* kind = rows != nullptr ? "sparse pull" : "pull";
    if (worker_at(from) < 0 || worker_at(from) != worker) {
      reply_error(from, request_id, ErrorCode::invalid_argument,
                  fmt::format("{}: {} from endpoint {} claims to come from worker {}; endpoint {} is {}", who(), kind,
                              from, worker, from, worker_at(from) >= 0 ? fmt::format("worker {}", worker_at(from))
                                                                       : std::string("not a worker")));
      return;
    }
    if (clock < 0) {  // clocks count steps; the bound's arithmetic relies on it
      reply_error(from, request_id, ErrorCode::invalid_argument,
                  fmt::format("{}: {} by worker {}: clock must be >= 0; got {}", who(), kind, worker, clock));
      return;
    }
    auto found = piece_of_var.find(var_id);
    if (found == piece_of_var.end()) {
      reply_error(from, request_id, ErrorCode::invalid_argument,
                  fmt::format("{}: {} by worker {}: variable {} is not held by this server", who(), kind, worker,
                              var_id));
      return;
    }
    if (rows != nullptr) {
      if (std::string problem = pull_rows_problem(*rows, pieces[found->second].held); !problem.empty()) {
        reply_error(from, request_id, ErrorCode::invalid_argument,
                    fmt::format("{}: sparse pull of '{}' by worker {}: {}", who(), var_name(var_id), worker, problem));
        return;
      }
    }
    Parked pull{from, request_id, worker, clock, var_id, min_version, rows != nullptr ? *rows : Tensor(), Clock::now()};
    if (readable(pull)) {
      answer(pull);
    } else {
      parked.push_back(std::move(pull));
    }
  }

  void answer_readable() {
    std::vector<Parked> waiting;
    for (Parked& pull : parked) {
      if (readable(pull)) {
        answer(pull);
      } else {
        waiting.push_back(std::move(pull));
      }
    }
    parked.swap(waiting);
  }

  void expire(Clock::time_point now) {
    std::vector<Parked> waiting;
    for (Parked& pull : parked) {
      const std::chrono::duration<double> waited = now - pull.arrived;
      if (waited < config.timeout) {
        waiting.push_back(std::move(pull));
        continue;
      }
      const std::string needs =
          config.mode == TrainingMode::sync
              ? fmt::format("it needs version {}", pull.min_version)
              : fmt::format("worker {} has pushed {} steps and reads once every live worker has pushed {}",
                            pull.worker, pull.clock, pull.clock - config.staleness);
      reply_error(pull.from, pull.request_id, ErrorCode::deadline_exceeded,
                  fmt::format("{}: pull of '{}' by worker {} waited {:.3f} s (timeout {} s) at version {}; {}; "
                              "waiting for {}",
                              who(), var_name(pull.var_id), pull.worker, waited.count(), config.timeout.count(),
                              work.version, needs, workers_text(awaited(pull))));
    }
    parked.swap(waiting);
  }

  // --- pushes -------------------------------------------------------------------------------

  // Why `push` from endpoint `from` cannot be taken, or "".
  std::string push_problem(int from, const Push& push) const {
    if (worker_at(from) < 0 || worker_at(from) != push.worker) {
      return fmt::format("push from endpoint {} claims to come from worker {}", from, push.worker);
    }
    const auto w = static_cast<size_t>(push.worker);
    if (!live[w]) return fmt::format("worker {} said goodbye and may push no more", push.worker);
    if (push.read_version < 0 || push.read_version > work.version) {
      return fmt::format("read version {} is not one this server had (its version is {})", push.read_version,
                         work.version);
    }
    if (config.mode == TrainingMode::bounded_staleness && push.clock <= clocks[w]) {
      return fmt::format("clock {} does not follow the worker's {} steps pushed", push.clock, clocks[w]);
    }
    std::vector<int32_t> seen;
    for (const PushEntry& entry : push.entries) {
      auto found = piece_of_var.find(entry.var_id);
      if (found == piece_of_var.end()) {
        return fmt::format("variable {} is not held by this server", entry.var_id);
      }
      if (std::find(seen.begin(), seen.end(), entry.var_id) != seen.end()) {
        return fmt::format("variable '{}' appears twice", var_name(entry.var_id));
      }
      seen.push_back(entry.var_id);
      if (std::string problem = push_entry_problem(entry, pieces[found->second].held); !problem.empty()) {
        return fmt::format("variable '{}' (id {}): {}", var_name(entry.var_id), entry.var_id, problem);
      }
    }
    return {};
  }

  // One gradient into one piece (dense: the optimizer's apply; sparse: only those rows).
  void apply_to_piece(Piece& piece, const Tensor& rows, const Tensor& grad) {
    const Device home = piece.var.device();
    if (!rows.defined()) {
      piece.optimizer->apply({grad.device() == home ? grad : grad.to(home)}, {piece.var});
    } else {
      OptimizerAccess::apply_sparse(*piece.optimizer, piece.var, rows, grad);
    }
  }

  void apply_push(const Push& push) {
    for (const PushEntry& entry : push.entries) {
      Piece& piece = pieces[piece_of_var.at(entry.var_id)];
      const bool dense = is_dense(entry, piece.held.shape);
      apply_to_piece(piece, dense ? Tensor() : entry.rows, entry.grad);
    }
  }

  // An optimizer (or an op under it) threw: the push counts as dropped and the error is kept.
  void failed_update(int from, const std::exception& e) {
    keep_failure(std::current_exception());
    ++work.updates_dropped;
    reply_error(from, 0, ErrorCode::internal, fmt::format("{}: applying a push failed: {}", who(), e.what()));
  }

  void on_push(int from, Push push) {
    if (std::string problem = push_problem(from, push); !problem.empty()) {
      drop(from, fmt::format("{}: dropped a push from worker {}: {}", who(), push.worker, problem));
      return;
    }
    const auto w = static_cast<size_t>(push.worker);
    switch (config.mode) {
      case TrainingMode::async: {
        clocks[w] = std::max(clocks[w], push.clock);
        try {
          apply_push(push);
        } catch (const std::exception& e) {
          failed_update(from, e);
          return;
        }
        record_applied(work.version - push.read_version);
        ++work.version;
        work.steps = work.updates_applied;
        return;
      }
      case TrainingMode::bounded_staleness: {
        // Staleness against the version the worker's push finds (before its own clock moves), so
        // every applied update has staleness <= k.
        const int64_t staleness = work.version - push.read_version;
        clocks[w] = push.clock;  // even if the update fails: no one waits for a step already taken
        try {
          apply_push(push);
          record_applied(staleness);
          work.steps = work.updates_applied;
        } catch (const std::exception& e) {
          failed_update(from, e);
        }
        refresh_bounded_version();
        answer_readable();
        return;
      }
      case TrainingMode::sync: {
        clocks[w] = std::max(clocks[w], push.clock);
        if (push.read_version < work.version) {
          // Late: its step completed without it. A push with no gradient (a worker's step tick to
          // a server it had nothing for, such as one it never read from) loses nothing: not counted.
          if (!push.entries.empty()) ++work.updates_dropped;
          return;
        }
        if (step.count(push.worker) != 0) {
          ++work.updates_dropped;  // the worker already pushed for this step
          return;
        }
        const int worker = push.worker;
        step.emplace(worker, std::move(push));
        complete_step_if_ready();
        return;
      }
    }
  }

  void complete_step_if_ready() {
    if (step.empty()) return;
    const auto needed = static_cast<size_t>(config.num_workers - config.backup_workers);
    bool every_live_in = true;
    for (int w = 0; w < num_workers(); ++w) {
      if (live[static_cast<size_t>(w)] && step.count(w) == 0) every_live_in = false;
    }
    if (step.size() < needed && !every_live_in) return;
    complete_step();
  }

  // Applies the step's mean once per piece, moves to the next version and answers the pulls that
  // waited for it. A piece whose update fails keeps the error; the step still completes, so that
  // no worker waits for a version that would never come.
  void complete_step() {
    std::map<int32_t, std::vector<PushEntry>> by_var;
    for (const auto& [worker, push] : step) {
      for (const PushEntry& entry : push.entries) by_var[entry.var_id].push_back(entry);
    }
    const auto pushes = static_cast<int64_t>(step.size());
    bool failed = false;
    for (const auto& [var_id, entries] : by_var) {
      Piece& piece = pieces[piece_of_var.at(var_id)];
      try {
        const StepGradient gradient = combine_step_gradients(entries, piece.held.shape, pushes);
        apply_to_piece(piece, gradient.rows, gradient.grad);
      } catch (const std::exception& e) {
        keep_failure(std::current_exception());
        failed = true;
        for (const auto& [worker, push] : step) {
          reply_error(config.num_servers + worker, 0, ErrorCode::internal,
                      fmt::format("{}: applying step {} to '{}' failed: {}", who(), work.version,
                                  var_name(var_id), e.what()));
        }
      }
    }
    if (failed) {
      work.updates_dropped += pushes;
    } else {
      record_applied(0, pushes);
    }
    ++work.version;
    ++work.steps;
    step.clear();
    answer_readable();
  }

  // --- goodbyes and dispatch ----------------------------------------------------------------

  void on_goodbye(int from, const Goodbye& goodbye) {
    if (worker_at(from) < 0 || worker_at(from) != goodbye.worker) {
      drop(from, fmt::format("{}: goodbye from endpoint {} claims to come from worker {}", who(), from,
                             goodbye.worker));
      return;
    }
    live[static_cast<size_t>(goodbye.worker)] = false;
    if (config.mode == TrainingMode::sync) complete_step_if_ready();
    if (config.mode == TrainingMode::bounded_staleness) refresh_bounded_version();
    answer_readable();
  }

  void handle(Incoming& item) {
    if (!item.message) {
      const int w = worker_at(item.from);
      drop(item.from, fmt::format("{}: dropped a malformed message from endpoint {}{}: {}", who(), item.from,
                                  w >= 0 ? fmt::format(" (worker {})", w) : std::string(), item.problem));
      return;
    }
    Message& message = *item.message;
    try {
      if (auto* pull = std::get_if<PullRequest>(&message)) {
        on_pull(item.from, pull->request_id, pull->worker, pull->clock, pull->var_id, pull->min_version, nullptr);
      } else if (auto* sparse = std::get_if<SparsePullRequest>(&message)) {
        on_pull(item.from, sparse->request_id, sparse->worker, sparse->clock, sparse->var_id, sparse->min_version,
                &sparse->rows);
      } else if (auto* push = std::get_if<Push>(&message)) {
        on_push(item.from, std::move(*push));
      } else if (auto* goodbye = std::get_if<Goodbye>(&message)) {
        on_goodbye(item.from, *goodbye);
      } else {
        drop(item.from, fmt::format("{}: dropped a {} from endpoint {}: servers take only pulls, pushes and goodbyes",
                                    who(), message_name(message), item.from));
      }
    } catch (const std::exception& e) {
      // Not an optimizer's failure (those are handled where they happen): a bug of the server's.
      keep_failure(std::current_exception());
      reply_error(item.from, 0, ErrorCode::internal,
                  fmt::format("{}: handling a {} failed: {}", who(), message_name(message), e.what()));
    }
  }

  // --- the thread ---------------------------------------------------------------------------

  void receive(int from, Bytes bytes) noexcept {
    try {
      Incoming item;
      item.from = from;
      try {
        item.message = decode(std::move(bytes));
      } catch (const std::exception& e) {
        item.problem = e.what();
      } catch (...) {
        item.problem = "decode threw a non-standard exception";
      }
      {
        std::lock_guard lock(queue_mutex);
        queue.push_back(std::move(item));
      }
      queue_ready.notify_one();
    } catch (...) {
      // Out of memory while queueing: the message is lost, and so is nothing else.
    }
  }

  // Until the next parked pull expires, but at most kWakeInterval (in double: a timeout of any
  // size converts without overflow).
  Clock::duration wait_time(Clock::time_point now) const {
    double wait = std::chrono::duration<double>(kWakeInterval).count();
    for (const Parked& pull : parked) {
      const double left = config.timeout.count() - std::chrono::duration<double>(now - pull.arrived).count();
      wait = std::min(wait, std::max(0.0, left));
    }
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(wait));
  }

  // Runs `work` so that nothing it throws ends the server's loop: the error is kept for finish().
  template <class F>
  void guarded(F&& work) noexcept {
    try {
      work();
    } catch (...) {
      keep_failure(std::current_exception());
    }
  }

  void serve() noexcept {
    try {
      LocalCreation local;
      EagerScope eager;
      for (;;) {
        std::deque<Incoming> batch;
        {
          std::unique_lock lock(queue_mutex);
          queue_ready.wait_for(lock, wait_time(Clock::now()), [&] { return stopping || !queue.empty(); });
          if (stopping) break;
          batch.swap(queue);
        }
        for (Incoming& item : batch) {
          guarded([&] { handle(item); });
          guarded([&] { flush(); });
        }
        guarded([&] { expire(Clock::now()); });
        guarded([&] { flush(); });
      }
      // Pulls still parked when the run ends get an answer rather than silence.
      for (const Parked& pull : parked) {
        reply_error(pull.from, pull.request_id, ErrorCode::internal,
                    fmt::format("{}: the run ended before the pull of '{}' by worker {} could be answered", who(),
                                var_name(pull.var_id), pull.worker));
      }
      parked.clear();
    } catch (...) {
      keep_failure(std::current_exception());
    }
    try {
      flush();
    } catch (...) {
    }
    {
      std::lock_guard lock(mutex);
      thread_done = true;
      if (failure && !published_failure) published_failure = failure;
    }
    published_changed.notify_all();
  }

  // Stops the thread (if any) and detaches from the transport.
  void stop() {
    {
      std::lock_guard lock(queue_mutex);
      stopping = true;
    }
    queue_ready.notify_all();
    if (thread.joinable()) thread.join();
    transport.detach(config.server);
    running = false;
  }
};

ShardServer::ShardServer(ServerConfig config, std::vector<VariablePlacement> placements, Transport& transport) {
  const ServerConfig& c = config;
  const char* op = "ShardServer";
  if (c.num_servers < 1 || c.server < 0 || c.server >= c.num_servers) {
    fail<InvalidArgument>("{}: server must be in [0, num_servers) with num_servers >= 1; got server {} of {}", op,
                          c.server, c.num_servers);
  }
  if (c.num_workers < 1) fail<InvalidArgument>("{}: num_workers must be >= 1; got {}", op, c.num_workers);
  if (c.mode == TrainingMode::sync && (c.backup_workers < 0 || c.backup_workers >= c.num_workers)) {
    fail<InvalidArgument>("{}: backup_workers must be in [0, num_workers); got {} with {} workers", op,
                          c.backup_workers, c.num_workers);
  }
  if (c.mode == TrainingMode::bounded_staleness && c.staleness < 0) {
    fail<InvalidArgument>("{}: staleness must be >= 0; got {}", op, c.staleness);
  }
  if (!(c.timeout.count() > 0)) fail<InvalidArgument>("{}: timeout must be > 0 s; got {}", op, c.timeout.count());
  if (!c.make_optimizer) fail<InvalidArgument>("{}: make_optimizer is empty", op);
  if (transport.endpoints() < c.num_servers + c.num_workers) {
    fail<InvalidArgument>("{}: the transport has {} endpoints; {} servers and {} workers need {}", op,
                          transport.endpoints(), c.num_servers, c.num_workers, c.num_servers + c.num_workers);
  }
  state_ = std::make_unique<State>(std::move(config), std::move(placements), transport);
  State& s = *state_;
  for (size_t i = 0; i < s.placements.size(); ++i) {
    const VariablePlacement& p = s.placements[i];
    const ShardPiece* piece = p.piece_on(s.config.server);
    if (piece == nullptr) continue;
    if (piece->row_begin < 0 || piece->row_begin > piece->row_end || piece->row_end > p.rows()) {
      fail<InvalidArgument>("{}: variable '{}' {}: server {}'s rows [{}, {}) are outside [0, {})", op, p.name,
                            p.shape, s.config.server, piece->row_begin, piece->row_end, p.rows());
    }
    if (s.piece_of_var.count(p.id) != 0) {
      fail<InvalidArgument>("{}: variable id {} is placed twice ('{}')", op, p.id, p.name);
    }
    s.piece_of_var.emplace(p.id, s.pieces.size());
    s.pieces.push_back(Piece{i, HeldPiece{&p, *piece, piece_shape(p, *piece)}, Variable(), nullptr});
  }
  s.work.server = s.config.server;
  s.work.staleness_histogram.assign(kStalenessBuckets, 0);
  s.live.assign(static_cast<size_t>(s.config.num_workers), false);
  s.clocks.assign(static_cast<size_t>(s.config.num_workers), 0);
  s.published = s.work;
  s.published_live = s.live;
}

ShardServer::~ShardServer() {
  if (!state_ || !state_->running) return;
  try {
    state_->stop();
  } catch (...) {
    // A transport that cannot detach: nothing more to do in a destructor.
  }
}

void ShardServer::seed(const std::vector<Tensor>& values) {
  State& s = *state_;
  const char* op = "ShardServer::seed";
  if (s.running) fail<InvalidArgument>("{}: server {} is running; seed it before start() or after finish()", op,
                                       s.config.server);
  if (values.size() != s.placements.size()) {
    fail<InvalidArgument>("{}: one value per placed variable; got {} values for {} variables", op, values.size(),
                          s.placements.size());
  }
  // Every value checked and every new optimizer made before anything changes.
  for (const Piece& piece : s.pieces) {
    const VariablePlacement& p = s.placements[piece.index];
    const Tensor& value = values[piece.index];
    if (!value.defined()) fail<InvalidArgument>("{}: the value of '{}' is an empty Tensor handle", op, p.name);
    if (value.dtype() != p.dtype) {
      fail<DTypeError>("{}: the value of '{}' must be {}; got {}", op, p.name, p.dtype, value.dtype());
    }
    if (!(value.shape() == p.shape)) {
      fail<ShapeError>("{}: the value of '{}' must have shape {}; got {}", op, p.name, p.shape, value.shape());
    }
  }
  LocalCreation local;
  EagerScope eager;
  std::vector<std::unique_ptr<optim::Optimizer>> made(s.pieces.size());
  for (size_t i = 0; i < s.pieces.size(); ++i) {
    if (s.pieces[i].optimizer) continue;
    made[i] = s.config.make_optimizer();
    if (!made[i]) fail<InvalidArgument>("{}: make_optimizer returned null", op);
  }
  std::vector<Tensor> rows(s.pieces.size());
  for (size_t i = 0; i < s.pieces.size(); ++i) {
    const Piece& piece = s.pieces[i];
    const Tensor& value = values[piece.index];
    const Tensor mine = value.rank() == 0 ? value : slice(value, 0, piece.held.rows.row_begin, piece.held.rows.rows());
    rows[i] = mine.device() == s.config.device ? mine : mine.to(s.config.device);
  }
  for (size_t i = 0; i < s.pieces.size(); ++i) {
    Piece& piece = s.pieces[i];
    if (made[i]) {
      piece.var = Variable(rows[i], s.placements[piece.index].name);  // a private copy
      piece.optimizer = std::move(made[i]);
    } else {
      piece.var.assign(rows[i]);  // the same variable: the optimizer's slots stay attached to it
    }
  }
  const int64_t version = s.work.version;
  s.work = ServerStats{};
  s.work.server = s.config.server;
  s.work.version = version;
  s.work.staleness_histogram.assign(kStalenessBuckets, 0);
  s.version_base = version;
  s.live.assign(static_cast<size_t>(s.config.num_workers), true);
  s.clocks.assign(static_cast<size_t>(s.config.num_workers), 0);
  s.step.clear();
  s.parked.clear();
  s.failure = nullptr;
  {
    std::lock_guard lock(s.mutex);
    s.published = s.work;
    s.published_live = s.live;
    s.published_failure = nullptr;
    s.thread_done = false;
  }
  s.seeded = true;
}

void ShardServer::start() {
  State& s = *state_;
  if (s.running) fail<InvalidArgument>("ShardServer::start: server {} is already running", s.config.server);
  if (!s.seeded) {
    fail<InvalidArgument>("ShardServer::start: server {} was not seeded since its last run; call seed() first",
                          s.config.server);
  }
  {
    std::lock_guard lock(s.queue_mutex);
    s.stopping = false;
    s.queue.clear();
  }
  s.transport.attach(s.config.server, [&s](int from, Bytes bytes) { s.receive(from, std::move(bytes)); });
  try {
    s.thread = std::thread([&s] { s.serve(); });
  } catch (...) {
    s.transport.detach(s.config.server);
    throw;
  }
  s.running = true;
  s.seeded = false;
}

void ShardServer::finish(std::chrono::steady_clock::time_point deadline) {
  State& s = *state_;
  if (!s.running) return;
  std::vector<int> missing;
  {
    std::unique_lock lock(s.mutex);
    const auto all_gone = [&] {
      return s.thread_done ||
             std::none_of(s.published_live.begin(), s.published_live.end(), [](bool live) { return live; });
    };
    if (!s.published_changed.wait_until(lock, deadline, all_gone)) {
      for (int w = 0; w < s.config.num_workers; ++w) {
        if (s.published_live[static_cast<size_t>(w)]) missing.push_back(w);
      }
    }
  }
  s.stop();
  std::exception_ptr failure;
  {
    std::lock_guard lock(s.mutex);
    failure = s.published_failure;
  }
  if (failure) std::rethrow_exception(failure);
  if (!missing.empty()) {
    fail<DeadlineExceeded>("ShardServer::finish: {}: {} did not say goodbye by the deadline (version {})", s.who(),
                           workers_text(missing), s.work.version);
  }
}

std::vector<Tensor> ShardServer::piece_values() const {
  const State& s = *state_;
  if (s.running) {
    fail<InvalidArgument>("ShardServer::piece_values: server {} is running; read its pieces after finish()",
                          s.config.server);
  }
  std::vector<Tensor> values(s.placements.size());
  for (const Piece& piece : s.pieces) {
    if (piece.var.defined()) values[piece.index] = piece.var.value();
  }
  return values;
}

const optim::Optimizer* ShardServer::optimizer(int32_t var_id) const {
  const State& s = *state_;
  auto found = s.piece_of_var.find(var_id);
  return found == s.piece_of_var.end() ? nullptr : s.pieces[found->second].optimizer.get();
}

ShardServer::PieceState ShardServer::piece_state(int32_t var_id) {
  State& s = *state_;
  if (s.running) {
    fail<InvalidArgument>("ShardServer::piece_state: server {} is running; its optimizers change until finish()",
                          s.config.server);
  }
  auto found = s.piece_of_var.find(var_id);
  if (found == s.piece_of_var.end()) return {};
  Piece& piece = s.pieces[found->second];
  if (!piece.optimizer) return {};
  return {piece.var, piece.optimizer.get()};
}

ServerStats ShardServer::stats() const {
  const State& s = *state_;
  ServerStats stats;
  {
    std::lock_guard lock(s.mutex);
    stats = s.published;
  }
  const TransportCounters counters = s.transport.counters(s.config.server);
  stats.bytes_received = counters.bytes_received;
  stats.bytes_sent = counters.bytes_sent;
  stats.messages_received = counters.messages_received;
  stats.messages_sent = counters.messages_sent;
  return stats;
}

}  // namespace flowlet::detail::ps
