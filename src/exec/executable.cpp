#include "exec/executable.hpp"

#include <chrono>

#include <fmt/format.h>

#include "runtime/rendezvous.hpp"
#include "runtime/thread_pool.hpp"

namespace flowlet::detail {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Executable::Executable(std::shared_ptr<const Graph> graph, bool dynamic_shapes, bool cuda_graphs)
    : graph_(std::move(graph)) {
  partitioned_ = split_partitions(*graph_);
  if (partitioned_.partitions.size() <= 1) {
    const Plan& plan = *plans_[plans_.push_back(std::make_unique<Plan>(graph_, dynamic_shapes))];
    why_not_captured_ = GraphCapture::why_not(*graph_, plan, dynamic_shapes, cuda_graphs);
    if (why_not_captured_.empty()) capture_ = std::make_unique<GraphCapture>(*graph_, plan);
    return;
  }
  why_not_captured_ = fmt::format("it spans {} devices", partitioned_.partitions.size());
  for (const GraphPartition& part : partitioned_.partitions) {
    plans_.push_back(std::make_unique<Plan>(part.graph, dynamic_shapes, part.global_ids, /*in_group=*/true));
  }
}

Executable::~Executable() = default;

CudaGraphInfo Executable::cuda_graph_info() const {
  if (capture_) return capture_->info();
  CudaGraphInfo info;
  info.why_not = why_not_captured_;
  return info;
}

std::vector<Tensor> Executable::run(std::span<const Tensor> arguments, StepStats* stats) const {
  if (plans_.size() == 1) {
    if (capture_ && !(stats && stats->record_nodes)) return capture_->run(arguments);
    return plans_[PartitionIndex(0)]->run(arguments, stats);
  }
  Rendezvous rendezvous(partitioned_.slots);
  StepShared shared;
  shared.context.rendezvous = &rendezvous;
  shared.remaining = static_cast<int>(plans_.size());
  if (stats) {
    stats->nodes.clear();
    if (stats->record_nodes) shared.stats = stats;
    shared.start_ns = now_ns();
  }
  // A cancelled step wakes its parked Recvs (they fail with Cancelled; the first error wins).
  shared.cancellation.on_cancel([&rendezvous] {
    rendezvous.abort(std::make_exception_ptr(Cancelled("the step was cancelled: another node failed")));
  });
  IndexedVector<PartitionIndex, Plan::StepPtr> steps;
  for (const auto& plan : plans_) steps.push_back(plan->make_step(shared, arguments));
  // Every partition but the first starts on a pool thread; the caller runs the first, then waits.
  const PartitionIndex first(0);
  for (PartitionIndex p = first + 1; p < plans_.end_index(); ++p) schedule(&Plan::start_task, steps[p].get());
  plans_[first]->start(*steps[first]);
  shared.wait();
  if (stats) {
    stats->wall_ns = now_ns() - shared.start_ns;
    stats->bytes_transferred = rendezvous.bytes_moved();
    stats->transfers = rendezvous.transfers();
  }
  if (shared.error) rethrow_from_node(shared.error, *shared.error_node);
  std::vector<Tensor> outputs;
  outputs.reserve(partitioned_.outputs.size());
  for (const auto& [partition, i] : partitioned_.outputs) {
    const PartitionIndex p(partition);
    outputs.push_back(plans_[p]->output(*steps[p], static_cast<size_t>(i)));
  }
  return outputs;
}

}  // namespace flowlet::detail
