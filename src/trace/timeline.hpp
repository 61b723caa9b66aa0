// A traced call's step statistics as Chrome/Perfetto trace-event JSON (TracedFunction::timeline_json).
#pragma once

#include <string>

#include "exec/executor.hpp"
#include "flowlet/graph.hpp"

namespace flowlet::detail {

// One timeline process per device (named by a metadata event), one row per thread, one complete
// event per node run; `stats` belongs to a run of `graph`.
std::string timeline_json(const Graph& graph, const StepStats& stats);

}  // namespace flowlet::detail
