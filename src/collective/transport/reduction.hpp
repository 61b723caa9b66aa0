// Element-wise reduction of the participants' buffers on the host, shared by the in-process exchange
// and the MPI backend's local stage.
//
// A reduction runs in two steps so that a cross-process stage can sit between them:
//   accumulate(): participant buffers -> one buffer in the *wire dtype*, reducing in participant
//                 order (so every process computes the same bits);
//   finish():     wire buffer -> the result dtype, dividing by the participant count for mean.
// The wire dtype is the input dtype, except that f16 and bf16 accumulate in f32 and round once in
// finish(). Integers wrap on overflow (two's complement) and mean truncates toward zero. b8 holds
// 0/1: sum and max are "any", min and mean are "all" (mean = count / participants, truncated).
// Floating max/min propagate NaN.
#pragma once

#include <cstdint>
#include <vector>

#include "flowlet/collective.hpp"
#include "flowlet/core/dtype.hpp"

namespace flowlet::detail {

DType wire_dtype(DType dtype);

// The reduction that combines wire buffers of partial results (what a cross-process stage
// applies): mean combines as sum (finish divides), b8 sum as max and b8 mean as min.
ReduceOp wire_op(DType dtype, ReduceOp op);

// out[i] = inputs[0][i] (op) inputs[1][i] (op) ... in order; `out` holds `count` wire-dtype
// elements and may alias inputs[0] only when the input dtype is its own wire dtype.
void accumulate(DType dtype, ReduceOp op, const std::vector<const void*>& inputs, void* out, int64_t count);

// Does finish() change anything, or is the wire buffer already the result?
bool needs_finish(DType dtype, ReduceOp op);

// out[i] = wire[i] (/ participants for mean) converted to `dtype`. `out` may alias `wire` when
// `dtype` is its own wire dtype.
void finish(DType dtype, ReduceOp op, int participants, const void* wire, void* out, int64_t count);

}  // namespace flowlet::detail
