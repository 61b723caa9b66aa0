// How a parameter-server job's state is laid out in a distributed checkpoint: the names of its
// logical tensors and the attributes a restore needs (src/ps/checkpoint/README.md has the picture).
//
//   <variable>                        the server variable's value, whole ([rows, ...]); each server
//                                     writes its rows
//   <optimizer>/<variable>/<slot>     one optimizer slot of the variable (the name the optimizer
//                                     gives the slot variable), whole; each server writes its rows
//   <optimizer>/<variable>/iterations i64 [pieces]: the step counter of each piece's optimizer, in
//                                     placement order; the server of piece k writes row k
//
// Attributes ("ps." keys, the same on every process): kind ("parameter_server"), servers, workers,
// mode, variables (how many), optimizer (its name; "" when no optimizer state is saved), slots
// (comma-separated slot names) and placement.<variable> ("server:begin-end,..." in row order).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ps/sharding.hpp"

namespace flowlet::detail::ps::checkpoint {

inline constexpr const char* kKind = "parameter_server";

std::string slot_tensor(const std::string& optimizer, const std::string& variable, const std::string& slot);
std::string iterations_tensor(const std::string& optimizer, const std::string& variable);
// The shard file server `server` writes: "server-<server>".
std::string shard_name(int server);

// What a parameter-server job records in a checkpoint's attributes.
struct SavedJob {
  int servers = 0;
  int workers = 0;
  std::string mode;
  std::string optimizer;           // "" : values only
  std::vector<std::string> slots;  // the optimizer's slot names
  // Each saved variable's pieces (server, rows) in row order, by variable name.
  std::map<std::string, std::vector<ShardPiece>> placement;
};

void write_attributes(const SavedJob& job, std::map<std::string, std::string>& attributes);
// The job a checkpoint's attributes describe. InvalidArgument naming `path` when they are not a
// parameter-server job's (another kind of checkpoint) or are malformed.
SavedJob read_attributes(const std::map<std::string, std::string>& attributes, const std::string& path);

}  // namespace flowlet::detail::ps::checkpoint
