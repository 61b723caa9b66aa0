#include "collective/transport/owned_thread.hpp"

namespace flowlet::detail {

namespace {
thread_local bool released_here = false;
}

void join_or_release(std::thread& thread) {
  if (!thread.joinable()) return;
  if (thread.get_id() == std::this_thread::get_id()) {
    thread.detach();
    released_here = true;
  } else {
    thread.join();
  }
}

bool object_released_here() { return released_here; }

}  // namespace flowlet::detail
