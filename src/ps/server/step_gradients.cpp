// Averaging one variable's gradients over a synchronous step (step_gradients.hpp).
#include "ps/server/step_gradients.hpp"

#include <algorithm>

#include "core/check.hpp"
#include "flowlet/ops/creation.hpp"
#include "flowlet/ops/elementwise.hpp"
#include "flowlet/ops/shape.hpp"
#include "ps/server/request_checks.hpp"

namespace flowlet::detail::ps {
namespace {

StepGradient combine_dense(const std::vector<PushEntry>& entries, const Shape& piece_shape) {
  Tensor sum;
  for (const PushEntry& entry : entries) {
    const Tensor dense =
        is_dense(entry, piece_shape) ? entry.grad : scatter_add(entry.rows, entry.grad, piece_shape[0]);
    sum = sum.defined() ? sum + dense : dense;
  }
  if (entries.size() == 1) return {Tensor(), sum};
  return {Tensor(), sum / static_cast<double>(entries.size())};
}

StepGradient combine_sparse(const std::vector<PushEntry>& entries, int64_t pushes_in_step) {
  std::vector<int64_t> all_rows;
  std::vector<Tensor> grads;
  for (const PushEntry& entry : entries) {
    const std::vector<int64_t> rows = entry.rows.to_vector<int64_t>();
    all_rows.insert(all_rows.end(), rows.begin(), rows.end());
    grads.push_back(entry.grad);
  }
  std::vector<int64_t> unique = all_rows;
  std::sort(unique.begin(), unique.end());
  unique.erase(std::unique(unique.begin(), unique.end()), unique.end());
  // Where each pushed row's gradient goes among the unique rows.
  std::vector<int64_t> slot(all_rows.size());
  for (size_t i = 0; i < all_rows.size(); ++i) {
    slot[i] = std::lower_bound(unique.begin(), unique.end(), all_rows[i]) - unique.begin();
  }
  const auto n = static_cast<int64_t>(unique.size());
  const Device host;  // decoded gradients live on cpu:0
  const Tensor rows = tensor_from_host(unique.data(), unique.size(), i64, Shape{n}, host);
  const Tensor where = tensor_from_host(slot.data(), slot.size(), i64, Shape{static_cast<int64_t>(slot.size())}, host);
  const Tensor joined = grads.size() == 1 ? grads[0] : concat(grads, 0);
  const Tensor summed = scatter_add(where, joined, n);
  return {rows, pushes_in_step == 1 ? summed : summed / static_cast<double>(pushes_in_step)};
}

}  // namespace

StepGradient combine_step_gradients(const std::vector<PushEntry>& entries, const Shape& piece_shape,
                                    int64_t pushes_in_step) {
  if (entries.empty() || pushes_in_step < static_cast<int64_t>(entries.size())) {
    fail<InvalidArgument>("combine_step_gradients: need 1 .. pushes_in_step entries; got {} entries for {} pushes",
                          entries.size(), pushes_in_step);
  }
  const bool any_dense = std::any_of(entries.begin(), entries.end(),
                                     [&](const PushEntry& entry) { return is_dense(entry, piece_shape); });
  return any_dense ? combine_dense(entries, piece_shape) : combine_sparse(entries, pushes_in_step);
}

}  // namespace flowlet::detail::ps
