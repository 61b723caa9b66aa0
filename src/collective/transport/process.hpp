// This process's place in the job, read once from the launcher's environment. Reading it never
// initializes MPI: a program started plainly is a 1-process job and pays nothing.
#pragma once

#include <string>

namespace flowlet::detail {

struct ProcessPlacement {
  int index = 0;        // among the job's processes
  int count = 1;        // the job's processes
  int local_index = 0;  // among the job's processes on this machine
  std::string source;   // the launcher it came from ("Open MPI", "Slurm", ...; "none" for a plain run)
};

// The placement from the environment: Open MPI (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK), MPICH's Hydra
// (PMI_RANK/PMI_SIZE/MPI_LOCALRANKID), Slurm (SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID), first match
// wins. InvalidArgument when the variables are there but not a consistent placement.
const ProcessPlacement& process_placement();

// The same, read from the environment now (not cached): for tests.
ProcessPlacement placement_from_environment();

}  // namespace flowlet::detail
