// How communicator.cpp reaches the backends that a build may lack, without #ifdefs:
//   - MPI (this layer): mpi_communicator.cpp in a build with MPI, no_mpi.cpp in one without (Meson
//     compiles exactly one);
//   - NCCL (src/collective/nccl, the backends layer, above this one): registers its factory while
//     the library loads, so the runtime layer never includes it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "collective/communicator.hpp"

namespace flowlet::detail {

// A communicator over CPU devices `devices` of every process of a job of more than one process
// (made collectively). DeviceError / InvalidArgument in a build without MPI.
std::shared_ptr<Communicator> make_mpi_communicator(const std::vector<Device>& devices, double timeout_seconds);

// Whether MPI has been initialized in this process (a plain run never initializes it).
bool mpi_started();

// True on a thread inside Communicator::run: it waits for the call it starts, so a backend may do
// the call's work on it instead of handing it to another thread.
bool caller_waits();

using GpuCommunicatorFactory = std::shared_ptr<Communicator> (*)(const std::vector<Device>& devices,
                                                                 double timeout_seconds);
// Installs the GPU (NCCL) factory; called once, while the library loads.
void register_gpu_communicator_factory(GpuCommunicatorFactory factory);

}  // namespace flowlet::detail
