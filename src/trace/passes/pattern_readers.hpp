// What the rewrite passes that match a producer and its consumer (fuse_convolutions,
// fuse_matmul_bias, fuse_relu_bias_grad, fuse_cross_entropy_grad) share: who reads each node's
// output 0, whether something needs that value as it is, small node tests, and the relu a producer
// may take over (with relu's gradient tests).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "flowlet/graph.hpp"

namespace flowlet::detail {

// Every use of each node's output 0: the reading node ids (a node reading it twice counts twice);
// `pinned` when something needs the value as it is (another output index of a multi-output node
// does not count here, a control edge, a graph output or an effect does).
struct Readers {
  std::vector<std::vector<int32_t>> of;
  std::vector<bool> pinned;
  std::vector<bool> ordered;  // a control input of some node, or an effect: must stay a node

  explicit Readers(const Graph& graph);

  // Node `id`'s output 0 has exactly one reader and nothing else needs it as it is: a rewrite that
  // replaces that reader may drop (or take over) the node.
  bool only_reader_is_one_node(int32_t id) const {
    const auto i = static_cast<size_t>(id);
    return !pinned[i] && of[i].size() == 1;
  }
};

// A live op node of exactly `op` (false when op is null: an op this build did not register).
bool is_live_op(const Node& n, const Op* op);

// A rank-0 floating constant equal to zero (relu's gradient compares with one: x > 0).
bool is_zero_scalar(const Node& n);

// Adds `from`'s control inputs to `into`'s, sorted and without duplicates (a node that takes over
// another's value takes over what that node waited for).
void merge_control_inputs(Node& into, const Node& from);

// Whether the producer of relu node `relu_id`'s input (output 0 of a one-output node) can take over
// the relu, computing relu(x) in place of x: x is read by that relu once and otherwise only by
// greater(x, 0) nodes after the relu (relu's gradient, where(x > 0, g, 0); x > 0 and relu(x) > 0
// agree for every x, NaN included), x is not pinned, the relu is not ordered and waits for nothing
// the producer does not already follow, and both sit on one device. Returns those tests, or
// nullopt. The caller checks the producer's kind.
std::optional<std::vector<int32_t>> relu_takeover_tests(const Graph& graph, const Readers& readers, int32_t relu_id);

// Makes the producer of relu `relu_id`'s input produce the relu's value (the caller has changed its
// op or attributes): the tests read the relu's value, then every use of the relu reads the
// producer, which takes the relu's control inputs; the relu is removed.
void take_over_relu(Graph& graph, int32_t relu_id, const std::vector<int32_t>& tests);

}  // namespace flowlet::detail
