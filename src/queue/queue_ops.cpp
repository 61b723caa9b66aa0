// queue_dequeue and queue_enqueue: the stateful graph nodes that Queue::dequeue and Queue::enqueue
// record inside a traced function. Both are asynchronous kernels: a node that has to wait parks a
// callback in the queue (no thread waits), and the step's cancellation takes it back out.
#include <mutex>

#include <fmt/format.h>

#include "core/check.hpp"
#include "runtime/cancellation.hpp"
#include "runtime/step_context.hpp"
#include "flowlet/core/format.hpp"
#include "flowlet/dispatch.hpp"
#include "ops/registry.hpp"
#include "queue/queue_internal.hpp"

namespace flowlet::detail {
namespace {

struct QueueOpAttrs {
  std::shared_ptr<QueueState> state;
  std::string queue_name;
  std::vector<TensorMeta> item;  // dequeue: the traced signature every item must match
  Device device;                 // dequeue: where the traced item's tensors lived
  std::string describe() const {
    std::string text = fmt::format("queue='{}'", queue_name);
    for (const TensorMeta& m : item) text += fmt::format(", {} {}", m.dtype, m.shape);
    return text;
  }
};

// "dequeue" or "enqueue": the Queue method that records `op`.
const char* queue_method(const Op& op);

void check_in_step(const OpCall& call) {
  if (call.step == nullptr || call.step->cancellation == nullptr) {
    fail<InvalidArgument>("{}: runs only inside a graph step (Queue::{} records it while tracing)", call.op.name,
                          queue_method(call.op));
  }
}

// Joins a parked queue waiter to the step's cancellation, whichever of "the wait ended" and
// "the step was cancelled" comes first.
class CancellableWait : public std::enable_shared_from_this<CancellableWait> {
 public:
  CancellableWait(std::shared_ptr<QueueState> state, Cancellation& cancellation)
      : state_(std::move(state)), cancellation_(cancellation) {}

  // After the queue call returned the waiter's id.
  void watch(int64_t id) {
    auto self = shared_from_this();
    const Cancellation::Token token = cancellation_.on_cancel([self, id] {
      abandon_waiter(*self->state_, id, std::make_exception_ptr(Cancelled("queue wait: the step was cancelled")));
    });
    if (token == Cancellation::kAlreadyCancelled) {
      abandon_waiter(*state_, id, std::make_exception_ptr(Cancelled("queue wait: the step was cancelled")));
      return;
    }
    std::lock_guard lock(mutex_);
    if (ended_) {
      cancellation_.forget(token);
    } else {
      token_ = token;
    }
  }
  // From the waiter's callback, before it reports.
  void ended() {
    Cancellation::Token token;
    {
      std::lock_guard lock(mutex_);
      ended_ = true;
      token = token_;
    }
    if (token >= 0) cancellation_.forget(token);
  }

 private:
  std::shared_ptr<QueueState> state_;
  Cancellation& cancellation_;
  std::mutex mutex_;
  bool ended_ = false;
  Cancellation::Token token_ = -1;
};

// The item's signature comes from the attributes: record_dequeue saw the queue's first item.
void dequeue_infer(const OpCall& call, OutputSpec& spec) {
  const auto& attrs = call.attrs<QueueOpAttrs>();
  spec.count = static_cast<int>(attrs.item.size());
  spec.device = attrs.device;
  for (size_t k = 0; k < attrs.item.size(); ++k) spec.outputs[k] = attrs.item[k];
}

void enqueue_infer(const OpCall&, OutputSpec& spec) { spec.count = 0; }

// The item a graph dequeue returns must match what the graph was traced with: its nodes were sized
// for that.
void check_item(const QueueOpAttrs& attrs, const std::vector<Tensor>& item) {
  if (item.size() != attrs.item.size()) {
    fail<InvalidArgument>("queue_dequeue: queue '{}' gave an item of {} tensors; the traced graph expects {}",
                          attrs.queue_name, item.size(), attrs.item.size());
  }
  for (size_t k = 0; k < item.size(); ++k) {
    const TensorMeta& want = attrs.item[k];
    if (item[k].dtype() != want.dtype || !(item[k].shape() == want.shape) || item[k].device() != attrs.device) {
      fail<InvalidArgument>(
          "queue_dequeue: component {} of an item of queue '{}' is {} {} on {}; the function was traced with {} {} on "
          "{}; items of a traced dequeue keep one signature (trace again for another, or make the sizes equal)",
          k, attrs.queue_name, item[k].dtype(), item[k].shape(), item[k].device(), want.dtype, want.shape,
          attrs.device);
    }
  }
}

void dequeue_kernel(const OpCall& call, std::span<Tensor> outputs, AsyncDone done) {
  check_in_step(call);
  const auto& attrs = call.attrs<QueueOpAttrs>();
  auto wait = std::make_shared<CancellableWait>(attrs.state, *call.step->cancellation);
  const int64_t id = dequeue_async(*attrs.state, [wait, &attrs, outputs, done](std::vector<Tensor> item,
                                                                              std::exception_ptr error) {
    wait->ended();
    if (!error) {
      try {
        check_item(attrs, item);
        for (size_t k = 0; k < item.size(); ++k) outputs[k] = std::move(item[k]);
      } catch (...) {
        error = std::current_exception();
      }
    }
    done(std::move(error));
  });
  wait->watch(id);
}

void enqueue_kernel(const OpCall& call, std::span<Tensor>, AsyncDone done) {
  check_in_step(call);
  const auto& attrs = call.attrs<QueueOpAttrs>();
  auto wait = std::make_shared<CancellableWait>(attrs.state, *call.step->cancellation);
  std::vector<Tensor> item(call.inputs.begin(), call.inputs.end());
  const int64_t id = enqueue_async(*attrs.state, std::move(item), [wait, done](std::exception_ptr error) {
    wait->ended();
    done(std::move(error));
  });
  wait->watch(id);
}

ResourceAccess uses_queue(const void* attributes) {
  return {static_cast<const QueueOpAttrs*>(attributes)->state.get(), /*writes=*/true};
}
std::string dequeue_node_name(const void* attributes) {
  return "dequeue_" + static_cast<const QueueOpAttrs*>(attributes)->queue_name;
}
std::string enqueue_node_name(const void* attributes) {
  return "enqueue_" + static_cast<const QueueOpAttrs*>(attributes)->queue_name;
}

// Both change the queue (a dequeue takes an item out), so both write it: they keep program order.
Op queue_dequeue_op{.name = "queue_dequeue",
                    .flags = kGraphOnly | kStateful | kView,
                    .infer = &dequeue_infer,
                    .copy_attributes = &copy_attributes<QueueOpAttrs>,
                    .describe_attributes = &describe_attributes<QueueOpAttrs>,
                    .async_kernels = {&dequeue_kernel},
                    .resource = &uses_queue,
                    .node_name = &dequeue_node_name};
Op queue_enqueue_op{.name = "queue_enqueue",
                    .max_inputs = kMaxOutputs,
                    .flags = kGraphOnly | kStateful | kView,
                    .infer = &enqueue_infer,
                    .copy_attributes = &copy_attributes<QueueOpAttrs>,
                    .describe_attributes = &describe_attributes<QueueOpAttrs>,
                    .async_kernels = {&enqueue_kernel},
                    .resource = &uses_queue,
                    .node_name = &enqueue_node_name};

const char* queue_method(const Op& op) { return &op == &queue_dequeue_op ? "dequeue" : "enqueue"; }

void check_graph_item_size(const char* op, const QueueState& s, const std::string& name, size_t size) {
  (void)s;
  if (size > static_cast<size_t>(kMaxOutputs)) {
    fail<InvalidArgument>("{}: a traced item of queue '{}' holds at most {} tensors; got {}", op, name, kMaxOutputs,
                          size);
  }
}

}  // namespace

void add_queue_ops(std::vector<Op*>& ops) { ops.insert(ops.end(), {&queue_enqueue_op, &queue_dequeue_op}); }

std::vector<Tensor> record_dequeue(const std::shared_ptr<QueueState>& state, const std::string& name) {
  const std::vector<Tensor> first = wait_for_first_item(*state, "dequeue");
  check_graph_item_size("dequeue", *state, name, first.size());
  QueueOpAttrs attrs{state, name, {}, first.empty() ? Device() : first[0].device()};
  for (const Tensor& t : first) attrs.item.push_back(TensorMeta{t.shape(), t.dtype()});
  return dispatch_all(queue_dequeue_op, {}, &attrs);
}

void record_enqueue(const std::shared_ptr<QueueState>& state, const std::string& name, const std::vector<Tensor>& item) {
  check_graph_item_size("enqueue", *state, name, item.size());
  for (size_t k = 0; k < item.size(); ++k) {
    if (!item[k].defined()) {
      fail<InvalidArgument>("enqueue: component {} of the item for queue '{}' is an empty Tensor handle; got Tensor()",
                            k, name);
    }
  }
  const QueueOpAttrs attrs{state, name, {}, Device()};
  dispatch_all(queue_enqueue_op, item, &attrs);
}

}  // namespace flowlet::detail
