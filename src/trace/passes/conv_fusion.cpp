// fuse_convolutions: two rewrites around conv2d (src/ops/conv_attrs.hpp), in this order:
//
//  1. Batch norm folded into the convolution (inference graphs): batch_norm_inference(conv2d(x, w,
//     b), gamma, beta, mean, var) -> conv2d(x, w * s, (b - mean) * s + beta), s = gamma / sqrt(var +
//     eps) reshaped to [O, 1, 1, 1] for the weight. s, w * s and the bias are graph nodes, not
//     constants: the variables they read change between calls. No bias: (-mean) * s + beta. Saves
//     one pass over the activations (read y, write y) for O * (C/g * kH * kW + 5) scalar ops.
//  2. ReLU into the convolution: relu(conv2d(...)) -> conv2d(..., activation = relu), so the
//     output is written once instead of written, read and written again. In a training graph the
//     relu's gradient rule reads the convolution's output too (where(x > 0, g, 0)); x > 0 and
//     relu(x) > 0 agree for every x (NaN included: both false), so such `greater(x, 0)` nodes read
//     the relu's output instead, and the convolution's output is then the relu's alone.
//
// Where: conv2d with activation none whose output 0 is read only by the pattern's one consumer
// (and, for 2, by greater(x, 0) nodes after the relu): never a graph output, a control input or a
// value another node needs as it was. Both nodes on one device; f32 or f64 (1 also needs the bias,
// when there is one, and every statistic in the convolution's dtype).
//
// Relies on (flowlet/graph.hpp): topological order, live inputs. Runs after place() (new nodes take
// the convolution's device) and before fuse_elementwise (which would otherwise absorb the relu).
// Keeps: the batch norm node becomes the folded conv2d at its own id (its users unchanged) and the
// nodes computing the folded weight and bias are inserted just before it, the graph renumbered to
// keep the order; in 2 the convolution keeps its id and takes over the relu's uses. Removed nodes
// stay in place with `removed` set.
//
// Switched off with PassOptions::fuse_convolutions = false or FLOWLET_CONV_FUSION=0 (measuring;
// tests comparing fused with unfused graphs).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "flowlet/ops/creation.hpp"
#include "ops/conv_attrs.hpp"
#include "ops/elementwise_ops.hpp"
#include "ops/known_ops.hpp"
#include "ops/reshape_attrs.hpp"
#include "trace/passes/passes.hpp"
#include "trace/passes/pattern_readers.hpp"

namespace flowlet::detail {
namespace {

// The ops the rewrites match, found once by name and compared by identity afterwards (the conv
// and normalization families keep their Op values to themselves). Null when not registered.
struct ConvOps {
  const Op* conv2d = find_op("conv2d");
  const Op* batch_norm_inference = find_op("batch_norm_inference");
};
const ConvOps& conv_ops() {
  static const ConvOps ops;
  return ops;
}

// A conv2d node the rewrites may change: activation none, f32/f64, one output.
const Conv2dAttrs* plain_conv(const Graph& graph, const ValueRef& value) {
  if (value.output != 0) return nullptr;
  const Node& n = graph.node(value.node);
  if (!is_live_op(n, conv_ops().conv2d) || n.outputs.size() != 1 || !n.attributes) return nullptr;
  const auto* attrs = static_cast<const Conv2dAttrs*>(n.attributes.get());
  if (attrs->activation != ConvActivation::none) return nullptr;
  const DType dt = n.outputs[0].dtype;
  return dt == f32 || dt == f64 ? attrs : nullptr;
}

// New nodes inserted before existing ones: appended while rewriting (so ids stay valid), moved into
// place by apply() at the end.
class Insertions {
 public:
  explicit Insertions(Graph& graph) : graph_(graph), first_new_(static_cast<int32_t>(graph.nodes().size())) {}

  // An op node like `like` (device, placement, source) computing `meta`, to sit before node `before`.
  ValueRef op(const Op& op, std::vector<ValueRef> inputs, TensorMeta meta, const Node& like, int32_t before,
              std::shared_ptr<const void> attributes = nullptr) {
    Node n;
    n.kind = NodeKind::op;
    n.op = &op;
    n.inputs = std::move(inputs);
    n.outputs = {std::move(meta)};
    n.attributes = std::move(attributes);
    n.device = like.device;
    n.requested_device = like.requested_device;
    n.placement_reason = "with the convolution it folds into (fuse_convolutions)";
    n.source = like.source;
    return add(std::move(n), before);
  }
  ValueRef constant(Tensor value, int32_t before) {
    const int32_t id = graph_.add_constant(std::move(value));
    before_.push_back(before);
    return {id, 0};
  }

  // Moves every new node to just before its node (in the order they were added) and renumbers.
  void apply() {
    const auto count = static_cast<int32_t>(graph_.nodes().size());
    if (count == first_new_) return;
    std::vector<std::vector<int32_t>> ahead(static_cast<size_t>(first_new_));
    for (int32_t k = 0; k < count - first_new_; ++k) ahead[static_cast<size_t>(before_[static_cast<size_t>(k)])].push_back(first_new_ + k);
    std::vector<int32_t> order;
    order.reserve(static_cast<size_t>(count));
    for (int32_t i = 0; i < first_new_; ++i) {
      for (int32_t id : ahead[static_cast<size_t>(i)]) order.push_back(id);
      order.push_back(i);
    }
    std::vector<int32_t> position(static_cast<size_t>(count));
    for (size_t k = 0; k < order.size(); ++k) position[static_cast<size_t>(order[k])] = static_cast<int32_t>(k);
    auto renumber = [&](int32_t id) { return id < 0 ? id : position[static_cast<size_t>(id)]; };
    std::vector<Node>& nodes = graph_.mutable_nodes();
    std::vector<Node> reordered;
    reordered.reserve(nodes.size());
    for (int32_t id : order) {
      Node n = std::move(nodes[static_cast<size_t>(id)]);
      for (ValueRef& in : n.inputs) in.node = renumber(in.node);
      for (int32_t& c : n.control_inputs) c = renumber(c);
      n.gradient_of = renumber(n.gradient_of);
      reordered.push_back(std::move(n));
    }
    nodes = std::move(reordered);
    std::vector<ValueRef> outputs = graph_.outputs();
    for (ValueRef& out : outputs) out.node = renumber(out.node);
    graph_.set_outputs(std::move(outputs));
    std::vector<int32_t> effects = graph_.effects();
    for (int32_t& e : effects) e = renumber(e);
    graph_.set_effects(std::move(effects));
  }

 private:
  ValueRef add(Node node, int32_t before) {
    const int32_t id = graph_.add_node(std::move(node));
    before_.push_back(before);
    return {id, 0};
  }
  Graph& graph_;
  int32_t first_new_;
  std::vector<int32_t> before_;  // per new node: the existing node it goes before
};

// Rewrite 1 on node `id` (a batch_norm_inference) when its input is a foldable conv2d.
void fold_batch_norm(Graph& graph, const Readers& readers, Insertions& insert, int32_t id) {
  const Node& norm = graph.node(id);
  if (norm.inputs.size() != 5 || norm.outputs.size() != 1 || !norm.attributes) return;
  const ValueRef conv_value = norm.inputs[0];
  const Conv2dAttrs* conv_attrs = plain_conv(graph, conv_value);
  if (conv_attrs == nullptr) return;
  if (!readers.only_reader_is_one_node(conv_value.node)) return;  // its only reader is this node
  const Node conv = graph.node(conv_value.node);  // a copy: adding nodes may move the vector
  if (conv.device != norm.device) return;
  const DType dt = conv.outputs[0].dtype;
  const Shape weight_shape = graph.meta(conv.inputs[1]).shape;  // a copy: insertions move nodes
  const int64_t channels = weight_shape[0];
  for (size_t i = 1; i < 5; ++i) {
    const TensorMeta& stat = graph.meta(norm.inputs[i]);
    if (stat.dtype != dt || stat.shape != Shape{channels}) return;
  }
  if (conv.inputs.size() == 3 && graph.meta(conv.inputs[2]).dtype != dt) return;
  const double eps = static_cast<const NormAttrs*>(norm.attributes.get())->eps;
  const ValueRef gamma = norm.inputs[1], beta = norm.inputs[2], mean = norm.inputs[3], var = norm.inputs[4];

  const Op& add = elementwise_op(ElementwiseOp::add);
  const Op& sub = elementwise_op(ElementwiseOp::sub);
  const Op& mul = elementwise_op(ElementwiseOp::mul);
  const Op& div = elementwise_op(ElementwiseOp::div);
  const Op& sqrt = elementwise_op(ElementwiseOp::sqrt);
  const TensorMeta per_channel{Shape{channels}, dt};
  // s = gamma / sqrt(var + eps)
  const ValueRef eps_value = insert.constant(full(Shape{}, eps, dt, graph.node(var.node).device), id);
  const ValueRef shifted = insert.op(add, {var, eps_value}, per_channel, conv, id);
  const ValueRef root = insert.op(sqrt, {shifted}, per_channel, conv, id);
  const ValueRef scale = insert.op(div, {gamma, root}, per_channel, conv, id);
  // w' = w * s[o]
  const Shape column{channels, 1, 1, 1};
  const ValueRef scale_column = insert.op(reshape_op, {scale}, TensorMeta{column, dt}, conv, id,
                                          std::make_shared<const ReshapeAttrs>(ReshapeAttrs{column}));
  const ValueRef weight = insert.op(mul, {conv.inputs[1], scale_column}, TensorMeta{weight_shape, dt}, conv, id);
  // b' = (b - mean) * s + beta
  const ValueRef centred = conv.inputs.size() == 3 ? insert.op(sub, {conv.inputs[2], mean}, per_channel, conv, id)
                                                   : insert.op(elementwise_op(ElementwiseOp::neg), {mean}, per_channel, conv, id);
  const ValueRef scaled = insert.op(mul, {centred, scale}, per_channel, conv, id);
  const ValueRef bias = insert.op(add, {scaled, beta}, per_channel, conv, id);

  Node& folded = graph.node(id);
  folded.op = conv.op;
  folded.attributes = conv.attributes;
  folded.inputs = {conv.inputs[0], weight, bias};
  merge_control_inputs(folded, conv);
  graph.node(conv_value.node).removed = true;
}

// Rewrite 2 on node `id` (a relu) when its input is a conv2d read by nothing else but greater(x, 0)
// nodes after the relu.
void fuse_relu(Graph& graph, const Readers& readers, int32_t id) {
  if (graph.node(id).inputs.size() != 1) return;
  const ValueRef conv_value = graph.node(id).inputs[0];
  const Conv2dAttrs* attrs = plain_conv(graph, conv_value);
  if (attrs == nullptr) return;
  const auto tests = relu_takeover_tests(graph, readers, id);
  if (!tests) return;
  Conv2dAttrs fused = *attrs;
  fused.activation = ConvActivation::relu;
  graph.node(conv_value.node).attributes = std::make_shared<const Conv2dAttrs>(fused);
  take_over_relu(graph, id, *tests);
}

}  // namespace

bool conv_fusion_enabled_by_environment() {
  const char* env = std::getenv("FLOWLET_CONV_FUSION");
  return env == nullptr || std::strcmp(env, "0") != 0;
}

void fuse_convolutions(Graph& graph) {
  const ConvOps& ops = conv_ops();
  if (ops.conv2d == nullptr) return;
  if (ops.batch_norm_inference != nullptr) {
    const Readers readers(graph);
    Insertions insert(graph);
    const size_t count = graph.nodes().size();
    for (size_t i = 0; i < count; ++i) {
      if (is_live_op(graph.node(static_cast<int32_t>(i)), ops.batch_norm_inference)) {
        fold_batch_norm(graph, readers, insert, static_cast<int32_t>(i));
      }
    }
    insert.apply();
  }
  // Readers again: the folding renumbered the graph and made new convolutions.
  const Readers readers(graph);
  const Op* relu = &elementwise_op(ElementwiseOp::relu);
  for (size_t i = 0; i < graph.nodes().size(); ++i) {
    if (is_live_op(graph.node(static_cast<int32_t>(i)), relu)) fuse_relu(graph, readers, static_cast<int32_t>(i));
  }
}

}  // namespace flowlet::detail
