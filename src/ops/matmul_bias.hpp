// matmul_bias: a dense layer's forward in one node, y = act(a @ w + bias) with the bias broadcast
// over rows, made by the fuse_matmul_bias pass (src/trace/passes/matmul_bias_fusion.cpp) from
// add(matmul(a, w), bias) and a following relu; eager code keeps its three ops. Internal, not in
// the public op table.
#pragma once

#include <string>

#include "flowlet/op.hpp"

namespace flowlet::detail {

enum class DenseActivation : int { none, relu };

struct MatmulBiasAttrs {
  DenseActivation activation = DenseActivation::none;
  std::string describe() const { return activation == DenseActivation::relu ? "activation=relu" : "activation=none"; }
};

// Inputs a [m, k], w [k, n], bias [n], all f32 or all f64 (views of any strides); output [m, n].
// The kernel writes the bias into every row of the output, lets the GEMM accumulate a @ w into it
// (gemm_into with beta = 1: no separate pass adds the bias) and applies relu in place, so the
// output is written by the GEMM and touched once more at most, where eager writes the product,
// reads it to add the bias into a new tensor and reads that again for relu. Results equal eager's
// within rounding (the bias joins the sum before the product's last rounding instead of after).
// No gradient: the pass runs after the gradients were recorded.
extern Op matmul_bias_op;

}  // namespace flowlet::detail
