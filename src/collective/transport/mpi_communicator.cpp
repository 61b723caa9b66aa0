#include "collective/transport/mpi_communicator.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <climits>

#include "collective/transport/backends.hpp"
#include "collective/transport/host_collective.hpp"
#include "collective/transport/in_process.hpp"
#include "collective/transport/mpi_runtime.hpp"
#include "collective/transport/owned_thread.hpp"
#include "collective/transport/reduction.hpp"
#include "flowlet/core/error.hpp"
#include "flowlet/core/format.hpp"

namespace flowlet::detail {

namespace {

constexpr int kHeaderTag = 1;
constexpr int kGoodbyeTag = 2;

using Clock = std::chrono::steady_clock;

std::atomic<uint64_t> communicators_made{0};

// The MPI type that moves elements of `dtype` unchanged.
MPI_Datatype move_type(DType dtype) {
  switch (dtype_size(dtype)) {
    case 1:
      return MPI_UINT8_T;
    case 2:
      return MPI_UINT16_T;
    case 4:
      return MPI_UINT32_T;
    default:
      return MPI_UINT64_T;
  }
}

// Floating max and min that propagate NaN, as the host reduction does (MPI_MAX's `a > b ? a : b`
// would drop a NaN depending on its position).
template <class T, bool kMax>
void nan_max_min(void* in_raw, void* inout_raw, int* count, MPI_Datatype*) {
  const auto* in = static_cast<const T*>(in_raw);
  auto* inout = static_cast<T*>(inout_raw);
  for (int i = 0; i < *count; ++i) {
    const T a = in[i];
    const T b = inout[i];
    if (a != a || b != b) {
      inout[i] = a + b;
    } else {
      inout[i] = kMax ? (a < b ? b : a) : (b < a ? b : a);
    }
  }
}

// Made once, after MPI started; kept until MPI_Finalize frees them.
struct FloatingOps {
  MPI_Op max_f32, min_f32, max_f64, min_f64;
  FloatingOps() {
    MPI_Op_create(&nan_max_min<float, true>, 1, &max_f32);
    MPI_Op_create(&nan_max_min<float, false>, 1, &min_f32);
    MPI_Op_create(&nan_max_min<double, true>, 1, &max_f64);
    MPI_Op_create(&nan_max_min<double, false>, 1, &min_f64);
  }
};
const FloatingOps& floating_ops() {
  static const FloatingOps* ops = new FloatingOps;
  return *ops;
}

// The MPI type and op that reduce wire buffers of `dtype` (reduction.hpp): integer sums on the
// unsigned type, where wrapping is defined.
std::pair<MPI_Datatype, MPI_Op> reduce_type(DType dtype, ReduceOp op) {
  const ReduceOp combine = wire_op(dtype, op);
  const MPI_Op mpi_op = combine == ReduceOp::sum ? MPI_SUM : (combine == ReduceOp::max ? MPI_MAX : MPI_MIN);
  const bool sum = combine == ReduceOp::sum;
  const bool max = combine == ReduceOp::max;
  switch (wire_dtype(dtype)) {
    case DType::f32:
      return {MPI_FLOAT, sum ? MPI_SUM : (max ? floating_ops().max_f32 : floating_ops().min_f32)};
    case DType::f64:
      return {MPI_DOUBLE, sum ? MPI_SUM : (max ? floating_ops().max_f64 : floating_ops().min_f64)};
    case DType::i32:
      return {sum ? MPI_UINT32_T : MPI_INT32_T, mpi_op};
    case DType::i64:
      return {sum ? MPI_UINT64_T : MPI_INT64_T, mpi_op};
    default:  // u8, b8 (0/1 with max/min)
      return {MPI_UINT8_T, mpi_op};
  }
}

int mpi_count(int64_t n) { return static_cast<int>(n); }  // start() refuses counts past INT_MAX

// Waits for `request` (a collective made while creating the communicator) until `deadline`.
bool wait_at_creation(MPI_Request* request, Clock::time_point deadline) {
  for (int spins = 0;; ++spins) {
    int flag = 0;
    MPI_Test(request, &flag, MPI_STATUS_IGNORE);
    if (flag) return true;
    if (Clock::now() > deadline) return false;
    if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

}  // namespace

std::shared_ptr<Communicator> make_mpi_communicator(const std::vector<Device>& devices, double timeout_seconds) {
  return std::make_shared<MpiCommunicator>(devices, timeout_seconds);
}

MpiCommunicator::MpiCommunicator(std::vector<Device> devices, double timeout_seconds)
    : devices_(std::move(devices)),
      timeout_seconds_(timeout_seconds),
      exchange_(
          devices_, 0, timeout_seconds, "",
          [this](uint64_t number, std::vector<Arrival>& arrivals) {
            Job job = job_for_group<Job>(number, arrivals);
            const CollectiveCall& first = arrivals.front().call;
            const int root_process = first.root / local_size();
            const int root_local =
                first.kind == CollectiveKind::broadcast && root_process == rank_ ? first.root % local_size() : -1;
            try {
              // One participant whose dtype travels as it is: MPI reads its input directly (out of
              // place), saving the copy into a wire buffer.
              if (arrivals.size() == 1 && reduces(first.kind) && wire_dtype(first.input.dtype()) == first.input.dtype()) {
                job.wire = first.input;
                job.wire_is_input = true;
              } else {
                job.wire = combine_local(arrivals, root_local);
              }
            } catch (...) {  // out of memory for the wire buffer: the call fails here, and the peers learn it
              deliver(arrivals, {}, std::current_exception());
              job.failed_here = true;
              enqueue(std::move(job));
              return;
            }
            job.arrivals = std::move(arrivals);
            enqueue(std::move(job));
          },
          [this](uint64_t number, const CallHeader& header, bool check_header, std::exception_ptr) {
            enqueue(job_failed_here<Job>(number, header, check_header));
          }) {
  ensure_mpi_started();
  serial_ = communicators_made++;
  const Clock::time_point deadline = deadline_after(timeout_seconds);
  MPI_Request request;
  MPI_Comm_idup(MPI_COMM_WORLD, &comm_, &request);
  if (!wait_at_creation(&request, deadline)) {
    abort_job(fmt::format("make_communicator: not every process made communicator {} within {:g} s", serial_,
                          timeout_seconds));
  }
  MPI_Comm_size(comm_, &processes_);
  MPI_Comm_rank(comm_, &rank_);
  describe_ = describe_communicator(processes_, devices_);
  exchange_.set_identity(rank_ * local_size(), describe_);

  // Every process must bring the same number of participants.
  const int mine = local_size();
  std::vector<int> counts(static_cast<size_t>(processes_));
  MPI_Iallgather(&mine, 1, MPI_INT, counts.data(), 1, MPI_INT, comm_, &request);
  if (!wait_at_creation(&request, deadline)) {
    abort_job(fmt::format("make_communicator: not every process made {} within {:g} s", describe_, timeout_seconds));
  }
  for (int p = 1; p < processes_; ++p) {
    if (counts[static_cast<size_t>(p)] != counts[0]) {  // the same message on every process
      MPI_Comm_free(&comm_);
      throw InvalidArgument(
          fmt::format("make_communicator: every process must pass the same number of local devices; "
                      "got {} on process 0 and {} on process {}",
                      counts[0], counts[static_cast<size_t>(p)], p));
    }
  }

  left_after_.assign(static_cast<size_t>(processes_), -1);
  goodbye_payloads_.assign(2 * static_cast<size_t>(processes_), 0);
  goodbye_requests_.assign(static_cast<size_t>(processes_), MPI_REQUEST_NULL);
  for (int p = 0; p < processes_; ++p) {
    if (p == rank_) continue;
    MPI_Irecv(&goodbye_payloads_[2 * static_cast<size_t>(p)], 2, MPI_UINT64_T, p, kGoodbyeTag, comm_,
              &goodbye_requests_[static_cast<size_t>(p)]);
  }
  register_live_communicator(this);
  progress_ = std::thread([this] { progress(); });
}

MpiCommunicator::~MpiCommunicator() { shut_down(); }

Device MpiCommunicator::device(int local) const {
  check_local_index(*this, local);
  return devices_[static_cast<size_t>(local)];
}

void MpiCommunicator::start(int local, CollectiveCall call, CollectiveDone done) {
  check_local_index(*this, local);
  if (shut_down_.load()) {
    throw InvalidArgument(
        fmt::format("{}: {} was shut down (MPI ended at exit)", collective_name(call.kind), describe_));
  }
  prepare_call(call, size(), rank_of(local), devices_[static_cast<size_t>(local)], describe_);
  if (call.input.defined() && call.input.numel() > INT_MAX / size()) {
    throw InvalidArgument(
        fmt::format("{}: {} elements per participant are more than one MPI call moves over {} "
                    "participants (MPI counts are int); got shape {}",
                    collective_name(call.kind), call.input.numel(), size(), call.input.shape()));
  }
  exchange_.arrive(local, std::move(call), std::move(done));
}

void MpiCommunicator::enqueue(Job job) {
  std::unique_lock lock(mutex_);
  const uint64_t number = job.number;
  ++in_flight_;
  if (caller_waits() && !busy_ && number == next_job_ && jobs_.empty()) {
    // The thread completing this call is about to wait for it (Communicator::run) and nothing is
    // ahead of it: it makes the MPI calls itself, saving two thread hand-offs. The progress thread
    // leaves the calls alone meanwhile (busy_).
    busy_ = true;
    lock.unlock();
    Delivery delivery = run_job(job);
    lock.lock();
    finish_job_locked(lock);  // unlocks
    deliver(delivery.arrivals, std::move(delivery.results), std::move(delivery.error));
    return;
  }
  jobs_.emplace(number, std::move(job));
  // Notified under the lock: once it is released, the progress thread may run this call and a done
  // callback may destroy the communicator (and wake_) before a notify made after the unlock.
  if (progress_sleeping_) wake_.notify_all();  // else it is running a call and looks for the next one after
}

void MpiCommunicator::finish_job_locked(std::unique_lock<std::mutex>& lock) {
  // The MPI part of the call is over: the next call may start (on the progress thread, or on a
  // thread that a done callback below makes wait for one) while this one's results are handed out.
  busy_ = false;
  ++next_job_;
  if (!jobs_.empty() && progress_sleeping_) wake_.notify_all();  // under the lock: see enqueue()
  lock.unlock();
}

void MpiCommunicator::progress() {
  std::unique_lock lock(mutex_);
  for (;;) {
    auto it = busy_ ? jobs_.end() : jobs_.find(next_job_);
    if (it != jobs_.end()) {
      Job job = std::move(it->second);
      jobs_.erase(it);
      busy_ = true;
      lock.unlock();
      Delivery delivery = run_job(job);
      lock.lock();
      finish_job_locked(lock);
      deliver(delivery.arrivals, std::move(delivery.results), std::move(delivery.error));
      if (object_released_here()) return;  // a callback destroyed this communicator
      lock.lock();
      continue;
    }
    if (stopping_) return;
    progress_sleeping_ = true;
    wake_.wait(lock);
    progress_sleeping_ = false;
  }
}

std::string MpiCommunicator::who(int process) const {
  if (local_size() == 1) return fmt::format("participant {}", process);
  return fmt::format("process {} (participants {} .. {})", process, process * local_size(),
                     (process + 1) * local_size() - 1);
}

std::string MpiCommunicator::participants_of(const std::vector<int>& processes) const {
  std::vector<int> participants;
  for (int p : processes) {
    for (int l = 0; l < local_size(); ++l) participants.push_back(p * local_size() + l);
  }
  if (local_size() == 1) return fmt::format("participants [{}]", fmt::join(participants, ", "));
  return fmt::format("participants [{}] (processes [{}])", fmt::join(participants, ", "), fmt::join(processes, ", "));
}

MpiCommunicator::Delivery MpiCommunicator::run_job(Job& job) {
  const char* name =
      job.header.kind == kFailedHere ? "collective" : collective_name(static_cast<CollectiveKind>(job.header.kind));
  std::exception_ptr error;
  Tensor global;
  if (!broken_.empty()) {
    error = std::make_exception_ptr(DeadlineExceeded(fmt::format("{}: {}", name, broken_)));
  } else if (peer_gone_before(job.number) >= 0) {
    error = peer_left_error(name, job.number);
  } else if (job.failed_here && !job.check_header) {
    // The peers expect this call's data, and a data-only call has no way to tell them it failed
    // here. Nothing is sent: they time out (or fail at once when this process destroys the
    // communicator, as its goodbye counts only the calls it took part in), and this process's
    // later calls fail at once, since its calls no longer line up with theirs.
    skipped_call_ = std::min(skipped_call_, job.number);
    broken_ = fmt::format(
        "call {} failed in this process on a call that exchanges no header, so the other "
        "processes could not be told; {} cannot be used again",
        job.number, describe_);
  } else {
    if (job.check_header || job.failed_here) error = exchange_headers(job);
    if (error == nullptr && !job.failed_here) error = exchange_data(job, global);
  }
  if (job.failed_here) {  // its participants got this process's own error already
    --in_flight_;
    return {};
  }
  std::vector<Tensor> results;
  if (error == nullptr) {
    try {
      results = distribute(job.arrivals, global, size(), devices_);
    } catch (...) {
      error = std::current_exception();
    }
  }
  // Over for this process before anyone hears of it: a participant may destroy the communicator
  // as soon as its done ran.
  --in_flight_;
  return Delivery{std::move(job.arrivals), std::move(results), error};
}

std::exception_ptr MpiCommunicator::exchange_headers(const Job& job) {
  // On the heap: a send abandoned on a timeout keeps its buffer until the communicator goes.
  auto mine = std::make_unique<HeaderMessage>();
  mine->serial = serial_;
  mine->number = job.number;
  mine->header = job.header;
  if (job.failed_here) mine->header.kind = kFailedHere;
  std::vector<HeaderMessage> messages(static_cast<size_t>(processes_));
  messages[static_cast<size_t>(rank_)] = *mine;
  std::vector<MPI_Request> all(static_cast<size_t>(processes_), MPI_REQUEST_NULL);  // receives, then sends
  auto post_receive = [&](int p) {
    MPI_Irecv(&messages[static_cast<size_t>(p)], sizeof(HeaderMessage), MPI_BYTE, p, kHeaderTag, comm_,
              &all[static_cast<size_t>(p)]);
  };
  for (int p = 0; p < processes_; ++p) {
    if (p == rank_) continue;
    post_receive(p);
    all.emplace_back();
    MPI_Isend(mine.get(), sizeof(HeaderMessage), MPI_BYTE, p, kHeaderTag, comm_, &all.back());
  }
  const char* name = collective_name(static_cast<CollectiveKind>(job.header.kind));
  const Clock::time_point deadline = deadline_after(timeout_seconds_);
  // A message of another communicator that reused this one's MPI context (sent to a process that
  // had stopped listening) is not ours: drop it and listen again.
  const Wait outcome = poll_until(
      [&] {
        bool done = true;
        for (int p = 0; p < processes_; ++p) {
          MPI_Request& r = all[static_cast<size_t>(p)];
          if (r == MPI_REQUEST_NULL) continue;
          int flag = 0;
          MPI_Test(&r, &flag, MPI_STATUS_IGNORE);
          if (!flag) {
            done = false;
          } else if (messages[static_cast<size_t>(p)].serial != serial_) {
            post_receive(p);
            done = false;
          }
        }
        int sent = 0;
        MPI_Testall(static_cast<int>(all.size()) - processes_, all.data() + processes_, &sent, MPI_STATUSES_IGNORE);
        return done && sent;
      },
      deadline, job.number);
  if (outcome != Wait::done) {
    // MPI_Testall completes none of them unless all are done: test each to see who is missing.
    std::vector<int> missing;
    for (int p = 0; p < processes_; ++p) {
      MPI_Request& r = all[static_cast<size_t>(p)];
      if (r == MPI_REQUEST_NULL) continue;
      int flag = 0;
      MPI_Test(&r, &flag, MPI_STATUS_IGNORE);
      if (flag) continue;
      missing.push_back(p);
      MPI_Cancel(&r);
      MPI_Wait(&r, MPI_STATUS_IGNORE);
    }
    bool abandoned_send = false;
    for (size_t i = static_cast<size_t>(processes_); i < all.size(); ++i) {
      int flag = 0;
      if (all[i] != MPI_REQUEST_NULL) MPI_Test(&all[i], &flag, MPI_STATUS_IGNORE);
      if (all[i] != MPI_REQUEST_NULL) {
        MPI_Request_free(&all[i]);  // a send the peer never took: MPI finishes it with the buffer kept below
        abandoned_send = true;
      }
    }
    if (abandoned_send) abandoned_headers_.push_back(std::move(mine));
    if (outcome == Wait::peer_left) return peer_left_error(name, job.number);
    broken_ = fmt::format("an earlier call of {} timed out; a communicator whose call timed out cannot be used again",
                          describe_);
    return std::make_exception_ptr(DeadlineExceeded(fmt::format(
        "{}: {} of {} did not arrive within {:g} s", name, participants_of(missing), describe_, timeout_seconds_)));
  }
  std::vector<CallHeader> headers;
  for (const HeaderMessage& m : messages) {
    if (m.number != job.number) {
      abort_job(fmt::format("{}: call {} of {} received the header of call {}: the processes are out of step", name,
                            job.number, describe_, m.number));
    }
    headers.push_back(m.header);
  }
  return compare_process_headers(headers, job.failed_here ? "collective" : name, describe_,
                                 [this](int p) { return who(p); });
}

std::exception_ptr MpiCommunicator::exchange_data(const Job& job, Tensor& global) {
  const CollectiveCall& first = job.arrivals.front().call;
  const DType dtype = first.kind == CollectiveKind::barrier ? f32 : first.input.dtype();
  const int64_t n = job.wire.defined() ? job.wire.numel() : 0;
  MPI_Request request = MPI_REQUEST_NULL;
  switch (first.kind) {
    case CollectiveKind::all_reduce: {
      const auto [type, op] = reduce_type(dtype, first.op);
      if (job.wire_is_input) {
        global = Tensor::empty(Shape{n}, dtype, devices_[0]);
        MPI_Iallreduce(job.wire.raw_data(), global.raw_data(), mpi_count(n), type, op, comm_, &request);
      } else {
        global = job.wire;
        MPI_Iallreduce(MPI_IN_PLACE, global.raw_data(), mpi_count(n), type, op, comm_, &request);
      }
      break;
    }
    case CollectiveKind::reduce_scatter: {
      const auto [type, op] = reduce_type(dtype, first.op);
      const int64_t block = n / processes_;
      global = Tensor::empty(Shape{block}, wire_dtype(dtype), devices_[0]);
      MPI_Ireduce_scatter_block(job.wire.raw_data(), global.raw_data(), mpi_count(block), type, op, comm_, &request);
      break;
    }
    case CollectiveKind::all_gather: {
      global = Tensor::empty(Shape{n * processes_}, dtype, devices_[0]);
      MPI_Iallgather(job.wire.raw_data(), mpi_count(n), move_type(dtype), global.raw_data(), mpi_count(n),
                     move_type(dtype), comm_, &request);
      break;
    }
    case CollectiveKind::broadcast:
      global = job.wire;
      MPI_Ibcast(global.raw_data(), mpi_count(n), move_type(dtype), first.root / local_size(), comm_, &request);
      break;
    case CollectiveKind::barrier:
      MPI_Ibarrier(comm_, &request);
      break;
  }
  std::vector<MPI_Request> requests = {request};
  const Clock::time_point deadline = deadline_after(timeout_seconds_);
  const Wait outcome = wait_for(requests, deadline, job.number);
  if (outcome == Wait::done) return nullptr;
  // MPI cannot withdraw a collective: it may still read or write these buffers if the peers come.
  collective_abandoned_ = true;
  abandoned_buffers_.push_back(job.wire);
  abandoned_buffers_.push_back(global);
  const char* name = collective_name(first.kind);
  if (outcome == Wait::peer_left) return peer_left_error(name, job.number);
  broken_ = fmt::format("an earlier call of {} timed out; a communicator whose call timed out cannot be used again",
                        describe_);
  return std::make_exception_ptr(DeadlineExceeded(
      fmt::format("{}: the call on {} did not complete within {:g} s (a data-only call exchanges no header, so which "
                  "participants did not arrive is not known here)",
                  name, describe_, timeout_seconds_)));
}

MpiCommunicator::Wait MpiCommunicator::wait_for(std::vector<MPI_Request>& requests, Clock::time_point deadline,
                                                uint64_t number) {
  return poll_until(
      [&] {
        int flag = 0;
        MPI_Testall(static_cast<int>(requests.size()), requests.data(), &flag, MPI_STATUSES_IGNORE);
        return flag != 0;
      },
      deadline, number);
}

MpiCommunicator::Wait MpiCommunicator::poll_until(const std::function<bool()>& done, Clock::time_point deadline,
                                                  uint64_t number) {
  // Nonblocking collectives progress only inside MPI calls: test continuously, then back off so that
  // a long wait does not hold a core.
  const Clock::time_point begin = Clock::now();
  for (uint64_t spins = 0;; ++spins) {
    if (done()) return Wait::done;
    if ((spins & 255) == 0) {
      const Clock::time_point now = Clock::now();
      if (now >= next_goodbye_poll_) {
        poll_goodbyes();
        next_goodbye_poll_ = now + std::chrono::milliseconds(1);
        if (peer_gone_before(number) >= 0) return Wait::peer_left;
      }
      if (now > deadline) return Wait::timed_out;
      // Large messages move in fragments, each needing an MPI call to progress: keep testing
      // (yielding the core to whoever needs it) for a second before backing off to sleeps.
      if (now - begin > std::chrono::seconds(1)) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (spins > 64) std::this_thread::yield();
  }
}

void MpiCommunicator::poll_goodbyes() {
  for (int p = 0; p < processes_; ++p) {
    MPI_Request& r = goodbye_requests_[static_cast<size_t>(p)];
    if (r == MPI_REQUEST_NULL) continue;
    int flag = 0;
    MPI_Test(&r, &flag, MPI_STATUS_IGNORE);
    if (!flag) continue;
    const uint64_t* payload = &goodbye_payloads_[2 * static_cast<size_t>(p)];
    if (payload[0] == serial_) {
      left_after_[static_cast<size_t>(p)] = static_cast<int64_t>(payload[1]);
    } else {  // from an earlier communicator that reused this one's context: not ours
      MPI_Irecv(&goodbye_payloads_[2 * static_cast<size_t>(p)], 2, MPI_UINT64_T, p, kGoodbyeTag, comm_, &r);
    }
  }
}

int MpiCommunicator::peer_gone_before(uint64_t number) const {
  for (int p = 0; p < processes_; ++p) {
    const int64_t left = left_after_[static_cast<size_t>(p)];
    if (left >= 0 && static_cast<uint64_t>(left) <= number) return p;
  }
  return -1;
}

std::exception_ptr MpiCommunicator::peer_left_error(const char* name, uint64_t number) {
  const int p = peer_gone_before(number);
  broken_ = fmt::format("{} left {}", who(p), describe_);
  return std::make_exception_ptr(DeadlineExceeded(
      fmt::format("{}: {} of {} left it (destroyed the communicator or ended) after {} calls; call {} waits for it in "
                  "vain",
                  name, who(p), describe_, left_after_[static_cast<size_t>(p)], number)));
}

void MpiCommunicator::shut_down() {
  begin_shut_down();
  end_shut_down();
}

void MpiCommunicator::begin_shut_down() {
  if (shut_down_.exchange(true)) return;
  unregister_live_communicator(this);
  bool in_flight = false;
  {
    std::lock_guard lock(mutex_);
    in_flight = in_flight_ > 0;
    stopping_ = true;
  }
  if (in_flight || exchange_.has_waiting_groups()) {
    abort_job(fmt::format("{} was destroyed while a call was in flight; its peers would wait for it", describe_));
  }
  wake_.notify_all();
  join_or_release(progress_);
  if (!mpi_usable() || comm_ == MPI_COMM_NULL) return;
  // Tell every peer how many calls this process completed, so that a peer waiting for a later one
  // fails at once instead of at its timeout.
  goodbye_[0] = serial_;
  goodbye_[1] = std::min(next_job_, skipped_call_);
  for (int p = 0; p < processes_; ++p) {
    if (p == rank_) continue;
    goodbye_sends_.emplace_back();
    MPI_Isend(goodbye_, 2, MPI_UINT64_T, p, kGoodbyeTag, comm_, &goodbye_sends_.back());
  }
  saying_goodbye_ = true;
}

void MpiCommunicator::end_shut_down() {
  if (!saying_goodbye_) return;
  saying_goodbye_ = false;
  if (!mpi_usable()) return;
  // MPI_Comm_free only when no message of this communicator can still be on its way: every peer's
  // goodbye is in (it sends nothing after it) and no header send was abandoned on a timeout. A
  // message that arrived after the free would land on the next communicator that reuses the MPI
  // context and break its message order. Otherwise the communicator is kept (not freed) until
  // MPI_Finalize, which keeps its context from being reused. Peers normally end together; the wait
  // is bounded so that processes destroying communicators in different orders cannot deadlock.
  const Clock::time_point until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                     std::chrono::duration<double>(std::min(timeout_seconds_, 10.0)));
  bool all_in = false;
  for (;;) {
    poll_goodbyes();
    all_in = true;
    for (int p = 0; p < processes_; ++p) all_in = all_in && (p == rank_ || left_after_[static_cast<size_t>(p)] >= 0);
    int sent = 0;
    MPI_Testall(static_cast<int>(goodbye_sends_.size()), goodbye_sends_.data(), &sent, MPI_STATUSES_IGNORE);
    if ((all_in && sent) || Clock::now() > until) break;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  for (MPI_Request& r : goodbye_sends_) {
    if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
  }
  for (MPI_Request& r : goodbye_requests_) {
    if (r == MPI_REQUEST_NULL) continue;
    MPI_Cancel(&r);
    MPI_Wait(&r, MPI_STATUS_IGNORE);
  }
  if (all_in && abandoned_headers_.empty() && !collective_abandoned_) {
    MPI_Comm_free(&comm_);
  } else {
    comm_ = MPI_COMM_NULL;  // kept by MPI until MPI_Finalize (see above)
    // An abandoned collective's buffers stay valid until the process ends (MPI_Finalize does not
    // wait for it; Open MPI 4.1 was seen to finalize cleanly with one pending).
    static auto* kept = new std::vector<Tensor>;
    kept->insert(kept->end(), abandoned_buffers_.begin(), abandoned_buffers_.end());
  }
}

}  // namespace flowlet::detail
