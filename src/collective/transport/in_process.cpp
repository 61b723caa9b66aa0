#include "collective/transport/in_process.hpp"

#include <fmt/format.h>

#include "collective/transport/host_collective.hpp"
#include "flowlet/core/error.hpp"
#include "flowlet/core/format.hpp"

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

void InProcessCommunicator::complete(std::vector<Arrival>& arrivals) {
  std::vector<Tensor> results;
  std::exception_ptr error;
  try {
    const CollectiveCall& first = arrivals.front().call;
    const int root_local = first.kind == CollectiveKind::broadcast ? first.root : -1;
    const Tensor wire = combine_local(arrivals, size(), root_local);
    results = distribute(arrivals, wire, size(), devices_);
  } catch (...) {
    error = std::current_exception();  // an allocation that failed: every participant gets it
  }
  deliver(arrivals, std::move(results), error);
}

}  // namespace flowlet::detail
