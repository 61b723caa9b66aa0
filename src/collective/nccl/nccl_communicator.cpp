#include "collective/nccl/nccl_communicator.hpp"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "collective/transport/backends.hpp"
#include "collective/transport/call_header.hpp"
#include "collective/transport/host_collective.hpp"
#include "collective/transport/in_process.hpp"
#include "collective/transport/local_exchange.hpp"
#include "collective/transport/owned_thread.hpp"
#include "collective/transport/reduction.hpp"
#include "cuda/runtime.hpp"
#include "flowlet/core/error.hpp"
#include "flowlet/core/format.hpp"

#if NCCL_VERSION_CODE < 21000
#error "flowlet's NCCL backend needs NCCL 2.10 or newer (ncclAvg, ncclBfloat16)"
#endif

namespace flowlet::detail {

namespace {

using Clock = std::chrono::steady_clock;

void check_nccl(ncclResult_t result, const char* what) {
  if (result != ncclSuccess && result != ncclInProgress) {
    throw DeviceError(
        fmt::format("{}: NCCL failed: {} ({})", what, ncclGetErrorString(result), static_cast<int>(result)));
  }
}

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
    case DType::f16:  // reduced in f32 (converted first)
    case DType::bf16:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    case DType::u8:
    case DType::b8:
      return ncclUint8;
  }
  return ncclUint8;
}

// The type that moves elements unchanged (broadcast, all_gather).
ncclDataType_t move_type(DType dtype) {
  switch (dtype_size(dtype)) {
    case 1:
      return ncclUint8;
    case 2:
      return ncclFloat16;  // 2-byte elements, moved bit for bit
    case 4:
      return ncclInt32;
    default:
      return ncclInt64;
  }
}

ncclRedOp_t nccl_op(DType dtype, ReduceOp op) {
  if (dtype == b8) return wire_op(dtype, op) == ReduceOp::min ? ncclMin : ncclMax;
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::mean:
      return ncclAvg;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::min:
      return ncclMin;
  }
  return ncclSum;
}

bool is_half(DType dtype) { return dtype == f16 || dtype == bf16; }

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::vector<Device> devices, double timeout_seconds)
      : devices_(std::move(devices)),
        processes_(process_count()),
        rank_(process_index()),
        timeout_seconds_(timeout_seconds),
        describe_(describe_communicator(processes_, devices_)),
        exchange_(
            devices_, rank_ * static_cast<int>(devices_.size()), timeout_seconds, describe_,
            [this](uint64_t number, std::vector<Arrival>& arrivals) {
              Job job = job_for_group<Job>(number, arrivals);
              job.arrivals = std::move(arrivals);
              enqueue(std::move(job));
            },
            [this](uint64_t number, const CallHeader& header, bool check_header, std::exception_ptr) {
              enqueue(job_failed_here<Job>(number, header, check_header));
            }) {
    const int local = static_cast<int>(devices_.size());
    comms_.assign(devices_.size(), nullptr);
    if (processes_ == 1) {
      std::vector<int> list;
      for (const Device& d : devices_) list.push_back(d.index());
      check_nccl(ncclCommInitAll(comms_.data(), local, list.data()), "make_communicator");
    } else {
      // The control communicator (one CPU participant per process, over MPI) carries the unique id
      // and the header exchange. Made first: it also checks that every process is here.
      control_ = make_communicator({Device(DeviceKind::cpu, 0)}, {.timeout_seconds = timeout_seconds});
      ncclUniqueId id;
      std::memset(&id, 0, sizeof(id));
      if (rank_ == 0) check_nccl(ncclGetUniqueId(&id), "make_communicator");
      Tensor bytes = Tensor::empty(Shape{static_cast<int64_t>(sizeof(id))}, u8, Device(DeviceKind::cpu, 0));
      std::memcpy(bytes.raw_data(), &id, sizeof(id));
      CollectiveCall call;
      call.kind = CollectiveKind::broadcast;
      call.input = bytes;
      const Tensor got = control_->run(0, call);
      std::memcpy(&id, got.raw_data(), sizeof(id));
      check_nccl(ncclGroupStart(), "make_communicator");
      for (int l = 0; l < local; ++l) {
        cuda::use_device(devices_[static_cast<size_t>(l)].index());
        check_nccl(ncclCommInitRank(&comms_[static_cast<size_t>(l)], processes_ * local, id, rank_ * local + l),
                   "make_communicator");
      }
      check_nccl(ncclGroupEnd(), "make_communicator");
    }
    progress_ = std::thread([this] { progress(); });
  }

  ~NcclCommunicator() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    join_or_release(progress_);
    // Calls whose local stage completed but that never ran: their participants hear of it.
    for (auto& [number, job] : jobs_) {
      deliver(job.arrivals, {},
              std::make_exception_ptr(
                  Cancelled(fmt::format("collective: {} was destroyed before call {} ran", describe_, number))));
    }
    for (ncclComm_t comm : comms_) {
      if (comm == nullptr) continue;
      if (broken_.empty()) {
        ncclCommDestroy(comm);
      } else {
        ncclCommAbort(comm);
      }
    }
  }

  int local_size() const override { return static_cast<int>(devices_.size()); }
  int processes() const override { return processes_; }
  int process_rank() const override { return rank_; }
  Device device(int local) const override {
    check_local_index(*this, local);
    return devices_[static_cast<size_t>(local)];
  }
  std::string describe() const override { return describe_; }

  void abort(std::exception_ptr error) override { exchange_.abort(std::move(error)); }

  void start(int local, CollectiveCall call, CollectiveDone done) override {
    check_local_index(*this, local);
    prepare_call(call, size(), rank_of(local), devices_[static_cast<size_t>(local)], describe_);
    exchange_.arrive(local, std::move(call), std::move(done));
  }

 private:
  struct Job {
    uint64_t number = 0;
    std::vector<Arrival> arrivals;
    CallHeader header;
    bool check_header = true;
    bool failed_here = false;
  };
  // The header exchange's message: the header stamped with the call number.
  struct HeaderMessage {
    uint64_t number = 0;
    CallHeader header;
  };

  void enqueue(Job job) {
    std::lock_guard lock(mutex_);
    const uint64_t number = job.number;
    jobs_.emplace(number, std::move(job));
    // Under the lock: once it is released, a done callback on the progress thread may destroy the
    // communicator (and wake_).
    wake_.notify_all();
  }

  void progress() {
    std::unique_lock lock(mutex_);
    for (;;) {
      auto it = jobs_.find(next_job_);
      if (it != jobs_.end()) {
        Job job = std::move(it->second);
        jobs_.erase(it);
        lock.unlock();
        run_job(job);
        if (object_released_here()) return;  // a callback destroyed this communicator
        lock.lock();
        ++next_job_;
        continue;
      }
      if (stopping_) return;
      wake_.wait(lock);
    }
  }

  std::string who(int process) const {
    return fmt::format("process {} (participants {} .. {})", process, process * local_size(),
                       (process + 1) * local_size() - 1);
  }

  std::exception_ptr exchange_headers(const Job& job) {
    HeaderMessage mine;
    mine.number = job.number;
    mine.header = job.header;
    if (job.failed_here) mine.header.kind = kFailedHere;
    Tensor bytes = Tensor::empty(Shape{static_cast<int64_t>(sizeof(mine))}, u8, Device(DeviceKind::cpu, 0));
    std::memcpy(bytes.raw_data(), &mine, sizeof(mine));
    CollectiveCall call;
    call.kind = CollectiveKind::all_gather;
    call.input = bytes;
    call.check_header = false;
    Tensor all;
    try {
      all = control_->run(0, call);
    } catch (...) {
      return std::current_exception();
    }
    std::vector<HeaderMessage> messages(static_cast<size_t>(processes_));
    std::memcpy(messages.data(), all.raw_data(), messages.size() * sizeof(HeaderMessage));
    const char* name = job.failed_here ? "collective" : collective_name(static_cast<CollectiveKind>(job.header.kind));
    std::vector<CallHeader> headers;
    headers.reserve(messages.size());
    for (const HeaderMessage& m : messages) headers.push_back(m.header);
    return compare_process_headers(headers, name, describe_, [this](int p) { return who(p); });
  }

  // Issues the call on every local GPU and returns the results (valid once the events complete).
  std::vector<Tensor> issue(const Job& job, std::vector<Tensor>& keep_alive) {
    const CollectiveCall& first = job.arrivals.front().call;
    const size_t local = job.arrivals.size();
    std::vector<Tensor> results(local);
    std::vector<Tensor> sends(local);
    std::vector<Tensor> receives(local);
    const bool barrier = first.kind == CollectiveKind::barrier;
    const DType dtype = barrier ? f32 : first.input.dtype();
    const bool widen = !barrier && is_half(dtype) && reduces(first.kind);
    const Shape shape = barrier ? Shape{1} : result_shape(first, size());
    for (size_t l = 0; l < local; ++l) {
      const Device device = devices_[l];
      if (barrier) {
        sends[l] = Tensor::empty(Shape{1}, f32, device);
        receives[l] = sends[l];
        continue;
      }
      sends[l] = widen ? job.arrivals[l].call.input.astype(f32) : job.arrivals[l].call.input;
      receives[l] = Tensor::empty(shape, widen ? f32 : dtype, device);
    }
    check_nccl(ncclGroupStart(), collective_name(first.kind));
    for (size_t l = 0; l < local; ++l) {
      const int index = devices_[l].index();
      cudaStream_t stream = cuda::stream(index);
      const void* in = sends[l].raw_data();
      void* out = receives[l].raw_data();
      const auto count = static_cast<size_t>(sends[l].numel());
      const char* name = collective_name(first.kind);
      switch (first.kind) {
        case CollectiveKind::all_reduce:
          check_nccl(ncclAllReduce(in, out, count, nccl_type(dtype), nccl_op(dtype, first.op), comms_[l], stream),
                     name);
          break;
        case CollectiveKind::reduce_scatter:
          check_nccl(ncclReduceScatter(in, out, count / static_cast<size_t>(size()), nccl_type(dtype),
                                       nccl_op(dtype, first.op), comms_[l], stream),
                     name);
          break;
        case CollectiveKind::all_gather:
          check_nccl(ncclAllGather(in, out, count, move_type(dtype), comms_[l], stream), name);
          break;
        case CollectiveKind::broadcast:
          check_nccl(ncclBroadcast(in, out, count, move_type(dtype), first.root, comms_[l], stream), name);
          break;
        case CollectiveKind::barrier:
          check_nccl(ncclAllReduce(in, out, 1, ncclFloat32, ncclSum, comms_[l], stream), name);
          break;
      }
    }
    check_nccl(ncclGroupEnd(), collective_name(first.kind));
    for (size_t l = 0; l < local; ++l) {
      if (barrier) continue;
      results[l] = widen ? receives[l].astype(dtype) : receives[l];
    }
    keep_alive = sends;
    keep_alive.insert(keep_alive.end(), receives.begin(), receives.end());
    return results;
  }

  // Waits for the work queued on every local GPU's compute stream, up to the deadline.
  bool wait_for_streams(Clock::time_point deadline) {
    std::vector<cudaEvent_t> events;
    for (const Device& d : devices_) events.push_back(cuda::record_event(d.index(), cuda::stream(d.index())));
    bool done = false;
    for (int spins = 0;; ++spins) {
      done = true;
      for (cudaEvent_t e : events) done = done && cudaEventQuery(e) != cudaErrorNotReady;
      if (done || Clock::now() > deadline) break;
      if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    for (size_t l = 0; l < events.size(); ++l) cuda::give_event(devices_[l].index(), events[l]);
    return done;
  }

  void run_job(Job& job) {
    std::exception_ptr error;
    if (!broken_.empty()) {
      error = std::make_exception_ptr(DeadlineExceeded(
          fmt::format("{}: {}", collective_name(static_cast<CollectiveKind>(job.header.kind)), broken_)));
    } else if (processes_ > 1 && (job.check_header || job.failed_here)) {
      error = exchange_headers(job);
    }
    if (job.failed_here) return;
    std::vector<Tensor> results;
    if (error == nullptr) {
      try {
        std::vector<Tensor> keep_alive;
        results = issue(job, keep_alive);
        const Clock::time_point deadline = deadline_after(timeout_seconds_);
        if (!wait_for_streams(deadline)) {
          for (ncclComm_t comm : comms_) ncclCommAbort(comm);
          comms_.assign(comms_.size(), nullptr);
          broken_ = fmt::format(
              "an earlier call of {} timed out; a communicator whose call timed out cannot be used "
              "again",
              describe_);
          throw DeadlineExceeded(fmt::format(
              "{}: the call on {} did not complete within {:g} s (NCCL does not say which participants did not "
              "arrive)",
              collective_name(static_cast<CollectiveKind>(job.header.kind)), describe_, timeout_seconds_));
        }
      } catch (...) {
        error = std::current_exception();
        results.clear();
      }
    }
    deliver(job.arrivals, std::move(results), error);
  }

  const std::vector<Device> devices_;
  const int processes_;
  const int rank_;
  const double timeout_seconds_;
  const std::string describe_;
  std::vector<ncclComm_t> comms_;
  std::shared_ptr<Communicator> control_;  // across processes only
  std::string broken_;

  std::mutex mutex_;
  std::condition_variable wake_;
  std::map<uint64_t, Job> jobs_;
  uint64_t next_job_ = 0;
  bool stopping_ = false;
  std::thread progress_;

  LocalExchange exchange_;  // last: its callbacks use everything above
};

// Installs the factory while the library loads (see transport/backends.hpp).
const bool registered = [] {
  register_gpu_communicator_factory(&make_nccl_communicator);
  return true;
}();

}  // namespace

std::shared_ptr<Communicator> make_nccl_communicator(const std::vector<Device>& devices, double timeout_seconds) {
  return std::make_shared<NcclCommunicator>(devices, timeout_seconds);
}

}  // namespace flowlet::detail
