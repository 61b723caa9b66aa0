// queue_dequeue and queue_enqueue: the stateful graph nodes that Queue::dequeue and Queue::enqueue
// record inside a traced function. Both are asynchronous kernels: a node that has to wait parks a
// callback in the queue (no thread waits), and the step's cancellation takes it back out.
#include <mutex>

#include <fmt/format.h>

#include "core/check.hpp"
#include "exec/cancellation.hpp"
#include "exec/step_context.hpp"
#include "flowlet/core/format.hpp"
#include "queue/queue_internal.hpp"
#include "trace/tracer.hpp"

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

void check_in_step(const OpCall& call) {
  if (call.step == nullptr || call.step->cancellation == nullptr) {
    fail<InvalidArgument>("{}: runs only inside a graph step (Queue::{} records it while tracing)", call.op.name,
                          call.op.name == "queue_dequeue" ? "dequeue" : "enqueue");
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

void dequeue_infer(const OpCall& call, OutputSpec&) {
  fail<InvalidArgument>("{}: records only through Queue::dequeue while tracing", call.op.name);
}

void enqueue_infer(const OpCall& call, OutputSpec& spec) {
  (void)call;
  spec.count = 0;
}

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

Op queue_dequeue_op{"queue_dequeue", 0, 0, kStateful | kView, &dequeue_infer, {}, nullptr,
                    &copy_attributes<QueueOpAttrs>, &describe_attributes<QueueOpAttrs>, {&dequeue_kernel, nullptr}};
Op queue_enqueue_op{"queue_enqueue", 0, kMaxOutputs, kStateful | kView, &enqueue_infer, {}, nullptr,
                    &copy_attributes<QueueOpAttrs>, &describe_attributes<QueueOpAttrs>, {&enqueue_kernel, nullptr}};

void check_graph_item_size(const char* op, const QueueState& s, const std::string& name, size_t size) {
  (void)s;
  if (size > static_cast<size_t>(kMaxOutputs)) {
    fail<InvalidArgument>("{}: a traced item of queue '{}' holds at most {} tensors; got {}", op, name, kMaxOutputs,
                          size);
  }
}

}  // namespace

std::vector<Tensor> record_dequeue(const std::shared_ptr<QueueState>& state, const std::string& name) {
  const std::vector<Tensor> first = wait_for_first_item(*state, "dequeue");
  check_graph_item_size("dequeue", *state, name, first.size());
  QueueOpAttrs attrs{state, name, {}, first.empty() ? Device() : first[0].device()};
  OutputSpec spec;
  spec.count = static_cast<int>(first.size());
  spec.device = attrs.device;
  for (size_t k = 0; k < first.size(); ++k) {
    attrs.item.push_back(TensorMeta{first[k].shape(), first[k].dtype()});
    spec.outputs[k] = attrs.item.back();
  }
  std::array<Tensor, kMaxOutputs> outputs;
  TraceBuilder* trace = active_trace();
  const int32_t node = trace->record(queue_dequeue_op, {}, &attrs, spec,
                                     std::span<Tensor>(outputs.data(), first.size()), state.get(), /*writes=*/true);
  trace->graph().node(node).name = fmt::format("dequeue_{}_{}", name, node);
  return std::vector<Tensor>(outputs.begin(), outputs.begin() + static_cast<std::ptrdiff_t>(first.size()));
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
  OutputSpec spec;
  spec.count = 0;
  spec.device = item.empty() ? Device() : item[0].device();
  TraceBuilder* trace = active_trace();
  const int32_t node = trace->record(queue_enqueue_op, item, &attrs, spec, {}, state.get(), /*writes=*/true);
  trace->graph().node(node).name = fmt::format("enqueue_{}_{}", name, node);
}

}  // namespace flowlet::detail
