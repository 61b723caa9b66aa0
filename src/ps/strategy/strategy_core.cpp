// StrategyCore: the options checked and resolved, this process's role, the transport and the
// collectives it needs, the servers kept between runs, placement and optimizers of a variable.
#include "ps/strategy/strategy_core.hpp"

#include <cmath>
#include <cstdlib>
#include <set>

#include "collective/transport/process.hpp"
#include "core/check.hpp"
#include "flowlet/collective.hpp"
#include "flowlet/eager_scope.hpp"
#include "ps/server/optimizer_access.hpp"
#include "ps/strategy/run_steps.hpp"
#include "state/mirrored_variable.hpp"

namespace flowlet::detail::ps {

namespace {

constexpr const char* kWho = "ParameterServerStrategy";

double timeout_from_environment() {
  const char* text = std::getenv("FLOWLET_PS_TIMEOUT");
  if (text == nullptr || *text == '\0') return 300;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(seconds > 0) || !std::isfinite(seconds)) {
    fail<InvalidArgument>("{}: FLOWLET_PS_TIMEOUT must be a positive number of seconds; got '{}'", kWho, text);
  }
  return seconds;
}

bool uses_processes(const ParameterServerOptions& o) {
  switch (o.cluster) {
    case ParameterServerOptions::Cluster::automatic:
      return process_count() > 1;
    case ParameterServerOptions::Cluster::in_process:
      return false;
    case ParameterServerOptions::Cluster::processes:
      return true;
  }
  fail<InvalidArgument>("{}: options.cluster must be automatic, in_process or processes; got {}", kWho,
                        static_cast<int>(o.cluster));
}

void check_devices(const std::vector<Device>& devices, int expected, const char* field, const char* who) {
  if (devices.empty()) return;
  if (static_cast<int>(devices.size()) != expected) {
    fail<InvalidArgument>("{}: options.{} must be empty or name one device per {}; got {} devices for {}", kWho, field,
                          who, devices.size(), expected);
  }
  for (size_t i = 0; i < devices.size(); ++i) {
    if (devices[i].kind() != DeviceKind::cpu) {
      fail<DeviceError>(
          "{}: options.{}[{}] must be a CPU device (servers and workers run on logical CPU devices); "
          "got {}",
          kWho, field, i, devices[i]);
    }
    check_device_exists(kWho, devices[i]);
  }
}

void check_faults(const FaultInjection& f, int num_workers, bool processes) {
  const StepDelay& d = f.step_delay;
  switch (d.kind) {
    case StepDelay::Kind::none:
      break;
    case StepDelay::Kind::constant:
      if (!(d.seconds >= 0) || !std::isfinite(d.seconds)) {
        fail<InvalidArgument>("{}: a constant step delay must be >= 0 seconds; got {}", kWho, d.seconds);
      }
      break;
    case StepDelay::Kind::log_normal:
      if (!(d.seconds > 0) || !std::isfinite(d.seconds) || !(d.sigma >= 0) || !std::isfinite(d.sigma)) {
        fail<InvalidArgument>(
            "{}: a log-normal step delay needs a median > 0 and a sigma >= 0; got median {} and "
            "sigma {}",
            kWho, d.seconds, d.sigma);
      }
      break;
    case StepDelay::Kind::straggler:
      if (d.worker < 0 || d.worker >= num_workers) {
        fail<InvalidArgument>("{}: the straggler must be a worker in [0, {}); got worker {}", kWho, num_workers,
                              d.worker);
      }
      if (!(d.factor >= 1) || !std::isfinite(d.factor)) {
        fail<InvalidArgument>("{}: a straggler's factor must be >= 1 (its steps take factor times as long); got {}",
                              kWho, d.factor);
      }
      break;
    default:
      fail<InvalidArgument>("{}: unknown step delay kind {}", kWho, static_cast<int>(d.kind));
  }
  if (!(f.message_delay_seconds >= 0) || !std::isfinite(f.message_delay_seconds)) {
    fail<InvalidArgument>("{}: faults.message_delay_seconds must be >= 0; got {}", kWho, f.message_delay_seconds);
  }
  if (processes && f.message_delay_seconds > 0) {
    fail<InvalidArgument>(
        "{}: faults.message_delay_seconds works only in the in-process cluster (MPI carries the "
        "processes' messages); got {} under mpirun",
        kWho, f.message_delay_seconds);
  }
  std::set<int> stopped;
  for (const auto& [worker, step] : f.stop_worker_at_step) {
    if (worker < 0 || worker >= num_workers) {
      fail<InvalidArgument>("{}: faults.stop_worker_at_step names worker {}, which is not in [0, {})", kWho, worker,
                            num_workers);
    }
    if (step < 1) {
      fail<InvalidArgument>("{}: faults.stop_worker_at_step: worker {} must stop at a step >= 1; got {}", kWho, worker,
                            step);
    }
    if (!stopped.insert(worker).second) {
      fail<InvalidArgument>("{}: faults.stop_worker_at_step names worker {} twice", kWho, worker);
    }
  }
}

}  // namespace

ParameterServerOptions resolved_options(ParameterServerOptions o) {
  if (o.num_servers < 1) fail<InvalidArgument>("{}: options.num_servers must be >= 1; got {}", kWho, o.num_servers);
  const bool processes = uses_processes(o);
  if (processes) {
    const int count = process_count();
    if (count <= o.num_servers) {
      fail<InvalidArgument>(
          "{}: a cluster of processes needs more processes than servers (every other process "
          "works); got {} servers in a job of {} processes{}",
          kWho, o.num_servers, count, count == 1 ? " (run it under mpirun -np S+W)" : "");
    }
    const int workers = count - o.num_servers;
    if (o.num_workers != 0 && o.num_workers != workers) {
      fail<InvalidArgument>(
          "{}: under mpirun every process that does not serve works, so options.num_workers must be "
          "0 or {} ({} processes - {} servers); got {}",
          kWho, workers, count, o.num_servers, o.num_workers);
    }
    o.num_workers = workers;
    if (o.server_processes.empty()) {
      for (int s = 0; s < o.num_servers; ++s) o.server_processes.push_back(s);
    }
  } else if (o.num_workers < 1) {
    fail<InvalidArgument>("{}: options.num_workers must be >= 1 in the in-process cluster; got {}", kWho,
                          o.num_workers);
  }
  if (!o.server_processes.empty()) {
    if (static_cast<int>(o.server_processes.size()) != o.num_servers) {
      fail<InvalidArgument>("{}: options.server_processes must name one process per server; got {} for {} servers",
                            kWho, o.server_processes.size(), o.num_servers);
    }
    std::set<int> seen;
    for (size_t i = 0; i < o.server_processes.size(); ++i) {
      const int p = o.server_processes[i];
      if (processes && (p < 0 || p >= process_count())) {
        fail<InvalidArgument>("{}: options.server_processes[{}] must be a process index in [0, {}); got {}", kWho, i,
                              process_count(), p);
      }
      if (!seen.insert(p).second) {
        fail<InvalidArgument>("{}: options.server_processes names process {} twice", kWho, p);
      }
    }
  }
  switch (o.mode) {
    case TrainingMode::async:
    case TrainingMode::sync:
    case TrainingMode::bounded_staleness:
      break;
    default:
      fail<InvalidArgument>("{}: options.mode must be async, sync or bounded_staleness; got {}", kWho,
                            static_cast<int>(o.mode));
  }
  if (o.backup_workers < 0 || o.backup_workers >= o.num_workers) {
    fail<InvalidArgument>(
        "{}: options.backup_workers must be in [0, num_workers) = [0, {}) (a step needs at least one "
        "push); got {}",
        kWho, o.num_workers, o.backup_workers);
  }
  if (o.backup_workers > 0 && o.mode != TrainingMode::sync) {
    fail<InvalidArgument>("{}: options.backup_workers applies to sync mode only; got {} backup workers in {} mode",
                          kWho, o.backup_workers, to_string(o.mode));
  }
  if (o.staleness < 0) fail<InvalidArgument>("{}: options.staleness must be >= 0; got {}", kWho, o.staleness);
  if (o.sharding.min_bytes_to_split < 0) {
    fail<InvalidArgument>("{}: options.sharding.min_bytes_to_split must be >= 0; got {}", kWho,
                          o.sharding.min_bytes_to_split);
  }
  if (o.sharding.max_shards < 0) {
    fail<InvalidArgument>("{}: options.sharding.max_shards must be >= 0 (0: every server); got {}", kWho,
                          o.sharding.max_shards);
  }
  if (std::isnan(o.timeout_seconds) || std::isinf(o.timeout_seconds)) {
    fail<InvalidArgument>("{}: options.timeout_seconds must be finite; got {}", kWho, o.timeout_seconds);
  }
  if (o.timeout_seconds <= 0) o.timeout_seconds = timeout_from_environment();
  check_faults(o.faults, o.num_workers, processes);
  check_devices(o.server_devices, o.num_servers, "server_devices", "server");
  check_devices(o.worker_devices, o.num_workers, "worker_devices", "worker");
  // The default devices: one logical CPU device each when the process has enough, else cpu:0.
  const bool spread = !processes && device_count(DeviceKind::cpu) >= o.num_servers + o.num_workers;
  if (o.server_devices.empty()) {
    for (int s = 0; s < o.num_servers; ++s) o.server_devices.push_back(spread ? Device(DeviceKind::cpu, s) : Device());
  }
  if (o.worker_devices.empty()) {
    for (int w = 0; w < o.num_workers; ++w) {
      o.worker_devices.push_back(spread ? Device(DeviceKind::cpu, o.num_servers + w) : Device());
    }
  }
  o.cluster = processes ? ParameterServerOptions::Cluster::processes : ParameterServerOptions::Cluster::in_process;
  return o;
}

ClusterRole role_of(const ParameterServerOptions& o) {
  ClusterRole role;
  role.in_process = o.cluster == ParameterServerOptions::Cluster::in_process;
  if (role.in_process) return role;
  const int me = process_index();
  std::vector<bool> serves(static_cast<size_t>(process_count()), false);
  for (int s = 0; s < o.num_servers; ++s) {
    const int p = o.server_processes[static_cast<size_t>(s)];
    serves[static_cast<size_t>(p)] = true;
    role.endpoint_process.push_back(p);
    if (p == me) role.server = s;
  }
  for (int p = 0; p < process_count(); ++p) {
    if (serves[static_cast<size_t>(p)]) continue;
    if (p == me) role.worker = static_cast<int>(role.endpoint_process.size()) - o.num_servers;
    role.endpoint_process.push_back(p);
  }
  return role;
}

StrategyCore::StrategyCore(ParameterServerOptions opts)
    : options(resolved_options(std::move(opts))),
      role(role_of(options)),
      timeout(options.timeout_seconds),
      variables(std::make_shared<ServerVariables>(this, options.num_servers, options.sharding)),
      creation(variables) {
  if (role.in_process) {
    transport_ = make_in_memory_transport(options.num_servers + options.num_workers,
                                          std::chrono::duration<double>(options.faults.message_delay_seconds));
    servers_.resize(static_cast<size_t>(options.num_servers));
    return;
  }
  // Collective, in the same order on every process: the transport, then the two communicators.
  transport_ = make_mpi_transport(role.endpoint_process);
  collectives_ = make_communicator({Device()});
  CommunicatorOptions patient;
  patient.timeout_seconds = 1e7;  // about 116 days: see end_ in the header
  end_ = make_communicator({Device()}, patient);
  check_processes_agree(*collectives_, option_facts(options), "the strategy's options");
  servers_.resize(static_cast<size_t>(options.num_servers));
}

StrategyCore::~StrategyCore() = default;

ServerConfig StrategyCore::server_config(int server) const {
  ServerConfig config;
  config.server = server;
  config.num_servers = options.num_servers;
  config.num_workers = options.num_workers;
  config.mode = options.mode;
  config.backup_workers = options.backup_workers;
  config.staleness = options.staleness;
  config.timeout = timeout;
  config.device = options.server_devices[static_cast<size_t>(server)];
  // The servers outlive any one run's factory: they ask the core for the one of the run in progress.
  auto* core = const_cast<StrategyCore*>(this);
  config.make_optimizer = [core] { return core->make_optimizer(); };
  return config;
}

WorkerConfig StrategyCore::worker_config(int worker) const {
  WorkerConfig config;
  config.worker = worker;
  config.num_servers = options.num_servers;
  config.num_workers = options.num_workers;
  config.mode = options.mode;
  // The server is the one that knows whom a parked pull waits for (ps_options.hpp: the error names
  // the server and the workers it waits for), so the client's own watchdog, there for a server
  // that never answers, gives the server's error reply time to arrive first.
  config.timeout = timeout * 1.25 + std::chrono::duration<double>(0.5 + 2 * options.faults.message_delay_seconds);
  config.device = options.worker_devices[static_cast<size_t>(worker)];
  config.faults = options.faults;
  return config;
}

std::unique_ptr<optim::Optimizer> StrategyCore::make_optimizer() {
  std::lock_guard lock(factory_mutex_);  // servers are threads: the user's factory runs one call at a time
  if (factory_ == nullptr) {
    fail<InvalidArgument>("{}: a server asked for an optimizer outside run() (the factory is run()'s argument)", kWho);
  }
  std::unique_ptr<optim::Optimizer> optimizer = (*factory_)();
  if (!optimizer) fail<InvalidArgument>("{}::run: make_optimizer returned a null optimizer", kWho);
  return optimizer;
}

void StrategyCore::prepare_servers(const std::vector<VariablePlacement>& placements) {
  if (served_) {
    if (placements.size() != served_variables_) {
      fail<InvalidArgument>(
          "{}::run: {} server variables were made after the first run() (the servers serve the {} "
          "made before it); make every variable in scope() before the first run(), or use a new "
          "strategy",
          kWho, placements.size() - served_variables_, served_variables_);
    }
    return;
  }
  // All or nothing: a server that cannot be made leaves none made (the next run tries again).
  std::vector<std::unique_ptr<ShardServer>> made(static_cast<size_t>(options.num_servers));
  for (int s = 0; s < options.num_servers; ++s) {
    if (role.in_process || s == role.server) {
      made[static_cast<size_t>(s)] = std::make_unique<ShardServer>(server_config(s), placements, *transport_);
    }
  }
  servers_ = std::move(made);
  served_ = true;
  served_variables_ = placements.size();
}

ParameterServerStats StrategyCore::run(const OptimizerFactory& make_optimizer, const WorkerFunction& worker_fn) {
  if (!make_optimizer) fail<InvalidArgument>("{}::run: make_optimizer is an empty function", kWho);
  if (!worker_fn) fail<InvalidArgument>("{}::run: worker_fn is an empty function", kWho);
  if (is_tracing()) {
    fail<InvalidArgument>(
        "{}::run: called while a function is being traced; call run() from eager code (a worker's "
        "step may be traced inside worker_fn)",
        kWho);
  }
  if (const WorkerContext* worker = current_worker(); worker != nullptr) {
    fail<InvalidArgument>("{}::run: called inside a worker function (worker {})", kWho,
                          worker->client->config().worker);
  }
  // A factory that cannot make an optimizer fails here, on every process, before anything starts.
  // Its step counter must not become a server variable when run() is called inside scope().
  std::unique_ptr<optim::Optimizer> probe;
  {
    const RemoteCreation* creation_here = exchange_remote_creation(nullptr);
    try {
      probe = make_optimizer();
    } catch (...) {
      exchange_remote_creation(creation_here);
      throw;
    }
    exchange_remote_creation(creation_here);
    if (!probe) fail<InvalidArgument>("{}::run: make_optimizer returned a null optimizer", kWho);
  }
  std::lock_guard run_lock(run_mutex_);
  // Optimizer state restored from a checkpoint must be of this optimizer (every process checks the
  // same things, so all refuse or none does); then the optimizer is remembered for checkpoints.
  if (pending_optimizer_state) pending_optimizer_state->check(*probe);
  optimizer_name_ = probe->name();
  optimizer_slots_ = OptimizerAccess::slot_names(*probe);
  const std::vector<VariablePlacement> placements = variables->placements();
  // Under mpirun, before anything is served: every process must mean the same variables.
  if (!role.in_process) check_processes_agree(*collectives_, placement_facts(placements), "the server variables");
  prepare_servers(placements);
  {
    std::lock_guard lock(factory_mutex_);
    factory_ = &make_optimizer;
  }
  struct ForgetFactory {
    StrategyCore& core;
    ~ForgetFactory() {
      std::lock_guard lock(core.factory_mutex_);
      core.factory_ = nullptr;
    }
  } forget{*this};
  return role.in_process ? run_in_process(worker_fn) : run_processes(worker_fn);
}

std::unique_lock<std::mutex> StrategyCore::between_runs(const char* function) const {
  // A worker function's thread (in-process or under mpirun) is inside run(); it may even hold
  // run_mutex_ itself (mpirun: run() is on the worker's thread), so ask before trying the lock.
  if (const WorkerContext* worker = current_worker(); worker != nullptr) {
    fail<InvalidArgument>(
        "{}: called inside {}::run() (worker {}); checkpoints save and restore between runs (after "
        "run() returned: every push of the run is in the values then)",
        function, kWho, worker->client->config().worker);
  }
  std::unique_lock lock(run_mutex_, std::try_to_lock);
  if (!lock.owns_lock()) {
    fail<InvalidArgument>(
        "{}: a {}::run() is in progress; checkpoints save and restore between runs (after run() "
        "returned)",
        function, kWho);
  }
  return lock;
}

ShardServer* StrategyCore::server(int index) const {
  if (index < 0 || static_cast<size_t>(index) >= servers_.size()) return nullptr;
  return servers_[static_cast<size_t>(index)].get();
}

void StrategyCore::install_pending_optimizer_state() {
  if (!pending_optimizer_state) return;
  for (size_t s = 0; s < servers_.size(); ++s) {
    if (servers_[s]) pending_optimizer_state->install(*servers_[s], static_cast<int>(s));
  }
  pending_optimizer_state.reset();
}

int32_t StrategyCore::id_of(const Variable& variable, const char* function) const {
  if (!variable.defined()) fail<InvalidArgument>("{}::{}: the variable is an empty handle", kWho, function);
  const int32_t id = variables->id_of(*VariableAccess::state(variable));
  if (id < 0) {
    fail<InvalidArgument>(
        "{}::{}: variable '{}' is not a server variable of this strategy (make it inside its "
        "scope())",
        kWho, function, variable.name());
  }
  return id;
}

std::vector<ParameterServerStrategy::Shard> StrategyCore::placement(const Variable& variable) const {
  const int32_t id = id_of(variable, "placement");
  const VariablePlacement p = variables->placements()[static_cast<size_t>(id)];
  std::vector<ParameterServerStrategy::Shard> shards;
  for (const ShardPiece& piece : p.pieces) shards.push_back({piece.server, piece.row_begin, piece.row_end});
  return shards;
}

std::vector<const optim::Optimizer*> StrategyCore::optimizers(const Variable& variable) const {
  const int32_t id = id_of(variable, "optimizers");
  std::vector<const optim::Optimizer*> result;
  if (!role.in_process) return result;  // they live in the server processes
  // Not during a run: the servers' threads change them (and a worker function asking would wait for
  // its own run to end).
  std::unique_lock run_lock(run_mutex_, std::try_to_lock);
  if (!run_lock.owns_lock()) {
    fail<InvalidArgument>(
        "{}::optimizers: a run() is in progress; the servers' optimizers change while it lasts "
        "(ask after it returned)",
        kWho);
  }
  if (static_cast<size_t>(id) >= served_variables_) return result;
  const VariablePlacement p = variables->placements()[static_cast<size_t>(id)];
  for (const ShardPiece& piece : p.pieces) {
    const ShardServer* server = servers_[static_cast<size_t>(piece.server)].get();
    const optim::Optimizer* optimizer = server ? server->optimizer(id) : nullptr;
    if (optimizer == nullptr) return {};  // no push reached this piece yet
    result.push_back(optimizer);
  }
  return result;
}

void WorkerRuntime::apply_gradients(const std::vector<Tensor>& grads, const std::vector<Variable>& vars) {
  core_.variables->push(grads, vars);
}

}  // namespace flowlet::detail::ps
