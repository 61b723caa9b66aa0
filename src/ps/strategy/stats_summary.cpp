// ParameterServerStats::summary(): the run's counters as the table the examples print, one line
// per server and per worker, then the totals and the staleness histogram.
#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "flowlet/ps_options.hpp"

namespace flowlet {

namespace {

std::string megabytes(int64_t bytes) { return fmt::format("{:.2f}", static_cast<double>(bytes) / 1e6); }

// Mean, median and slowest of a worker's step times, in milliseconds.
std::string step_times(const std::vector<double>& seconds) {
  if (seconds.empty()) return fmt::format("{:>9} {:>9} {:>9}", "-", "-", "-");
  std::vector<double> sorted = seconds;
  std::sort(sorted.begin(), sorted.end());
  const double mean = std::accumulate(sorted.begin(), sorted.end(), 0.0) / static_cast<double>(sorted.size());
  return fmt::format("{:9.2f} {:9.2f} {:9.2f}", mean * 1e3, sorted[sorted.size() / 2] * 1e3, sorted.back() * 1e3);
}

}  // namespace

std::string ParameterServerStats::summary() const {
  std::string out = fmt::format(
      "parameter servers, {} mode: {} servers, {} workers, {:.3f} s; updates applied {}, dropped {}, max staleness "
      "{}\n",
      to_string(mode), servers.size(), workers.size(), wall_seconds, updates_applied, updates_dropped, max_staleness);
  out += fmt::format("{:>6} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9} {:>8} {:>8}\n", "server", "version", "applied",
                     "dropped", "steps", "max stale", "msgs in", "msgs out", "MB in", "MB out");
  for (const ServerStats& s : servers) {
    out += fmt::format("{:>6} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9} {:>8} {:>8}\n", s.server, s.version,
                       s.updates_applied, s.updates_dropped, s.steps, s.max_staleness, s.messages_received,
                       s.messages_sent, megabytes(s.bytes_received), megabytes(s.bytes_sent));
  }
  out += fmt::format("{:>6} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8}  {}\n", "worker", "steps", "mean ms",
                     "median ms", "max ms", "msgs in", "msgs out", "MB in", "MB out", "status");
  for (const WorkerStats& w : workers) {
    std::string status = "ok";
    if (!w.error.empty()) {
      status = "failed: " + w.error;
    } else if (w.stopped) {
      status = "stopped";
    }
    out +=
        fmt::format("{:>6} {:>8} {} {:>9} {:>9} {:>8} {:>8}  {}\n", w.worker, w.steps, step_times(w.step_seconds),
                    w.messages_received, w.messages_sent, megabytes(w.bytes_received), megabytes(w.bytes_sent), status);
  }
  out += "staleness histogram:";
  if (staleness_histogram.empty()) out += " (no updates applied)";
  for (size_t s = 0; s < staleness_histogram.size(); ++s) {
    if (staleness_histogram[s] == 0) continue;
    const bool last = s + 1 == staleness_histogram.size();
    out += fmt::format(" {}{}: {}", s, last && s > 0 ? "+" : "", staleness_histogram[s]);
  }
  out += "\n";
  return out;
}

}  // namespace flowlet
