// The type-independent half of trace(): a bounded cache of graphs by signature (hashed; the least
// recently called dropped first), tracing a new signature once however many threads call with it
// at the same time, retrace diagnostics, and running the cached graph.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <list>
#include <mutex>
#include <unordered_map>

#include "core/check.hpp"
#include "core/device_scope_state.hpp"
#include "exec/executable.hpp"
#include "flowlet/trace.hpp"
#include "trace/passes/passes.hpp"
#include "trace/polymorphism.hpp"
#include "trace/signature.hpp"
#include "trace/timeline.hpp"
#include "trace/tracer.hpp"

namespace flowlet {

namespace detail {
namespace {

constexpr int64_t kDefaultCachedGraphs = 256;
// The retrace reason compares a new signature with this many of the most recently used ones, so
// its cost does not grow with the cache.
constexpr size_t kRetraceDiffCandidates = 8;

int64_t cache_capacity(const TraceOptions& options) {
  if (options.max_cached_graphs < 0) {
    fail<InvalidArgument>("{}: TraceOptions::max_cached_graphs must be 0 (the default) or positive; got {}",
                          options.name, options.max_cached_graphs);
  }
  if (options.max_cached_graphs > 0) return options.max_cached_graphs;
  const char* env = std::getenv("FLOWLET_TRACE_CACHE_SIZE");
  if (env == nullptr) return kDefaultCachedGraphs;
  char* end = nullptr;
  const long long size = std::strtoll(env, &end, 10);
  if (end == env || *end != '\0' || size <= 0) {
    fail<InvalidArgument>("FLOWLET_TRACE_CACHE_SIZE: expects a positive number of graphs; got '{}'", env);
  }
  return size;
}

PassOptions pass_options(const TraceOptions& options) {
  PassOptions passes;
  passes.dump_dir = options.dump_graphs_dir;
  passes.fuse_elementwise = options.fuse_elementwise && options.optimize;
  if (!options.optimize) {
    passes.simplify = passes.fold_constants = passes.eliminate_common_subexpressions = false;
    passes.fuse_variable_updates = false;
    passes.fuse_convolutions = false;
    passes.fuse_matmul_bias = passes.fuse_relu_bias_grad = false;
  }
  return passes;
}

std::string join(const std::vector<std::string>& parts) {
  std::string text;
  for (const std::string& p : parts) text += (text.empty() ? "" : "; ") + p;
  return text;
}

// One trace of fn: at the call's sizes, or (the probe) with every unknown dimension one larger.
std::unique_ptr<TraceBuilder> record(std::span<const Tensor> tensors, TraceBody body,
                                     const Signature& signature, const std::vector<std::pair<size_t, size_t>>& grown) {
  std::vector<TensorMeta> metas;
  metas.reserve(tensors.size());
  for (const Tensor& t : tensors) metas.push_back(TensorMeta{t.shape(), t.dtype()});
  for (const auto& [arg, dim] : grown) {
    size_t tensor = 0;
    for (size_t i = 0; i < arg; ++i) tensor += static_cast<size_t>(signature[i].tensor_count);
    Shape& shape = metas[tensor].shape;
    shape[dim] = shape[dim] + 1;
  }
  auto builder = std::make_unique<TraceBuilder>();
  std::vector<Tensor> symbolic;
  symbolic.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    symbolic.push_back(builder->add_argument(metas[i], tensors[i].device(), static_cast<int32_t>(i)));
  }
  std::vector<Tensor> outputs;
  {
    ActiveTraceScope tracing(builder.get());
    outputs = body.invoke(body.fn, symbolic);
  }
  builder->set_outputs(outputs);  // outside the trace: later passes run ops eagerly (constant folding)
  return builder;
}

}  // namespace

// One traced signature's graph, ready to run.
struct CachedGraph {
  Signature signature;  // unknown dimensions hold -1
  size_t hash = 0;
  std::shared_ptr<const Graph> graph;
  std::unique_ptr<Executable> executable;
};

class TracedCore {
 public:
  explicit TracedCore(TraceOptions options)
      : options_(std::move(options)), capacity_(cache_capacity(options_)) {}

  std::shared_ptr<CachedGraph> find_or_trace(const Signature& signature, std::span<const Tensor> tensors,
                                             TraceBody body);
  std::vector<Tensor> run(const CachedGraph& entry, std::span<const Tensor> tensors);

  int64_t trace_count() const {
    std::lock_guard lock(mutex_);
    return traces_;
  }
  std::string last_retrace_reason() const {
    std::lock_guard lock(mutex_);
    return last_reason_;
  }
  std::string timeline_json() const;
  TransferStats last_transfer_stats() const {
    return TransferStats{last_transfers_.load(std::memory_order_relaxed),
                         last_transfer_bytes_.load(std::memory_order_relaxed)};
  }
  CudaGraphInfo cuda_graph_info() const;
  TraceCacheStats cache_stats() const {
    std::lock_guard lock(mutex_);
    return TraceCacheStats{static_cast<int64_t>(recent_.size()), capacity_, evictions_, comparisons_};
  }

 private:
  using Recent = std::list<std::shared_ptr<CachedGraph>>;
  // A signature one thread is tracing; other threads calling with it wait for that trace.
  struct InFlight {
    const Signature& signature;
    bool done = false;
  };

  std::shared_ptr<CachedGraph> find_locked(const Signature& signature);
  std::shared_ptr<CachedGraph> find_hashed_locked(const Signature& signature, size_t hash);
  std::shared_ptr<CachedGraph> trace(const Signature& signature, std::span<const Tensor> tensors, TraceBody body,
                                     std::string& not_polymorphic) const;
  void insert_locked(std::shared_ptr<CachedGraph> entry, const std::string& not_polymorphic);
  std::string retrace_reason_locked(const Signature& signature) const;

  const TraceOptions options_;
  const int64_t capacity_;

  mutable std::mutex mutex_;  // guards everything up to the atomics
  std::condition_variable traced_;  // an in-flight trace finished (or failed)
  Recent recent_;                   // most recently called first
  std::unordered_multimap<size_t, Recent::iterator> by_hash_;
  std::vector<std::shared_ptr<InFlight>> in_flight_;
  int64_t traces_ = 0;
  int64_t evictions_ = 0;
  int64_t comparisons_ = 0;
  std::string last_reason_;
  bool warned_ = false;
  bool warned_polymorphic_ = false;
  std::shared_ptr<const Graph> timeline_graph_;  // the graph last_stats_ ran
  StepStats last_stats_;

  // What the last call ran and moved; atomics, so plain calls update them without the mutex.
  std::atomic<const CachedGraph*> last_run_{nullptr};  // compared only, never followed without the mutex
  std::atomic<int64_t> last_transfers_{0};
  std::atomic<int64_t> last_transfer_bytes_{0};
};

std::shared_ptr<CachedGraph> TracedCore::find_hashed_locked(const Signature& signature, size_t hash) {
  const auto [first, last] = by_hash_.equal_range(hash);
  for (auto it = first; it != last; ++it) {
    ++comparisons_;
    if (!matches((*it->second)->signature, signature)) continue;
    recent_.splice(recent_.begin(), recent_, it->second);  // iterators stay valid
    return recent_.front();
  }
  return nullptr;
}

std::shared_ptr<CachedGraph> TracedCore::find_locked(const Signature& signature) {
  if (recent_.empty()) return nullptr;
  ++comparisons_;
  if (matches(recent_.front()->signature, signature)) return recent_.front();  // calls repeat: the common case
  if (auto hit = find_hashed_locked(signature, signature_hash(signature))) return hit;
  if (options_.unknown_dims.empty()) return nullptr;
  Signature general = signature;
  if (!generalize(general, unknown_dimensions(options_, signature))) return nullptr;
  return find_hashed_locked(signature, signature_hash(general));
}

std::shared_ptr<CachedGraph> TracedCore::find_or_trace(const Signature& signature, std::span<const Tensor> tensors,
                                                       TraceBody body) {
  std::unique_lock lock(mutex_);
  while (true) {
    if (auto hit = find_locked(signature)) return hit;
    const auto pending = std::find_if(in_flight_.begin(), in_flight_.end(),
                                      [&](const auto& f) { return matches(f->signature, signature); });
    if (pending == in_flight_.end()) break;
    const std::shared_ptr<InFlight> other = *pending;
    traced_.wait(lock, [&] { return other->done; });  // then look again: it is cached, or it failed
  }
  const auto mine = std::make_shared<InFlight>(InFlight{signature});
  in_flight_.push_back(mine);
  auto finished = [&] {
    in_flight_.erase(std::find(in_flight_.begin(), in_flight_.end(), mine));
    mine->done = true;
    traced_.notify_all();
  };
  lock.unlock();
  std::shared_ptr<CachedGraph> entry;
  std::string not_polymorphic;
  try {
    entry = trace(signature, tensors, body, not_polymorphic);
  } catch (...) {
    lock.lock();
    finished();  // a waiting thread traces it again (and meets the same error)
    throw;
  }
  lock.lock();
  insert_locked(entry, not_polymorphic);
  finished();
  return entry;
}

std::shared_ptr<CachedGraph> TracedCore::trace(const Signature& signature, std::span<const Tensor> tensors,
                                               TraceBody body, std::string& not_polymorphic) const {
  const auto dims = unknown_dimensions(options_, signature);
  auto entry = std::make_shared<CachedGraph>();
  entry->signature = signature;
  std::unique_ptr<TraceBuilder> traced = record(tensors, body, signature, {});
  // With unknown dimensions, a second trace at other sizes checks that one graph really serves
  // every size (nothing in fn turned a size into a constant).
  bool dynamic = false;
  Signature general = signature;
  if (generalize(general, dims)) {
    std::unique_ptr<TraceBuilder> probe = record(tensors, body, signature, dims);
    if (auto difference = first_structural_difference(traced->graph(), probe->graph())) {
      not_polymorphic = *difference;
    } else {
      dynamic = true;
      entry->signature = std::move(general);
    }
  }
  entry->hash = signature_hash(entry->signature);
  auto graph = std::make_shared<Graph>(std::move(traced->graph()));
  {
    NoDeviceScope graph_decides;  // passes (constant folding) run ops where the nodes say, not in a scope
    optimize(*graph, pass_options(options_));
  }
  entry->graph = graph;
  entry->executable =
      std::make_unique<Executable>(graph, dynamic, options_.cuda_graphs && !options_.collect_step_stats);
  return entry;
}

std::string TracedCore::retrace_reason_locked(const Signature& signature) const {
  if (recent_.empty()) return "first call";
  std::vector<std::string> best;
  size_t compared = 0;
  for (auto it = recent_.begin(); it != recent_.end() && compared < kRetraceDiffCandidates; ++it, ++compared) {
    std::vector<std::string> d = signature_differences((*it)->signature, signature);
    if (best.empty() || d.size() < best.size()) best = std::move(d);
  }
  return join(best);
}

void TracedCore::insert_locked(std::shared_ptr<CachedGraph> entry, const std::string& not_polymorphic) {
  last_reason_ = retrace_reason_locked(entry->signature);
  if (!not_polymorphic.empty() && !warned_polymorphic_) {
    warned_polymorphic_ = true;
    fmt::print(stderr,
               "flowlet: warning: '{}' cannot serve other sizes of its unknown dimensions with one graph, so each "
               "size is traced on its own: tracing at another size recorded a different graph ({}). Typically a "
               "size became a constant there (a reshape to a fixed shape, a loop over a dimension).\n",
               options_.name, not_polymorphic);
  }
  const size_t hash = entry->hash;
  recent_.push_front(std::move(entry));
  by_hash_.emplace(hash, recent_.begin());
  while (static_cast<int64_t>(recent_.size()) > capacity_) {
    const auto oldest = std::prev(recent_.end());
    const auto [first, last] = by_hash_.equal_range((*oldest)->hash);
    by_hash_.erase(std::find_if(first, last, [&](const auto& item) { return item.second == oldest; }));
    recent_.erase(oldest);
    ++evictions_;
  }
  ++traces_;
  if (!warned_ && traces_ > options_.retrace_warning_after) {
    warned_ = true;
    fmt::print(stderr,
               "flowlet: warning: '{}' has been traced {} times; the latest retrace because {}. Each new "
               "signature traces and compiles again: declare dimensions that vary in TraceOptions::unknown_dims, "
               "or pass changing numbers as tensors.{}\n",
               options_.name, traces_, last_reason_,
               evictions_ == 0 ? std::string()
                               : fmt::format(" {} graphs were dropped from the cache of {} (raise "
                                             "TraceOptions::max_cached_graphs if calls cycle through more).",
                                             evictions_, capacity_));
  }
}

std::vector<Tensor> TracedCore::run(const CachedGraph& entry, std::span<const Tensor> tensors) {
  NoDeviceScope graph_decides;  // nodes run on their Node::device; kernels that call ops stay there
  if (last_run_.load(std::memory_order_relaxed) != &entry) last_run_.store(&entry, std::memory_order_relaxed);
  if (entry.executable->num_partitions() == 1 && !options_.collect_step_stats) {
    std::vector<Tensor> outputs = entry.executable->run(tensors);
    if (last_transfers_.load(std::memory_order_relaxed) != 0) {
      last_transfers_.store(0, std::memory_order_relaxed);
      last_transfer_bytes_.store(0, std::memory_order_relaxed);
    }
    return outputs;
  }
  StepStats stats;
  stats.record_nodes = options_.collect_step_stats;
  std::vector<Tensor> outputs = entry.executable->run(tensors, &stats);
  last_transfers_.store(stats.transfers, std::memory_order_relaxed);
  last_transfer_bytes_.store(stats.bytes_transferred, std::memory_order_relaxed);
  if (options_.collect_step_stats) {  // the mutex only when there is a timeline to keep
    std::lock_guard lock(mutex_);
    last_stats_ = std::move(stats);
    timeline_graph_ = entry.graph;
  }
  return outputs;
}

std::string TracedCore::timeline_json() const {
  std::lock_guard lock(mutex_);
  if (!timeline_graph_) return "{\"traceEvents\":[]}";
  return detail::timeline_json(*timeline_graph_, last_stats_);
}

CudaGraphInfo TracedCore::cuda_graph_info() const {
  std::shared_ptr<CachedGraph> last;
  {
    std::lock_guard lock(mutex_);
    const CachedGraph* ran = last_run_.load(std::memory_order_relaxed);
    if (ran == nullptr) return CudaGraphInfo{false, 0, 0, "not called yet"};
    const auto found = std::find_if(recent_.begin(), recent_.end(), [&](const auto& e) { return e.get() == ran; });
    if (found == recent_.end()) return CudaGraphInfo{false, 0, 0, "its graph was dropped from the trace cache"};
    last = *found;
  }
  return last->executable->cuda_graph_info();
}

// --- the seam TracedFunction calls (flowlet/trace.hpp) ---

std::shared_ptr<TracedCore> make_traced_core(TraceOptions options) {
  return std::make_shared<TracedCore>(std::move(options));
}

std::vector<Tensor> call_traced(TracedCore& core, const Signature& signature, std::span<const Tensor> tensors,
                                TraceBody body) {
  const std::shared_ptr<CachedGraph> entry = core.find_or_trace(signature, tensors, body);
  return core.run(*entry, tensors);
}

const Graph& traced_graph(TracedCore& core, const Signature& signature, std::span<const Tensor> tensors,
                          TraceBody body) {
  return *core.find_or_trace(signature, tensors, body)->graph;
}

int64_t trace_count(const TracedCore& core) { return core.trace_count(); }
std::string last_retrace_reason(const TracedCore& core) { return core.last_retrace_reason(); }
std::string timeline_json(const TracedCore& core) { return core.timeline_json(); }
TransferStats last_transfer_stats(const TracedCore& core) { return core.last_transfer_stats(); }
CudaGraphInfo cuda_graph_info(const TracedCore& core) { return core.cuda_graph_info(); }
TraceCacheStats cache_stats(const TracedCore& core) { return core.cache_stats(); }

}  // namespace detail
}  // namespace flowlet
