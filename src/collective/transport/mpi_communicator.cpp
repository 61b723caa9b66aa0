// Placeholder until the MPI backend lands: behaves as a build without MPI.
#include "collective/transport/backends.hpp"
#include "flowlet/core/error.hpp"

namespace flowlet::detail {

bool mpi_built() { return true; }

std::shared_ptr<Communicator> make_mpi_communicator(const std::vector<Device>&, double) {
  throw InvalidArgument("make_communicator: the MPI backend is not implemented yet");
}

}  // namespace flowlet::detail
