// ParameterServerStrategy, its Scope and ps::Worker: the public API of flowlet/parameter_server.hpp,
// each call forwarded to the StrategyCore or the worker's WorkerRuntime. Also to_string(TrainingMode).
#include "flowlet/parameter_server.hpp"

#include "ps/strategy/run_steps.hpp"
#include "ps/strategy/strategy_core.hpp"

namespace flowlet {

std::string to_string(TrainingMode mode) {
  switch (mode) {
    case TrainingMode::async:
      return "async";
    case TrainingMode::sync:
      return "sync";
    case TrainingMode::bounded_staleness:
      return "bounded_staleness";
  }
  return "unknown";
}

namespace ps {

int Worker::index() const { return runtime_->index(); }
int Worker::num_workers() const { return runtime_->num_workers(); }
Device Worker::device() const { return runtime_->device(); }
int64_t Worker::steps() const { return runtime_->steps(); }
void Worker::apply_gradients(const std::vector<Tensor>& grads, const std::vector<Variable>& vars) {
  runtime_->apply_gradients(grads, vars);
}
bool Worker::should_stop() const { return runtime_->should_stop(); }
void Worker::request_stop() { runtime_->request_stop(); }

}  // namespace ps

ParameterServerStrategy::ParameterServerStrategy(ParameterServerOptions options)
    : core_(std::make_shared<detail::ps::StrategyCore>(std::move(options))) {}

ParameterServerStrategy::~ParameterServerStrategy() = default;

const ParameterServerOptions& ParameterServerStrategy::options() const { return core_->options; }
int ParameterServerStrategy::num_servers() const { return core_->options.num_servers; }
int ParameterServerStrategy::num_workers() const { return core_->options.num_workers; }
bool ParameterServerStrategy::in_process() const { return core_->role.in_process; }
bool ParameterServerStrategy::is_server() const { return core_->role.server >= 0; }
int ParameterServerStrategy::worker_index() const { return core_->role.worker; }

ParameterServerStrategy::Scope ParameterServerStrategy::scope() const { return Scope(core_); }

ParameterServerStrategy::Scope::Scope(std::shared_ptr<detail::ps::StrategyCore> core)
    : core_(std::move(core)), active_(true) {
  previous_ = detail::exchange_remote_creation(&core_->creation);
}

ParameterServerStrategy::Scope::Scope(Scope&& other) noexcept
    : core_(std::move(other.core_)), previous_(other.previous_), active_(other.active_) {
  other.active_ = false;
}

ParameterServerStrategy::Scope::~Scope() {
  if (active_) detail::exchange_remote_creation(static_cast<const detail::RemoteCreation*>(previous_));
}

std::vector<Variable> ParameterServerStrategy::variables() const {
  std::vector<Variable> result;
  for (auto& state : core_->variables->states()) result.push_back(detail::ps::variable_of(std::move(state)));
  return result;
}

std::vector<ParameterServerStrategy::Shard> ParameterServerStrategy::placement(const Variable& variable) const {
  return core_->placement(variable);
}

ParameterServerStats ParameterServerStrategy::run(const OptimizerFactory& make_optimizer,
                                                  const std::function<void(ps::Worker&)>& worker_fn) {
  return core_->run(make_optimizer, worker_fn);
}

const ParameterServerStats& ParameterServerStrategy::last_stats() const { return core_->last_stats(); }

std::vector<const optim::Optimizer*> ParameterServerStrategy::optimizers(const Variable& variable) const {
  return core_->optimizers(variable);
}

}  // namespace flowlet
