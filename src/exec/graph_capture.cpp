// CUDA Graph capture of traced steps: which graphs qualify, recording in phases, replaying (see
// graph_capture.hpp for the contract).
#include "exec/graph_capture.hpp"

#include <cstdlib>
#include <string_view>

#include "core/check.hpp"
#include "core/device_scope_state.hpp"
#include "state/variable_state.hpp"
#include "exec/executor.hpp"
#include "flowlet/graph.hpp"
#include "ops/internal.hpp"
#include "state/variable_ops.hpp"

namespace flowlet::detail {

constinit thread_local CaptureRecorder* capture_recorder = nullptr;

void CaptureRecorder::defer_check(std::function<void()> check) {
  if (!checks_allowed) {
    fail<DeviceError>("CUDA Graph: node {} checks data on the host after the step's first variable update, so a "
                      "bad value could not be refused before the update; the function runs uncaptured",
                      node ? node->label() : std::string("?"));
  }
  checks.push_back({std::move(check), node});
}

namespace {

// A recording gives up for good after this many (each new one follows a variable changing buffer).
constexpr int kMaxRecordings = 4;

bool disabled_by_environment() {
  static const bool off = [] {
    const char* env = std::getenv("FLOWLET_CUDA_GRAPHS");
    return env != nullptr && std::string_view(env) == "0";
  }();
  return off;
}

bool writes_variable(const Op& op) { return &op == &assign_variable_op || &op == &assign_matmul_op; }
bool touches_variable(const Op& op) { return writes_variable(op) || &op == &read_variable_op; }

// The variable's value's address, under its lock.
const void* buffer_of(VariableState& s) {
  std::lock_guard lock(s.mutex);
  return s.value.raw_data();
}

// Sets capture_recorder for a scope.
class RecorderScope {
 public:
  explicit RecorderScope(CaptureRecorder* recorder) : saved_(capture_recorder) { capture_recorder = recorder; }
  ~RecorderScope() { capture_recorder = saved_; }
  RecorderScope(const RecorderScope&) = delete;
  RecorderScope& operator=(const RecorderScope&) = delete;

 private:
  CaptureRecorder* saved_;
};

}  // namespace

struct GraphCapture::Recorded {
  std::unique_ptr<RecordedGraph> graph;  // destroyed first (it waits for running launches)
  std::vector<Tensor> inputs;            // the graph reads its arguments here
  std::vector<Tensor> outputs;           // and leaves its results here
  std::vector<CaptureRecorder::DeferredCheck> checks;  // after phase 0
  ~Recorded() { graph.reset(); }
};

std::string GraphCapture::why_not(const Graph& graph, const Plan& plan, bool dynamic_shapes, bool allowed) {
  if (!allowed) return "turned off (TraceOptions::cuda_graphs is false, or collect_step_stats is on)";
  if (disabled_by_environment()) return "turned off by FLOWLET_CUDA_GRAPHS=0";
  if (dynamic_shapes) return "its shapes vary between calls (unknown dimensions)";
  if (plan.num_items() == 0) return "it runs no op";
  std::optional<Device> device;
  for (const Node& node : graph.nodes()) {
    if (node.removed) continue;
    if (node.device.kind() != DeviceKind::cuda) return fmt::format("{} runs on {}", node.label(), node.device);
    if (device && node.device != *device) {
      return fmt::format("it spans {} and {} ({})", *device, node.device, node.label());
    }
    device = node.device;
    if (node.kind != NodeKind::op) continue;
    if (node.op->has_flag(kStateful) && !touches_variable(*node.op)) {
      return fmt::format("{} acts on the host or outside the step", node.label());
    }
  }
  if (!plan.sequential()) return "its plan runs nodes concurrently (FLOWLET_EXECUTOR=concurrent)";
  return "";
}

GraphCapture::GraphCapture(const Graph& graph, const Plan& plan) : graph_(graph), plan_(plan) {
  first_write_ = plan.num_items();
  device_ = plan.item_node(0).device.index();  // why_not: at least one item, every node on one GPU
  for (int32_t i = 0; i < plan.num_items(); ++i) {
    const Node& node = plan.item_node(i);
    if (!touches_variable(*node.op)) continue;
    if (writes_variable(*node.op) && first_write_ == plan.num_items()) first_write_ = i;
    VariableState* state = static_cast<const VariableAttrs*>(node.attributes.get())->state.get();
    bool known = false;
    for (VariableUse& use : variables_) {
      if (use.state != state) continue;
      use.writes |= writes_variable(*node.op);
      known = true;
    }
    if (!known) variables_.push_back({state, writes_variable(*node.op), nullptr});
  }
}

GraphCapture::~GraphCapture() = default;

void GraphCapture::give_up(std::string why) {
  why_not_ = std::move(why);
  recorded_.reset();
  given_up_.store(true, std::memory_order_release);
}

std::vector<Tensor> GraphCapture::run(std::span<const Tensor> arguments) {
  if (given_up_.load(std::memory_order_acquire)) return plan_.run(arguments);
  std::unique_lock lock(mutex_);
  if (given_up_.load(std::memory_order_relaxed)) {
    lock.unlock();
    return plan_.run(arguments);
  }
  if (++calls_ == 1) return plan_.run(arguments);  // warm-up: lazy initialisation happens outside a recording
  if (recorded_ && !buffers_unchanged()) recorded_.reset();
  if (!recorded_) {
    if (recordings_ == kMaxRecordings) {
      give_up(fmt::format("recorded {} times: a variable it uses changed its buffer between calls each time (an "
                          "eager assign, or a tensor read from the variable kept alive while the step updates it)",
                          recordings_));
      lock.unlock();
      return plan_.run(arguments);
    }
    if (!record(arguments)) {
      lock.unlock();
      return plan_.run(arguments);
    }
  }
  return replay(arguments);
}

bool GraphCapture::record(std::span<const Tensor> arguments) {
  ++recordings_;
  auto recorded = std::make_unique<Recorded>();
  CaptureRecorder recorder;
  try {
    // Written variables that others share get a private copy now, so the recording can update
    // them in place (later recordings had it done by the check before them).
    (void)buffers_unchanged();
    recorded->graph = backend(DeviceKind::cuda).start_recording(device_);
    RecorderScope scope(&recorder);
    for (const Tensor& argument : arguments) {
      recorded->inputs.push_back(Tensor::empty(argument.shape(), argument.dtype(), argument.device()));
    }
    StepShared shared;
    shared.remaining = 1;
    shared.context.recording = &recorder;
    Plan::StepPtr step = plan_.make_step(shared, recorded->inputs);
    recorded->graph->begin_phase();
    plan_.run_items(*step, 0, first_write_);
    if (!recorder.checks.empty() && first_write_ < plan_.num_items()) {
      // The updates wait in a second phase until the checks passed.
      recorded->graph->end_phase();
      recorded->graph->begin_phase();
    }
    recorder.checks_allowed = false;
    plan_.run_items(*step, first_write_, plan_.num_items());
    // Copies, so an output is always the graph's own buffer (never a variable's or an argument's).
    for (const Tensor& output : plan_.outputs(*step)) recorded->outputs.push_back(copy_to_contiguous(output));
    step.reset();
    recorded->graph->end_phase();
    recorded->graph->stop();
  } catch (const std::exception& e) {
    give_up(fmt::format("recording failed: {}", e.what()));
    return false;
  }
  recorded->checks = std::move(recorder.checks);
  for (VariableUse& use : variables_) use.buffer = buffer_of(*use.state);
  recorded_ = std::move(recorded);
  return true;
}

bool GraphCapture::buffers_unchanged() {
  bool unchanged = true;
  for (VariableUse& use : variables_) {
    VariableState& s = *use.state;
    std::lock_guard lock(s.mutex);
    // A reader holding the value of a variable the step updates keeps the old values, as on the
    // eager path: the variable moves to a private copy, and the graph is recorded again.
    if (use.writes && !exclusively_owned(s.value)) {
      NoDeviceScope here;
      s.value = copy_to_contiguous(s.value);
    }
    unchanged &= s.value.raw_data() == use.buffer;
  }
  return unchanged;
}

std::vector<Tensor> GraphCapture::replay(std::span<const Tensor> arguments) {
  Recorded& r = *recorded_;
  for (size_t i = 0; i < r.inputs.size(); ++i) backend(DeviceKind::cuda).copy_in_place(r.inputs[i], arguments[i]);
  r.graph->launch(0);
  for (const CaptureRecorder::DeferredCheck& c : r.checks) {
    try {
      c.check();
    } catch (...) {
      rethrow_from_node(std::current_exception(), *c.node);
    }
  }
  for (int phase = 1; phase < r.graph->phases(); ++phase) r.graph->launch(phase);
  ++replays_;
  std::vector<Tensor> outputs;
  outputs.reserve(r.outputs.size());
  for (const Tensor& output : r.outputs) outputs.push_back(copy_to_contiguous(output));
  return outputs;
}

CudaGraphInfo GraphCapture::info() const {
  std::lock_guard lock(mutex_);
  return CudaGraphInfo{recorded_ != nullptr && replays_ > 0, replays_, recordings_, why_not_};
}

}  // namespace flowlet::detail
