// run() under mpirun: this process is one server or one worker, messages go over the MPI
// transport, and the end of the run is collective so that every process returns the same values
// and counters.
//
// Order of a run, on every process:
//   1. a server process seeds its ShardServer from its local values and starts it; then a barrier,
//      so that no worker's first pull reaches a server that is not attached yet (a detached
//      endpoint drops messages);
//   2. a worker process runs the worker function with its client, finishes it (its goodbye) and,
//      when fault injection stopped it, sends the goodbye itself (there is no other thread to);
//      a server process serves until every worker said goodbye;
//   3. a barrier that waits as long as the slowest worker trains (its own communicator: a
//      collective timeout there would end runs that are merely long);
//   4. every variable piece is broadcast from its server's process, and every process assigns the
//      joined values to its local variables;
//   5. the processes' reports (counters, errors) are all-gathered as bytes, so every process
//      builds the same ParameterServerStats and rethrows the same first error.
#include <algorithm>
#include <cstring>

#include "core/check.hpp"
#include "flowlet/collective.hpp"
#include "flowlet/ops/creation.hpp"
#include "flowlet/ops/shape.hpp"
#include "ps/strategy/process_report.hpp"
#include "ps/strategy/run_steps.hpp"
#include "ps/strategy/strategy_core.hpp"

namespace flowlet::detail::ps {

namespace {

void barrier_on(Communicator& communicator) {
  CollectiveCall call;
  call.kind = CollectiveKind::barrier;
  communicator.run(0, std::move(call));
}

Tensor collective(Communicator& communicator, CollectiveKind kind, const Tensor& input, int root = 0) {
  CollectiveCall call;
  call.kind = kind;
  call.op = ReduceOp::max;
  call.root = root;
  call.input = input.device() == Device() ? input.contiguous() : input.to(Device()).contiguous();
  return communicator.run(0, std::move(call));
}

// Every process's report, in process order.
std::vector<ProcessReport> exchange_reports(Communicator& communicator, const ProcessReport& mine) {
  const Bytes bytes = encode_report(mine);
  const int64_t size = static_cast<int64_t>(bytes.size());
  const Tensor sizes =
      collective(communicator, CollectiveKind::all_gather, tensor_from_host(&size, 1, i64, Shape{1}, Device()));
  const std::vector<int64_t> all_sizes = sizes.to_vector<int64_t>();
  const int64_t longest = *std::max_element(all_sizes.begin(), all_sizes.end());
  std::vector<uint8_t> padded(static_cast<size_t>(longest), 0);
  std::memcpy(padded.data(), bytes.data(), bytes.size());
  const Tensor gathered = collective(communicator, CollectiveKind::all_gather,
                                     tensor_from_host(padded.data(), padded.size(), u8, Shape{longest}, Device()));
  const std::vector<uint8_t> all = gathered.to_vector<uint8_t>();
  std::vector<ProcessReport> reports;
  for (size_t p = 0; p < all_sizes.size(); ++p) {
    const auto* begin = reinterpret_cast<const std::byte*>(all.data()) + p * static_cast<size_t>(longest);
    reports.push_back(decode_report({begin, static_cast<size_t>(all_sizes[p])}));
  }
  return reports;
}

}  // namespace

ParameterServerStats StrategyCore::run_processes(const WorkerFunction& worker_fn) {
  const auto started = std::chrono::steady_clock::now();
  const int num_servers = options.num_servers;
  const std::vector<std::shared_ptr<VariableState>> states = variables->states();
  const std::vector<VariablePlacement> placements = variables->placements();
  const std::vector<Tensor> values = local_values(states);
  const int me = process_index();

  ProcessReport report;
  std::exception_ptr worker_error, server_error;
  ShardServer* server = role.server >= 0 ? servers_[static_cast<size_t>(role.server)].get() : nullptr;
  transport_->reset_counters();
  bool serving = false;
  if (server == nullptr) pending_optimizer_state.reset();  // a worker has no optimizer state to install
  if (server != nullptr) {
    try {
      server->seed(values);
      install_pending_optimizer_state();  // a checkpoint's optimizer state, restored before the first run
      server->start();
      serving = true;
    } catch (...) {
      server_error = std::current_exception();
    }
  }
  barrier_on(*collectives_);

  if (role.worker >= 0) {
    WorkerClient client(worker_config(role.worker), placements, *transport_);
    std::atomic<bool> stop{false};
    WorkerOutcome outcome = run_worker(*this, client, role.worker,
                                       options.worker_devices[static_cast<size_t>(role.worker)], stop, worker_fn);
    if (client.stopped()) {
      try {
        say_goodbye_for(*transport_, num_servers, role.worker, client.steps());
      } catch (...) {
        if (!outcome.error) outcome.error = std::current_exception();
      }
    }
    worker_error = outcome.error;
    report.worker_error = error_kind(worker_error);
    report.worker = std::move(outcome.stats);
  }
  std::vector<Tensor> pieces(placements.size());
  if (server != nullptr) {
    if (serving) {
      try {
        // Workers' pulls and steps have their own deadlines; this one only bounds a worker function
        // that never returns (see end_ in strategy_core.hpp).
        server->finish(std::chrono::steady_clock::now() + std::chrono::hours(24 * 116));
      } catch (...) {
        server_error = std::current_exception();
      }
      pieces = server->piece_values();
    }
    report.server = server->stats();
    report.server->server = role.server;
    report.server_error = error_kind(server_error);
    if (server_error) {
      try {
        std::rethrow_exception(server_error);
      } catch (const std::exception& e) {
        report.server_message = e.what();
      } catch (...) {
        report.server_message = "an exception that is not a std::exception";
      }
    }
  }

  barrier_on(*end_);

  // Each piece from the process of its server; the others pass their local rows (same shape).
  std::vector<Tensor> finals;
  for (size_t v = 0; v < placements.size(); ++v) {
    const VariablePlacement& placement = placements[v];
    std::vector<Tensor> received;
    for (const ShardPiece& piece : placement.pieces) {
      const int root = role.endpoint_process[static_cast<size_t>(piece.server)];
      Tensor input = placement.shape.rank() == 0 ? values[v] : slice(values[v], 0, piece.row_begin, piece.rows());
      if (root == me && pieces[v].defined()) input = pieces[v];
      received.push_back(collective(*collectives_, CollectiveKind::broadcast, input, root));
    }
    finals.push_back(joined_value(placement, received, values[v]));
  }
  store_values(states, finals);

  report.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const std::vector<ProcessReport> reports = exchange_reports(*collectives_, report);
  std::vector<ServerStats> server_stats;
  std::vector<WorkerStats> worker_stats;
  double wall = 0;
  for (const ProcessReport& r : reports) {
    wall = std::max(wall, r.wall_seconds);
    if (r.server) server_stats.push_back(*r.server);
    if (r.worker) worker_stats.push_back(*r.worker);
  }
  last_stats_ = combined_stats(options.mode, wall, std::move(server_stats), std::move(worker_stats));

  // The same error on every process: the failed worker of lowest index, else the failed server of
  // lowest index (the process that saw it rethrows the original).
  const ProcessReport* failed_worker = nullptr;
  const ProcessReport* failed_server = nullptr;
  for (const ProcessReport& r : reports) {
    if (r.worker && r.worker_error != ErrorKind::none &&
        (failed_worker == nullptr || r.worker->worker < failed_worker->worker->worker)) {
      failed_worker = &r;
    }
    if (r.server && r.server_error != ErrorKind::none &&
        (failed_server == nullptr || r.server->server < failed_server->server->server)) {
      failed_server = &r;
    }
  }
  if (failed_worker != nullptr) {
    if (failed_worker->worker->worker == role.worker) std::rethrow_exception(worker_error);
    throw_error(failed_worker->worker_error, fmt::format("ParameterServerStrategy::run: worker {} failed: {}",
                                                         failed_worker->worker->worker, failed_worker->worker->error));
  }
  if (failed_server != nullptr) {
    if (failed_server->server->server == role.server) std::rethrow_exception(server_error);
    throw_error(failed_server->server_error, fmt::format("ParameterServerStrategy::run: server {} failed: {}",
                                                         failed_server->server->server, failed_server->server_message));
  }
  return last_stats_;
}

}  // namespace flowlet::detail::ps
