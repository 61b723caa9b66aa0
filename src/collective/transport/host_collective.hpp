// The host-memory steps of a collective, around the one cross-process step a backend may add:
//   combine_local():  every local participant's input -> one wire buffer for this process
//   (cross-process):  the MPI backend turns it into the job-wide buffer (identity in one process)
//   distribute():     the job-wide buffer -> each local participant's result on its device
// Wire buffers per kind (see reduction.hpp for the wire dtype):
//   all_reduce      combine: the local reduction (wire dtype, numel elements); global: the same, over all
//   reduce_scatter  combine: as all_reduce; global: this process's local_size parts, reduced over all
//   all_gather      combine: the local inputs concatenated; global: every process's, in process order
//   broadcast       combine: the root's input when the root is local, else a buffer to receive it
//   barrier         none (an empty handle)
// Used only for CPU devices: every pointer here is host memory.
#pragma once

#include <string>
#include <vector>

#include "collective/communicator.hpp"
#include "collective/transport/local_exchange.hpp"

namespace flowlet::detail {

// The checks of one participant's call that need no peer (thrown by start()), and its input made
// contiguous. `participants`: the communicator's size; `rank`: this participant's index in it.
void prepare_call(CollectiveCall& call, int participants, int rank, Device expected, const std::string& describe);

// The result's shape for one participant.
Shape result_shape(const CollectiveCall& call, int participants);

// This process's wire buffer (1-D, on the first local participant's device). `root_local` is the
// root's local index when the broadcast root is in this process, else -1.
Tensor combine_local(const std::vector<Arrival>& arrivals, int root_local);

// Each local participant's result from the job-wide wire buffer.
std::vector<Tensor> distribute(const std::vector<Arrival>& arrivals, const Tensor& global_wire, int participants,
                               const std::vector<Device>& devices);

// Calls every arrival's done with its result, or with `error` for all when it is set.
void deliver(std::vector<Arrival>& arrivals, std::vector<Tensor> results, std::exception_ptr error);

}  // namespace flowlet::detail
