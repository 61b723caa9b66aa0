// Stands in for the MPI backend in a build without MPI (-Dmpi=disabled, or no MPI found).
#include <fmt/format.h>

#include "collective/transport/backends.hpp"
#include "collective/transport/process.hpp"
#include "flowlet/core/error.hpp"

namespace flowlet::detail {

bool mpi_started() { return false; }

std::shared_ptr<Communicator> make_mpi_communicator(const std::vector<Device>&, double) {
  const ProcessPlacement& placement = process_placement();
  throw InvalidArgument(
      fmt::format("make_communicator: this is process {} of {} ({}), and this build of flowlet has "
                  "no MPI backend to reach the others (configure with -Dmpi=enabled)",
                  placement.index, placement.count, placement.source));
}

}  // namespace flowlet::detail
