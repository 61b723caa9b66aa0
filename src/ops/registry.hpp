// Each op family lists its ops here; src/registry.cpp gathers them (explicit, no static constructors).
#pragma once

#include <vector>

#include "flowlet/op.hpp"

namespace flowlet::detail {

// The families with public functions (src/ops/<family>.cpp).
void add_creation_ops(std::vector<Op*>& ops);
void add_elementwise_ops(std::vector<Op*>& ops);
void add_linalg_ops(std::vector<Op*>& ops);
void add_nn_ops(std::vector<Op*>& ops);
void add_reduce_ops(std::vector<Op*>& ops);
void add_shape_ops(std::vector<Op*>& ops);
void add_host_ops(std::vector<Op*>& ops);  // print, host_callback
// Issue 15 (ops in src/ops/conv_attrs.hpp): conv2d and its backward ops; max/avg pooling and theirs;
// batch_norm_training/backward/inference, layer_norm and its backward op; dropout.
void add_conv_ops(std::vector<Op*>& ops);
void add_pool_ops(std::vector<Op*>& ops);
void add_normalization_ops(std::vector<Op*>& ops);
void add_dropout_ops(std::vector<Op*>& ops);

// Ops that only graphs hold, recorded by a library call while tracing or inserted by a pass.
void add_state_ops(std::vector<Op*>& ops);     // read_variable, assign_variable, assign_matmul
void add_transfer_ops(std::vector<Op*>& ops);  // send, recv
void add_fused_ops(std::vector<Op*>& ops);     // fused_elementwise
void add_matmul_bias_ops(std::vector<Op*>& ops);  // matmul_bias (src/ops/matmul_bias.cpp)
void add_relu_bias_grad_ops(std::vector<Op*>& ops);  // relu_bias_grad (src/ops/relu_bias_grad.cpp)
void add_cross_entropy_grad_ops(std::vector<Op*>& ops);  // softmax_cross_entropy_grad (src/ops/cross_entropy_grad.cpp)
void add_queue_ops(std::vector<Op*>& ops);     // queue_enqueue, queue_dequeue (src/queue/queue_ops.cpp)

// all_reduce, broadcast, all_gather, reduce_scatter, barrier (src/collective/ops/collective_ops.cpp).
void add_collective_ops(std::vector<Op*>& ops);
void add_ps_ops(std::vector<Op*>& ops);                // src/ps/ops/ps_ops.cpp: ps_pull, ps_lookup, ps_push

}  // namespace flowlet::detail
