// How much of a traced step's all-reduce time ran while other nodes computed: read from the step's
// timeline (TracedFunction::timeline_json / MirroredStrategy::timeline_json, Chrome trace-event
// JSON with one "X" event per node: name, cat = the op, ts and dur in microseconds).
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace examples {

struct CollectiveOverlap {
  double collective_us = 0;  // summed duration of the all_reduce nodes (waiting for peers included)
  double hidden_us = 0;      // the part of it during which some other node was running
  int collectives = 0;
  double hidden_share() const { return collective_us > 0 ? hidden_us / collective_us : 0.0; }
};

namespace detail {

// The text of `"key":<value>` in `event` (a number or a quoted string, without the quotes).
inline std::string field(std::string_view event, std::string_view key) {
  std::string pattern(1, '"');
  pattern.append(key).append("\":");
  const size_t at = event.find(pattern);
  if (at == std::string_view::npos) return {};
  size_t begin = at + pattern.size();
  if (begin < event.size() && event[begin] == '"') {
    const size_t end = event.find('"', begin + 1);
    return std::string(event.substr(begin + 1, end - begin - 1));
  }
  size_t end = begin;
  while (end < event.size() && event[end] != ',' && event[end] != '}') ++end;
  return std::string(event.substr(begin, end - begin));
}

}  // namespace detail

inline CollectiveOverlap collective_overlap(std::string_view timeline, std::string_view collective = "all_reduce") {
  using Interval = std::pair<double, double>;
  std::vector<Interval> collectives, compute;
  for (size_t at = timeline.find("{\"name\""); at != std::string_view::npos; at = timeline.find("{\"name\"", at + 1)) {
    const size_t end = timeline.find('}', at);
    const std::string_view event = timeline.substr(at, end - at + 1);
    if (detail::field(event, "ph") != "X") continue;
    const std::string cat = detail::field(event, "cat");
    const double ts = std::stod(detail::field(event, "ts"));
    const double dur = std::stod(detail::field(event, "dur"));
    // Transfers and variable reads take no compute time worth hiding behind.
    if (cat == collective) {
      collectives.emplace_back(ts, ts + dur);
    } else if (!cat.empty() && cat != "recv" && cat != "send" && cat != "read_variable") {
      compute.emplace_back(ts, ts + dur);
    }
  }
  // The union of the compute intervals, then each collective's overlap with it.
  std::sort(compute.begin(), compute.end());
  std::vector<Interval> merged;
  for (const Interval& i : compute) {
    if (!merged.empty() && i.first <= merged.back().second) {
      merged.back().second = std::max(merged.back().second, i.second);
    } else {
      merged.push_back(i);
    }
  }
  CollectiveOverlap result;
  for (const Interval& c : collectives) {
    ++result.collectives;
    result.collective_us += c.second - c.first;
    for (const Interval& m : merged) {
      result.hidden_us += std::max(0.0, std::min(c.second, m.second) - std::max(c.first, m.first));
    }
  }
  return result;
}

}  // namespace examples
