// trace(fn): records what fn does into a dataflow graph, optimizes it once, and runs the graph on
// later calls with the same signature.
//
//   Variable w(randn({784, 10}, 1) * 0.01f, "w");
//   optim::SGD opt(0.1);
//   auto step = trace([&](Tensor x, Tensor y) {
//     GradientTape tape;
//     Tensor loss = mean(softmax_cross_entropy(matmul(x, w), y));
//     opt.apply(tape.gradient(loss, {w}), {w});
//     return loss;
//   });
//   Tensor loss = step(x, y);   // first call with this signature traces; later calls run the graph
//
// What to know:
//   - The signature of a call is the dtype, shape and device of each tensor argument, the value
//     of every other argument, and the DeviceScope (or ColocateWith) active at the call. A new
//     signature traces fn again (trace_count() counts them; a warning names the difference when
//     one function keeps retracing), once even when several threads bring it at the same time.
//     TraceOptions::unknown_dims lets one graph serve every size of a dimension, e.g. the batch.
//   - At most TraceOptions::max_cached_graphs graphs are kept (default 256); the least recently
//     called signature is dropped first and traced again if it comes back.
//   - fn's own C++ code runs only while it is traced: a std::cout in fn prints once. Use
//     flowlet::print or flowlet::host_callback for effects at every call.
//   - Inside fn, tensors are symbolic: ops on them record nodes; reading their elements (item,
//     to_vector, data) throws InvalidArgument. Tensors and variables captured from outside are
//     read when the graph runs: variables through stateful nodes (their updates run in program
//     order and are never pruned), captured tensors as constants of the graph.
//   - A GradientTape inside fn records its gradient ops into the same graph.
//   - A traced call is opaque to a GradientTape outside it: put the tape inside fn.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "flowlet/core/tensor.hpp"
#include "flowlet/eager_scope.hpp"
#include "flowlet/graph.hpp"
#include "flowlet/run_info.hpp"

namespace flowlet {

// A dimension of one argument whose size may change between calls without retracing.
struct UnknownDim {
  int argument = 0;   // position among fn's arguments
  int dimension = 0;  // negative counts from the end
};

struct TraceOptions {
  std::string name = "traced function";  // for warnings and dumps
  std::vector<UnknownDim> unknown_dims;
  int retrace_warning_after = 5;  // warn (stderr) once more than this many signatures were traced
  // Graphs kept, one per signature; past this the least recently called is dropped (and traced
  // again if its signature comes back). 0: FLOWLET_TRACE_CACHE_SIZE if set, else 256.
  int64_t max_cached_graphs = 0;
  bool optimize = true;           // run the graph passes (prune always runs)
  bool fuse_elementwise = true;
  std::string dump_graphs_dir;    // write DOT/JSON before and after every pass (also FLOWLET_DUMP_GRAPHS)
  bool collect_step_stats = false;  // record each node's start, end and thread on every call
  // Replay a graph that runs wholly on one GPU as a CUDA Graph: one launch per call instead of one
  // per op (see cuda_graph_info(); FLOWLET_CUDA_GRAPHS=0 turns it off for the whole process).
  bool cuda_graphs = true;
};

// The state of a traced function's graph cache (TracedFunction::cache_stats()).
struct TraceCacheStats {
  int64_t graphs = 0;     // cached now, at most max_cached_graphs
  int64_t capacity = 0;   // max_cached_graphs as resolved (option, environment or default)
  int64_t evictions = 0;  // graphs dropped to stay within the capacity
  // Signatures compared with cached ones by all lookups so far: a lookup hashes the signature, so
  // this grows by a small constant per call, whatever the number of cached graphs.
  int64_t signature_comparisons = 0;
};

namespace detail {

// One argument of a call as the signature sees it.
struct ArgSignature {
  bool is_tensor = false;
  int tensor_count = 0;  // tensors a std::vector<Tensor> argument holds (1 for a Tensor)
  DType dtype = DType::f32;
  Shape shape;
  Device device;
  std::string value;  // non-tensor arguments: their value, formatted
  bool is_scope = false;  // the last entry: the DeviceScope / ColocateWith active at the call
};

// Appends the caller's active device scope to a signature: nodes record it as their requested
// device, so a call under another scope needs its own graph.
void describe_device_scope(std::vector<ArgSignature>& signature);

// fn as the non-template core calls it while tracing: symbolic tensor arguments in, flat outputs out.
struct TraceBody {
  void* fn = nullptr;
  std::vector<Tensor> (*invoke)(void* fn, std::span<const Tensor> symbolic_arguments) = nullptr;
};

// Everything about one traced function that does not depend on fn's C++ type: the graph cache,
// tracing a new signature (once, however many threads call with it at the same time), and running
// the cached graph. Defined in src/trace/function.cpp; TracedFunction reaches it through these
// functions only.
class TracedCore;
std::shared_ptr<TracedCore> make_traced_core(TraceOptions options);
// Runs the graph for `signature` (tracing `body` first if the signature is new) on `tensors`.
std::vector<Tensor> call_traced(TracedCore& core, const std::vector<ArgSignature>& signature,
                                std::span<const Tensor> tensors, TraceBody body);
// The graph for `signature`, traced now if it is new. Valid while its signature stays cached.
const Graph& traced_graph(TracedCore& core, const std::vector<ArgSignature>& signature,
                          std::span<const Tensor> tensors, TraceBody body);
int64_t trace_count(const TracedCore& core);
std::string last_retrace_reason(const TracedCore& core);
std::string timeline_json(const TracedCore& core);
TransferStats last_transfer_stats(const TracedCore& core);
CudaGraphInfo cuda_graph_info(const TracedCore& core);
TraceCacheStats cache_stats(const TracedCore& core);

// --- how arguments and results map to tensors ---

template <class T>
inline constexpr bool is_tensor_arg = std::is_same_v<std::remove_cvref_t<T>, Tensor>;
template <class T>
inline constexpr bool is_tensor_list_arg = std::is_same_v<std::remove_cvref_t<T>, std::vector<Tensor>>;

template <class T>
void describe_argument(const T& arg, std::vector<ArgSignature>& signature, std::vector<Tensor>& tensors) {
  ArgSignature s;
  if constexpr (is_tensor_arg<T>) {
    s.is_tensor = true;
    s.tensor_count = 1;
    s.dtype = arg.dtype();
    s.shape = arg.shape();
    s.device = arg.device();
    tensors.push_back(arg);
  } else if constexpr (is_tensor_list_arg<T>) {
    s.is_tensor = true;
    s.tensor_count = static_cast<int>(arg.size());
    for (const Tensor& t : arg) {
      s.value += fmt::format("{}{}@{};", dtype_name(t.dtype()), t.shape().str(), t.device().str());
      tensors.push_back(t);
    }
  } else if constexpr (std::is_enum_v<T>) {
    s.value = fmt::format("{}", static_cast<std::underlying_type_t<T>>(arg));
  } else {
    static_assert(std::is_arithmetic_v<T> || std::is_convertible_v<const T&, std::string_view>,
                  "trace: arguments must be Tensor, std::vector<Tensor>, numbers, enums or strings "
                  "(capture other things by reference instead)");
    s.value = fmt::format("{}", arg);
  }
  signature.push_back(std::move(s));
}

// The argument fn receives while traced: the next symbolic tensor(s), or the value itself.
template <class T>
decltype(auto) substitute(T&& arg, std::span<const Tensor> symbolic, size_t& cursor) {
  if constexpr (is_tensor_arg<T>) {
    return Tensor(symbolic[cursor++]);
  } else if constexpr (is_tensor_list_arg<T>) {
    std::vector<Tensor> list(symbolic.begin() + static_cast<std::ptrdiff_t>(cursor),
                             symbolic.begin() + static_cast<std::ptrdiff_t>(cursor + arg.size()));
    cursor += arg.size();
    return list;
  } else {
    return std::forward<T>(arg);
  }
}

template <class R>
struct Results;
template <>
struct Results<Tensor> {
  static std::vector<Tensor> flatten(Tensor r) { return {std::move(r)}; }
  static Tensor build(std::vector<Tensor>& outputs) { return std::move(outputs.at(0)); }
};
template <>
struct Results<std::vector<Tensor>> {
  static std::vector<Tensor> flatten(std::vector<Tensor> r) { return r; }
  static std::vector<Tensor> build(std::vector<Tensor>& outputs) { return std::move(outputs); }
};
template <class... Ts>
struct Results<std::tuple<Ts...>> {
  static_assert((std::is_same_v<Ts, Tensor> && ...), "trace: a returned tuple must hold only Tensors");
  static std::vector<Tensor> flatten(std::tuple<Ts...> r) {
    return std::apply([](auto&... t) { return std::vector<Tensor>{t...}; }, r);
  }
  static std::tuple<Ts...> build(std::vector<Tensor>& outputs) {
    return [&]<size_t... I>(std::index_sequence<I...>) { return std::tuple<Ts...>{outputs.at(I)...}; }(
        std::index_sequence_for<Ts...>{});
  }
};

}  // namespace detail

// The callable trace() returns. Copying it shares the cache of traced graphs. Calls may come from
// several threads at once.
template <class F>
class TracedFunction {
 public:
  TracedFunction(F fn, TraceOptions options)
      : fn_(std::make_shared<F>(std::move(fn))), core_(detail::make_traced_core(std::move(options))) {}

  template <class... Args>
  auto operator()(Args&&... args) {
    using R = std::invoke_result_t<F&, Args...>;
    if (is_tracing()) return (*fn_)(std::forward<Args>(args)...);  // inside another trace: inline
    Call<R, Args...> call(*this, args...);
    std::vector<Tensor> outputs = detail::call_traced(*core_, call.signature, call.tensors, call.body());
    if constexpr (!std::is_void_v<R>) return detail::Results<std::remove_cvref_t<R>>::build(outputs);
  }

  // The optimized graph for these arguments (traced now if this signature is new). The reference
  // stays valid while the signature is cached (TraceOptions::max_cached_graphs).
  template <class... Args>
  const Graph& graph(Args&&... args) {
    Call<std::invoke_result_t<F&, Args...>, Args...> call(*this, args...);
    return detail::traced_graph(*core_, call.signature, call.tensors, call.body());
  }

  int64_t trace_count() const { return detail::trace_count(*core_); }
  // Why the latest trace happened, as differences from the closest of the most recently used
  // signatures ("argument 0: shape [8, 5] -> [16, 5]"); "first call" for the first.
  std::string last_retrace_reason() const { return detail::last_retrace_reason(*core_); }
  // The last call's step statistics as Chrome/Perfetto trace-event JSON (needs collect_step_stats).
  std::string timeline_json() const { return detail::timeline_json(*core_); }
  // Tensors the last call moved between its device partitions (all zero on one device).
  TransferStats last_transfer_stats() const { return detail::last_transfer_stats(*core_); }
  // Whether the last call ran its graph as a CUDA Graph (TraceOptions::cuda_graphs), and why not.
  CudaGraphInfo cuda_graph_info() const { return detail::cuda_graph_info(*core_); }
  // How many graphs are cached, the bound, and how many were dropped.
  TraceCacheStats cache_stats() const { return detail::cache_stats(*core_); }

 private:
  // One call's signature (built once) and tensors, and how to run fn on symbolic arguments.
  template <class R, class... Args>
  struct Call {
    Call(TracedFunction& self, Args&... args) : fn(*self.fn_), arguments(args...) {
      std::apply([&](auto&... a) { (detail::describe_argument(a, signature, tensors), ...); }, arguments);
      detail::describe_device_scope(signature);
    }

    detail::TraceBody body() { return detail::TraceBody{this, &Call::invoke}; }

    static std::vector<Tensor> invoke(void* self, std::span<const Tensor> symbolic) {
      Call& call = *static_cast<Call*>(self);
      size_t cursor = 0;
      // Braced initialisation evaluates left to right, so arguments meet their tensors in order.
      auto call_args = std::apply(
          [&](auto&... a) {
            return std::tuple<decltype(detail::substitute(a, symbolic, cursor))...>{
                detail::substitute(a, symbolic, cursor)...};
          },
          call.arguments);
      if constexpr (std::is_void_v<R>) {
        std::apply(call.fn, std::move(call_args));
        return {};
      } else {
        return detail::Results<std::remove_cvref_t<R>>::flatten(std::apply(call.fn, std::move(call_args)));
      }
    }

    F& fn;
    std::tuple<Args&...> arguments;
    std::vector<detail::ArgSignature> signature;
    std::vector<Tensor> tensors;
  };

  std::shared_ptr<F> fn_;
  std::shared_ptr<detail::TracedCore> core_;
};

template <class F>
TracedFunction<std::decay_t<F>> trace(F&& fn, TraceOptions options = {}) {
  return TracedFunction<std::decay_t<F>>(std::forward<F>(fn), std::move(options));
}

}  // namespace flowlet
