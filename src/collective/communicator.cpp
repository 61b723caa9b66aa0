#include "collective/communicator.hpp"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "collective/transport/backends.hpp"
#include "collective/transport/in_process.hpp"
#include "collective/transport/local_exchange.hpp"
#include "collective/transport/process.hpp"
#include "flowlet/core/error.hpp"
#include "flowlet/core/format.hpp"

namespace flowlet {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::mean:
      return "mean";
    case ReduceOp::max:
      return "max";
    case ReduceOp::min:
      return "min";
  }
  return "unknown reduction";
}

}  // namespace flowlet

namespace flowlet::detail {

const char* collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::all_reduce:
      return "all_reduce";
    case CollectiveKind::broadcast:
      return "broadcast";
    case CollectiveKind::all_gather:
      return "all_gather";
    case CollectiveKind::reduce_scatter:
      return "reduce_scatter";
    case CollectiveKind::barrier:
      return "barrier";
  }
  return "unknown collective";
}

namespace {
thread_local bool waiting_caller = false;
}  // namespace

bool caller_waits() { return waiting_caller; }

Tensor Communicator::run(int local, CollectiveCall call) {
  // The communicator's watchdog bounds the wait: every call ends, with a result or an error. The
  // caller spins briefly before sleeping, as small collectives complete within microseconds and a
  // futex wake-up would cost as much again. Shared with the callback, which may still be notifying
  // when this returns.
  struct Waiting {
    std::atomic<bool> ready{false};
    std::mutex mutex;
    std::condition_variable wake;
    Tensor result;
    std::exception_ptr error;
  };
  auto waiting = std::make_shared<Waiting>();
  struct CallerWaits {  // restores the flag however start() ends
    bool previous = waiting_caller;
    CallerWaits() { waiting_caller = true; }
    ~CallerWaits() { waiting_caller = previous; }
  };
  {
    CallerWaits scope;
    start(local, std::move(call), [waiting](Tensor value, std::exception_ptr error) {
      waiting->result = std::move(value);
      waiting->error = error;
      {
        std::lock_guard lock(waiting->mutex);
        waiting->ready.store(true, std::memory_order_release);
      }
      waiting->wake.notify_one();
    });
  }
  const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
  while (!waiting->ready.load(std::memory_order_acquire) && std::chrono::steady_clock::now() < spin_until) {
    std::this_thread::yield();
  }
  if (!waiting->ready.load(std::memory_order_acquire)) {
    std::unique_lock lock(waiting->mutex);
    waiting->wake.wait(lock, [&] { return waiting->ready.load(std::memory_order_acquire); });
  }
  if (waiting->error != nullptr) std::rethrow_exception(waiting->error);
  return std::move(waiting->result);
}

namespace {

GpuCommunicatorFactory gpu_factory = nullptr;

void check_devices(const std::vector<Device>& devices) {
  if (devices.empty()) throw InvalidArgument("make_communicator: needs at least one local device; got none");
  for (size_t i = 0; i < devices.size(); ++i) {
    check_device_exists("make_communicator", devices[i]);
    if (devices[i].kind() != devices[0].kind()) {
      throw InvalidArgument(
          fmt::format("make_communicator: the local devices must be all CPU devices or all GPUs; got "
                      "{} and {}",
                      devices[0], devices[i]));
    }
    for (size_t j = 0; j < i; ++j) {
      if (devices[j] == devices[i]) {
        throw InvalidArgument(
            fmt::format("make_communicator: the local devices must be distinct; got {} twice", devices[i]));
      }
    }
  }
}

}  // namespace

void register_gpu_communicator_factory(GpuCommunicatorFactory factory) { gpu_factory = factory; }

std::shared_ptr<Communicator> make_communicator(const std::vector<Device>& local_devices, CommunicatorOptions options) {
  check_devices(local_devices);
  const double timeout = resolve_timeout(options.timeout_seconds);
  if (local_devices[0].kind() == DeviceKind::cuda) {
    if (gpu_factory == nullptr) {
      throw DeviceError(
          fmt::format("make_communicator: GPU participants ({}) need NCCL, and this build of flowlet has "
                      "no NCCL backend (configure with -Dnccl=enabled)",
                      local_devices[0]));
    }
    return gpu_factory(local_devices, timeout);
  }
  if (process_count() == 1) return std::make_shared<InProcessCommunicator>(local_devices, timeout);
  return make_mpi_communicator(local_devices, timeout);
}

std::shared_ptr<Communicator> world_communicator() {
  // Held until the program exits (the MPI backend's exit handler shuts it down before MPI ends). A
  // failed first construction throws and is tried again on the next call.
  static const std::shared_ptr<Communicator> world = make_communicator({Device(DeviceKind::cpu, 0)});
  return world;
}

}  // namespace flowlet::detail
