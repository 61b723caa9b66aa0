// Gradient tapes. Each thread keeps a stack of live tapes. dispatch() hands every op to
// record_on_tapes(), which appends a node (op, inputs, outputs, copied attributes) to each
// recording tape that tracks one of the inputs; gradient() walks the nodes backwards, calling
// each op's gradient rule. The rules run through dispatch like any op, so an outer tape records
// them (higher-order gradients), while the tape computing gradients is paused.
#include "flowlet/autodiff.hpp"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "core/check.hpp"
#include "core/device_scope_state.hpp"
#include "flowlet/op.hpp"
#include "flowlet/ops/creation.hpp"
#include "flowlet/ops/elementwise.hpp"
#include "flowlet/ops/reduce.hpp"
#include "trace/tracer.hpp"

namespace flowlet {
namespace detail {

struct TapeNode {
  const Op* op;
  std::vector<Tensor> inputs;
  std::vector<Tensor> outputs;
  std::shared_ptr<const void> attributes;
};

struct TapeState {
  bool persistent = false;
  bool used = false;       // a non-persistent tape's gradient() ran
  bool recording = true;   // paused while this tape computes gradients
  TapeState* outer = nullptr;
  std::unordered_set<const TensorImpl*> tracked;
  std::vector<Tensor> watched;  // keeps watched tensors alive, so their addresses stay unique
  std::vector<TapeNode> nodes;
  std::unordered_map<const void*, std::vector<Tensor>> variable_reads;

  bool tracks(const Tensor& t) const { return tracked.count(t.impl_ptr()) != 0; }
  void track(const Tensor& t) {
    if (!is_floating(t.dtype())) return;  // integer and boolean values have no gradient
    if (tracked.insert(t.impl_ptr()).second) watched.push_back(t);
  }
};

namespace {
[[gnu::tls_model("initial-exec")]] thread_local TapeState* innermost_tape = nullptr;
}  // namespace

bool any_tape_active() { return innermost_tape != nullptr; }

void record_on_tapes(const Op& op, std::span<const Tensor> inputs, const void* attributes,
                     std::span<const Tensor> outputs) {
  for (TapeState* tape = innermost_tape; tape; tape = tape->outer) {
    if (!tape->recording || tape->used) continue;
    const bool connected = std::any_of(inputs.begin(), inputs.end(), [&](const Tensor& t) { return tape->tracks(t); });
    if (!connected || !op.grad) continue;
    TapeNode node{&op, {inputs.begin(), inputs.end()}, {outputs.begin(), outputs.end()}, nullptr};
    if (attributes && op.copy_attributes) node.attributes = op.copy_attributes(attributes);
    for (const Tensor& out : outputs) tape->track(out);
    tape->nodes.push_back(std::move(node));
  }
}

namespace {
// Remembers that `value` was read from `variable`, and tracks it.
void note_read(TapeState& tape, const void* variable, const Tensor& value) {
  if (!is_floating(value.dtype())) return;
  auto& reads = tape.variable_reads[variable];
  if (std::none_of(reads.begin(), reads.end(), [&](const Tensor& r) { return r.impl_ptr() == value.impl_ptr(); })) {
    reads.push_back(value);
  }
  tape.track(value);
}
}  // namespace

void note_variable_read(const void* variable, const Tensor& value) {
  for (TapeState* tape = innermost_tape; tape; tape = tape->outer) {
    if (tape->recording && !tape->used) note_read(*tape, variable, value);
  }
}

namespace {

// Pauses a tape while it computes gradients (ops then record only on outer tapes).
class PauseRecording {
 public:
  explicit PauseRecording(TapeState& tape) : tape_(tape), was_(tape.recording) { tape_.recording = false; }
  ~PauseRecording() { tape_.recording = was_; }

 private:
  TapeState& tape_;
  bool was_;
};

// Gradients of `target` with respect to every tracked tensor it depends on, by tensor identity.
std::unordered_map<const TensorImpl*, Tensor> backward(TapeState& tape, const Tensor& target) {
  std::unordered_map<const TensorImpl*, Tensor> grads;
  if (!tape.tracks(target)) return grads;
  grads[target.impl_ptr()] = ones_like(target);
  std::vector<Tensor> output_grads;
  std::vector<Tensor> input_grads;
  for (auto node = tape.nodes.rbegin(); node != tape.nodes.rend(); ++node) {
    bool reached = false;
    output_grads.clear();
    for (const Tensor& out : node->outputs) {
      const auto found = grads.find(out.impl_ptr());
      reached |= found != grads.end();
      output_grads.push_back(found != grads.end() ? found->second : zeros_like(out));
    }
    if (!reached) continue;
    input_grads.assign(node->inputs.size(), Tensor());
    uint64_t wanted = 0;
    for (size_t i = 0; i < node->inputs.size() && i < 64; ++i) {
      if (tape.tracks(node->inputs[i])) wanted |= uint64_t{1} << i;
    }
    const GradCall call{*node->op, node->inputs, node->outputs, node->attributes.get(), wanted};
    {
      // While tracing, the rule's nodes remember the forward node, so they run on its device.
      int32_t forward = -1;
      if (const TraceBuilder* trace = active_trace(); trace && !node->outputs.empty() &&
          node->outputs[0].impl_ptr()->trace_id == trace->id()) {
        forward = node->outputs[0].impl_ptr()->trace_node;
      }
      GradientOfScope gradient_of(forward);
      node->op->grad(call, output_grads, input_grads);
    }
    for (size_t i = 0; i < node->inputs.size(); ++i) {
      const Tensor& input = node->inputs[i];
      if (!input_grads[i].defined() || !tape.tracks(input)) continue;
      if (!(input_grads[i].shape() == input.shape())) {
        fail<Error>("gradient: the rule of {} gave input {} a gradient of shape {} for an input of shape {}",
                    node->op->name, i, input_grads[i].shape(), input.shape());
      }
      auto [slot, fresh] = grads.try_emplace(input.impl_ptr(), input_grads[i]);
      if (!fresh) slot->second = slot->second + input_grads[i];
    }
  }
  return grads;
}

Tensor gradient_or_zeros(const std::unordered_map<const TensorImpl*, Tensor>& grads, const Tensor& source) {
  const auto found = grads.find(source.impl_ptr());
  return found != grads.end() ? found->second : zeros_like(source);
}

}  // namespace
}  // namespace detail

GradientTape::GradientTape(bool persistent) : state_(std::make_unique<detail::TapeState>()) {
  state_->persistent = persistent;
  state_->outer = detail::innermost_tape;
  detail::innermost_tape = state_.get();
}

GradientTape::~GradientTape() {
  // Tapes are scoped, so this is normally the innermost one; unlink it wherever it is.
  for (detail::TapeState** link = &detail::innermost_tape; *link; link = &(*link)->outer) {
    if (*link == state_.get()) {
      *link = state_->outer;
      break;
    }
  }
}

void GradientTape::watch(const Tensor& t) {
  if (!t.defined()) detail::fail<InvalidArgument>("watch: tensor is an empty Tensor handle; got Tensor()");
  state_->track(t);
}

void GradientTape::watch(const Variable& v) {
  if (!v.defined()) detail::fail<InvalidArgument>("watch: variable is an empty Variable handle");
  detail::note_read(*state_, v.identity(), v.value());
}

namespace {
void check_gradient_call(detail::TapeState& tape, const Tensor& target) {
  if (tape.used) {
    throw InvalidArgument(
        "gradient: this tape was already used; a non-persistent tape computes gradients once; "
        "construct GradientTape(/*persistent=*/true) to call gradient() several times");
  }
  if (!target.defined()) detail::fail<InvalidArgument>("gradient: target is an empty Tensor handle; got Tensor()");
  if (!is_floating(target.dtype())) {
    detail::fail<DTypeError>("gradient: target must have a floating dtype; got {}", target.dtype());
  }
}

// The scalar that is differentiated: the target itself, or its sum when it has several elements.
Tensor scalar_target(detail::TapeState& tape, const Tensor& target) {
  if (target.rank() == 0 || !tape.tracks(target)) return target;
  const bool recording = tape.recording;
  tape.recording = true;  // record the sum on this tape too, so the walk starts from it
  Tensor total = sum(target);
  tape.recording = recording;
  return total;
}
}  // namespace

namespace {
// Checks the call, differentiates the (summed) target, and retires a non-persistent tape.
std::unordered_map<const detail::TensorImpl*, Tensor> differentiate(detail::TapeState& tape, const Tensor& target) {
  check_gradient_call(tape, target);
  const Tensor scalar = scalar_target(tape, target);
  detail::PauseRecording pause(tape);
  auto grads = detail::backward(tape, scalar);
  if (!tape.persistent) {
    tape.used = true;
    tape.nodes.clear();
  }
  return grads;
}
}  // namespace

std::vector<Tensor> GradientTape::gradient(const Tensor& target, const std::vector<Tensor>& sources) {
  for (size_t i = 0; i < sources.size(); ++i) {
    if (!sources[i].defined()) detail::fail<InvalidArgument>("gradient: source {} is an empty Tensor handle", i);
  }
  detail::NoDeviceScope follow_forward;  // each gradient op runs where its forward op ran
  const auto grads = differentiate(*state_, target);
  std::vector<Tensor> result;
  for (const Tensor& source : sources) result.push_back(detail::gradient_or_zeros(grads, source));
  return result;
}

// A variable's gradient is the sum over every value of it that was read while the tape recorded.
std::vector<Tensor> GradientTape::gradient(const Tensor& target, const std::vector<Variable>& sources) {
  for (size_t i = 0; i < sources.size(); ++i) {
    if (!sources[i].defined()) detail::fail<InvalidArgument>("gradient: source {} is an empty Variable handle", i);
  }
  detail::NoDeviceScope follow_forward;  // each gradient lands on its source's device
  const auto grads = differentiate(*state_, target);
  std::vector<Tensor> result;
  for (const Variable& v : sources) {
    Tensor total;
    const auto reads = state_->variable_reads.find(v.identity());
    if (reads != state_->variable_reads.end()) {
      for (const Tensor& read : reads->second) {
        const auto found = grads.find(read.impl_ptr());
        if (found == grads.end()) continue;
        total = total.defined() ? total + found->second : found->second;
      }
    }
    result.push_back(total.defined() ? total : zeros_like(v.value()));
  }
  return result;
}

}  // namespace flowlet
