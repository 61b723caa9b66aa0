// flowlet-bench's per-op table: how to call an op of the registry with --attr attributes (public
// functions, or dispatch with the internal attribute structs of the issue-15 ops), what its inputs
// hold (indices for gather, conditions for where), its FLOP count, and the shapes --list probes.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "flowlet/flowlet.hpp"
#include "flowlet/op.hpp"
#include "options.hpp"

namespace flowlet_bench {

using OpCallFn = std::function<std::vector<flowlet::Tensor>(const std::vector<flowlet::Tensor>&)>;

struct PreparedOp {
  OpCallFn call;  // works eagerly and inside trace()
  std::vector<flowlet::DType> input_dtypes;  // one per input
  std::vector<bool> index_inputs;            // inputs filled with small non-negative indices
};

// Why flowlet-bench cannot run `op` (graph-only, stateful, creation ops, backward ops needing the
// forward's sizes); empty when it can.
std::string unsupported_reason(const flowlet::Op& op);

// The call of `op` with these attributes on `input_count` inputs of `dtype`. UsageError for an
// unsupported op or an attribute it does not take.
PreparedOp prepare_op(const flowlet::Op& op, const Attributes& attributes, size_t input_count, flowlet::DType dtype);

// An input: random normal values for floating dtypes, 0/1 for index inputs, small integers else,
// random booleans for b8.
flowlet::Tensor make_input(const flowlet::Shape& shape, flowlet::DType dtype, bool index, flowlet::Device device,
                           uint64_t seed);

// Floating-point operations of one call (0: the op is memory-bound by nature and has no count).
double flop_count(const flowlet::Op& op, const std::vector<flowlet::Tensor>& inputs,
                  const std::vector<flowlet::Tensor>& outputs);

// Small input shapes that `op` accepts, for --list's dtype probe.
std::vector<flowlet::Shape> probe_shapes(const flowlet::Op& op);

}  // namespace flowlet_bench
