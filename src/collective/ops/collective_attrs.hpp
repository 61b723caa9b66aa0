// The collective ops (all_reduce, broadcast, all_gather, reduce_scatter, barrier): the attribute
// struct every one of them carries, and the one call that dispatches them, shared by the public
// functions (flowlet/collective.hpp) and the gradient rules (collective_grads.cpp).
#pragma once

#include <atomic>
#include <memory>
#include <span>
#include <string>

#include "collective/communicator.hpp"
#include "flowlet/op.hpp"

namespace flowlet::detail {

struct CollectiveAttrs {
  std::shared_ptr<Communicator> communicator;  // kept alive by every node and tape entry that holds it
  int local = 0;                               // the calling participant's local index in it
  CollectiveKind kind = CollectiveKind::all_reduce;
  ReduceOp op = ReduceOp::sum;  // all_reduce, reduce_scatter
  int root = 0;                 // broadcast
  // False until a traced node holding these attributes has run once (header_checks.hpp). Copies
  // share it, so the node the tracer keeps sees its own runs; each call of a public function makes a
  // fresh one, so each traced node has its own.
  std::shared_ptr<std::atomic<bool>> node_has_run = std::make_shared<std::atomic<bool>>(false);

  int rank() const { return communicator->rank_of(local); }
  // "participant 1 of communicator of 2 participants (...)": for error messages.
  std::string participant() const;
  // Every field that changes what the op computes (graph dumps, CSE keys; the nodes are stateful,
  // so CSE never merges two of them anyway).
  std::string describe() const;
};

// The attributes of a collective called now on this thread: the running replica's communicator and
// participant inside MirroredStrategy::run (detail::current_replica()), else participant 0 of the
// world communicator (one participant per process).
CollectiveAttrs participant_attrs(CollectiveKind kind, ReduceOp op = ReduceOp::sum, int root = 0);

// Dispatches the collective `attrs.kind` on `input` (ignored for a barrier, which returns an empty
// handle).
Tensor dispatch_collective(const CollectiveAttrs& attrs, const Tensor& input);

// The gradient rules (collective_grads.cpp), written with public ops and dispatch_collective.
void all_reduce_grad(const GradCall& call, std::span<const Tensor> output_grads, std::span<Tensor> input_grads);
void broadcast_grad(const GradCall& call, std::span<const Tensor> output_grads, std::span<Tensor> input_grads);
void all_gather_grad(const GradCall& call, std::span<const Tensor> output_grads, std::span<Tensor> input_grads);
void reduce_scatter_grad(const GradCall& call, std::span<const Tensor> output_grads, std::span<Tensor> input_grads);

}  // namespace flowlet::detail
