#include "collective/transport/in_process.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "collective/transport/host_collective.hpp"
#include "collective/transport/reduction.hpp"
#include "flowlet/core/error.hpp"
#include "flowlet/core/format.hpp"
#include "runtime/thread_pool.hpp"

namespace flowlet::detail {

std::string describe_communicator(int processes, const std::vector<Device>& devices) {
  std::string list;
  for (size_t i = 0; i < devices.size(); ++i) list += (i > 0 ? ", " : "") + devices[i].str();
  const int participants = processes * static_cast<int>(devices.size());
  return fmt::format("communicator of {} participant{} ({} process{} x [{}])", participants,
                     participants == 1 ? "" : "s", processes, processes == 1 ? "" : "es", list);
}

void check_local_index(const Communicator& communicator, int local) {
  if (local < 0 || local >= communicator.local_size()) {
    throw InvalidArgument(fmt::format("collective: local participant {} does not exist in {} (0 .. {})", local,
                                      communicator.describe(), communicator.local_size() - 1));
  }
}

InProcessCommunicator::InProcessCommunicator(std::vector<Device> devices, double timeout_seconds)
    : devices_(std::move(devices)),
      describe_(describe_communicator(1, devices_)),
      exchange_(devices_, 0, timeout_seconds, describe_,
                [this](uint64_t, std::vector<Arrival>& arrivals) { complete(arrivals); }) {}

Device InProcessCommunicator::device(int local) const {
  check_local_index(*this, local);
  return devices_[static_cast<size_t>(local)];
}

void InProcessCommunicator::start(int local, CollectiveCall call, CollectiveDone done) {
  check_local_index(*this, local);
  prepare_call(call, size(), local, devices_[static_cast<size_t>(local)], describe_);
  exchange_.arrive(local, std::move(call), std::move(done));
}

namespace {

// all_reduce in one pass over memory: each block of the inputs is reduced into participant 0's
// result and copied to the others' while it is still in cache (an all-reduce of P participants
// then reads P inputs and writes P results, the least it can), blocks spread over the thread pool.
std::vector<Tensor> all_reduce_in_one_pass(const std::vector<Arrival>& arrivals, const std::vector<Device>& devices) {
  const CollectiveCall& first = arrivals.front().call;
  const DType dtype = first.input.dtype();
  const int64_t n = first.input.numel();
  const size_t item = dtype_size(dtype);
  const bool finishes = needs_finish(dtype, first.op);
  std::vector<Tensor> results;
  for (size_t i = 0; i < arrivals.size(); ++i) results.push_back(Tensor::empty(first.input.shape(), dtype, devices[i]));
  constexpr int64_t kBlock = 4096;
  parallel_for(n, kParallelGrain, [&](int64_t begin, int64_t end) {
    std::vector<std::byte> scratch(finishes ? static_cast<size_t>(kBlock) * dtype_size(wire_dtype(dtype)) : 0);
    std::vector<const void*> inputs(arrivals.size());
    for (int64_t start = begin; start < end; start += kBlock) {
      const int64_t count = std::min(end, start + kBlock) - start;
      const size_t offset = static_cast<size_t>(start) * item;
      for (size_t i = 0; i < arrivals.size(); ++i) {
        inputs[i] = static_cast<const std::byte*>(arrivals[i].call.input.raw_data()) + offset;
      }
      auto* out = static_cast<std::byte*>(results[0].raw_data()) + offset;
      if (finishes) {
        accumulate(dtype, first.op, inputs, scratch.data(), count);
        finish(dtype, first.op, static_cast<int>(arrivals.size()), scratch.data(), out, count);
      } else {
        accumulate(dtype, first.op, inputs, out, count);
      }
      for (size_t i = 1; i < results.size(); ++i) {
        std::memcpy(static_cast<std::byte*>(results[i].raw_data()) + offset, out, static_cast<size_t>(count) * item);
      }
    }
  });
  return results;
}

}  // namespace

void InProcessCommunicator::complete(std::vector<Arrival>& arrivals) {
  std::vector<Tensor> results;
  std::exception_ptr error;
  try {
    const CollectiveCall& first = arrivals.front().call;
    if (first.kind == CollectiveKind::all_reduce) {
      deliver(arrivals, all_reduce_in_one_pass(arrivals, devices_), nullptr);
      return;
    }
    const int root_local = first.kind == CollectiveKind::broadcast ? first.root : -1;
    const Tensor wire = combine_local(arrivals, root_local);
    results = distribute(arrivals, wire, size(), devices_);
  } catch (...) {
    error = std::current_exception();  // an allocation that failed: every participant gets it
  }
  deliver(arrivals, std::move(results), std::move(error));
}

}  // namespace flowlet::detail
