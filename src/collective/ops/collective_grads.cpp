// The collectives' gradient rules, written with public ops and dispatch_collective on the forward
// call's communicator and participant, so they run eagerly, record on outer tapes and trace.
//
// The loss of a collective program is the sum over participants of each participant's loss (every
// participant runs the same program: SPMD). With y_s participant s's output and g_s = dL/dy_s, the
// gradient of participant r's input x_r is itself a collective of the g_s:
//   all_reduce sum     y_s = sum_r x_r                 -> sum_s g_s          (all_reduce sum)
//   all_reduce mean    y_s = mean_r x_r                -> mean_s g_s         (all_reduce mean)
//   all_reduce max/min y_s = max_r x_r                 -> sum_s g_s where x_r holds the extreme,
//                      split evenly between tied participants (the convention of the single-device
//                      max), 0 elsewhere
//   broadcast          y_s = x_root                    -> sum_s g_s on the root, 0 elsewhere
//   all_gather         y_s = [x_0; ...; x_{P-1}]       -> sum_s g_s[part r]  (reduce_scatter sum)
//   reduce_scatter     y_s = (sum_r x_r)[part s]       -> [g_0; ...; g_{P-1}] (all_gather), with
//                      mean and max/min as for all_reduce
// Every participant calls the same collectives in the same order (the tapes replay the same
// program backwards), which is what matching needs.
#include "collective/ops/collective_attrs.hpp"
#include "flowlet/ops/creation.hpp"
#include "flowlet/ops/elementwise.hpp"
#include "flowlet/ops/shape.hpp"

namespace flowlet::detail {
namespace {

// The forward call's participant, calling `kind` with `op`.
Tensor collective_like(const GradCall& call, CollectiveKind kind, ReduceOp op, const Tensor& input) {
  CollectiveAttrs attrs = call.attrs<CollectiveAttrs>();
  attrs.kind = kind;
  attrs.op = op;
  attrs.root = 0;
  attrs.node_has_run = std::make_shared<std::atomic<bool>>(false);  // a new call site
  return dispatch_collective(attrs, input);
}

// The share of the summed gradient `total` that reaches `x` through a max/min whose extreme is
// `extreme` (x's shape): where x holds the extreme, total divided by the number of participants
// that hold it too; 0 elsewhere (and everywhere a NaN made the extreme unequal to every input).
Tensor extreme_share(const GradCall& call, const Tensor& x, const Tensor& extreme, const Tensor& total) {
  const Tensor holds = cast(equal(x, extreme), x.dtype());
  const Tensor holders = collective_like(call, CollectiveKind::all_reduce, ReduceOp::sum, holds);
  return total * holds / maximum(holders, ones_like(holders));
}

}  // namespace

void all_reduce_grad(const GradCall& call, std::span<const Tensor> output_grads, std::span<Tensor> input_grads) {
  const ReduceOp op = call.attrs<CollectiveAttrs>().op;
  const Tensor& g = output_grads[0];
  if (op == ReduceOp::sum || op == ReduceOp::mean) {
    input_grads[0] = collective_like(call, CollectiveKind::all_reduce, op, g);
    return;
  }
  const Tensor total = collective_like(call, CollectiveKind::all_reduce, ReduceOp::sum, g);
  input_grads[0] = extreme_share(call, call.inputs[0], call.outputs[0], total);
}

void broadcast_grad(const GradCall& call, std::span<const Tensor> output_grads, std::span<Tensor> input_grads) {
  const auto& attrs = call.attrs<CollectiveAttrs>();
  const Tensor total = collective_like(call, CollectiveKind::all_reduce, ReduceOp::sum, output_grads[0]);
  input_grads[0] = attrs.rank() == attrs.root ? total : zeros_like(total);
}

void all_gather_grad(const GradCall& call, std::span<const Tensor> output_grads, std::span<Tensor> input_grads) {
  const Tensor part = collective_like(call, CollectiveKind::reduce_scatter, ReduceOp::sum, output_grads[0]);
  input_grads[0] = reshape(part, call.inputs[0].shape());  // a scalar's part is [1]
}

void reduce_scatter_grad(const GradCall& call, std::span<const Tensor> output_grads, std::span<Tensor> input_grads) {
  const auto& attrs = call.attrs<CollectiveAttrs>();
  const Tensor all = collective_like(call, CollectiveKind::all_gather, ReduceOp::sum, output_grads[0]);
  switch (attrs.op) {
    case ReduceOp::sum:
      input_grads[0] = all;
      return;
    case ReduceOp::mean:
      input_grads[0] = all / static_cast<double>(attrs.communicator->size());
      return;
    case ReduceOp::max:
    case ReduceOp::min: {
      const Tensor extreme = collective_like(call, CollectiveKind::all_gather, ReduceOp::sum, call.outputs[0]);
      input_grads[0] = extreme_share(call, call.inputs[0], extreme, all);
      return;
    }
  }
}

}  // namespace flowlet::detail
