// Executable: a finished graph ready to run, as one Plan per device partition. A graph on one
// device runs its single plan directly (no rendezvous, nothing shared). A graph over several
// devices runs every partition at once, each started on its own pool thread: the partitions meet
// only at the step's rendezvous (Send/Recv pairs) and share its cancellation, so one failing node
// stops them all and its error is rethrown with the node's name.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "exec/executor.hpp"
#include "exec/graph_capture.hpp"
#include "trace/passes/passes.hpp"

namespace flowlet::detail {

class Executable {
 public:
  // `graph` is placed and has its Send/Recv pairs (optimize() did both). `cuda_graphs`: a graph
  // wholly on one GPU may replay as a CUDA Graph (exec/graph_capture.hpp; the caller passes false
  // when it wants per-node statistics).
  Executable(std::shared_ptr<const Graph> graph, bool dynamic_shapes, bool cuda_graphs = true);
  ~Executable();

  std::vector<Tensor> run(std::span<const Tensor> arguments, StepStats* stats = nullptr) const;

  const Graph& graph() const { return *graph_; }
  size_t num_partitions() const { return plans_.size(); }
  CudaGraphInfo cuda_graph_info() const;
  const GraphPartition& partition(size_t i) const { return partitioned_.partitions.at(i); }

 private:
  std::shared_ptr<const Graph> graph_;
  PartitionedGraph partitioned_;
  IndexedVector<PartitionIndex, std::unique_ptr<Plan>> plans_;
  std::unique_ptr<GraphCapture> capture_;  // set when the single plan may run as a CUDA Graph
  std::string why_not_captured_;
};

}  // namespace flowlet::detail
