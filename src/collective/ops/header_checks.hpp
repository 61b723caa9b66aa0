// When a collective exchanges its header (kind, op, root, dtype, shape) before the data.
//
// The exchange costs a round trip, so it is done where a disagreement can first show up and not
// on every call:
//   - a traced node checks on its first run and never after: a graph runs the same calls, in the
//     same order, with the same signatures every time (a new trace is a new node, and checks again);
//   - an eager call checks when this participant of this communicator has not yet made a call with
//     the same signature (kind, op, root, dtype, shape): a training loop checks on its first step.
// Every participant that runs the same program therefore takes the same decision for call k,
// which the MPI backend needs (its header exchange is part of the call's protocol).
// Limit: participants that diverge into two signatures each of them had already verified are not
// caught by the header; FLOWLET_COLLECTIVE_CHECKS=always checks every call (the in-process
// exchange compares headers on every call anyway).
#pragma once

#include "collective/ops/collective_attrs.hpp"

namespace flowlet::detail {

// For a graph node's run (traced = true) or an eager call, with the call's input (empty for a barrier).
bool should_check_header(const CollectiveAttrs& attrs, const Tensor& input, bool traced);
// After a call that checked its header succeeded: later calls of the node (of the signature) skip
// the check. A call that failed is not marked, so a retry checks again.
void mark_verified(const CollectiveAttrs& attrs, const Tensor& input, bool traced);

// Whether FLOWLET_COLLECTIVE_CHECKS=always is set (read once).
bool always_check_headers();

}  // namespace flowlet::detail
