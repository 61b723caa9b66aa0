// A job whose process fails must end, non-zero, within seconds on every process: never a hang.
// Run by scripts/mpi_expect_failure.py (tests/meson.build), which passes when mpirun exits
// non-zero within its limit and fails when the job succeeds or outlives it.
//
//   mpi_fault <mode>: every process runs all_reduce in a loop; at call 20, process 1
//     sigkill             kills itself with SIGKILL (mpirun notices the dead process)
//     uncaught_exception  throws an exception nobody catches (flowlet's terminate handler aborts)
//     early_return        returns from main (its exit handler tells the peers it left; their
//                         waiting call fails and, uncaught, aborts the job)
//     destroyed_mid_call  destroys a communicator with a call in flight (flowlet aborts the job)
#include <csignal>
#include <cstdio>
#include <cstring>
#include <flowlet/flowlet.hpp>
#include <stdexcept>
#include <string>

#include "collective/communicator.hpp"

namespace fl = flowlet;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s sigkill|uncaught_exception|early_return|destroyed_mid_call\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  // A communicator of our own (not the world one, which lives until exit), so that
  // destroyed_mid_call can destroy it.
  auto comm = fl::detail::make_communicator({fl::Device("cpu:0")});
  for (int call = 0; call < 1000000; ++call) {
    if (call == 20 && fl::process_index() == 1) {
      if (mode == "sigkill") {
        std::raise(SIGKILL);
      } else if (mode == "uncaught_exception") {
        throw std::runtime_error("mpi_fault: process 1 fails on purpose");
      } else if (mode == "early_return") {
        return 0;
      } else if (mode == "destroyed_mid_call") {
        fl::detail::CollectiveCall barrier;
        barrier.kind = fl::detail::CollectiveKind::barrier;
        comm->start(0, barrier, [](fl::Tensor, std::exception_ptr) {});
        comm.reset();
        return 0;
      } else {
        std::fprintf(stderr, "mpi_fault: unknown mode %s\n", mode.c_str());
        return 2;
      }
    }
    fl::Tensor x = fl::ones({1024});
    fl::detail::CollectiveCall all_reduce;
    all_reduce.input = x;
    all_reduce.check_header = call == 0;
    comm->run(0, all_reduce);
  }
  return 0;
}
