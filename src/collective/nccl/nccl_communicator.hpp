// The NCCL backend: GPU participants, `local_size()` GPUs of every process. Within one process the
// NCCL communicators come from ncclCommInitAll; across processes from ncclCommInitRank, with the
// unique id sent by a broadcast on a CPU communicator of one participant per process (MPI), which
// also carries the header exchange.
//
// A call: the process's participants meet in a LocalExchange (headers compared on every call);
// the last to arrive hands the call to the communicator's progress thread, which (after the
// cross-process header exchange when asked for) issues one NCCL group over every local GPU on the
// devices' compute streams, then polls an event per GPU against the deadline and hands out the
// results. A call that misses its deadline aborts the NCCL communicators (ncclCommAbort, which
// frees the streams) and fails with DeadlineExceeded; the communicator cannot be used after that.
//
// Reductions: f16 and bf16 are reduced in f32 (converted before and rounded once after, as the
// host backends do); mean is NCCL's ncclAvg (integers: sum, then divided, truncating); b8 sum/max
// are "any" and min/mean "all" (reduction.hpp). A barrier is a 1-element all-reduce.
#pragma once

#include <memory>
#include <vector>

#include "collective/communicator.hpp"

namespace flowlet::detail {

std::shared_ptr<Communicator> make_nccl_communicator(const std::vector<Device>& devices, double timeout_seconds);

}  // namespace flowlet::detail
