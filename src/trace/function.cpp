// The type-independent half of trace(): the signature cache, tracing and compiling a new
// signature, retrace diagnostics, and running the cached plan.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <cstdio>
#include <deque>
#include <mutex>
#include <optional>

#include "core/check.hpp"
#include "core/device_scope_state.hpp"
#include "exec/executable.hpp"
#include "flowlet/trace.hpp"
#include "trace/json_text.hpp"
#include "trace/passes/passes.hpp"
#include "trace/tracer.hpp"

namespace flowlet {

EagerScope::EagerScope() : saved_(new detail::ActiveTraceScope(nullptr)) {}
EagerScope::~EagerScope() { delete static_cast<detail::ActiveTraceScope*>(saved_); }

bool is_tracing() { return detail::active_trace() != nullptr; }

namespace detail {
namespace {

std::string signature_shape_text(const Shape& shape) {
  std::string text = "[";
  for (size_t d = 0; d < shape.size(); ++d) {
    if (d > 0) text += ", ";
    text += shape[d] < 0 ? std::string("?") : std::to_string(shape[d]);
  }
  return text + "]";
}

std::string argument_text(const ArgSignature& s) {
  if (!s.is_tensor) return s.value;
  if (!s.value.empty() || s.tensor_count != 1) return fmt::format("a list of {} tensors", s.tensor_count);
  return fmt::format("{} {} on {}", dtype_name(s.dtype), signature_shape_text(s.shape), s.device.str());
}

// The differences between a cached signature and a new one, one phrase per changed argument.
std::vector<std::string> differences(const std::vector<ArgSignature>& before, const std::vector<ArgSignature>& now) {
  std::vector<std::string> found;
  if (before.size() != now.size()) {
    found.push_back(fmt::format("{} arguments -> {}", before.size(), now.size()));
    return found;
  }
  for (size_t i = 0; i < now.size(); ++i) {
    const ArgSignature& a = before[i];
    const ArgSignature& b = now[i];
    if (a.is_scope || b.is_scope) {
      if (a.value != b.value) found.push_back(fmt::format("device scope {} -> {}", a.value, b.value));
    } else if (a.is_tensor != b.is_tensor || a.tensor_count != b.tensor_count) {
      found.push_back(fmt::format("argument {}: {} -> {}", i, argument_text(a), argument_text(b)));
    } else if (!a.is_tensor || !a.value.empty()) {
      if (a.value != b.value) found.push_back(fmt::format("argument {}: value {} -> {}", i, a.value, b.value));
    } else {
      if (a.dtype != b.dtype) {
        found.push_back(fmt::format("argument {}: dtype {} -> {}", i, dtype_name(a.dtype), dtype_name(b.dtype)));
      }
      if (!(a.shape == b.shape)) {
        found.push_back(fmt::format("argument {}: shape {} -> {}", i, signature_shape_text(a.shape), signature_shape_text(b.shape)));
      }
      if (a.device != b.device) {
        found.push_back(fmt::format("argument {}: device {} -> {}", i, a.device.str(), b.device.str()));
      }
    }
  }
  return found;
}


std::string join(const std::vector<std::string>& parts) {
  std::string text;
  for (const std::string& p : parts) text += (text.empty() ? "" : "; ") + p;
  return text;
}

// Where two traces of one function differ, ignoring shapes: null when they record the same ops on
// the same inputs with the same attributes and constants (so one graph serves both sizes).
std::optional<std::string> first_structural_difference(const Graph& a, const Graph& b) {
  if (a.nodes().size() != b.nodes().size()) {
    return fmt::format("{} nodes instead of {}", b.nodes().size(), a.nodes().size());
  }
  for (size_t i = 0; i < a.nodes().size(); ++i) {
    const Node& x = a.nodes()[i];
    const Node& y = b.nodes()[i];
    auto differ = [&](std::string_view what) { return fmt::format("{} differs in its {}", x.label(), what); };
    if (x.kind != y.kind || x.op != y.op || x.argument != y.argument) return differ("op");
    if (x.inputs != y.inputs || x.control_inputs != y.control_inputs) return differ("inputs");
    if (static_cast<bool>(x.attributes) != static_cast<bool>(y.attributes)) return differ("attributes");
    if (x.attributes) {
      if (!x.op->describe_attributes) return differ("attributes (they cannot be compared)");
      const std::string da = x.op->describe_attributes(x.attributes.get());
      const std::string db = y.op->describe_attributes(y.attributes.get());
      if (da != db) return fmt::format("{} has attributes {} at one size and {} at the other", x.label(), da, db);
    }
    if (x.kind == NodeKind::constant && x.value.impl_ptr() != y.value.impl_ptr()) {
      // A constant on a GPU is compared through a host copy (never read on the host where it is).
      auto on_host = [](const Tensor& t) {
        EagerScope eager;
        return t.device().kind() == DeviceKind::cpu ? t : t.to(Device(DeviceKind::cpu, 0));
      };
      const bool small = x.value.dtype() == y.value.dtype() && x.value.shape() == y.value.shape() &&
                         x.value.numel() <= 64;
      const Tensor hx = small ? on_host(x.value) : Tensor(), hy = small ? on_host(y.value) : Tensor();
      const bool same = small && hx.is_contiguous() && hy.is_contiguous() &&
                        std::memcmp(hx.raw_data(), hy.raw_data(),
                                    static_cast<size_t>(hx.numel()) * dtype_size(hx.dtype())) == 0;
      if (!same) return fmt::format("constant '{}' differs (a value computed from a size?)", x.name);
    }
  }
  if (a.outputs() != b.outputs() || a.effects() != b.effects()) return std::string("the outputs differ");
  return std::nullopt;
}

struct Entry {
  std::vector<ArgSignature> signature;  // unknown dimensions hold -1
  std::shared_ptr<const Graph> graph;
  std::unique_ptr<Executable> executable;
};

// What begin_trace hands to the caller: the recording, active until finish_trace.
struct Recording {
  TraceBuilder builder;
  std::optional<ActiveTraceScope> scope;
};

}  // namespace

void describe_device_scope(std::vector<ArgSignature>& signature) {
  ArgSignature scope;
  scope.is_scope = true;
  if (const ScopeFrame* frame = innermost_scope) {
    scope.value = frame->requested ? frame->requested->str() : "none";
    if (frame->colocate_with != nullptr) scope.value += fmt::format(" (colocated with {})", frame->colocate_with);
  } else {
    scope.value = "none";
  }
  signature.push_back(std::move(scope));
}

class FunctionCore {
 public:
  explicit FunctionCore(TraceOptions o) : options(std::move(o)) {}

  TraceOptions options;
  mutable std::mutex mutex;  // guards everything below
  std::deque<std::shared_ptr<Entry>> entries;
  int last_used = -1;
  int64_t traces = 0;
  std::string last_reason;
  bool warned = false;
  bool warned_polymorphic = false;
  StepStats last_stats;
  // The last call's transfers; atomics, so single-device calls reset them without the mutex.
  std::atomic<int64_t> last_transfers{0};
  std::atomic<int> last_run{-1};  // the entry the last call ran (cuda_graph_info)
  std::atomic<int64_t> last_transfer_bytes{0};

  // The unknown dimensions as (argument, dimension >= 0), checked against `signature`.
  std::vector<std::pair<size_t, size_t>> unknown_dims(const std::vector<ArgSignature>& signature) const {
    std::vector<std::pair<size_t, size_t>> dims;
    for (const UnknownDim& u : options.unknown_dims) {
      const auto arg = static_cast<size_t>(u.argument);
      if (u.argument < 0 || arg >= signature.size() || !signature[arg].is_tensor || signature[arg].tensor_count != 1 ||
          !signature[arg].value.empty()) {
        const size_t arguments = signature.size() - (!signature.empty() && signature.back().is_scope ? 1 : 0);
        fail<InvalidArgument>("{}: unknown_dims names argument {}, which is not a Tensor argument; got {} arguments",
                              options.name, u.argument, arguments);
      }
      const Shape& shape = signature[arg].shape;
      const int64_t rank = static_cast<int64_t>(shape.size());
      const int64_t d = u.dimension < 0 ? u.dimension + rank : u.dimension;
      if (d < 0 || d >= rank) {
        fail<InvalidArgument>("{}: unknown_dims names dimension {} of argument {}, which has shape {}", options.name,
                              u.dimension, u.argument, signature_shape_text(shape));
      }
      dims.emplace_back(arg, static_cast<size_t>(d));
    }
    return dims;
  }

  static bool same(const std::vector<ArgSignature>& a, const std::vector<ArgSignature>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      const ArgSignature& x = a[i];
      const ArgSignature& y = b[i];
      if (x.is_tensor != y.is_tensor || x.tensor_count != y.tensor_count || x.value != y.value) return false;
      if (x.is_tensor && x.value.empty()) {
        if (x.dtype != y.dtype || x.device != y.device || x.shape.size() != y.shape.size()) return false;
        for (size_t d = 0; d < x.shape.size(); ++d) {
          // An unknown dimension (-1) serves every size from 2 up; sizes 0 and 1 broadcast
          // differently, so they get graphs of their own.
          if (x.shape[d] < 0 ? y.shape[d] < 2 : x.shape[d] != y.shape[d]) return false;
        }
      }
    }
    return true;
  }
};

TracedCore::TracedCore(TraceOptions options) : core_(std::make_unique<FunctionCore>(std::move(options))) {}
TracedCore::~TracedCore() = default;

int TracedCore::find(const std::vector<ArgSignature>& signature) const {
  if (!core_->options.unknown_dims.empty()) (void)core_->unknown_dims(signature);  // checks them
  std::lock_guard lock(core_->mutex);
  const int last = core_->last_used;
  if (last >= 0 && FunctionCore::same(core_->entries[static_cast<size_t>(last)]->signature, signature)) return last;
  for (size_t i = 0; i < core_->entries.size(); ++i) {
    if (FunctionCore::same(core_->entries[i]->signature, signature)) {
      core_->last_used = static_cast<int>(i);
      return static_cast<int>(i);
    }
  }
  return -1;
}

TracedCore::Builder TracedCore::begin_trace(const std::vector<ArgSignature>& signature,
                                            std::span<const Tensor> tensor_args, bool probe) {
  std::vector<TensorMeta> metas;
  for (const Tensor& t : tensor_args) metas.push_back(TensorMeta{t.shape(), t.dtype()});
  if (probe) {
    // The probe sees every unknown dimension one larger.
    for (const auto& [arg, dim] : core_->unknown_dims(signature)) {
      size_t tensor = 0;
      for (size_t i = 0; i < arg; ++i) tensor += static_cast<size_t>(signature[i].tensor_count);
      Shape& shape = metas[tensor].shape;
      shape[dim] = shape[dim] + 1;
    }
  }
  auto recording = std::make_shared<Recording>();
  Builder builder;
  for (size_t i = 0; i < tensor_args.size(); ++i) {
    builder.symbolic_arguments.push_back(
        recording->builder.add_argument(metas[i], tensor_args[i].device(), static_cast<int32_t>(i)));
  }
  recording->scope.emplace(&recording->builder);
  builder.state = recording;
  return builder;
}

void TracedCore::end_trace(Builder& builder, const std::vector<Tensor>& outputs) {
  auto& recording = *static_cast<Recording*>(builder.state.get());
  recording.scope.reset();  // later passes run ops eagerly (constant folding)
  recording.builder.set_outputs(outputs);
}

bool TracedCore::wants_probe(const std::vector<ArgSignature>& signature) const {
  const auto dims = core_->unknown_dims(signature);
  if (dims.empty()) return false;
  return std::all_of(dims.begin(), dims.end(), [&](const auto& d) { return signature[d.first].shape[d.second] >= 2; });
}

int TracedCore::finish_trace(const std::vector<ArgSignature>& signature, Builder& main, Builder& probe) {
  Graph& traced = static_cast<Recording*>(main.state.get())->builder.graph();
  auto entry = std::make_shared<Entry>();
  entry->signature = signature;
  bool dynamic = false;
  std::string not_polymorphic;
  if (probe.state) {
    const Graph& other = static_cast<Recording*>(probe.state.get())->builder.graph();
    if (auto difference = first_structural_difference(traced, other)) {
      not_polymorphic = *difference;
    } else {
      dynamic = true;
      for (const auto& [arg, dim] : core_->unknown_dims(signature)) entry->signature[arg].shape[dim] = -1;
    }
  }

  auto graph = std::make_shared<Graph>(std::move(traced));
  PassOptions passes;
  passes.dump_dir = core_->options.dump_graphs_dir;
  passes.fuse_elementwise = core_->options.fuse_elementwise && core_->options.optimize;
  if (!core_->options.optimize) {
    passes.simplify = passes.fold_constants = passes.eliminate_common_subexpressions = false;
    passes.fuse_variable_updates = false;
  }
  {
    NoDeviceScope graph_decides;  // passes (constant folding) run ops where the nodes say, not in a scope
    optimize(*graph, passes);
  }
  entry->graph = graph;
  entry->executable = std::make_unique<Executable>(
      graph, dynamic, core_->options.cuda_graphs && !core_->options.collect_step_stats);

  std::lock_guard lock(core_->mutex);
  // Why this trace: the differences from the closest signature already cached.
  if (core_->entries.empty()) {
    core_->last_reason = "first call";
  } else {
    std::vector<std::string> best;
    for (const auto& e : core_->entries) {
      std::vector<std::string> d = differences(e->signature, signature);
      if (best.empty() || d.size() < best.size()) best = std::move(d);
    }
    core_->last_reason = join(best);
  }
  if (!not_polymorphic.empty() && !core_->warned_polymorphic) {
    core_->warned_polymorphic = true;
    fmt::print(stderr,
               "flowlet: warning: '{}' cannot serve other sizes of its unknown dimensions with one graph, so each "
               "size is traced on its own: tracing at another size recorded a different graph ({}). Typically a "
               "size became a constant there (a reshape to a fixed shape, a loop over a dimension).\n",
               core_->options.name, not_polymorphic);
  }
  core_->entries.push_back(std::move(entry));
  core_->last_used = static_cast<int>(core_->entries.size()) - 1;
  ++core_->traces;
  if (!core_->warned && core_->traces > core_->options.retrace_warning_after) {
    core_->warned = true;
    fmt::print(stderr,
               "flowlet: warning: '{}' has been traced {} times; the latest retrace because {}. Each new "
               "signature traces and compiles again: declare dimensions that vary in TraceOptions::unknown_dims, "
               "or pass changing numbers as tensors.\n",
               core_->options.name, core_->traces, core_->last_reason);
  }
  return core_->last_used;
}

std::vector<Tensor> TracedCore::run(int entry, std::span<const Tensor> tensor_args) {
  NoDeviceScope graph_decides;  // nodes run on their Node::device; kernels that call ops stay there
  std::shared_ptr<Entry> e;
  {
    std::lock_guard lock(core_->mutex);
    e = core_->entries.at(static_cast<size_t>(entry));
  }
  if (core_->last_run.load(std::memory_order_relaxed) != entry) core_->last_run.store(entry, std::memory_order_relaxed);
  if (e->executable->num_partitions() == 1 && !core_->options.collect_step_stats) {
    std::vector<Tensor> outputs = e->executable->run(tensor_args);
    if (core_->last_transfers.load(std::memory_order_relaxed) != 0) {
      core_->last_transfers.store(0, std::memory_order_relaxed);
      core_->last_transfer_bytes.store(0, std::memory_order_relaxed);
    }
    return outputs;
  }
  StepStats stats;
  stats.record_nodes = core_->options.collect_step_stats;
  std::vector<Tensor> outputs = e->executable->run(tensor_args, &stats);
  core_->last_transfers.store(stats.transfers, std::memory_order_relaxed);
  core_->last_transfer_bytes.store(stats.bytes_transferred, std::memory_order_relaxed);
  if (core_->options.collect_step_stats) {  // the mutex only when there is a timeline to keep
    std::lock_guard lock(core_->mutex);
    core_->last_stats = std::move(stats);
    core_->last_used = entry;
  }
  return outputs;
}

const Graph& TracedCore::graph(int entry) const {
  std::lock_guard lock(core_->mutex);
  return *core_->entries.at(static_cast<size_t>(entry))->graph;
}

int64_t TracedCore::trace_count() const {
  std::lock_guard lock(core_->mutex);
  return core_->traces;
}

const std::string& TracedCore::last_retrace_reason() const {
  std::lock_guard lock(core_->mutex);
  return core_->last_reason;
}


CudaGraphInfo TracedCore::cuda_graph_info() const {
  std::shared_ptr<Entry> e;
  {
    std::lock_guard lock(core_->mutex);
    const int entry = core_->last_run.load(std::memory_order_relaxed);
    if (entry < 0) return CudaGraphInfo{false, 0, 0, "not called yet"};
    e = core_->entries.at(static_cast<size_t>(entry));
  }
  return e->executable->cuda_graph_info();
}

TransferStats TracedCore::last_transfer_stats() const {
  return TransferStats{core_->last_transfers.load(std::memory_order_relaxed),
                       core_->last_transfer_bytes.load(std::memory_order_relaxed)};
}

std::string TracedCore::timeline_json() const {
  std::lock_guard lock(core_->mutex);
  if (core_->last_used < 0) return "{\"traceEvents\":[]}";
  const Graph& graph = *core_->entries[static_cast<size_t>(core_->last_used)]->graph;
  // One timeline process per device (named by a metadata event), one row per thread.
  std::vector<std::string> events;
  std::vector<Device> devices;
  auto process_of = [&](Device d) {
    const auto found = std::find(devices.begin(), devices.end(), d);
    if (found != devices.end()) return static_cast<int>(found - devices.begin()) + 1;
    devices.push_back(d);
    events.push_back(fmt::format("{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{},\"args\":{{\"name\":\"{}\"}}}}",
                                 devices.size(), d));
    return static_cast<int>(devices.size());
  };
  for (const StepStats::NodeRun& run : core_->last_stats.nodes) {
    const Node& node = graph.node(run.node);
    const int pid = process_of(node.device);
    events.push_back(fmt::format(
        "{{\"name\":\"{}\",\"cat\":\"{}\",\"ph\":\"X\",\"ts\":{:.3f},\"dur\":{:.3f},\"pid\":{},\"tid\":{}}}",
        json_escape(node.name), node.op ? node.op->name : "", static_cast<double>(run.start_ns) / 1e3,
        static_cast<double>(run.end_ns - run.start_ns) / 1e3, pid, run.thread));
  }
  return fmt::format("{{\"displayTimeUnit\":\"ns\",\"traceEvents\":[{}],\"wall_ns\":{}}}", fmt::join(events, ","),
                     core_->last_stats.wall_ns);
}

}  // namespace detail
}  // namespace flowlet
