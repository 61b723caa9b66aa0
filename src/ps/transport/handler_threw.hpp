// What both transports do when an endpoint's handler throws: the contract (transport.hpp) makes
// that a bug in the endpoint, so the process says which handler threw what, and ends.
#pragma once

#include <cstdio>
#include <exception>
#include <string>

namespace flowlet::detail::ps {

// Call only from a catch block: rethrows the exception being handled to read its message, prints
// "flowlet: ps <transport> transport: the handler of endpoint E threw on a message from F: what",
// and calls std::terminate (flowlet's terminate handler aborts an MPI job).
[[noreturn]] inline void handler_threw(const char* transport, int endpoint, int from) {
  std::string what = "an unknown exception";
  try {
    throw;
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
  }
  std::fprintf(stderr, "flowlet: ps %s transport: the handler of endpoint %d threw on a message from %d: %s\n",
               transport, endpoint, from, what.c_str());
  std::fflush(stderr);
  std::terminate();
}

}  // namespace flowlet::detail::ps
