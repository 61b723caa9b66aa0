#include "collective/mirrored/gradient_averaging.hpp"

#include "collective/communicator.hpp"
#include "collective/mirrored/replica_step.hpp"
#include "collective/replica_context.hpp"
#include "core/check.hpp"
#include "flowlet/collective.hpp"
#include "flowlet/ops/creation.hpp"
#include "flowlet/ops/elementwise.hpp"
#include "flowlet/ops/shape.hpp"

namespace flowlet::detail {

namespace {
constexpr int64_t kDefaultBucketBytes = int64_t{4} << 20;

int64_t byte_size(const Tensor& t) { return t.numel() * static_cast<int64_t>(dtype_size(t.dtype())); }
}  // namespace

std::vector<std::vector<size_t>> gradient_buckets(const std::vector<Tensor>& grads, int64_t bucket_bytes) {
  std::vector<std::vector<size_t>> buckets;
  int64_t bytes = 0;
  for (size_t k = grads.size(); k-- > 0;) {
    const Tensor& g = grads[k];
    if (!g.defined()) continue;
    const bool fits = !buckets.empty() && grads[buckets.back().front()].dtype() == g.dtype() &&
                      bytes + byte_size(g) <= bucket_bytes;
    if (!fits) {
      buckets.emplace_back();
      bytes = 0;
    }
    buckets.back().push_back(k);
    bytes += byte_size(g);
  }
  return buckets;
}

std::vector<Tensor> average_gradients(const std::vector<Tensor>& grads) {
  return average_gradients_with_completion(grads).grads;
}

AveragedGradients average_gradients_with_completion(const std::vector<Tensor>& grads) {
  const ReplicaContext* replica = current_replica();
  if (replica == nullptr || !replica->communicator) {
    fail<InvalidArgument>("average_gradients: called outside MirroredStrategy::run");
  }
  if (replica->communicator->size() == 1) return {grads, Tensor()};  // one replica: its gradient is the average
  const ReplicaStep* step = current_replica_step();
  if (step != nullptr && step->strategy != replica->strategy) step = nullptr;
  const int replicas = replica->communicator->size();
  // Weight rows_r / B makes the sum the full batch's mean gradient (for a loss that is a mean over
  // the replica's rows). When every replica has the same rows (or without a step: a replica set up
  // by hand) that is the mean over replicas, which the all-reduce computes without a pass of its own.
  const bool even = step == nullptr || (step->global_rows > 0 && step->global_rows % replicas == 0);
  const double weight =
      even || step->global_rows == 0 ? 1.0 : static_cast<double>(step->rows) / static_cast<double>(step->global_rows);
  const bool contributes = even || step->rows > 0;  // 0 rows: its mean gradient is 0/0
  const ReduceOp reduction = even ? ReduceOp::mean : ReduceOp::sum;
  const int64_t bucket_bytes = step != nullptr && step->bucket_bytes > 0 ? step->bucket_bytes : kDefaultBucketBytes;

  std::vector<Tensor> averaged(grads.size());
  Tensor last_reduced;
  for (const std::vector<size_t>& bucket : gradient_buckets(grads, bucket_bytes)) {
    std::vector<Tensor> flat;
    flat.reserve(bucket.size());
    for (size_t k : bucket) {
      const Tensor& g = grads[k];
      const Tensor row = g.rank() == 1 ? g : reshape(g, Shape{g.numel()});  // no node for a no-op
      flat.push_back(!contributes ? zeros_like(row) : weight == 1.0 ? row : row * weight);
    }
    const Tensor reduced = all_reduce(flat.size() == 1 ? flat[0] : concat(flat, 0), reduction);
    if (reduced.numel() > 0) last_reduced = reduced;
    int64_t offset = 0;
    for (size_t k : bucket) {
      const Tensor& g = grads[k];
      const Tensor part = bucket.size() == 1 ? reduced : slice(reduced, 0, offset, g.numel());
      averaged[k] = g.rank() == 1 ? part : reshape(part, g.shape());
      offset += g.numel();
    }
  }
  Tensor completed;
  if (last_reduced.defined()) {
    // 1 whatever the value (NaN included), but computed from it: the graph runs this only after the
    // all-reduce succeeded. The passes fold neither where() with equal branches nor a value's compare.
    const Tensor first = slice(last_reduced, 0, 0, 1);
    const Tensor one = ones({1}, i64, last_reduced.device());
    completed = reshape(where(first == first, one, one), Shape{});
  }
  return {std::move(averaged), completed};
}

}  // namespace flowlet::detail
