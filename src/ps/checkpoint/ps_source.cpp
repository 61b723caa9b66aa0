// DistributedCheckpointManager::add(ParameterServerStrategy&) and the servers' checkpoint source
// (see ps_source.hpp and README.md in this folder).
#include "ps/checkpoint/ps_source.hpp"

#include <algorithm>
#include <set>

#include "core/check.hpp"
#include "flowlet/eager_scope.hpp"
#include "flowlet/ops/creation.hpp"
#include "flowlet/ops/shape.hpp"
#include "ps/checkpoint/ps_layout.hpp"
#include "ps/server/optimizer_access.hpp"
#include "ps/strategy/run_steps.hpp"

namespace flowlet {

void DistributedCheckpointManager::add(ParameterServerStrategy& strategy) {
  detail::ckpt::ManagerAccess::add_source(*this, std::make_shared<detail::ps::checkpoint::ParameterServerSource>(
                                                     detail::ps::StrategyAccess::core(strategy)));
}

}  // namespace flowlet

namespace flowlet::detail::ps::checkpoint {

namespace {

constexpr const char* kSave = "DistributedCheckpointManager::save (ParameterServerStrategy)";
constexpr const char* kRestore = "DistributedCheckpointManager::restore (ParameterServerStrategy)";

// Rows [begin, end) of `t` (rank 0: itself).
Tensor rows_of(const Tensor& t, int64_t begin, int64_t end) {
  return t.rank() == 0 ? t : slice(t, 0, begin, end - begin);
}

std::string names_text(const std::map<std::string, std::vector<ShardPiece>>& placement) {
  std::string text;
  for (const auto& [name, pieces] : placement) text += (text.empty() ? "'" : ", '") + name + "'";
  return text.empty() ? "none" : text;
}

// The tensor `name` of the checkpoint with the given dtype and shape, or the error that says why not.
const ckpt::TensorRecord& expect_tensor(ckpt::Reader& reader, const std::string& name, DType dtype, const Shape& shape,
                                        const std::string& what) {
  const ckpt::TensorRecord* record = reader.find(name);
  if (record == nullptr) {
    fail<InvalidArgument>("{}: checkpoint {} holds no tensor '{}' ({}); it does not fit this job", kRestore,
                          reader.path(), name, what);
  }
  if (record->dtype != dtype) {
    fail<DTypeError>("{}: checkpoint {}: '{}' ({}) is {}; this job's is {}", kRestore, reader.path(), name, what,
                     record->dtype, dtype);
  }
  if (!(record->shape == shape)) {
    fail<ShapeError>("{}: checkpoint {}: '{}' ({}) has shape {}; this job's has {}", kRestore, reader.path(), name,
                     what, record->shape, shape);
  }
  return *record;
}

}  // namespace

ParameterServerSource::ParameterServerSource(std::shared_ptr<StrategyCore> core) : core_(std::move(core)) {
  std::set<std::string> seen;
  for (const VariablePlacement& p : core_->variables->placements()) {
    if (p.name.empty()) {
      fail<InvalidArgument>(
          "DistributedCheckpointManager::add(ParameterServerStrategy): server variable {} ({} {}) has no "
          "name; a checkpoint finds variables by name (give each one a unique name)",
          p.id, p.dtype, p.shape);
    }
    if (!seen.insert(p.name).second) {
      fail<InvalidArgument>(
          "DistributedCheckpointManager::add(ParameterServerStrategy): two server variables are named "
          "'{}'; a checkpoint finds variables by name (give each one a unique name)",
          p.name);
    }
    names_.push_back(p.name);
  }
}

std::vector<int> ParameterServerSource::my_servers() const {
  std::vector<int> servers;
  if (core_->role.in_process) {
    for (int s = 0; s < core_->options.num_servers; ++s) servers.push_back(s);
  } else if (core_->role.server >= 0) {
    servers.push_back(core_->role.server);
  }
  return servers;
}

void ParameterServerSource::check_variables(const char* function) const {
  const std::vector<VariablePlacement> placements = core_->variables->placements();
  if (placements.size() != names_.size()) {
    fail<InvalidArgument>(
        "{}: the strategy has {} server variables, but had {} when it was added to the manager; make "
        "every server variable before add(strategy)",
        function, placements.size(), names_.size());
  }
}

void ParameterServerSource::snapshot(const ckpt::ProcessView& /*view*/, std::vector<ckpt::ShardContent>& shards,
                                     std::map<std::string, std::string>& attributes) {
  const std::unique_lock lock = core_->between_runs(kSave);
  check_variables(kSave);
  EagerScope eager;
  const std::vector<VariablePlacement> placements = core_->variables->placements();
  const std::vector<Tensor> values = local_values(core_->variables->states());
  // A restored state that no run() has installed yet is the state of the job: it is what is saved.
  OptimizerState captured;
  const OptimizerState* state = dynamic_cast<const OptimizerState*>(core_->pending_optimizer_state.get());
  if (state == nullptr) {
    captured = capture_optimizer_state(*core_, placements);
    state = &captured;
  }

  SavedJob job;
  job.servers = core_->options.num_servers;
  job.workers = core_->options.num_workers;
  job.mode = to_string(core_->options.mode);
  job.optimizer = state->optimizer;
  job.slots = state->slots;
  for (const VariablePlacement& p : placements) job.placement.emplace(p.name, p.pieces);
  write_attributes(job, attributes);

  for (const int server : my_servers()) {
    ckpt::ShardContent shard{shard_name(server), {}};
    for (size_t v = 0; v < placements.size(); ++v) {
      const VariablePlacement& p = placements[v];
      for (size_t k = 0; k < p.pieces.size(); ++k) {
        const ShardPiece& piece = p.pieces[k];
        if (piece.server != server) continue;
        shard.pieces.push_back({p.name, p.dtype, p.shape, piece.row_begin, piece.row_end,
                                private_host_copy(rows_of(values[v], piece.row_begin, piece.row_end))});
        if (state->optimizer.empty()) continue;
        auto found = std::find_if(state->pieces.begin(), state->pieces.end(),
                                  [&](const PieceOptimizerState& s) { return s.var == p.id && s.server == server; });
        if (found == state->pieces.end()) {
          fail<InvalidArgument>("{}: no optimizer state for server {}'s piece of '{}' (an internal error)", kSave,
                                server, p.name);
        }
        for (const std::string& slot : state->slots) {
          shard.pieces.push_back({slot_tensor(state->optimizer, p.name, slot), OptimizerAccess::slot_dtype(p.dtype),
                                  p.shape, piece.row_begin, piece.row_end, private_host_copy(found->slots.at(slot))});
        }
        const int64_t count = found->iterations;
        shard.pieces.push_back({iterations_tensor(state->optimizer, p.name), i64,
                                Shape{static_cast<int64_t>(p.pieces.size())}, static_cast<int64_t>(k),
                                static_cast<int64_t>(k) + 1, tensor_from_host(&count, 1, i64, Shape{1}, Device())});
      }
    }
    shards.push_back(std::move(shard));
  }
}

void ParameterServerSource::load(const ckpt::ProcessView& /*view*/, ckpt::Reader& reader) {
  loaded_.reset();
  const std::unique_lock lock = core_->between_runs(kRestore);
  check_variables(kRestore);
  EagerScope eager;
  const std::string& path = reader.path();
  const SavedJob job = read_attributes(reader.attributes(), path);
  if (job.workers != core_->options.num_workers) {
    fail<InvalidArgument>(
        "{}: checkpoint {} was written by a job of {} workers; this job has {} (the workers' data "
        "positions would not map); restart with {} workers",
        kRestore, path, job.workers, core_->options.num_workers, job.workers);
  }
  if (!job.optimizer.empty() && core_->servers_made() &&
      (job.optimizer != core_->optimizer_name() || job.slots != core_->optimizer_slots())) {
    fail<InvalidArgument>(
        "{}: checkpoint {} holds the state of optimizer '{}' ({}), but this job's servers run '{}' "
        "({}); restore it into a strategy that runs '{}'",
        kRestore, path, job.optimizer, slot_list(job.slots), core_->optimizer_name(),
        slot_list(core_->optimizer_slots()), job.optimizer);
  }

  const std::vector<VariablePlacement> placements = core_->variables->placements();
  // Everything is checked before anything is read.
  for (const VariablePlacement& p : placements) {
    auto saved = job.placement.find(p.name);
    if (saved == job.placement.end()) {
      fail<InvalidArgument>(
          "{}: checkpoint {} holds no server variable '{}' (it holds {}); it was written by another "
          "model",
          kRestore, path, p.name, names_text(job.placement));
    }
    expect_tensor(reader, p.name, p.dtype, p.shape, "a server variable");
    if (saved->second.back().row_end != p.rows()) {
      fail<InvalidArgument>("{}: checkpoint {}: the placement of '{}' covers {} rows; the variable has {}", kRestore,
                            path, p.name, saved->second.back().row_end, p.rows());
    }
    if (job.optimizer.empty()) continue;
    for (const std::string& slot : job.slots) {
      expect_tensor(reader, slot_tensor(job.optimizer, p.name, slot), OptimizerAccess::slot_dtype(p.dtype), p.shape,
                    "an optimizer slot");
    }
    expect_tensor(reader, iterations_tensor(job.optimizer, p.name), i64,
                  Shape{static_cast<int64_t>(saved->second.size())}, "the step counters of its saved pieces");
  }

  Loaded loaded;
  for (const VariablePlacement& p : placements) loaded.values.push_back(reader.read(p.name));
  auto state = std::make_shared<OptimizerState>();
  state->optimizer = job.optimizer;
  state->slots = job.slots;
  state->origin = path;
  const std::vector<int> servers = my_servers();
  for (const VariablePlacement& p : placements) {
    const std::vector<ShardPiece>& saved = job.placement.at(p.name);
    std::vector<int64_t> counters;
    if (!job.optimizer.empty()) counters = reader.read(iterations_tensor(job.optimizer, p.name)).to_vector<int64_t>();
    for (const ShardPiece& piece : p.pieces) {
      if (std::find(servers.begin(), servers.end(), piece.server) == servers.end()) continue;
      PieceOptimizerState restored{p.id, piece.server, piece.row_begin, piece.row_end, {}, 0};
      if (!job.optimizer.empty()) {
        for (const std::string& slot : job.slots) {
          restored.slots.emplace(slot,
                                 reader.read(slot_tensor(job.optimizer, p.name, slot), piece.row_begin, piece.row_end));
        }
        // Rows that came from saved pieces with different step counts: the piece takes the largest,
        // so that no shard's count goes back (they are equal whenever every push reached every shard).
        for (size_t k = 0; k < saved.size(); ++k) {
          if (saved[k].row_begin < piece.row_end && piece.row_begin < saved[k].row_end) {
            restored.iterations = std::max(restored.iterations, counters[k]);
          }
        }
      }
      state->pieces.push_back(std::move(restored));
    }
  }
  loaded.optimizer_state = std::move(state);
  loaded_ = std::move(loaded);
}

void ParameterServerSource::commit() {
  if (!loaded_) fail<InvalidArgument>("{}: commit() without a successful load()", kRestore);
  const std::unique_lock lock = core_->between_runs(kRestore);
  Loaded loaded = std::move(*loaded_);
  loaded_.reset();
  store_values(core_->variables->states(), loaded.values);
  if (core_->servers_made()) {
    // The servers' optimizers exist (after a run): the state goes in now.
    for (const int server : my_servers()) {
      if (ShardServer* made = core_->server(server)) loaded.optimizer_state->install(*made, server);
    }
    core_->pending_optimizer_state.reset();
  } else {
    core_->pending_optimizer_state = std::move(loaded.optimizer_state);
  }
}

}  // namespace flowlet::detail::ps::checkpoint
