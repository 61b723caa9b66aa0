// fuse_matmul_bias: a dense layer's forward, add(matmul(a, w), bias) with bias [n] broadcast over
// the rows of the [m, n] product (either operand order), becomes one matmul_bias node
// (src/ops/matmul_bias.hpp), and a relu reading it is taken over too (activation relu). Eager code
// writes the product, reads it to add the bias into a new tensor and reads that for relu; the fused
// node writes the bias rows, lets the GEMM accumulate into them and applies relu in place.
//
// Where: a live matmul of two rank-2 operands, more than one row (see fusible_product), whose
// output is read only by this add (not a graph output, control input or effect); the add's other
// operand is [n]; a, w, bias and the result one dtype, f32 or f64; matmul and add on one CPU
// device (the fused op has only a CPU kernel). The relu is taken over where the add's value is
// read only by it and by greater(z, 0) nodes after it (relu's gradient; they read the relu's value
// instead: pattern_readers.hpp); in a training graph
// the matmul's gradient reads a and w, never the product, so training graphs fuse too.
//
// Relies on (flowlet/graph.hpp): topological order, live inputs. Runs after place() and
// fuse_convolutions, before fuse_variable_updates and fuse_elementwise (which would otherwise take
// the relu). Keeps: the add becomes the matmul_bias node at its own id, name and uses (its inputs,
// the matmul's operands, come before the matmul and so before it; it takes the matmul's control
// inputs); a taken-over relu's uses read it. Removed nodes stay in place with `removed` set.
//
// Switched off with PassOptions::fuse_matmul_bias = false or FLOWLET_DENSE_FUSION=0 (which also
// turns off fuse_relu_bias_grad; measuring, tests comparing fused with unfused graphs).
#include <cstdlib>
#include <cstring>
#include <memory>

#include "ops/elementwise_ops.hpp"
#include "ops/known_ops.hpp"
#include "ops/matmul_bias.hpp"
#include "trace/passes/passes.hpp"
#include "trace/passes/pattern_readers.hpp"

namespace flowlet::detail {
namespace {

bool is_dense_dtype(DType dt) { return dt == f32 || dt == f64; }

// The operand index (0 or 1) of add node `id` that is a matmul this pass may absorb, or -1.
int fusible_product(const Graph& graph, const Readers& readers, int32_t id) {
  const Node& add = graph.node(id);
  if (add.inputs.size() != 2 || add.outputs.size() != 1 || add.device.kind() != DeviceKind::cpu) return -1;
  const TensorMeta& out = add.outputs[0];
  if (out.shape.rank() != 2 || !is_dense_dtype(out.dtype)) return -1;
  // One row (a batch-1 step) is left alone: the add is 1 x n there, so fusing saves nothing, and
  // the fused node measured slower (bench_trace's 1-thread SGD step at batch 1, quiet machine,
  // 11:33-11:53: traced 68.5 us fused, 48.1 unfused, 51.7 with this rule; profile_step: the two
  // matmul_bias nodes took 23-29 us per step where the two matmuls they replace took 15-18).
  if (out.shape[0] == 1) return -1;
  for (int side = 0; side < 2; ++side) {
    const ValueRef product = add.inputs[static_cast<size_t>(side)];
    const ValueRef bias = add.inputs[static_cast<size_t>(1 - side)];
    const Node& mm = graph.node(product.node);
    if (product.output != 0 || !is_live_op(mm, &matmul_op) || mm.inputs.size() != 2 || mm.device != add.device) continue;
    if (!readers.only_reader_is_one_node(product.node)) continue;  // its only reader is this add
    const TensorMeta& a = graph.meta(mm.inputs[0]);
    const TensorMeta& w = graph.meta(mm.inputs[1]);
    const TensorMeta& b = graph.meta(bias);
    if (a.shape.rank() != 2 || w.shape.rank() != 2 || mm.outputs[0].shape != out.shape) continue;
    if (a.dtype != out.dtype || w.dtype != out.dtype || b.dtype != out.dtype) continue;
    if (b.shape != Shape{out.shape[1]}) continue;
    return side;
  }
  return -1;
}

void fuse_at(Graph& graph, const Readers& readers, int32_t id, int side) {
  const ValueRef product = graph.node(id).inputs[static_cast<size_t>(side)];
  const ValueRef bias = graph.node(id).inputs[static_cast<size_t>(1 - side)];
  Node& mm = graph.node(product.node);
  Node& fused = graph.node(id);
  fused.op = &matmul_bias_op;
  fused.inputs = {mm.inputs[0], mm.inputs[1], bias};
  fused.attributes = std::make_shared<const MatmulBiasAttrs>();
  merge_control_inputs(fused, mm);
  mm.removed = true;

  const Op& relu = elementwise_op(ElementwiseOp::relu);
  for (int32_t reader : readers.of[static_cast<size_t>(id)]) {
    if (!is_live_op(graph.node(reader), &relu)) continue;
    const auto tests = relu_takeover_tests(graph, readers, reader);
    if (!tests) return;
    graph.node(id).attributes = std::make_shared<const MatmulBiasAttrs>(MatmulBiasAttrs{DenseActivation::relu});
    take_over_relu(graph, reader, *tests);
    return;
  }
}

}  // namespace

bool dense_fusion_enabled_by_environment() {
  const char* env = std::getenv("FLOWLET_DENSE_FUSION");
  return env == nullptr || std::strcmp(env, "0") != 0;
}

void fuse_matmul_bias(Graph& graph) {
  const Readers readers(graph);
  const Op* add = &elementwise_op(ElementwiseOp::add);
  for (size_t i = 0; i < graph.nodes().size(); ++i) {
    const auto id = static_cast<int32_t>(i);
    if (!is_live_op(graph.node(id), add)) continue;
    const int side = fusible_product(graph, readers, id);
    if (side >= 0) fuse_at(graph, readers, id, side);
  }
}

}  // namespace flowlet::detail
