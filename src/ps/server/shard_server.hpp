// One parameter server: the variable pieces it holds, an optimizer per piece, and the rules of the
// training mode (flowlet/ps_options.hpp, TrainingMode). It serves its endpoint of a Transport on a
// thread of its own: the transport's handler only decodes and queues.
//
// Handling, per message (all on the server's thread, in arrival order):
//   - PullRequest / SparsePullRequest: answered with a PullReply holding the piece's rows (sparse:
//     those rows; indices are bounds-checked, an error becomes an ErrorReply) and the server's
//     version, once the mode allows the read:
//       async: at once;
//       sync: when version >= min_version;
//       bounded_staleness k: when request.clock - (fewest steps pushed by a live worker) <= k.
//     Until then the request is parked; a parked request older than the timeout is answered with an
//     ErrorReply(deadline_exceeded) naming the server, the mode, the version and the workers it
//     waits for (those whose push the step or the bound still needs).
//   - Push: validated entry by entry against the placement (var_id held here, dtype, shape; sparse
//     rows unique and in range) before anything changes: a bad push changes nothing, is counted as
//     dropped and answered with ErrorReply(request_id 0). Then
//       async: applied now; staleness = version - read_version; version += 1;
//       bounded_staleness: applied now; the worker's clock becomes push.clock; staleness =
//         version - read_version, where version = fewest steps pushed by any live worker;
//       sync: if read_version < version: dropped (late). Else added to step `version`'s
//         accumulator (one push per worker per step: a second one from the same worker is dropped);
//         when num_workers - backup_workers pushes are in (or, once fewer workers are live than
//         that, every live worker's), each variable's gradients are averaged over the pushes that
//         carried them and applied once, version += 1, and parked pulls are answered. Late and
//         duplicate pushes get no reply (the worker learns the version from its next pull); once
//         every worker has said goodbye, pushes already in the step make a last step (none is lost).
//     "Applied": optimizer.apply({grad}, {piece variable}) for a dense entry; for a sparse entry
//     the optimizer's update on the gathered rows of the piece and of its slots, scattered back
//     (optimizer_access.hpp). How a sync step averages sparse and mixed entries: step_gradients.hpp.
//     A push that cannot be taken (a worker that said goodbye, a read_version above the server's,
//     a variable twice, bounded staleness: a clock that does not grow) is a bad push too.
//   - Goodbye: the worker is no longer live (sync and bounded stop waiting for it); when every
//     worker has said goodbye the server's run ends.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <vector>

#include "flowlet/optim.hpp"
#include "flowlet/ps_options.hpp"
#include "flowlet/variable.hpp"
#include "ps/sharding.hpp"
#include "ps/transport/transport.hpp"

namespace flowlet::detail::ps {

struct ServerConfig {
  int server = 0;       // this server's index (its endpoint)
  int num_servers = 1;  // workers are endpoints num_servers + w
  int num_workers = 1;
  TrainingMode mode = TrainingMode::async;
  int backup_workers = 0;
  int staleness = 0;
  std::chrono::duration<double> timeout{300.0};
  Device device;  // where the pieces and their optimizers live
  std::function<std::unique_ptr<optim::Optimizer>()> make_optimizer;
};

class ShardServer {
 public:
  // `placements`: every server variable of the strategy (the server keeps the pieces it holds).
  ShardServer(ServerConfig config, std::vector<VariablePlacement> placements, Transport& transport);
  ~ShardServer();  // stops the thread and detaches (a run still going is abandoned)
  ShardServer(const ShardServer&) = delete;
  ShardServer& operator=(const ShardServer&) = delete;

  // Before a run: the values of this server's pieces, taken from each variable's full local value
  // (`values[i]` for placements[i], any device; only this server's rows are copied). A piece seen
  // before keeps its optimizer and slots; its value is replaced. Resets the run's counters and
  // marks every worker live, version unchanged.
  void seed(const std::vector<Tensor>& values);

  // Attaches to the transport and starts serving on a new thread.
  void start();
  // Waits until every worker said goodbye (or `deadline` passes: DeadlineExceeded naming the
  // workers that did not), then stops the thread and detaches. Rethrows an internal failure of the
  // server thread (an optimizer that threw: the push is dropped and the error kept).
  void finish(std::chrono::steady_clock::time_point deadline);

  // After finish(): this server's piece of placements[i] (empty Tensor where it holds none).
  std::vector<Tensor> piece_values() const;
  // The optimizer of the piece of variable `var_id` here (null where none, or before the first
  // seed(): the optimizer is made when its piece is first seeded).
  const optim::Optimizer* optimizer(int32_t var_id) const;
  ServerStats stats() const;  // the run's counters (bytes: from the transport)

  // For checkpoints (src/ps/checkpoint/), while the server is not running: the piece of variable
  // `var_id` here (its rows of the variable, as last seeded or served) and its optimizer, to read
  // or set its slots and step counter. {} where the server holds no piece of it or has not been
  // seeded yet (no optimizer); InvalidArgument while it runs.
  struct PieceState {
    Variable var;
    optim::Optimizer* optimizer = nullptr;
  };
  PieceState piece_state(int32_t var_id);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace flowlet::detail::ps
