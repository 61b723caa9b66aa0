// WorkerClient: a worker's side of the parameter-server protocol (ps/worker/worker_client.hpp).
//
// Owns: the pending-request table (request id -> the pull it belongs to, the server asked and the
// deadline), the per-server clocks and versions a pull and a push carry, the step bookkeeping with
// its injected faults, the watchdog thread that fails pulls past the timeout, and the thread's
// WorkerScope. Replies are decoded on the transport's thread, which completes the pulls.
//
// Delays: a step's injected delay stands for that worker's computing time, so it must hold no
// thread a graph step shares (an async ps_push node runs on the process's thread pool, which every
// in-process worker needs). A push whose step is delayed, and every message issued after it while
// it waits (the step's other pushes, later pulls and pushes), goes into the `outbox`: a FIFO whose
// deadlines never decrease, sent in order by the client's `timer` thread when the front's deadline
// has come; each push's `done` runs after its message is handed to the transport. So the messages
// to one server leave in the order they were issued, delayed or not.
//
// Locks: `mutex` guards everything the transport, the watchdog and callers share; `step_mutex`
// serializes pushes (a step's bookkeeping, then the encode and the send or the queueing) and
// guards the outbox, so the pushes to one server leave in clock order. Lock order: step_mutex, then
// mutex. Nothing is sent and no `done` is called while `mutex` is held (the in-memory transport may
// deliver a reply on the sending thread); a pull is never sent under step_mutex either (its reply's
// `done` may start the next push on that thread), and no lock is held while waiting for a delay.
#include "ps/worker/worker_client.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "collective/transport/owned_thread.hpp"
#include "core/check.hpp"
#include "flowlet/core/format.hpp"

namespace flowlet::detail::ps {
namespace {

using Clock = std::chrono::steady_clock;

// How much later than the timeout the watchdog fails a pull (see register_job).
constexpr std::chrono::milliseconds kServerFirst{200};

// The row shape of a placement: its shape without axis 0 (rank 0: no dimensions).
Shape row_shape(const VariablePlacement& p) {
  if (p.shape.rank() == 0) return Shape{};
  return Shape(p.shape.begin() + 1, p.shape.end());
}

// [rows, row shape...]
Shape rows_shape(const VariablePlacement& p, int64_t rows) {
  Shape shape{rows};
  for (int64_t d : row_shape(p)) shape.push_back(d);
  return shape;
}

int64_t row_bytes(const VariablePlacement& p) {
  return p.row_elements() * static_cast<int64_t>(dtype_size(p.dtype));
}

// A CPU tensor with `t`'s values, contiguous (no copy when it already is one).
Tensor contiguous_on_host(const Tensor& t) {
  Tensor host = t.device().kind() == DeviceKind::cpu ? t : t.to(Device());
  return host.is_contiguous() ? host : host.contiguous();
}

// Where results are assembled: `device` itself when it is a CPU (logical CPU devices share the
// host's memory), else the host, moved afterwards.
Device assembly_device(Device device) { return device.kind() == DeviceKind::cpu ? device : Device(); }

Tensor finish_on(Tensor assembled, Device device) {
  return assembled.device() == device ? assembled : assembled.to(device);
}

std::exception_ptr error_of_reply(const ErrorReply& reply) {
  switch (reply.code) {
    case ErrorCode::deadline_exceeded:
      return std::make_exception_ptr(DeadlineExceeded(reply.message));
    case ErrorCode::invalid_argument:
      return std::make_exception_ptr(InvalidArgument(reply.message));
    case ErrorCode::internal:
      break;
  }
  return std::make_exception_ptr(Error(reply.message));
}

// Liveness of clients by serial number, so that a graph node holding a client of an earlier run can
// tell it is gone even when a new client took its address (WorkerClient::alive).
std::mutex live_mutex;
std::unordered_map<uint64_t, const WorkerClient*>& live_clients() {
  static auto* clients = new std::unordered_map<uint64_t, const WorkerClient*>();  // outlives exit-time clients
  return *clients;
}
std::atomic<uint64_t> next_serial{1};

thread_local const WorkerContext* current_context = nullptr;

}  // namespace

// Messages waiting in the outbox until `at` (and until everything queued before them has left).
struct Outgoing {
  Clock::time_point at;
  std::vector<std::pair<int, Bytes>> messages;
  std::function<void(std::exception_ptr)> done;  // a push's; none for a pull's requests
};

// One pull (dense: one part per piece; sparse: one part per owning server), completed once.
struct PullJob {
  int32_t var_id = 0;
  WorkerClient::Done done;
  Shape result_shape;
  std::vector<Shape> part_shapes;                 // what each part's reply must hold
  std::vector<int64_t> part_rows;                 // dense: where each part's rows start in the result
  std::vector<std::vector<int64_t>> positions;    // sparse: the result rows of each part's rows
  std::vector<Tensor> parts;
  std::vector<uint64_t> request_ids;
  int remaining = 0;
  bool finished = false;
};

namespace {

// A pull of `var_id` whose `done` is still to be called.
std::shared_ptr<PullJob> new_pull_job(int32_t var_id, WorkerClient::Done done) {
  auto job = std::make_shared<PullJob>();
  job->var_id = var_id;
  job->done = std::move(done);
  return job;
}

}  // namespace

struct Pending {
  std::shared_ptr<PullJob> job;
  int part = 0;
  int server = 0;
  Clock::time_point deadline;
};

// What this worker knows of one server.
struct ServerSide {
  int64_t clock = 0;           // steps pushed to it
  int64_t last_version = 0;    // of the newest reply
  std::optional<int64_t> min_since_push;
  int64_t min_version = 0;     // what the next pull asks for (sync: read version + 1)
};

struct WorkerClient::State {
  WorkerConfig config;
  std::vector<VariablePlacement> placements;
  Transport& transport;
  int endpoint = 0;
  uint64_t serial = 0;
  std::mt19937_64 rng;

  mutable std::mutex mutex;
  std::condition_variable wake;  // the watchdog: a new deadline, or stopping
  Clock::time_point watchdog_wakes_at = Clock::time_point::min();  // when it checks next (min: not waiting)
  std::map<uint64_t, Pending> pending;
  uint64_t next_request = 1;
  std::vector<ServerSide> servers;
  std::exception_ptr deferred;  // an ErrorReply to a push, or a message that made no sense
  bool started = false, attached = false, finished = false, stopping = false;
  std::atomic<bool> stopped{false};
  int64_t stopped_at = 0;
  std::thread watchdog;

  std::mutex step_mutex;
  int64_t steps = 0;  // under mutex; written under both
  std::vector<double> step_seconds;
  Clock::time_point last_step_start;  // when the previous step's pushes could leave (its delay's end)

  // Under step_mutex. The front stays queued while the timer sends it, so that nothing issued
  // meanwhile overtakes it.
  std::deque<Outgoing> outbox;
  std::condition_variable outbox_wake;  // the timer: a new entry, or stopping; finish(): drained
  bool timer_stopping = false;
  std::thread timer;

  State(WorkerConfig c, std::vector<VariablePlacement> p, Transport& t)
      : config(std::move(c)), placements(std::move(p)), transport(t) {}

  const VariablePlacement* find(int32_t var_id) const {
    if (var_id >= 0 && static_cast<size_t>(var_id) < placements.size() &&
        placements[static_cast<size_t>(var_id)].id == var_id) {
      return &placements[static_cast<size_t>(var_id)];
    }
    for (const VariablePlacement& p : placements) {
      if (p.id == var_id) return &p;
    }
    return nullptr;
  }

  WorkerStopped stopped_error() const {
    return WorkerStopped(fmt::format("ps worker {}: stopped by fault injection at step {}; it sends nothing more",
                                     config.worker, stopped_at));
  }

  // Why a call cannot proceed now (stopped, an earlier failure, not started), or null. Under mutex;
  // a deferred error is handed out once.
  std::exception_ptr refusal(const char* what) {
    if (stopped.load()) return std::make_exception_ptr(stopped_error());
    if (deferred) return std::exchange(deferred, nullptr);
    if (!started || finished) {
      return std::make_exception_ptr(InvalidArgument(fmt::format(
          "ps {} (worker {}): the client is {}", what, config.worker, finished ? "finished" : "not started; call start()")));
    }
    return nullptr;
  }

  // Registers the job's requests; returns the messages to send (after unlocking).
  std::vector<std::pair<int, Bytes>> register_job(const std::shared_ptr<PullJob>& job, const std::vector<int>& servers_of,
                                                  const std::vector<Tensor>& sparse_rows) {
    std::vector<std::pair<int, Bytes>> out;
    // A little past the timeout: a server that parked the pull answers at the timeout itself, with
    // an error that names the workers it waits for, which says more than "no reply".
    const Clock::time_point deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(config.timeout) + kServerFirst;
    for (size_t part = 0; part < servers_of.size(); ++part) {
      const int server = servers_of[part];
      const uint64_t id = next_request++;
      job->request_ids.push_back(id);
      pending.emplace(id, Pending{job, static_cast<int>(part), server, deadline});
      const ServerSide& side = servers[static_cast<size_t>(server)];
      if (sparse_rows.empty()) {
        out.emplace_back(server, encode(PullRequest{id, config.worker, side.clock, job->var_id, side.min_version}));
      } else {
        out.emplace_back(server, encode(SparsePullRequest{id, config.worker, side.clock, job->var_id, side.min_version,
                                                          sparse_rows[part]}));
      }
    }
    job->remaining = static_cast<int>(servers_of.size());
    job->parts.resize(servers_of.size());
    // Only a deadline before the watchdog's next check needs it awake now (usually none: it checks
    // every second, and a pull's deadline is the timeout away); waking it for every pull cost the
    // worker's process two context switches per pull.
    if (deadline < watchdog_wakes_at) wake.notify_all();
    return out;
  }

  // Marks `job` finished and forgets its requests; true when it was still running. Under mutex.
  bool close_job(PullJob& job) {
    if (job.finished) return false;
    job.finished = true;
    for (uint64_t id : job.request_ids) pending.erase(id);
    return true;
  }

  void send_all(std::vector<std::pair<int, Bytes>>& messages) {
    for (auto& [server, bytes] : messages) transport.send(endpoint, server, std::move(bytes));
  }

  // Queues `out` behind the outbox's entries (never before their deadlines). Under step_mutex.
  void enqueue(Outgoing out) {
    if (!outbox.empty()) out.at = std::max(out.at, outbox.back().at);
    outbox.push_back(std::move(out));
    outbox_wake.notify_all();
  }

  // A pull's requests: sent now, or behind the pushes still waiting in the outbox.
  void send_after_pushes(std::vector<std::pair<int, Bytes>>& messages) {
    {
      std::lock_guard lock(step_mutex);
      if (!outbox.empty()) {
        enqueue(Outgoing{Clock::now(), std::move(messages), nullptr});
        return;
      }
    }
    send_all(messages);
  }

  void on_message(int from, Bytes bytes);
  void on_reply(int from, PullReply reply);
  void on_error(int from, const ErrorReply& reply);
  void fail_later(std::exception_ptr error);
  void watch();
  void shutdown();
  Tensor assemble(PullJob& job) const;
  Clock::time_point step_bookkeeping(int64_t step);
  std::vector<std::vector<int64_t>> check_push(int server, const std::vector<VariableGradient>& grads) const;
  Outgoing prepare_push(int server, const std::vector<VariableGradient>& grads,
                        const std::vector<std::vector<int64_t>>& host_ids);
  Clock::time_point submit_push(int server, const std::vector<VariableGradient>& grads,
                                const std::function<void(std::exception_ptr)>& done);
  void send_delayed();
};

Tensor WorkerClient::State::assemble(PullJob& job) const {
  const VariablePlacement& p = *find(job.var_id);
  const Device device = config.device;
  if (job.parts.size() == 1 && job.positions.empty() && job.parts[0].device() == device) return job.parts[0];
  Tensor result = Tensor::empty(job.result_shape, p.dtype, assembly_device(device));
  auto* out = static_cast<char*>(result.raw_data());
  const int64_t bytes_per_row = row_bytes(p);
  for (size_t part = 0; part < job.parts.size(); ++part) {
    const auto* in = static_cast<const char*>(job.parts[part].raw_data());
    if (job.positions.empty()) {
      const int64_t n = job.parts[part].numel() * static_cast<int64_t>(dtype_size(p.dtype));
      if (n > 0) std::memcpy(out + job.part_rows[part] * bytes_per_row, in, static_cast<size_t>(n));
    } else {
      const std::vector<int64_t>& rows = job.positions[part];
      for (size_t k = 0; k < rows.size(); ++k) {
        std::memcpy(out + rows[k] * bytes_per_row, in + static_cast<int64_t>(k) * bytes_per_row,
                    static_cast<size_t>(bytes_per_row));
      }
    }
  }
  return finish_on(std::move(result), device);
}

void WorkerClient::State::on_message(int from, Bytes bytes) {
  Message message;
  try {
    message = decode(std::move(bytes));
  } catch (...) {
    // A worker cannot tell which pull a message it cannot read was for: the next call reports it.
    fail_later(std::current_exception());
    return;
  }
  if (auto* reply = std::get_if<PullReply>(&message)) {
    on_reply(from, std::move(*reply));
  } else if (const auto* error = std::get_if<ErrorReply>(&message)) {
    on_error(from, *error);
  } else {
    fail_later(std::make_exception_ptr(Error(fmt::format(
        "ps worker {}: got a {} from endpoint {}; a worker takes only pull replies and errors", config.worker,
        message_name(message), from))));
  }
}

void WorkerClient::State::fail_later(std::exception_ptr error) {
  std::lock_guard lock(mutex);
  if (!deferred) deferred = std::move(error);
}

void WorkerClient::State::on_reply(int from, PullReply reply) {
  std::shared_ptr<PullJob> job;
  std::exception_ptr error;
  {
    std::lock_guard lock(mutex);
    const auto found = pending.find(reply.request_id);
    if (found == pending.end()) return;  // its pull already failed (timeout) or was cancelled
    const Pending entry = found->second;
    pending.erase(found);
    if (entry.server != from) {
      // Not the server asked: never trust it with the pull.
      error = std::make_exception_ptr(DataLoss(fmt::format(
          "ps pull of '{}' (worker {}): request {} went to server {} but endpoint {} answered it",
          find(entry.job->var_id)->name, config.worker, reply.request_id, entry.server, from)));
    } else {
      ServerSide& side = servers[static_cast<size_t>(from)];
      side.last_version = reply.version;
      side.min_since_push = side.min_since_push ? std::min(*side.min_since_push, reply.version) : reply.version;
      const VariablePlacement& p = *find(entry.job->var_id);
      const Shape& want = entry.job->part_shapes[static_cast<size_t>(entry.part)];
      if (!reply.value.defined() || reply.value.dtype() != p.dtype || !(reply.value.shape() == want)) {
        error = std::make_exception_ptr(DataLoss(fmt::format(
            "ps pull of '{}' from server {} (worker {}): the reply holds {} {}; expected {} {}", p.name, from,
            config.worker, reply.value.defined() ? fmt::format("{}", reply.value.dtype()) : "no",
            reply.value.defined() ? reply.value.shape() : Shape{}, p.dtype, want)));
      } else if (!entry.job->finished) {
        entry.job->parts[static_cast<size_t>(entry.part)] = std::move(reply.value);
        if (--entry.job->remaining > 0) return;
      }
    }
    if (!close_job(*entry.job)) return;
    job = entry.job;
  }
  if (error) {
    job->done(Tensor(), error);
    return;
  }
  Tensor value;
  try {
    value = assemble(*job);
  } catch (...) {
    error = std::current_exception();
  }
  job->done(std::move(value), error);
}

void WorkerClient::State::on_error(int from, const ErrorReply& reply) {
  std::shared_ptr<PullJob> job;
  {
    std::lock_guard lock(mutex);
    if (reply.request_id == 0) {
      // A push failed on the server: the push has returned long ago, so the next call reports it.
      if (!deferred) deferred = error_of_reply(reply);
      return;
    }
    const auto found = pending.find(reply.request_id);
    if (found == pending.end() || found->second.server != from) return;
    job = found->second.job;
    if (!close_job(*job)) return;
  }
  job->done(Tensor(), error_of_reply(reply));
}

void WorkerClient::State::watch() {
  std::unique_lock lock(mutex);
  while (!stopping) {
    Clock::time_point next = Clock::now() + std::chrono::seconds(1);  // wakes up at least this often
    for (const auto& [id, entry] : pending) next = std::min(next, entry.deadline);
    watchdog_wakes_at = next;
    wake.wait_until(lock, next);
    watchdog_wakes_at = Clock::time_point::min();
    if (stopping) break;
    const Clock::time_point now = Clock::now();
    std::vector<Pending> late;  // the first late request of each job
    for (const auto& [id, entry] : pending) {
      if (entry.deadline > now) continue;
      if (std::none_of(late.begin(), late.end(), [&](const Pending& e) { return e.job == entry.job; })) {
        late.push_back(entry);
      }
    }
    std::vector<std::pair<std::shared_ptr<PullJob>, std::exception_ptr>> expired;
    for (const Pending& entry : late) {
      if (!close_job(*entry.job)) continue;  // forgets every request of the job
      expired.emplace_back(entry.job, std::make_exception_ptr(DeadlineExceeded(fmt::format(
                                          "ps pull of '{}' from server {}: no reply within {} s (worker {})",
                                          find(entry.job->var_id)->name, entry.server, config.timeout.count(),
                                          config.worker))));
    }
    if (expired.empty()) continue;
    lock.unlock();
    for (auto& [job, error] : expired) job->done(Tensor(), error);
    lock.lock();
  }
}

void WorkerClient::State::shutdown() {
  bool detach_now = false;
  {
    std::lock_guard lock(mutex);
    detach_now = attached;
    attached = false;
    stopping = true;
  }
  wake.notify_all();
  {
    std::lock_guard lock(step_mutex);
    timer_stopping = true;
  }
  outbox_wake.notify_all();
  join_or_release(timer);
  std::deque<Outgoing> unsent;
  {
    std::lock_guard lock(step_mutex);
    unsent.swap(outbox);
  }
  for (Outgoing& out : unsent) {
    // Their pulls, if any, are cancelled below with the pending requests.
    if (out.done) {
      out.done(std::make_exception_ptr(Cancelled(fmt::format(
          "ps push (worker {}): the worker's client finished before its step's delay ended; nothing sent",
          config.worker))));
    }
  }
  if (detach_now) transport.detach(endpoint);
  join_or_release(watchdog);
  std::vector<std::shared_ptr<PullJob>> orphans;
  {
    std::lock_guard lock(mutex);
    for (auto& [id, entry] : pending) {
      if (!entry.job->finished) {
        entry.job->finished = true;
        orphans.push_back(entry.job);
      }
    }
    pending.clear();
  }
  for (auto& job : orphans) {
    job->done(Tensor(), std::make_exception_ptr(Cancelled(fmt::format(
                            "ps pull of '{}' (worker {}): the worker's client finished before the reply came",
                            find(job->var_id)->name, config.worker))));
  }
}

// Under step_mutex. Returns when the step's pushes may leave: now plus the injected delay (never
// before the previous step's pushes could).
Clock::time_point WorkerClient::State::step_bookkeeping(int64_t step) {
  for (const auto& [worker, k] : config.faults.stop_worker_at_step) {
    if (worker == config.worker && k == step) {
      {
        std::lock_guard lock(mutex);
        stopped_at = step;
      }
      stopped.store(true);
      throw stopped_error();
    }
  }
  const StepDelay& delay = config.faults.step_delay;
  double seconds = 0;
  switch (delay.kind) {
    case StepDelay::Kind::none:
      break;
    case StepDelay::Kind::constant:
      seconds = delay.seconds;
      break;
    case StepDelay::Kind::log_normal:
      if (delay.seconds > 0) {
        // std::lognormal_distribution(m, s) is exp(N(m, s)): its median is exp(m).
        seconds = std::lognormal_distribution<double>(std::log(delay.seconds), std::max(delay.sigma, 0.0))(rng);
      }
      break;
    case StepDelay::Kind::straggler:
      if (delay.worker == config.worker && delay.factor > 1) {
        std::lock_guard lock(mutex);
        seconds = (delay.factor - 1) *
                  std::max(0.0, std::chrono::duration<double>(Clock::now() - last_step_start).count());
      }
      break;
  }
  // Not slept here: the caller waits (push) or the timer thread does (push_async).
  std::lock_guard lock(mutex);
  const Clock::time_point ready = std::max(Clock::now(), last_step_start) +
                                  std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  step_seconds.push_back(std::chrono::duration<double>(ready - last_step_start).count());
  last_step_start = ready;
  steps = step;
  return ready;
}

void WorkerClient::State::send_delayed() {
  std::unique_lock lock(step_mutex);
  while (!timer_stopping) {
    if (outbox.empty()) {
      outbox_wake.wait(lock);  // shutdown() notifies
      continue;
    }
    const Clock::time_point at = outbox.front().at;
    if (Clock::now() < at) {
      outbox_wake.wait_until(lock, at);
      continue;
    }
    std::vector<std::pair<int, Bytes>> messages = std::move(outbox.front().messages);
    std::function<void(std::exception_ptr)> done = std::move(outbox.front().done);
    lock.unlock();
    std::exception_ptr error;
    try {
      send_all(messages);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    outbox.pop_front();
    outbox_wake.notify_all();  // finish() may wait for the outbox to drain
    lock.unlock();
    if (done) done(std::move(error));
    if (object_released_here()) return;  // `done` destroyed the client
    lock.lock();
  }
}


WorkerClient::WorkerClient(WorkerConfig config, std::vector<VariablePlacement> placements, Transport& transport)
    : state_(std::make_unique<State>(std::move(config), std::move(placements), transport)) {
  State& s = *state_;
  if (s.config.num_servers < 1 || s.config.worker < 0 || s.config.worker >= s.config.num_workers) {
    fail<InvalidArgument>("ps worker client: worker {} of {} workers with {} servers is not a worker", s.config.worker,
                          s.config.num_workers, s.config.num_servers);
  }
  s.endpoint = s.config.num_servers + s.config.worker;
  if (s.endpoint >= transport.endpoints()) {
    fail<InvalidArgument>("ps worker client: worker {} needs endpoint {}; the transport has {} endpoints", s.config.worker,
                          s.endpoint, transport.endpoints());
  }
  if (!(s.config.timeout.count() > 0)) {
    fail<InvalidArgument>("ps worker client: the timeout must be positive; got {} s", s.config.timeout.count());
  }
  for (const VariablePlacement& p : s.placements) {
    for (const ShardPiece& piece : p.pieces) {
      if (piece.server < 0 || piece.server >= s.config.num_servers) {
        fail<InvalidArgument>("ps worker client: variable '{}' has a piece on server {}; there are {} servers", p.name,
                              piece.server, s.config.num_servers);
      }
    }
  }
  s.servers.resize(static_cast<size_t>(s.config.num_servers));
  std::seed_seq seed{static_cast<uint32_t>(s.config.faults.seed), static_cast<uint32_t>(s.config.faults.seed >> 32),
                     static_cast<uint32_t>(s.config.worker)};
  s.rng.seed(seed);
  s.serial = next_serial.fetch_add(1);
  std::lock_guard lock(live_mutex);
  live_clients().emplace(s.serial, this);
}

WorkerClient::~WorkerClient() {
  {
    std::lock_guard lock(live_mutex);
    live_clients().erase(state_->serial);
  }
  state_->shutdown();
}

const WorkerConfig& WorkerClient::config() const { return state_->config; }

const VariablePlacement& WorkerClient::placement(int32_t var_id) const {
  const VariablePlacement* p = state_->find(var_id);
  if (!p) {
    fail<InvalidArgument>("ps worker {}: no server variable has id {}; the client knows {} variables",
                          state_->config.worker, var_id, state_->placements.size());
  }
  return *p;
}

const std::vector<VariablePlacement>& WorkerClient::placements() const { return state_->placements; }

uint64_t WorkerClient::serial() const { return state_->serial; }

bool WorkerClient::alive(const WorkerClient* client, uint64_t serial) {
  std::lock_guard lock(live_mutex);
  const auto found = live_clients().find(serial);
  return found != live_clients().end() && found->second == client;
}

void WorkerClient::start() {
  State& s = *state_;
  {
    std::lock_guard lock(s.mutex);
    if (s.started) fail<InvalidArgument>("ps worker {}: start() was already called", s.config.worker);
    s.started = true;
    s.attached = true;
    s.last_step_start = Clock::now();
  }
  s.transport.attach(s.endpoint, [state = &s](int from, Bytes bytes) { state->on_message(from, std::move(bytes)); });
  s.watchdog = std::thread([state = &s] { state->watch(); });
  s.timer = std::thread([state = &s] { state->send_delayed(); });
}

void WorkerClient::pull(int32_t var_id, Done done) {
  State& s = *state_;
  auto job = new_pull_job(var_id, std::move(done));
  std::vector<std::pair<int, Bytes>> messages;
  std::exception_ptr error;
  {
    std::lock_guard lock(s.mutex);
    error = s.refusal("pull");
    const VariablePlacement* p = s.find(var_id);
    if (!error && !p) {
      error = std::make_exception_ptr(InvalidArgument(
          fmt::format("ps pull (worker {}): no server variable has id {}", s.config.worker, var_id)));
    }
    if (!error) {
      job->result_shape = p->shape;
      std::vector<int> servers_of;
      for (const ShardPiece& piece : p->pieces) {
        servers_of.push_back(piece.server);
        job->part_shapes.push_back(p->shape.rank() == 0 ? Shape{} : rows_shape(*p, piece.rows()));
        job->part_rows.push_back(piece.row_begin);
      }
      messages = s.register_job(job, servers_of, {});
    }
  }
  if (error) {
    job->done(Tensor(), error);
    return;
  }
  s.send_after_pushes(messages);
}

void WorkerClient::pull_rows(int32_t var_id, const Tensor& ids, Done done) {
  State& s = *state_;
  auto job = new_pull_job(var_id, std::move(done));
  std::vector<std::pair<int, Bytes>> messages;
  std::exception_ptr error;
  try {
    const VariablePlacement* p = s.find(var_id);
    if (!p) {
      fail<InvalidArgument>("ps pull_rows (worker {}): no server variable has id {}", s.config.worker, var_id);
    }
    if (!ids.defined() || ids.dtype() != DType::i64 || ids.rank() != 1) {
      fail<InvalidArgument>("ps pull_rows of '{}' (worker {}): ids must be i64 [n]; got {}", p->name, s.config.worker,
                            ids.defined() ? fmt::format("{} {}", ids.dtype(), ids.shape()) : "an empty Tensor handle");
    }
    const std::vector<int64_t> rows = ids.to_vector<int64_t>();
    const int64_t n = static_cast<int64_t>(rows.size());
    job->result_shape = rows_shape(*p, n);
    // Per piece: the local rows asked of its server and where they go in the result.
    std::vector<std::vector<int64_t>> local(p->pieces.size()), positions(p->pieces.size());
    for (int64_t i = 0; i < n; ++i) {
      const int64_t id = rows[static_cast<size_t>(i)];
      if (id < 0 || id >= p->rows()) {
        fail<OutOfRange>("ps pull_rows of '{}' (worker {}): id {} at position {} is outside [0, {})", p->name,
                         s.config.worker, id, i, p->rows());
      }
      const ShardPiece& piece = p->piece_of_row(id);
      const auto k = static_cast<size_t>(&piece - p->pieces.data());
      local[k].push_back(id - piece.row_begin);
      positions[k].push_back(i);
    }
    std::vector<int> servers_of;
    std::vector<Tensor> sparse_rows;
    for (size_t k = 0; k < p->pieces.size(); ++k) {
      if (local[k].empty()) continue;
      servers_of.push_back(p->pieces[k].server);
      Tensor t = Tensor::empty(Shape{static_cast<int64_t>(local[k].size())}, DType::i64);
      std::memcpy(t.raw_data(), local[k].data(), local[k].size() * sizeof(int64_t));
      sparse_rows.push_back(std::move(t));
      job->part_shapes.push_back(rows_shape(*p, static_cast<int64_t>(local[k].size())));
      job->positions.push_back(std::move(positions[k]));
    }
    std::lock_guard lock(s.mutex);
    if (std::exception_ptr refused = s.refusal("pull_rows")) std::rethrow_exception(refused);
    if (servers_of.empty()) {
      // No ids: nothing to ask, an empty result.
      job->parts.clear();
      job->finished = true;
    } else {
      messages = s.register_job(job, servers_of, sparse_rows);
    }
  } catch (...) {
    error = std::current_exception();
  }
  if (error) {
    job->done(Tensor(), error);
    return;
  }
  if (job->finished) {
    Tensor empty;
    try {
      empty = s.assemble(*job);
    } catch (...) {
      error = std::current_exception();
    }
    job->done(std::move(empty), error);
    return;
  }
  s.send_after_pushes(messages);
}

// The arguments of a push, checked before anything counts a step; returns the sparse ids, read to
// the host.
std::vector<std::vector<int64_t>> WorkerClient::State::check_push(int server,
                                                                  const std::vector<VariableGradient>& grads) const {
  const State& s = *this;
  const int worker = s.config.worker;
  if (server < 0 || server >= s.config.num_servers) {
    fail<InvalidArgument>("ps push (worker {}): server {} is outside [0, {})", worker, server, s.config.num_servers);
  }
  // Arguments first: a bad call must not count a step. Sparse ids are read to the host here.
  std::vector<std::vector<int64_t>> host_ids(grads.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    const VariableGradient& g = grads[i];
    const VariablePlacement* p = s.find(g.var_id);
    if (!p) fail<InvalidArgument>("ps push to server {} (worker {}): no server variable has id {}", server, worker, g.var_id);
    if (!g.grad.defined()) {
      fail<InvalidArgument>("ps push of '{}' (worker {}): the gradient is an empty Tensor handle", p->name, worker);
    }
    if (g.grad.dtype() != p->dtype) {
      fail<DTypeError>("ps push of '{}' (worker {}): the gradient is {}; the variable is {}", p->name, worker,
                       g.grad.dtype(), p->dtype);
    }
    if (!g.ids.defined()) {
      if (!(g.grad.shape() == p->shape)) {
        fail<ShapeError>("ps push of '{}' (worker {}): the gradient has shape {}; the variable has {}", p->name, worker,
                         g.grad.shape(), p->shape);
      }
      continue;
    }
    if (g.ids.dtype() != DType::i64 || g.ids.rank() != 1 || p->shape.rank() == 0 ||
        !(g.grad.shape() == rows_shape(*p, g.ids.shape()[0]))) {
      fail<ShapeError>("ps push of '{}' (worker {}): a sparse gradient needs ids i64 [n] and rows [n, {}...]; got ids {} "
                       "{} and rows {}",
                       p->name, worker, row_shape(*p), g.ids.dtype(), g.ids.shape(), g.grad.shape());
    }
    host_ids[i] = g.ids.to_vector<int64_t>();
    for (size_t k = 0; k < host_ids[i].size(); ++k) {
      if (host_ids[i][k] >= p->rows()) {  // negative ids are padding, skipped
        fail<OutOfRange>("ps push of '{}' (worker {}): id {} at position {} is outside [0, {})", p->name, worker,
                         host_ids[i][k], k, p->rows());
      }
    }
  }
  return host_ids;
}

// Under step_mutex: the step's bookkeeping (for its first push) and the encoded message, with when
// it may leave. Throws WorkerStopped and the client's other refusals.
Outgoing WorkerClient::State::prepare_push(int server, const std::vector<VariableGradient>& grads,
                                           const std::vector<std::vector<int64_t>>& host_ids) {
  State& s = *this;
  const int worker = s.config.worker;
  int64_t clock = 0;
  {
    std::lock_guard lock(s.mutex);
    if (std::exception_ptr refused = s.refusal("push")) std::rethrow_exception(refused);
    clock = s.servers[static_cast<size_t>(server)].clock + 1;
  }
  // The first push of a new step (clock above steps()) does its bookkeeping; the step's other
  // pushes come after it on step_mutex, and leave no earlier than it (the outbox).
  const Clock::time_point at = clock > s.steps ? s.step_bookkeeping(clock) : Clock::now();

  Push message{worker, clock, 0, {}};
  for (size_t i = 0; i < grads.size(); ++i) {
    const VariableGradient& g = grads[i];
    const VariablePlacement& p = *s.find(g.var_id);
    const ShardPiece* piece = p.piece_on(server);
    if (!piece) continue;
    const Tensor grad = contiguous_on_host(g.grad);
    if (!g.ids.defined()) {
      if (p.shape.rank() == 0 || (piece->row_begin == 0 && piece->row_end == p.rows())) {
        message.entries.push_back({g.var_id, Tensor(), grad});
      } else {
        // The piece's rows: a view of the contiguous gradient (encode copies it).
        const Shape shape = rows_shape(p, piece->rows());
        message.entries.push_back({g.var_id, Tensor(),
                                   Tensor::view(grad.storage(), shape, contiguous_strides(shape),
                                                grad.offset() + piece->row_begin * p.row_elements(), grad.dtype())});
      }
      continue;
    }
    // The ids this server owns, made local, and their gradient rows.
    std::vector<int64_t> local, source;
    for (size_t k = 0; k < host_ids[i].size(); ++k) {
      const int64_t id = host_ids[i][k];
      if (id >= piece->row_begin && id < piece->row_end) {
        local.push_back(id - piece->row_begin);
        source.push_back(static_cast<int64_t>(k));
      }
    }
    if (local.empty()) continue;
    const auto n = static_cast<int64_t>(local.size());
    Tensor rows = Tensor::empty(Shape{n}, DType::i64);
    std::memcpy(rows.raw_data(), local.data(), local.size() * sizeof(int64_t));
    Tensor values = Tensor::empty(rows_shape(p, n), p.dtype);
    const int64_t bytes = row_bytes(p);
    const auto* in = static_cast<const char*>(grad.raw_data());
    auto* out = static_cast<char*>(values.raw_data());
    for (int64_t j = 0; j < n; ++j) {
      std::memcpy(out + j * bytes, in + source[static_cast<size_t>(j)] * bytes, static_cast<size_t>(bytes));
    }
    message.entries.push_back({g.var_id, std::move(rows), std::move(values)});
  }
  {
    std::lock_guard lock(s.mutex);
    ServerSide& side = s.servers[static_cast<size_t>(server)];
    message.read_version = side.min_since_push ? *side.min_since_push : side.last_version;
    side.min_since_push.reset();
    if (s.config.mode == TrainingMode::sync) side.min_version = message.read_version + 1;
    side.clock = clock;
  }
  Outgoing out{at, {}, nullptr};
  out.messages.emplace_back(server, encode(message));
  return out;
}

// Sends the push now when nothing waits before it and its step has no delay left; else queues it
// for the timer. `done` runs exactly once (inline when sent now or refused). Returns when the
// message may leave.
Clock::time_point WorkerClient::State::submit_push(int server, const std::vector<VariableGradient>& grads,
                                                   const std::function<void(std::exception_ptr)>& done) {
  std::exception_ptr error;
  Clock::time_point at = Clock::now();
  try {
    const std::vector<std::vector<int64_t>> host_ids = check_push(server, grads);
    std::lock_guard step_lock(step_mutex);
    Outgoing out = prepare_push(server, grads, host_ids);
    at = out.at;
    if (!outbox.empty() || out.at > Clock::now()) {
      out.done = done;
      enqueue(std::move(out));
      return outbox.back().at;
    }
    send_all(out.messages);  // under step_mutex: a push gets no reply, so no callback runs here
  } catch (...) {
    error = std::current_exception();
  }
  done(std::move(error));
  return at;
}

void WorkerClient::push(int server, const std::vector<VariableGradient>& grads) {
  State& s = *state_;
  // Eagerly the injected delay is waited for here, on the worker's own thread; the timer sends.
  auto sent = std::make_shared<std::promise<void>>();
  std::future<void> result = sent->get_future();
  const Clock::time_point at = s.submit_push(server, grads, [sent](std::exception_ptr error) {
    if (error) {
      sent->set_exception(std::move(error));
    } else {
      sent->set_value();
    }
  });
  const auto limit = at + std::chrono::duration_cast<Clock::duration>(s.config.timeout);
  if (result.wait_until(limit) != std::future_status::ready) {
    fail<DeadlineExceeded>("ps push to server {} (worker {}): not sent within {} s after its step's delay", server,
                           s.config.worker, s.config.timeout.count());
  }
  result.get();
}

void WorkerClient::push_async(int server, std::vector<VariableGradient> grads,
                              std::function<void(std::exception_ptr)> done) {
  state_->submit_push(server, grads, done);
}

void WorkerClient::finish() {
  State& s = *state_;
  std::vector<int64_t> clocks;
  bool goodbye = false;
  {
    std::lock_guard lock(s.mutex);
    if (s.finished) return;
    s.finished = true;
    goodbye = s.started && !s.stopped.load();
    for (const ServerSide& side : s.servers) clocks.push_back(side.clock);
  }
  if (goodbye && std::this_thread::get_id() != s.timer.get_id()) {
    // The pushes still waiting for their step's delay leave first: a Goodbye must not overtake them.
    std::unique_lock lock(s.step_mutex);
    if (!s.outbox.empty()) {
      const Clock::time_point limit = s.outbox.back().at + std::chrono::duration_cast<Clock::duration>(s.config.timeout);
      s.outbox_wake.wait_until(lock, limit, [&] { return s.outbox.empty(); });
    }
  }
  if (goodbye) {
    for (int server = 0; server < s.config.num_servers; ++server) {
      s.transport.send(s.endpoint, server, encode(Goodbye{s.config.worker, clocks[static_cast<size_t>(server)]}));
    }
  }
  s.shutdown();
}

int64_t WorkerClient::steps() const {
  std::lock_guard lock(state_->mutex);
  return state_->steps;
}

bool WorkerClient::stopped() const { return state_->stopped.load(); }

WorkerStats WorkerClient::stats() const {
  const State& s = *state_;
  WorkerStats stats;
  stats.worker = s.config.worker;
  {
    std::lock_guard lock(s.mutex);
    stats.steps = s.steps;
    stats.step_seconds = s.step_seconds;
  }
  stats.stopped = s.stopped.load();
  const TransportCounters counters = s.transport.counters(s.endpoint);
  stats.bytes_received = counters.bytes_received;
  stats.bytes_sent = counters.bytes_sent;
  stats.messages_received = counters.messages_received;
  stats.messages_sent = counters.messages_sent;
  return stats;
}

const WorkerContext* current_worker() { return current_context; }

WorkerScope::WorkerScope(const WorkerContext* context) : previous_(current_context) { current_context = context; }
WorkerScope::~WorkerScope() { current_context = previous_; }

}  // namespace flowlet::detail::ps
