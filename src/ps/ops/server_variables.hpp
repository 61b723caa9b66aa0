// The server variables of one ParameterServerStrategy, and the graph ops a worker's reads and pushes
// become (state layer: they record through dispatch like the variable and collective ops).
//
// Ops (entries of the one op table, registered by add_ps_ops; stateful, asynchronous kernels in a
// traced step so that a node waiting for a server holds no executor thread, synchronous kernels
// eagerly; attributes hold the WorkerClient and the variable / server):
//   - ps_pull (no inputs): a whole variable, WorkerClient::pull. Not differentiable itself: the
//     read's tensor is noted on tapes as the variable's read (Variable::value()), as read_variable's.
//   - ps_lookup (ids, any integer dtype, any shape; flattened to n = ids.numel()): three outputs,
//     rows [n, row shape...] (the rows of the unique ids, in order of first appearance, then zero
//     rows), inverse i64 [n] (ids.flat[i] is unique entry inverse[i]) and unique_ids i64 [n] (the
//     unique ids, then -1). WorkerClient::pull_rows for the unique ids. OutOfRange for an id outside
//     [0, rows).
//   - ps_push (the gradients for one server, and the unique_ids of each sparse one): no outputs;
//     WorkerClient::push(server, ...).
// Resource order: every ps op of one worker is ordered on its WorkerClient (a push after the reads
// recorded before it, the next step's reads after it), so a traced step keeps program order per
// worker while the nodes still overlap with compute.
#pragma once

#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "flowlet/ps_options.hpp"
#include "flowlet/variable.hpp"
#include "ps/sharding.hpp"
#include "ps/worker/worker_client.hpp"
#include "state/remote_variable.hpp"
#include "state/variable_state.hpp"

namespace flowlet::detail::ps {

// One strategy's server variables. Every one of them carries (VariableState::remote) a pointer to
// this object (a small forwarding hook holding it weakly, since this object holds the states: once
// it is gone the variables are plain local ones), which decides per thread what a read means:
//   - on a thread whose current_worker() belongs to this strategy (`strategy` identity): read()
//     returns ps_pull's result, gather() ps_lookup's rows gathered back by `inverse` and reshaped to
//     ids.shape + row shape (noting the pulled rows on active tapes as the variable's read, and
//     remembering this worker's unique_ids for the variable until its next push), check_update()
//     throws InvalidArgument ("'w' lives on the parameter servers during run(); update it with
//     Worker::apply_gradients");
//   - anywhere else: the local value (read and gather return an empty Tensor, updates are allowed).
class ServerVariables final : public RemoteVariable {
 public:
  ServerVariables(const void* strategy, int num_servers, ShardingPolicy policy);

  // Registers a variable just made under the strategy's scope: places it (Placer, creation order)
  // and sets state->remote. InvalidArgument for a non-floating variable.
  void add(const std::shared_ptr<ServerVariables>& self, const std::shared_ptr<VariableState>& state);

  std::vector<std::shared_ptr<VariableState>> states() const;  // creation order
  std::vector<VariablePlacement> placements() const;           // creation order (id = index)
  int32_t id_of(const VariableState& state) const;             // -1: not one of these

  Tensor read(const std::shared_ptr<VariableState>& state) override;
  Tensor gather(const std::shared_ptr<VariableState>& state, const Tensor& indices) override;
  void check_update(const VariableState& state, const char* op) override;

  // Worker::apply_gradients for the worker on this thread (its current_worker() must belong to this
  // strategy): checks every pair (one of these variables; dtype; shape: the variable's, or for a
  // variable gathered since the last push, [n, row shape...] of that lookup), then records (traced)
  // or runs (eager) one ps_push per server, each with the gradients of the variables it holds a
  // piece of. Forgets the remembered lookups.
  void push(std::span<const Tensor> grads, std::span<const Variable> vars);

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace flowlet::detail::ps
