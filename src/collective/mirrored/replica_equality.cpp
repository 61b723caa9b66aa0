// The opt-in check that a strategy's replicas stayed equal: a checksum of every copy of every
// mirrored variable, compared within the process and, through an all_gather, across processes.
#include <cstring>

#include "collective/mirrored/mirrored_core.hpp"
#include "core/check.hpp"
#include "flowlet/collective.hpp"
#include "flowlet/eager_scope.hpp"
#include "flowlet/ops/creation.hpp"

namespace flowlet::detail {

namespace {

// FNV-1a over the value's bytes (dtype and shape included): equal copies give equal sums, and a
// changed bit changes it.
uint64_t checksum(const VariableState& copy) {
  Tensor value;
  {
    std::lock_guard lock(copy.mutex);
    value = copy.value;
  }
  const Tensor host = value.to(Device()).contiguous();
  uint64_t hash = 1469598103934665603ULL;
  auto mix = [&](const void* data, size_t bytes) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 1099511628211ULL;
  };
  const auto dtype = static_cast<int>(host.dtype());
  mix(&dtype, sizeof dtype);
  for (int64_t d : host.shape()) mix(&d, sizeof d);
  mix(host.raw_data(), static_cast<size_t>(host.numel()) * dtype_size(host.dtype()));
  return hash;
}

}  // namespace

void MirroredCore::check_replicas_equal() {
  EagerScope eager;
  const std::vector<std::shared_ptr<VariableState>> variables = live_variables();
  std::vector<int64_t> replica0(variables.size());
  for (size_t v = 0; v < variables.size(); ++v) {
    const std::vector<std::shared_ptr<VariableState>> copies = all_copies(variables[v]);
    const uint64_t first = checksum(*copies[0]);
    for (size_t l = 1; l < copies.size(); ++l) {
      if (checksum(*copies[l]) != first) {
        fail<InvalidArgument>("MirroredStrategy: replicas diverged: mirrored variable '{}' differs between replica {} "
                              "({}) and replica {} ({})",
                              variables[v]->name, communicator->rank_of(0), devices[0],
                              communicator->rank_of(static_cast<int>(l)), devices[l]);
      }
    }
    replica0[v] = static_cast<int64_t>(first);
  }
  if (communicator->processes() == 1) return;
  // Across processes: every process's replica-0 checksums, process-major.
  const auto count = static_cast<int64_t>(replica0.size());
  // all_gather outside run() spans the processes on the world communicator's device (a GPU's
  // NCCL communicator takes no host tensor).
  const Device world_device = world_communicator()->device(0);
  const Tensor gathered = all_gather(tensor(replica0, Shape{count}).to(world_device));
  const std::vector<int64_t> all = gathered.to_vector<int64_t>();
  const int processes = communicator->processes();
  if (static_cast<int64_t>(all.size()) != count * processes) {
    fail<InvalidArgument>("MirroredStrategy: replicas diverged: processes hold different numbers of mirrored "
                          "variables ({} here, {} in all over {} processes)",
                          count, all.size(), processes);
  }
  for (int64_t v = 0; v < count; ++v) {
    for (int p = 1; p < processes; ++p) {
      if (all[static_cast<size_t>(p * count + v)] != all[static_cast<size_t>(v)]) {
        fail<InvalidArgument>("MirroredStrategy: replicas diverged: mirrored variable '{}' differs between replica 0 "
                              "(process 0) and replica {} (process {})",
                              variables[static_cast<size_t>(v)]->name, p * local_size(), p);
      }
    }
  }
}

}  // namespace flowlet::detail
