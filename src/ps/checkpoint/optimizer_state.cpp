// Capturing and installing the servers' optimizer state (see optimizer_state.hpp).
#include "ps/checkpoint/optimizer_state.hpp"

#include <cstring>

#include "core/check.hpp"
#include "flowlet/eager_scope.hpp"
#include "flowlet/ops/creation.hpp"
#include "ps/server/optimizer_access.hpp"
#include "state/mirrored_variable.hpp"
#include "state/remote_variable.hpp"

namespace flowlet::detail::ps::checkpoint {

namespace {

// Slots and counters made while installing are plain local variables, whatever strategy scope the
// calling thread is in (run() may be called inside a scope).
class LocalVariables {
 public:
  LocalVariables() : mirrored_(exchange_mirrored_creation(nullptr)), remote_(exchange_remote_creation(nullptr)) {}
  ~LocalVariables() {
    exchange_mirrored_creation(mirrored_);
    exchange_remote_creation(remote_);
  }
  LocalVariables(const LocalVariables&) = delete;
  LocalVariables& operator=(const LocalVariables&) = delete;

 private:
  const MirrorPolicy* mirrored_;
  const RemoteCreation* remote_;
};

}  // namespace

std::string slot_list(const std::vector<std::string>& slots) {
  if (slots.empty()) return "no slots";
  std::string text = "slots ";
  for (size_t i = 0; i < slots.size(); ++i) text += (i ? ", " : "") + slots[i];
  return text;
}

Tensor private_host_copy(const Tensor& t) {
  EagerScope eager;
  const Device host;
  const Tensor source = (t.device() == host ? t : t.to(host)).contiguous();
  Tensor copy = Tensor::empty(source.shape(), source.dtype(), host);
  const size_t bytes = static_cast<size_t>(source.numel()) * dtype_size(source.dtype());
  if (bytes > 0) std::memcpy(copy.raw_data(), source.raw_data(), bytes);
  return copy;
}

void OptimizerState::check(const optim::Optimizer& made) const {
  if (optimizer.empty()) return;  // fresh optimizers: any will do
  const std::vector<std::string> made_slots = OptimizerAccess::slot_names(made);
  if (made.name() != optimizer || made_slots != slots) {
    fail<InvalidArgument>(
        "ParameterServerStrategy::run: the optimizer state restored from checkpoint {} is of optimizer "
        "'{}' ({}), but make_optimizer makes '{}' ({}); run with the optimizer that wrote the checkpoint "
        "(the restored state waits for it), or restore a checkpoint of this optimizer",
        origin, optimizer, slot_list(slots), made.name(), slot_list(made_slots));
  }
}

void OptimizerState::install(ShardServer& server, int index) const {
  LocalVariables local;
  EagerScope eager;
  for (const PieceOptimizerState& piece : pieces) {
    if (piece.server != index) continue;
    const ShardServer::PieceState state = server.piece_state(piece.var);
    if (state.optimizer == nullptr) continue;  // not seeded yet: nothing to install into
    state.optimizer->build({state.var});       // the slots exist (zeros), the counter sits beside the piece
    const std::map<std::string, Variable> made = OptimizerAccess::slots(*state.optimizer, state.var);
    for (const auto& [name, slot] : made) {
      Variable target = slot;
      auto restored = piece.slots.find(name);
      if (optimizer.empty() || restored == piece.slots.end()) {
        target.assign(zeros(target.shape(), target.dtype(), target.device()));
      } else {
        target.assign(restored->second.to(target.device()));
      }
    }
    Variable counter = state.optimizer->iterations();
    counter.assign(full({}, static_cast<double>(optimizer.empty() ? 0 : piece.iterations), i64, counter.device()));
  }
}

OptimizerState capture_optimizer_state(const StrategyCore& core, const std::vector<VariablePlacement>& placements) {
  OptimizerState state;
  state.optimizer = core.optimizer_name();
  state.slots = core.optimizer_slots();
  if (!core.servers_made()) {
    state.optimizer.clear();  // no run yet: no optimizer state
    state.slots.clear();
    return state;
  }
  EagerScope eager;
  for (const VariablePlacement& placement : placements) {
    for (const ShardPiece& piece : placement.pieces) {
      ShardServer* server = core.server(piece.server);
      if (server == nullptr) continue;  // another process serves it
      const ShardServer::PieceState live = server->piece_state(placement.id);
      PieceOptimizerState captured{placement.id, piece.server, piece.row_begin, piece.row_end, {}, 0};
      if (live.optimizer != nullptr) {
        const std::map<std::string, Variable> slots = OptimizerAccess::slots(*live.optimizer, live.var);
        for (const std::string& name : state.slots) {
          auto found = slots.find(name);
          if (found != slots.end()) captured.slots.emplace(name, private_host_copy(found->second.value()));
        }
        captured.iterations = live.optimizer->iterations().value().item<int64_t>();
      }
      // A slot not built yet (no push reached the piece) is what build() would make: zeros.
      Shape shape = placement.shape;
      if (shape.rank() > 0) {
        std::vector<int64_t> dims(shape.begin(), shape.end());
        dims[0] = piece.rows();
        shape = Shape(dims);
      }
      for (const std::string& name : state.slots) {
        if (captured.slots.count(name) == 0) {
          captured.slots.emplace(name, zeros(shape, OptimizerAccess::slot_dtype(placement.dtype), Device()));
        }
      }
      state.pieces.push_back(std::move(captured));
    }
  }
  return state;
}

}  // namespace flowlet::detail::ps::checkpoint
