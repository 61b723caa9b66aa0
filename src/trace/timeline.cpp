// Chrome trace-event JSON of one traced call (see timeline.hpp).
#include "trace/timeline.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "trace/json_text.hpp"

namespace flowlet::detail {

std::string timeline_json(const Graph& graph, const StepStats& stats) {
  std::vector<std::string> events;
  std::vector<Device> devices;
  auto process_of = [&](Device d) {
    const auto found = std::find(devices.begin(), devices.end(), d);
    if (found != devices.end()) return static_cast<int>(found - devices.begin()) + 1;
    devices.push_back(d);
    events.push_back(fmt::format("{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{},\"args\":{{\"name\":\"{}\"}}}}",
                                 devices.size(), d.str()));
    return static_cast<int>(devices.size());
  };
  for (const StepStats::NodeRun& run : stats.nodes) {
    const Node& node = graph.node(run.node);
    const int pid = process_of(node.device);
    events.push_back(fmt::format(
        "{{\"name\":\"{}\",\"cat\":\"{}\",\"ph\":\"X\",\"ts\":{:.3f},\"dur\":{:.3f},\"pid\":{},\"tid\":{}}}",
        json_escape(node.name), node.op ? node.op->name : "", static_cast<double>(run.start_ns) / 1e3,
        static_cast<double>(run.end_ns - run.start_ns) / 1e3, pid, run.thread));
  }
  return fmt::format("{{\"displayTimeUnit\":\"ns\",\"traceEvents\":[{}],\"wall_ns\":{}}}", fmt::join(events, ","),
                     stats.wall_ns);
}

}  // namespace flowlet::detail
