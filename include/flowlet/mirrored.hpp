// MirroredStrategy: synchronous data parallelism. Every replica holds a copy of the model's
// variables, runs the same step on its share of the batch, and averages its gradients with every
// other replica's before the update, so the copies stay equal.
//
//   MirroredStrategy dp({Device("cpu:0"), Device("cpu:1")});   // 2 replicas per process
//   nn::Sequential model;
//   { auto scope = dp.scope(); build(model); }                  // mirrored variables
//   const std::vector<Variable> params = model.parameters();
//   optim::Adam opt(1e-3);
//   auto step = [&](Tensor x, Tensor y) {
//     GradientTape tape;
//     Tensor loss = mean(softmax_cross_entropy(model(x), y));
//     opt.apply(tape.gradient(loss, params), params);            // averages over replicas first
//     return loss;
//   };
//   std::vector<Tensor> losses = dp.run(step, images, labels);  // one loss per local replica
//
// Replicas: the local devices of every process (global replica = process * local count + local).
// Every process passes the same global batch; run() gives global replica r its rows.
//
// What is exact and what is close:
//   - A batch of B rows over R replicas: replica r gets B / R rows, and the first B mod R replicas
//     one more (a replica may get 0 rows; it still takes part in every collective). Inside run(),
//     Optimizer::apply replaces each replica's gradient by sum_r (rows_r / B) * g_r (an all-reduce
//     mean when every replica has B / R rows), which equals the full-batch gradient when the loss
//     is the mean over the replica's rows (the usual `mean(...)` loss); a replica with 0 rows
//     contributes zeros. The result differs from one
//     device's full-batch gradient only by floating-point rounding (the sums are grouped
//     differently), so training matches single-device training closely, not bit for bit.
//   - Every replica receives the same all-reduced bits and applies the same update, so the copies
//     of a mirrored variable stay bit-identical (MirroredOptions::check_replicas_equal verifies it).
//
// Mirrored variables: a Variable made inside scope() has one copy per local replica on that
// replica's device, all equal to global replica 0's initial value. Creating one is a broadcast over
// the job's processes: every process must create its mirrored variables in the same order. Inside
// run() a mirrored variable (captured by fn like any variable) reads, updates and identifies the
// running replica's copy; outside run() reads give replica 0's copy, and updates (assign, a
// checkpoint restore) apply to every local copy. Optimizer slots and step counters of mirrored
// variables are mirrored too.
//
// run(fn, batch...): fn takes one Tensor per batch argument and returns what a traced function may
// return (Tensor, std::vector<Tensor>, a tuple of Tensors, or nothing). It is traced once per local
// replica (under a DeviceScope of the replica's device, one replica after another) and each
// replica's graph runs on its own persistent thread; run() returns fn's results for the local
// replicas, in local order. One run() at a time per strategy.
//
// Traces are kept for later calls with a callable of the same type and the same bytes (capture what
// changes between steps, and anything that owns memory, by reference, or it traces again). Making
// new mirrored variables (a new model in scope(), a new optimizer's state) drops the traces, so a
// new step lambda whose bytes repeat the old one's never runs the old model.
//
// Failures: an exception in any replica is rethrown after every replica has finished; replicas
// waiting in a collective for the failed one fail by the collective timeout
// (MirroredOptions::collective_timeout_seconds) instead of hanging. A replica whose trace fails
// stops every local replica before any runs. After a step that failed while running, variables
// whose updates waited for the gradient all-reduce are unchanged on every replica, and so is the
// optimizer's step counter (its increment waits for the all-reduce too); in one process the
// strategy then starts its replicas on a new communicator and traces fn again, while in a job of
// several processes further run() calls throw (the processes' collectives are out of step).
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "flowlet/core/device.hpp"
#include "flowlet/core/tensor.hpp"
#include "flowlet/trace.hpp"

namespace flowlet {

struct MirroredOptions {
  // Gradients are all-reduced in buckets of about this many bytes (one all_reduce per bucket; a
  // larger gradient gets a bucket of its own). > 0.
  int64_t bucket_bytes = int64_t{4} << 20;
  // After every run(), compare a checksum of every mirrored variable across all replicas and throw
  // InvalidArgument naming the first variable that differs and the replicas (costs a pass over the
  // variables and, across processes, an all_gather).
  bool check_replicas_equal = false;
  // A collective whose peers do not all arrive within this many seconds throws DeadlineExceeded.
  // <= 0: FLOWLET_COLLECTIVE_TIMEOUT, or 300 when unset.
  double collective_timeout_seconds = 0;
  // Options of the per-replica traces (collect_step_stats for timelines, dumps, ...).
  TraceOptions trace_options;
};

namespace detail {

class MirroredCore;

// Which traces a call reuses: the callable's type and its bytes (what a lambda captures: the
// addresses of what it captures by reference, the bytes of what it captures by value), so a lambda
// whose captured values changed traces anew instead of running a graph with the old values baked
// in. A captured object that owns memory (a std::vector, a std::string) has new bytes in every copy
// of the lambda, so it traces again each time: capture such things by reference.
struct FunctionKey {
  const std::type_info* type = nullptr;
  std::string bytes;
  bool operator==(const FunctionKey& other) const { return *type == *other.type && bytes == other.bytes; }
};

template <class Fn>
FunctionKey function_key(const Fn& fn) {
  FunctionKey key{&typeid(Fn), {}};
  if constexpr (!std::is_empty_v<Fn>) {
    key.bytes.assign(reinterpret_cast<const char*>(std::addressof(fn)), sizeof(Fn));
  }
  return key;
}

// fn applied to the symbolic slices while a replica is traced; its results flattened.
template <class Fn, class R, size_t N>
std::vector<Tensor> invoke_replica(void* fn, std::span<const Tensor> symbolic) {
  Fn& f = *static_cast<Fn*>(fn);
  return [&]<size_t... I>(std::index_sequence<I...>) -> std::vector<Tensor> {
    if constexpr (std::is_void_v<R>) {
      f(Tensor(symbolic[I])...);
      return {};
    } else {
      return Results<std::remove_cvref_t<R>>::flatten(f(Tensor(symbolic[I])...));
    }
  }(std::make_index_sequence<N>{});
}

// The non-template core of run(): splits `batches`, traces `body` per local replica (once per
// signature), runs the replicas and returns each local replica's flattened results.
std::vector<std::vector<Tensor>> run_mirrored(MirroredCore& core, const FunctionKey& key, TraceBody body,
                                              std::span<const Tensor> batches);

template <class T>
using AsTensor = Tensor;

}  // namespace detail

class MirroredStrategy {
 public:
  // Replicas on `local_devices` of every process (all CPU devices or all GPUs, distinct; every
  // process passes the same number). Empty: one replica per process on its default device
  // (cuda:<local_process_index()> when the machine has GPUs, else cpu:0). Collective over the
  // job's processes: every process constructs its strategies in the same order.
  explicit MirroredStrategy(std::vector<Device> local_devices = {}, MirroredOptions options = {});
  ~MirroredStrategy();
  MirroredStrategy(const MirroredStrategy&) = delete;
  MirroredStrategy& operator=(const MirroredStrategy&) = delete;

  int num_replicas() const;        // over all processes
  int num_local_replicas() const;  // in this process
  const std::vector<Device>& local_devices() const;
  const MirroredOptions& options() const;

  // While alive (on this thread), every Variable made is mirrored over the strategy's replicas.
  // It keeps the strategy's state alive (a scope that outlives its strategy stays valid).
  class Scope {
   public:
    ~Scope();
    Scope(Scope&& other) noexcept;
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    Scope& operator=(Scope&&) = delete;

   private:
    friend class MirroredStrategy;
    Scope(std::shared_ptr<const void> core, const void* policy);
    std::shared_ptr<const void> core_;
    const void* previous_ = nullptr;
    bool active_ = false;
  };
  [[nodiscard]] Scope scope() const;

  // Runs fn once per local replica on its share of every batch (see the top of this file).
  // InvalidArgument for a batch of rank 0 or batches whose axis 0 differ.
  template <class F, class... Batches>
  auto run(F&& fn, const Batches&... batches) {
    static_assert((std::is_same_v<Batches, Tensor> && ...), "MirroredStrategy::run: batch arguments must be Tensors");
    using Fn = std::remove_reference_t<F>;
    using R = std::invoke_result_t<Fn&, detail::AsTensor<Batches>...>;
    const std::array<Tensor, sizeof...(Batches)> arguments{batches...};
    const detail::TraceBody body{const_cast<void*>(static_cast<const void*>(std::addressof(fn))),
                                 &detail::invoke_replica<Fn, R, sizeof...(Batches)>};
    std::vector<std::vector<Tensor>> outputs =
        detail::run_mirrored(*core_, detail::function_key(fn), body, std::span<const Tensor>(arguments));
    if constexpr (!std::is_void_v<R>) {
      std::vector<std::remove_cvref_t<R>> results;
      results.reserve(outputs.size());
      for (std::vector<Tensor>& o : outputs) results.push_back(detail::Results<std::remove_cvref_t<R>>::build(o));
      return results;
    }
  }

  // Compares a checksum of every mirrored variable of this strategy across all replicas now
  // (collective over processes); InvalidArgument naming the first that differs and the replicas.
  void check_replicas_equal() const;

  // The optimized graph local replica `local` ran in the last run() (valid until the next run());
  // InvalidArgument before the first run.
  const Graph& graph(int local = 0) const;

  // The last run()'s step statistics of local replica `local` as Chrome/Perfetto JSON (needs
  // options().trace_options.collect_step_stats); empty before the first run.
  std::string timeline_json(int local = 0) const;

 private:
  std::shared_ptr<detail::MirroredCore> core_;
};

}  // namespace flowlet
