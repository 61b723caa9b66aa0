// ServerVariables: one strategy's server variables, their placement, and what a read, a row gather,
// an update and apply_gradients mean on the calling thread (ps/ops/server_variables.hpp).
//
// Each variable's VariableState::remote is a small Hook that reaches this object through a weak
// pointer: the object holds the states, so a strong pointer back would keep both alive forever.
// Once the strategy (and with it this object) is gone, the hook answers "the local value".
#include "ps/ops/server_variables.hpp"

#include <limits>
#include <map>
#include <unordered_map>

#include <fmt/format.h>

#include "core/check.hpp"
#include "flowlet/autodiff.hpp"
#include "flowlet/core/format.hpp"
#include "flowlet/ops/shape.hpp"
#include "ps/ops/ps_ops.hpp"
#include "state/mirrored_variable.hpp"
#include "trace/tracer.hpp"

namespace flowlet::detail::ps {

struct ServerVariables::Impl {
  const void* strategy = nullptr;
  int num_servers = 1;
  mutable std::mutex mutex;
  Placer placer;
  std::vector<std::shared_ptr<VariableState>> states;
  std::vector<VariablePlacement> placements;
  std::unordered_map<const VariableState*, int32_t> ids;
  // The unique_ids of each (worker client serial, variable) gathered since that worker's last push.
  std::map<std::pair<uint64_t, int32_t>, Tensor> lookups;

  Impl(const void* s, int servers, ShardingPolicy policy) : strategy(s), num_servers(servers), placer(servers, policy) {}

  // The worker this thread runs for this strategy, or null.
  WorkerClient* worker() const {
    const WorkerContext* context = current_worker();
    if (context == nullptr || context->strategy != strategy) return nullptr;
    return context->client;
  }
};

namespace {

class Hook final : public RemoteVariable {
 public:
  explicit Hook(std::weak_ptr<ServerVariables> owner) : owner_(std::move(owner)) {}
  Tensor read(const std::shared_ptr<VariableState>& state) override {
    const auto owner = owner_.lock();
    return owner ? owner->read(state) : Tensor();
  }
  Tensor gather(const std::shared_ptr<VariableState>& state, const Tensor& indices) override {
    const auto owner = owner_.lock();
    return owner ? owner->gather(state, indices) : Tensor();
  }
  void check_update(const VariableState& state, const char* op) override {
    if (const auto owner = owner_.lock()) owner->check_update(state, op);
  }

 private:
  std::weak_ptr<ServerVariables> owner_;
};

const std::string& name_of(const VariableState& state) {
  static const std::string unnamed = "variable";
  return state.name.empty() ? unnamed : state.name;
}

Shape sparse_shape(const VariablePlacement& p, int64_t n) {
  Shape shape{n};
  for (int64_t d = 1; d < p.shape.rank(); ++d) shape.push_back(p.shape[static_cast<size_t>(d)]);
  return shape;
}

}  // namespace

ServerVariables::ServerVariables(const void* strategy, int num_servers, ShardingPolicy policy) {
  if (num_servers < 1) fail<InvalidArgument>("ps server variables: need at least 1 server; got {}", num_servers);
  impl_ = std::make_shared<Impl>(strategy, num_servers, policy);
}

void ServerVariables::add(const std::shared_ptr<ServerVariables>& self, const std::shared_ptr<VariableState>& state) {
  if (self.get() != this) fail<InvalidArgument>("ps server variables: add() takes the object's own shared pointer");
  if (!state) fail<InvalidArgument>("ps server variables: add() got no variable");
  Shape shape;
  DType dtype = DType::f32;
  {
    std::lock_guard lock(state->mutex);
    shape = state->value.shape();
    dtype = state->value.dtype();
  }
  if (!is_floating(dtype)) {
    fail<InvalidArgument>(
        "ParameterServerStrategy: variable '{}' is {} {}; server variables are trained, so they need a floating "
        "dtype (make it outside the strategy's scope)",
        name_of(*state), dtype, shape);
  }
  {
    std::lock_guard lock(impl_->mutex);
    if (impl_->ids.count(state.get()) != 0) {
      fail<InvalidArgument>("ParameterServerStrategy: variable '{}' was added already", name_of(*state));
    }
    const auto id = static_cast<int32_t>(impl_->states.size());
    impl_->placements.push_back(impl_->placer.place(id, state->name, shape, dtype));
    impl_->states.push_back(state);
    impl_->ids.emplace(state.get(), id);
  }
  state->remote = std::make_shared<Hook>(self);
}

std::vector<std::shared_ptr<VariableState>> ServerVariables::states() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->states;
}

std::vector<VariablePlacement> ServerVariables::placements() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->placements;
}

int32_t ServerVariables::id_of(const VariableState& state) const {
  std::lock_guard lock(impl_->mutex);
  const auto found = impl_->ids.find(&state);
  return found == impl_->ids.end() ? -1 : found->second;
}

Tensor ServerVariables::read(const std::shared_ptr<VariableState>& state) {
  WorkerClient* client = impl_->worker();
  if (client == nullptr) return Tensor();
  const int32_t id = id_of(*state);
  if (id < 0) return Tensor();
  return dispatch_pull(*client, id);
}

Tensor ServerVariables::gather(const std::shared_ptr<VariableState>& state, const Tensor& indices) {
  WorkerClient* client = impl_->worker();
  if (client == nullptr) return Tensor();
  const int32_t id = id_of(*state);
  if (id < 0) return Tensor();
  if (!indices.defined()) {
    fail<InvalidArgument>("gather: indices for '{}' are an empty Tensor handle; got Tensor()", name_of(*state));
  }
  const Lookup lookup = dispatch_lookup(*client, id, indices);
  if (any_tape_active()) note_variable_read(state.get(), lookup.rows);
  {
    std::lock_guard lock(impl_->mutex);
    impl_->lookups[{client->serial(), id}] = lookup.unique_ids;
  }
  Shape shape = indices.shape();
  const VariablePlacement& p = client->placement(id);
  for (int64_t d = 1; d < p.shape.rank(); ++d) shape.push_back(p.shape[static_cast<size_t>(d)]);
  return reshape(flowlet::gather(lookup.rows, lookup.inverse), shape);
}

void ServerVariables::check_update(const VariableState& state, const char* op) {
  if (impl_->worker() == nullptr) return;
  fail<InvalidArgument>("{}: '{}' lives on the parameter servers during run(); update it with Worker::apply_gradients",
                        op, name_of(state));
}

void ServerVariables::push(std::span<const Tensor> grads, std::span<const Variable> vars) {
  WorkerClient* client = impl_->worker();
  if (client == nullptr) {
    throw InvalidArgument(
        "apply_gradients: called on a thread that runs no worker of this ParameterServerStrategy; call it inside "
        "the worker function given to run()");
  }
  if (grads.size() != vars.size()) {
    fail<InvalidArgument>("apply_gradients: got {} gradients for {} variables", grads.size(), vars.size());
  }
  const uint64_t serial = client->serial();
  struct Checked {
    int32_t id = 0;
    Tensor grad, ids;  // ids: the lookup's unique_ids for a gathered variable
  };
  std::vector<Checked> checked;
  std::vector<bool> seen;
  for (size_t i = 0; i < vars.size(); ++i) {
    if (!vars[i].defined()) fail<InvalidArgument>("apply_gradients: variable {} is an empty Variable handle", i);
    const std::shared_ptr<VariableState>& state = VariableAccess::state(vars[i]);
    const int32_t id = id_of(*state);
    if (id < 0) {
      fail<InvalidArgument>(
          "apply_gradients: variable {} ('{}') is not a server variable of this strategy (make it inside "
          "ParameterServerStrategy::scope())",
          i, name_of(*state));
    }
    if (seen.size() <= static_cast<size_t>(id)) seen.resize(static_cast<size_t>(id) + 1, false);
    if (seen[static_cast<size_t>(id)]) {
      fail<InvalidArgument>("apply_gradients: variable '{}' appears twice (again at index {})", name_of(*state), i);
    }
    seen[static_cast<size_t>(id)] = true;
    const Tensor& g = grads[i];
    if (!g.defined()) continue;  // no gradient: skipped
    const VariablePlacement& p = client->placement(id);
    if (g.dtype() != p.dtype) {
      fail<DTypeError>("apply_gradients: the gradient for '{}' is {} {}; the variable is {} {}", name_of(*state),
                       g.dtype(), g.shape(), p.dtype, p.shape);
    }
    Tensor ids;
    {
      std::lock_guard lock(impl_->mutex);
      if (const auto found = impl_->lookups.find({serial, id}); found != impl_->lookups.end()) ids = found->second;
    }
    // A lookup recorded by another trace (one that ended without a push) is not this step's.
    if (ids.defined() && ids.is_symbolic() &&
        (active_trace() == nullptr || ids.impl_ptr()->trace_id != active_trace()->id())) {
      ids = Tensor();
    }
    if (ids.defined()) {
      const Shape want = sparse_shape(p, ids.shape()[0]);
      if (!(g.shape() == want)) {
        fail<ShapeError>(
            "apply_gradients: the gradient for '{}' has shape {}; read with gather() in this step, it takes the "
            "gradient of the pulled rows, {}",
            name_of(*state), g.shape(), want);
      }
    } else if (!(g.shape() == p.shape)) {
      fail<ShapeError>("apply_gradients: the gradient for '{}' has shape {}; the variable has shape {}", name_of(*state),
                       g.shape(), p.shape);
    }
    checked.push_back({id, g, ids});
  }
  // Eagerly every input must sit on the worker's device (a traced step's partitioner moves them).
  const Device device = client->config().device;
  auto here = [&](const Tensor& t) { return t.is_symbolic() || t.device() == device ? t : t.to(device); };
  for (int server = 0; server < client->config().num_servers; ++server) {
    std::vector<PsPushEntry> entries;
    std::vector<Tensor> inputs;
    for (const Checked& c : checked) {
      const VariablePlacement& p = client->placement(c.id);
      if (p.piece_on(server) == nullptr) continue;
      entries.push_back({c.id, p.name, c.ids.defined()});
      inputs.push_back(here(c.grad));
      if (c.ids.defined()) inputs.push_back(here(c.ids));
    }
    // Every server, even with nothing for it: the push is the worker's step on that server.
    dispatch_push(*client, server, std::move(entries), inputs);
  }
  std::lock_guard lock(impl_->mutex);
  for (auto it = impl_->lookups.lower_bound({serial, std::numeric_limits<int32_t>::min()}); it != impl_->lookups.end() && it->first.first == serial;) {
    it = impl_->lookups.erase(it);
  }
}

}  // namespace flowlet::detail::ps
