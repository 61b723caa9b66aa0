// run() in one process: the servers and the workers are threads, messages move over the in-memory
// transport (with the injected message delay), and the strategy's thread does the bookkeeping.
//
// Order of a run: seed and start every server (so that no worker's first pull finds its server
// detached); one thread per worker runs its function and finishes its client (its goodbye); once
// every worker thread ended, the goodbyes of the stopped workers are sent for them, the servers
// finish (deadline: now + timeout), their values are written back into the local variables, and
// the counters are collected. The first worker error other than an injected stop is rethrown last.
#include <thread>

#include "core/check.hpp"
#include "ps/strategy/run_steps.hpp"
#include "ps/strategy/strategy_core.hpp"

namespace flowlet::detail::ps {

ParameterServerStats StrategyCore::run_in_process(const WorkerFunction& worker_fn) {
  const auto started = std::chrono::steady_clock::now();
  const int num_servers = options.num_servers;
  const int num_workers = options.num_workers;
  const std::vector<std::shared_ptr<VariableState>> states = variables->states();
  const std::vector<VariablePlacement> placements = variables->placements();
  const std::vector<Tensor> values = local_values(states);

  transport_->reset_counters();
  for (auto& server : servers_) server->seed(values);
  install_pending_optimizer_state();  // a checkpoint's optimizer state, restored before the first run
  int started_servers = 0;
  std::exception_ptr server_error;
  try {
    for (auto& server : servers_) {
      server->start();
      ++started_servers;
    }
  } catch (...) {
    server_error = std::current_exception();
  }

  if (server_error) {
    // No worker runs: the servers that did start end with every worker's goodbye.
    for (int w = 0; w < num_workers; ++w) {
      const Bytes goodbye = encode(Message(Goodbye{w, 0}));
      for (int s = 0; s < started_servers; ++s) transport_->send(num_servers + w, s, goodbye);
    }
  }

  std::vector<std::unique_ptr<WorkerClient>> clients;
  std::vector<WorkerOutcome> outcomes(static_cast<size_t>(num_workers));
  // Worker errors in the order they happened: the first is most likely the cause of the others.
  std::mutex errors_mutex;
  std::vector<std::exception_ptr> errors;
  if (!server_error) {
    for (int w = 0; w < num_workers; ++w) {
      clients.push_back(std::make_unique<WorkerClient>(worker_config(w), placements, *transport_));
    }
    std::atomic<bool> stop{false};
    std::vector<std::thread> threads;
    threads.reserve(static_cast<size_t>(num_workers));
    try {
      for (int w = 0; w < num_workers; ++w) {
        threads.emplace_back([&, w] {
          const size_t i = static_cast<size_t>(w);
          outcomes[i] = run_worker(*this, *clients[i], w, options.worker_devices[i], stop, worker_fn);
          if (outcomes[i].error) {
            std::lock_guard lock(errors_mutex);
            errors.push_back(outcomes[i].error);
          }
        });
      }
    } catch (...) {
      // No thread for the rest: they never start (their clients say goodbye below), the others end
      // by themselves (asked to stop).
      stop.store(true);
      std::lock_guard lock(errors_mutex);
      errors.push_back(std::current_exception());
    }
    for (std::thread& t : threads) t.join();
    try {
      for (int w = 0; w < num_workers; ++w) {
        WorkerClient& client = *clients[static_cast<size_t>(w)];
        client.finish();  // idempotent: each worker thread finished its own
        if (client.stopped()) say_goodbye_for(*transport_, num_servers, w, client.steps());
      }
    } catch (...) {
      if (!server_error) server_error = std::current_exception();
    }
  }

  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout);
  for (int s = 0; s < started_servers; ++s) {
    try {
      servers_[static_cast<size_t>(s)]->finish(deadline);
    } catch (...) {
      if (!server_error) server_error = std::current_exception();
    }
  }

  // The servers' values, back into the local variables (also after a failed worker: what the
  // servers applied happened).
  std::vector<std::vector<Tensor>> pieces_by_server;
  for (int s = 0; s < num_servers; ++s) {
    pieces_by_server.push_back(s < started_servers ? servers_[static_cast<size_t>(s)]->piece_values()
                                                   : std::vector<Tensor>(placements.size()));
  }
  std::vector<Tensor> finals;
  for (size_t v = 0; v < placements.size(); ++v) {
    std::vector<Tensor> pieces;
    for (const ShardPiece& piece : placements[v].pieces) {
      pieces.push_back(pieces_by_server[static_cast<size_t>(piece.server)][v]);
    }
    finals.push_back(joined_value(placements[v], pieces, values[v]));
  }
  store_values(states, finals);

  std::vector<ServerStats> server_stats;
  for (int s = 0; s < num_servers; ++s) {
    ServerStats stats = servers_[static_cast<size_t>(s)]->stats();
    stats.server = s;
    server_stats.push_back(std::move(stats));
  }
  std::vector<WorkerStats> worker_stats;
  for (int w = 0; w < num_workers; ++w) {
    WorkerStats stats = std::move(outcomes[static_cast<size_t>(w)].stats);
    stats.worker = w;
    worker_stats.push_back(std::move(stats));
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  last_stats_ = combined_stats(options.mode, wall, std::move(server_stats), std::move(worker_stats));

  if (std::exception_ptr error = first_error(errors)) std::rethrow_exception(error);
  if (server_error) std::rethrow_exception(server_error);
  return last_stats_;
}

}  // namespace flowlet::detail::ps
