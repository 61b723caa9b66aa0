// The helper threads a communicator owns (a watchdog, a progress thread) call user callbacks, and a
// callback may drop the last reference to the communicator: its destructor then runs on the very
// thread it would join.
#pragma once

#include <thread>

namespace flowlet::detail {

// Joins `thread`; called on that thread itself, detaches it instead and marks the thread, which
// must then return without touching its object again (see object_released_here()).
void join_or_release(std::thread& thread);

// True on a helper thread whose object was destroyed from inside one of its callbacks.
bool object_released_here();

}  // namespace flowlet::detail
