// all_reduce, broadcast, all_gather, reduce_scatter and barrier as ops of the one table, and the
// public functions of flowlet/collective.hpp, each one line through dispatch.
//
// Every call belongs to one participant of one communicator (the attributes hold both). Eagerly the
// op runs a synchronous kernel (Communicator::run); in a graph the executor prefers the
// asynchronous kernel, which starts the collective and completes through AsyncDone, so a node
// waiting for its peers holds no executor thread. The ops are stateful, ordered on their
// communicator: the tracer keeps one communicator's collectives in program order (so every
// participant issues them in the same order), and no pass folds, merges or prunes them. The node
// runs on its participant's device whatever the device scope (kPlacesOutput, kRunsAtResource): the
// communicator serves exactly that device.
#include <limits>

#include <fmt/format.h>

#include "collective/ops/collective_attrs.hpp"
#include "collective/ops/header_checks.hpp"
#include "collective/replica_context.hpp"
#include "core/check.hpp"
#include "core/device_scope_state.hpp"
#include "flowlet/collective.hpp"
#include "flowlet/dispatch.hpp"
#include "ops/registry.hpp"

namespace flowlet::detail {

std::string CollectiveAttrs::participant() const {
  return fmt::format("participant {} of {}", rank(), communicator->describe());
}

std::string CollectiveAttrs::describe() const {
  return fmt::format("participant={}, participants={}, op={}, root={}", rank(), communicator->size(), to_string(op),
                     root);
}

namespace {

// b8 reduces as logic: max is "any", min is "all"; a sum or mean of truth values has no b8 result.
void check_reduction(std::string_view name, const CollectiveAttrs& attrs, const Tensor& t) {
  if (t.dtype() == DType::b8 && (attrs.op == ReduceOp::sum || attrs.op == ReduceOp::mean)) {
    fail<DTypeError>("{}: b8 tensors reduce with max (any) or min (all); got ReduceOp::{} on b8 {}", name,
                     to_string(attrs.op), t.shape());
  }
}

void collective_infer(const OpCall& call, OutputSpec& spec) {
  const auto& attrs = call.attrs<CollectiveAttrs>();
  const std::string_view name = call.op.name;
  const Communicator& comm = *attrs.communicator;
  const int64_t participants = comm.size();
  spec.device = comm.device(attrs.local);
  if (attrs.kind == CollectiveKind::barrier) {
    spec.count = 0;
    return;
  }
  const Tensor& t = call.inputs[0];
  if (t.device() != spec.device) {
    fail<DeviceError>("{}: the input is on {}, but {} runs on {}; move the tensor there first", name, t.device(),
                      attrs.participant(), spec.device);
  }
  Shape shape = t.shape();
  switch (attrs.kind) {
    case CollectiveKind::all_reduce:
      check_reduction(name, attrs, t);
      break;
    case CollectiveKind::broadcast:
      if (attrs.root < 0 || attrs.root >= participants) {
        fail<InvalidArgument>("{}: root {} is outside [0, {}) ({})", name, attrs.root, participants,
                              attrs.participant());
      }
      break;
    case CollectiveKind::all_gather:
      if (t.rank() == 0) {
        shape = Shape{participants};
      } else if (shape[0] > std::numeric_limits<int64_t>::max() / participants) {
        fail<ShapeError>("{}: {} parts of shape {} do not fit int64 along axis 0", name, participants, t.shape());
      } else {
        shape[0] *= participants;
      }
      break;
    case CollectiveKind::reduce_scatter:
      check_reduction(name, attrs, t);
      if (t.rank() == 0 || shape[0] % participants != 0) {
        fail<ShapeError>("{}: axis 0 must split into {} equal parts (one per participant); got shape {}", name,
                         participants, t.shape());
      }
      shape[0] /= participants;
      break;
    case CollectiveKind::barrier:
      break;
  }
  spec.outputs[0] = TensorMeta{shape, t.dtype()};
}

CollectiveCall make_call(const CollectiveAttrs& attrs, const OpCall& call, bool traced) {
  CollectiveCall c;
  c.kind = attrs.kind;
  c.op = attrs.op;
  c.root = attrs.root;
  // The communicator takes contiguous buffers, and a view (an eager transpose, a graph's view node)
  // is copied where it is: an eager DeviceScope around the call must not move it off the
  // participant's device.
  if (!call.inputs.empty()) {
    const NoDeviceScope here;
    c.input = call.inputs[0].contiguous();
  }
  c.check_header = should_check_header(attrs, c.input, traced);
  return c;
}

void collective_kernel(const OpCall& call, std::span<Tensor> outputs) {
  const auto& attrs = call.attrs<CollectiveAttrs>();
  CollectiveCall c = make_call(attrs, call, /*traced=*/false);
  const bool checked = c.check_header;
  const Tensor input = c.input;
  Tensor result = attrs.communicator->run(attrs.local, std::move(c));
  if (checked) mark_verified(attrs, input, /*traced=*/false);
  if (!outputs.empty()) outputs[0] = std::move(result);
}

void collective_async_kernel(const OpCall& call, std::span<Tensor> outputs, AsyncDone done) {
  // The attributes belong to the graph's node, which outlives the step.
  const auto& attrs = call.attrs<CollectiveAttrs>();
  CollectiveCall c = make_call(attrs, call, /*traced=*/true);
  const bool checked = c.check_header;
  attrs.communicator->start(attrs.local, std::move(c),
                            [&attrs, checked, outputs, done](Tensor result, std::exception_ptr error) {
                              if (!error) {
                                if (checked) mark_verified(attrs, Tensor(), /*traced=*/true);
                                if (!outputs.empty()) outputs[0] = std::move(result);
                              }
                              done(std::move(error));
                            });
}

ResourceAccess uses_communicator(const void* attributes) {
  return {static_cast<const CollectiveAttrs*>(attributes)->communicator.get(), /*writes=*/true};
}

// kView: the communicator allocates the result itself; kAnyDevice: the communicator moves data on
// whichever device its participant has, so the CPU kernels serve every backend.
constexpr uint32_t kCollectiveFlags = kStateful | kView | kPlacesOutput | kRunsAtResource | kAnyDevice;

// constexpr, and the ops constinit: the table may be built during another file's static
// initialization, so the Op values must not wait for dynamic initialization.
constexpr Op make_collective_op(std::string_view name, int inputs, GradFn grad) {
  return Op{.name = name,
            .min_inputs = inputs,
            .max_inputs = inputs,
            .flags = kCollectiveFlags,
            .infer = &collective_infer,
            .kernels = {&collective_kernel},
            .grad = grad,
            .copy_attributes = &copy_attributes<CollectiveAttrs>,
            .describe_attributes = &describe_attributes<CollectiveAttrs>,
            .async_kernels = {&collective_async_kernel},
            .resource = &uses_communicator};
}

constinit Op all_reduce_op = make_collective_op("all_reduce", 1, &all_reduce_grad);
constinit Op broadcast_op = make_collective_op("broadcast", 1, &broadcast_grad);
constinit Op all_gather_op = make_collective_op("all_gather", 1, &all_gather_grad);
constinit Op reduce_scatter_op = make_collective_op("reduce_scatter", 1, &reduce_scatter_grad);
constinit Op barrier_op = make_collective_op("barrier", 0, nullptr);

const Op& op_of(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::all_reduce:
      return all_reduce_op;
    case CollectiveKind::broadcast:
      return broadcast_op;
    case CollectiveKind::all_gather:
      return all_gather_op;
    case CollectiveKind::reduce_scatter:
      return reduce_scatter_op;
    case CollectiveKind::barrier:
      return barrier_op;
  }
  fail<InvalidArgument>("collective: unknown kind {}", static_cast<int>(kind));
}

}  // namespace

CollectiveAttrs participant_attrs(CollectiveKind kind, ReduceOp op, int root) {
  CollectiveAttrs attrs;
  if (const ReplicaContext* replica = current_replica()) {
    attrs.communicator = replica->communicator;
    attrs.local = replica->local;
  } else {
    attrs.communicator = world_communicator();
  }
  attrs.kind = kind;
  attrs.op = op;
  attrs.root = root;
  return attrs;
}

Tensor dispatch_collective(const CollectiveAttrs& attrs, const Tensor& input) {
  const Op& op = op_of(attrs.kind);
  if (attrs.kind == CollectiveKind::barrier) {
    dispatch_all(op, {}, &attrs);
    return Tensor();
  }
  return dispatch(op, std::span<const Tensor>(&input, 1), &attrs);
}

void add_collective_ops(std::vector<Op*>& ops) {
  ops.insert(ops.end(), {&all_reduce_op, &broadcast_op, &all_gather_op, &reduce_scatter_op, &barrier_op});
}

}  // namespace flowlet::detail

namespace flowlet {

using detail::CollectiveKind;
using detail::dispatch_collective;
using detail::participant_attrs;

Tensor all_reduce(const Tensor& t, ReduceOp op) {
  return dispatch_collective(participant_attrs(CollectiveKind::all_reduce, op), t);
}

Tensor broadcast(const Tensor& t, int root) {
  return dispatch_collective(participant_attrs(CollectiveKind::broadcast, ReduceOp::sum, root), t);
}

Tensor all_gather(const Tensor& t) { return dispatch_collective(participant_attrs(CollectiveKind::all_gather), t); }

Tensor reduce_scatter(const Tensor& t, ReduceOp op) {
  return dispatch_collective(participant_attrs(CollectiveKind::reduce_scatter, op), t);
}

void barrier() { (void)dispatch_collective(participant_attrs(CollectiveKind::barrier), Tensor()); }

}  // namespace flowlet
