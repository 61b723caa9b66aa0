// Stands in for the MPI transport of the parameter servers in a build without MPI (-Dmpi=disabled,
// or no MPI found): the in-process transport still works; processes cannot be joined.
#include "core/check.hpp"
#include "flowlet/core/error.hpp"
#include "ps/transport/transport.hpp"

namespace flowlet::detail::ps {

std::unique_ptr<Transport> make_mpi_transport(const std::vector<int>& endpoint_process) {
  fail<InvalidArgument>(
      "make_mpi_transport: this build of flowlet was built without MPI, so it cannot reach the other {} "
      "endpoints' processes (configure with -Dmpi=enabled)",
      endpoint_process.size());
}

}  // namespace flowlet::detail::ps
