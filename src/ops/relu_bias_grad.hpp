// relu_bias_grad: the backward of a dense layer's relu and bias in one pass, made by the
// fuse_relu_bias_grad pass (src/trace/passes/relu_bias_grad_fusion.cpp) from relu's gradient
// where(y > 0, g, 0) and the bias gradient sum(that, axis 0, keepdims); eager code keeps its ops.
// Internal, not in the public op table.
#pragma once

#include "flowlet/op.hpp"

namespace flowlet::detail {

// Inputs y [m, n] (relu's input or output: only y > 0 matters) and g [m, n], one dtype, f32 or f64.
// Outputs dz [m, n] = where(y > 0, g, 0) and db [1, n], the column sums of dz (summed in f64 and
// rounded once, in row blocks per thread added in block order). One read of y and g, one write of
// dz; eager writes dz and reads it again for the sum. No gradient: the pass runs after gradients
// were recorded.
extern Op relu_bias_grad_op;

}  // namespace flowlet::detail
