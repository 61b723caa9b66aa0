// The optimizer state of the shards this process serves, in this job's placement: what a snapshot
// writes (taken from the servers' optimizers after a run) and what a restore installs (into them
// at commit when they exist, else when run()'s factory has made them: StrategyCore's pending
// optimizer state).
//
// Installing builds the piece's slots on its optimizer (Optimizer::build: zeros, the step counter
// placed beside the piece), then assigns the restored rows and counter; a state without an
// optimizer ("" : the checkpoint was saved before the first run) resets every slot to zeros and the
// counter to 0, as a fresh optimizer would have them.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "flowlet/core/tensor.hpp"
#include "ps/sharding.hpp"
#include "ps/strategy/strategy_core.hpp"

namespace flowlet::detail::ps::checkpoint {

// One piece's optimizer state: its variable, server and rows, each slot's rows, its step counter.
struct PieceOptimizerState {
  int32_t var = 0;  // the variable's id (creation index)
  int server = 0;
  int64_t row_begin = 0, row_end = 1;
  std::map<std::string, Tensor> slots;  // host copies, [rows of the piece, ...] (rank 0: scalar)
  int64_t iterations = 0;
};

class OptimizerState final : public PendingOptimizerState {
 public:
  std::string optimizer;           // its name; "" : fresh optimizers (no state was saved)
  std::vector<std::string> slots;  // the optimizer's slot names
  std::string origin;              // the checkpoint it was restored from, for messages ("" : live)
  std::vector<PieceOptimizerState> pieces;

  // InvalidArgument when `made` is another optimizer (name or slot names) than the state's.
  void check(const optim::Optimizer& made) const override;
  void install(ShardServer& server, int index) const override;
};

// The state of every piece of `placements` on a server this process serves, from the servers'
// optimizers (between runs, after the first). Slots a piece's optimizer has not built yet (no push
// reached it) are zeros, as build() would make them.
OptimizerState capture_optimizer_state(const StrategyCore& core, const std::vector<VariablePlacement>& placements);

// "slots m, v" ("no slots"), for messages.
std::string slot_list(const std::vector<std::string>& slots);

// A copy of `t` on the host, contiguous, sharing no memory with it (what a snapshot hands to the
// background writer while training goes on).
Tensor private_host_copy(const Tensor& t);

}  // namespace flowlet::detail::ps::checkpoint
