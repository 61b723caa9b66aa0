// The strided layout of a reduction whose axes are not one block of adjacent dimensions, or whose
// input is a view: read in place through element offsets instead of copied into a contiguous
// [outer, reduced, inner] block first (ops/reduce_layout.hpp), which is what the CPU kernels of
// src/ops/reduce.cpp do for the batch-norm pattern (axes 0, 2, 3 of NCHW; axes 0, 2 of [N, C, L]).
//
// After size-1 dimensions are dropped and neighbours of the same kind (both reduced or both kept)
// that are laid out as one are merged, the innermost dimension must have stride 1. Then either
//   runs:    it is reduced: each output element adds up `run`-element contiguous runs, one at each
//            of `reduced_offsets` from its base `out_offsets[o]`;
//   columns: it is kept: each output row (out_offsets[o], `run` consecutive outputs) adds up the
//            contiguous `run`-element rows at `reduced_offsets` from its base.
// Offsets are in elements from the tensor's first element (Tensor::raw_data()). Outputs are in the
// row-major order of the kept dimensions, as reduced_shape() lays them out.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "flowlet/core/tensor.hpp"

namespace flowlet::detail {

struct StridedReduction {
  enum class Kind { runs, columns };
  Kind kind = Kind::runs;
  int64_t run = 1;                       // contiguous elements per run (runs) or per row (columns)
  std::vector<int64_t> out_offsets;      // per output element (runs) or per output row (columns)
  std::vector<int64_t> reduced_offsets;  // per run / per reduced row, from an output's base
};

// The plan for reducing t (any strides) over the sorted, checked `axes`, or nothing when the
// contiguous block path costs no copy (t contiguous and the axes adjacent), when t is empty or
// nothing is reduced, or when the innermost dimension is strided or its runs are shorter than
// `min_run` elements (there a copy that makes the reads contiguous pays for itself).
std::optional<StridedReduction> plan_strided_reduction(const Tensor& t, const std::vector<int64_t>& axes,
                                                       int64_t min_run = 8);

}  // namespace flowlet::detail
