// Tensor names and attributes of a parameter-server job's checkpoint (see ps_layout.hpp).
#include "ps/checkpoint/ps_layout.hpp"

#include <charconv>

#include "core/check.hpp"

namespace flowlet::detail::ps::checkpoint {

namespace {

constexpr const char* kWho = "DistributedCheckpointManager::restore (ParameterServerStrategy)";

std::string joined(const std::vector<std::string>& items) {
  std::string text;
  for (size_t i = 0; i < items.size(); ++i) text += (i ? "," : "") + items[i];
  return text;
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  if (text.empty()) return parts;
  size_t begin = 0;
  while (true) {
    const size_t end = text.find(separator, begin);
    parts.push_back(text.substr(begin, end == std::string::npos ? std::string::npos : end - begin));
    if (end == std::string::npos) return parts;
    begin = end + 1;
  }
}

// A whole non-negative decimal number, or -1.
int64_t number(const std::string& text) {
  int64_t value = -1;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end || value < 0) return -1;
  return value;
}

const std::string& required(const std::map<std::string, std::string>& attributes, const std::string& key,
                            const std::string& path) {
  auto found = attributes.find(key);
  if (found == attributes.end()) {
    fail<InvalidArgument>("{}: checkpoint {} has no attribute '{}' (a damaged manifest?)", kWho, path, key);
  }
  return found->second;
}

int positive(const std::map<std::string, std::string>& attributes, const std::string& key, const std::string& path) {
  const std::string& text = required(attributes, key, path);
  const int64_t value = number(text);
  if (value < 1 || value > (1 << 20)) {
    fail<InvalidArgument>("{}: checkpoint {}: attribute '{}' must be a positive count; got '{}'", kWho, path, key,
                          text);
  }
  return static_cast<int>(value);
}

std::vector<ShardPiece> parse_placement(const std::string& text, const std::string& variable, const std::string& path,
                                        int servers) {
  std::vector<ShardPiece> pieces;
  int64_t next_row = 0;
  for (const std::string& item : split(text, ',')) {
    const size_t colon = item.find(':'), dash = item.find('-');
    ShardPiece piece{-1, -1, -1};
    if (colon != std::string::npos && dash != std::string::npos && colon < dash) {
      const int64_t server = number(item.substr(0, colon));
      piece.server = server >= 0 && server < servers ? static_cast<int>(server) : -1;
      piece.row_begin = number(item.substr(colon + 1, dash - colon - 1));
      piece.row_end = number(item.substr(dash + 1));
    }
    if (piece.server < 0 || piece.row_begin != next_row || piece.row_end <= piece.row_begin) {
      fail<InvalidArgument>(
          "{}: checkpoint {}: the placement of '{}' must be pieces 'server:begin-end' (servers in [0, {}), "
          "rows in order from 0); got '{}'",
          kWho, path, variable, servers, text);
    }
    next_row = piece.row_end;
    pieces.push_back(piece);
  }
  if (pieces.empty()) {
    fail<InvalidArgument>("{}: checkpoint {}: the placement of '{}' is empty", kWho, path, variable);
  }
  return pieces;
}

}  // namespace

std::string slot_tensor(const std::string& optimizer, const std::string& variable, const std::string& slot) {
  return optimizer + "/" + variable + "/" + slot;
}

std::string iterations_tensor(const std::string& optimizer, const std::string& variable) {
  return optimizer + "/" + variable + "/iterations";
}

std::string shard_name(int server) { return "server-" + std::to_string(server); }

void write_attributes(const SavedJob& job, std::map<std::string, std::string>& attributes) {
  attributes["ps.kind"] = kKind;
  attributes["ps.servers"] = std::to_string(job.servers);
  attributes["ps.workers"] = std::to_string(job.workers);
  attributes["ps.mode"] = job.mode;
  attributes["ps.optimizer"] = job.optimizer;
  attributes["ps.slots"] = joined(job.slots);
  attributes["ps.variables"] = std::to_string(job.placement.size());
  for (const auto& [name, pieces] : job.placement) {
    std::vector<std::string> items;
    for (const ShardPiece& p : pieces) items.push_back(fmt::format("{}:{}-{}", p.server, p.row_begin, p.row_end));
    attributes["ps.placement." + name] = joined(items);
  }
}

SavedJob read_attributes(const std::map<std::string, std::string>& attributes, const std::string& path) {
  auto kind = attributes.find("ps.kind");
  if (kind == attributes.end() || kind->second != kKind) {
    fail<InvalidArgument>(
        "{}: checkpoint {} was not written by a parameter-server job ({}); restore it with the "
        "manager's add(variables) of the job that wrote it, or pick a checkpoint this job wrote",
        kWho, path,
        kind == attributes.end() ? std::string("it records no ps.kind") : "its ps.kind is '" + kind->second + "'");
  }
  SavedJob job;
  job.servers = positive(attributes, "ps.servers", path);
  job.workers = positive(attributes, "ps.workers", path);
  job.mode = required(attributes, "ps.mode", path);
  job.optimizer = required(attributes, "ps.optimizer", path);
  job.slots = split(required(attributes, "ps.slots", path), ',');
  const std::string& count_text = required(attributes, "ps.variables", path);
  const int64_t count = number(count_text);
  const std::string prefix = "ps.placement.";
  for (auto it = attributes.lower_bound(prefix); it != attributes.end() && it->first.starts_with(prefix); ++it) {
    const std::string name = it->first.substr(prefix.size());
    job.placement.emplace(name, parse_placement(it->second, name, path, job.servers));
  }
  if (count < 0 || static_cast<size_t>(count) != job.placement.size()) {
    fail<InvalidArgument>("{}: checkpoint {}: attribute ps.variables is '{}' but {} placements are recorded", kWho,
                          path, count_text, job.placement.size());
  }
  return job;
}

}  // namespace flowlet::detail::ps::checkpoint
