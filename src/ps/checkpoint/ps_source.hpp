// The checkpoint source of a ParameterServerStrategy (DistributedCheckpointManager::add(strategy)):
// its server variables' values and its servers' optimizer state, written by the servers that hold
// them and restored onto any number of servers (README.md in this folder has the whole story).
//
//   snapshot  between runs only: one ShardContent "server-<s>" per server this process serves (in
//             one process: every server; under mpirun: the server processes, workers none) with
//             its rows of every server variable (from the local values, which run() left equal to
//             the servers') and of every optimizer slot, and its pieces' step counters.
//   load      refuses another kind of checkpoint, another number of workers, another optimizer,
//             missing variables (InvalidArgument), shapes and dtypes (ShapeError / DTypeError); reads
//             every variable whole, and the optimizer state of the pieces this process serves in
//             THIS job's placement (rows re-sharded; a piece's counter is the largest of the saved
//             pieces its rows came from).
//   commit    assigns the local variables (the next run() seeds the servers from them) and installs
//             the optimizer state now if the servers' optimizers exist, else at the next run().
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/distributed/source.hpp"
#include "ps/checkpoint/optimizer_state.hpp"
#include "ps/strategy/strategy_core.hpp"

namespace flowlet::detail::ps::checkpoint {

class ParameterServerSource final : public ckpt::Source {
 public:
  // InvalidArgument when a server variable has no name or shares one with another.
  explicit ParameterServerSource(std::shared_ptr<StrategyCore> core);

  std::vector<std::string> tensor_names() const override { return names_; }
  void snapshot(const ckpt::ProcessView& view, std::vector<ckpt::ShardContent>& shards,
                std::map<std::string, std::string>& attributes) override;
  void load(const ckpt::ProcessView& view, ckpt::Reader& reader) override;
  void commit() override;

 private:
  // The servers whose state this process writes and restores.
  std::vector<int> my_servers() const;
  // InvalidArgument when variables were made in the strategy's scope after add(strategy).
  void check_variables(const char* function) const;

  std::shared_ptr<StrategyCore> core_;
  std::vector<std::string> names_;  // the server variables at add(), creation order

  // What load() read, for commit().
  struct Loaded {
    std::vector<Tensor> values;  // per server variable, whole
    std::shared_ptr<OptimizerState> optimizer_state;
  };
  std::optional<Loaded> loaded_;
};

}  // namespace flowlet::detail::ps::checkpoint
