// Capturing where user code recorded a node, cheaply at trace time (return addresses only).
#pragma once

#include "flowlet/graph.hpp"

namespace flowlet::detail {

// The current call stack, for a node being recorded now.
SourceTrace capture_source();

}  // namespace flowlet::detail
