#include "ops/transfer.hpp"

#include <memory>

#include <fmt/format.h>

#include "core/check.hpp"
#include "runtime/rendezvous.hpp"
#include "runtime/step_context.hpp"
#include "flowlet/core/storage.hpp"
#include "ops/internal.hpp"
#include "ops/registry.hpp"

namespace flowlet::detail {
namespace {

Rendezvous& rendezvous_of(const OpCall& call) {
  if (call.step == nullptr || call.step->rendezvous == nullptr) {
    fail<InvalidArgument>("{}: runs only inside a partitioned graph step (the partition pass inserts it)",
                          call.op.name);
  }
  return *call.step->rendezvous;
}

void send_infer(const OpCall& call, OutputSpec& spec) {
  spec.count = 0;
  spec.device = call.attrs<TransferAttrs>().source;
}

void recv_infer(const OpCall& call, OutputSpec&) {
  fail<InvalidArgument>("{}: its output is known only when the step runs", call.op.name);
}

void send_kernel(const OpCall& call, std::span<Tensor>) {
  const auto& attrs = call.attrs<TransferAttrs>();
  Tensor value = call.inputs.empty() ? Tensor() : call.inputs[0];
  const int64_t bytes =
      value.defined() ? value.numel() * static_cast<int64_t>(dtype_size(value.dtype())) : int64_t{0};
  rendezvous_of(call).send(attrs.slot, std::move(value), bytes);
}

struct Waiting {
  std::span<Tensor> outputs;
  Device destination;
  AsyncDone done;
};

void recv_kernel(const OpCall& call, std::span<Tensor> outputs, AsyncDone done) {
  const auto& attrs = call.attrs<TransferAttrs>();
  Rendezvous& rendezvous = rendezvous_of(call);
  // Owned by the receiver callback once receive() accepted it (it runs now or on the sender's
  // thread and frees it); freed here if receive() throws instead.
  auto waiting = std::make_unique<Waiting>(Waiting{outputs, attrs.destination, done});
  rendezvous.receive(
      attrs.slot,
      [](void* context, Tensor value, std::exception_ptr error) {
        std::unique_ptr<Waiting> w(static_cast<Waiting*>(context));
        if (!error && !w->outputs.empty()) {
          try {
            w->outputs[0] = deliver_to(value, w->destination);
          } catch (...) {
            error = std::current_exception();
          }
        }
        w->done(std::move(error));
      },
      waiting.get());
  (void)waiting.release();
}

}  // namespace

Tensor deliver_to(const Tensor& value, Device destination) {
  if (value.device() == destination) return value;
  if (value.device().kind() != DeviceKind::cpu || destination.kind() != DeviceKind::cpu) {
    return copy_to_device(value, destination);
  }
  const Ref<Storage>& source = value.storage();
  auto keeps_source_alive = std::make_shared<Ref<Storage>>(source);
  auto view = make_ref<Storage>(source->data(), source->bytes(), destination, std::move(keeps_source_alive));
  return Tensor::view(std::move(view), value.shape(), value.strides(), value.offset(), value.dtype());
}

std::string TransferAttrs::describe() const {
  return fmt::format("key='{}', slot={}, from={}, to={}{}", key, slot, source, destination,
                     control ? ", control=true" : "");
}

// Both move handles only (a copy between device kinds is deliver_to's, through dispatch), so one
// kernel serves every device kind (kAnyDevice).
Op send_op{.name = "send",
           .max_inputs = 1,
           .flags = kGraphOnly | kStateful | kView | kAnyDevice,
           .infer = &send_infer,
           .kernels = {&send_kernel},
           .copy_attributes = &copy_attributes<TransferAttrs>,
           .describe_attributes = &describe_attributes<TransferAttrs>};
Op recv_op{.name = "recv",
           .flags = kGraphOnly | kStateful | kView | kAnyDevice,
           .infer = &recv_infer,
           .copy_attributes = &copy_attributes<TransferAttrs>,
           .describe_attributes = &describe_attributes<TransferAttrs>,
           .async_kernels = {&recv_kernel}};

void add_transfer_ops(std::vector<Op*>& ops) { ops.insert(ops.end(), {&send_op, &recv_op}); }

}  // namespace flowlet::detail
