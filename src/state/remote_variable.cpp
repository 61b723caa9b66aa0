// The thread's creation policy for server variables (state/remote_variable.hpp).
#include "state/remote_variable.hpp"

namespace flowlet::detail {
namespace {
thread_local const RemoteCreation* creation = nullptr;
}  // namespace

const RemoteCreation* remote_creation() { return creation; }

const RemoteCreation* exchange_remote_creation(const RemoteCreation* next) {
  const RemoteCreation* previous = creation;
  creation = next;
  return previous;
}

}  // namespace flowlet::detail
