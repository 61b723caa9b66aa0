// The graph passes trace() runs after recording, in the order optimize() lists. Each pass lives in
// its own file, which opens with the invariants it relies on and keeps (see flowlet/graph.hpp for
// those every pass keeps).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "flowlet/graph.hpp"

namespace flowlet::detail {

struct PassOptions {
  bool simplify = true;       // algebraic simplification
  bool fold_constants = true;
  bool eliminate_common_subexpressions = true;
  bool fuse_elementwise = true;
  bool fuse_variable_updates = true;
  bool fuse_convolutions = true;  // also off when FLOWLET_CONV_FUSION=0
  bool fuse_matmul_bias = true;     // also off when FLOWLET_DENSE_FUSION=0
  bool fuse_relu_bias_grad = true;  // also off when FLOWLET_DENSE_FUSION=0
  bool fuse_cross_entropy_grad = true;  // also off when FLOWLET_DENSE_FUSION=0
  // Write the graph (DOT and JSON) before the first pass and after every pass into this folder.
  // Empty: the environment variable FLOWLET_DUMP_GRAPHS decides (unset: no dumps).
  std::string dump_dir;
};

// Keeps what the outputs and effects need (arguments cut the graph); removes the rest.
void prune(Graph& graph);
// x*1, 1*x, x+0, 0+x, x-0, x/1 -> x; neg(neg(x)) -> x; transpose(transpose(x)) -> x; reshape of
// reshape -> one reshape; casts to the same dtype -> x.
void simplify_algebra(Graph& graph);
// A node whose inputs are all constants, and which is not stateful, becomes a constant.
void fold_constants(Graph& graph);
// Two nodes with the same op, attributes and inputs become one (stateful nodes never merge).
void eliminate_common_subexpressions(Graph& graph);
// Chooses each op node's device: requests, colocation with variables, kernel availability, then
// follow the largest input (see placement.cpp). Throws DeviceError on constraints that conflict.
void place(Graph& graph);
// v -= scale * (a @ b) becomes one GEMM accumulating into v (see update_fusion.cpp).
void fuse_variable_updates(Graph& graph);
// batch_norm_inference(conv2d(...)) -> conv2d with the folded weight and bias; relu(conv2d(...)) ->
// conv2d with activation relu (see conv_fusion.cpp).
void fuse_convolutions(Graph& graph);
// False when FLOWLET_CONV_FUSION is "0" (read at every optimize(), so tests can switch it).
bool conv_fusion_enabled_by_environment();
// add(matmul(a, w), bias[n]) (and a relu reading it) -> one matmul_bias node (see
// matmul_bias_fusion.cpp).
void fuse_matmul_bias(Graph& graph);
// where(y > 0, g, 0) and its column sums sum(.., {0}, keepdims) -> one relu_bias_grad node with both
// outputs (see relu_bias_grad_fusion.cpp).
void fuse_relu_bias_grad(Graph& graph);
// g * (softmax(logits) - one_hot(labels, C)) (softmax_cross_entropy's gradient) -> one
// softmax_cross_entropy_grad node (see cross_entropy_grad_fusion.cpp); then, where the forward loss
// of the same logits and labels is in the graph, share_cross_entropy_softmax.
void fuse_cross_entropy_grad(Graph& graph);
// The forward loss also writes its softmax and the gradient reads it (see
// cross_entropy_softmax_sharing.cpp). Called by fuse_cross_entropy_grad.
void share_cross_entropy_softmax(Graph& graph);
// False when FLOWLET_DENSE_FUSION is "0": the dense-layer rewrites and the cross-entropy gradient
// above (read at every optimize(), as for convolutions).
bool dense_fusion_enabled_by_environment();
// Chains of elementwise ops over same-shaped tensors become one fused node.
void fuse_elementwise(Graph& graph);

// Every edge between devices becomes a Send/Recv pair (see partition.cpp). Runs after place().
void insert_send_recv(Graph& graph);

// One device's part of a graph that insert_send_recv() processed.
struct GraphPartition {
  Device device;
  std::shared_ptr<Graph> graph;        // the device's nodes, in the whole graph's order
  std::vector<int32_t> global_ids;     // node id in the partition -> node id in the whole graph
  std::vector<int32_t> sends;          // its send nodes (also effects of the partition)
};
struct PartitionedGraph {
  std::vector<GraphPartition> partitions;                // in order of first node
  std::vector<std::pair<int32_t, int32_t>> outputs;      // per graph output: (partition, its output index)
  int32_t slots = 0;                                     // rendezvous slots (Send/Recv pairs)
};
// Cuts a graph into one graph per device; the rendezvous replaces each Send->Recv control edge.
PartitionedGraph split_partitions(const Graph& graph);

// All of the above, in order, then prune and compact; dumps around each pass when asked.
void optimize(Graph& graph, const PassOptions& options = {});

}  // namespace flowlet::detail
