// Plans in-place strided reductions (see reduce_strided.hpp): drops size-1 dimensions, merges
// neighbours of the same kind, checks the innermost stride, and lists the offsets of the output
// bases and of the runs or rows each output adds up.
#include "ops/reduce_strided.hpp"

#include <algorithm>

namespace flowlet::detail {
namespace {

struct Dim {
  int64_t extent, stride;
  bool reduced;
};

// Element offsets of every index of `dims` (row-major, the last fastest), from offset 0.
std::vector<int64_t> offsets_of(const std::vector<Dim>& dims) {
  std::vector<int64_t> offsets{0};
  for (const Dim& d : dims) {
    std::vector<int64_t> next;
    next.reserve(offsets.size() * static_cast<size_t>(d.extent));
    for (int64_t base : offsets)
      for (int64_t i = 0; i < d.extent; ++i) next.push_back(base + i * d.stride);
    offsets.swap(next);
  }
  return offsets;
}

}  // namespace

std::optional<StridedReduction> plan_strided_reduction(const Tensor& t, const std::vector<int64_t>& axes,
                                                       int64_t min_run) {
  if (axes.empty() || t.numel() == 0) return std::nullopt;
  const bool adjacent = axes.back() - axes.front() + 1 == static_cast<int64_t>(axes.size());
  if (adjacent && t.is_contiguous()) return std::nullopt;  // the block path reads it in place already

  std::vector<Dim> dims;
  for (int64_t d = 0; d < t.rank(); ++d) {
    const auto i = static_cast<size_t>(d);
    if (t.shape()[i] == 1) continue;
    const bool reduced = std::binary_search(axes.begin(), axes.end(), d);
    if (!dims.empty() && dims.back().reduced == reduced && dims.back().stride == t.strides()[i] * t.shape()[i]) {
      dims.back().extent *= t.shape()[i];  // one dimension in memory: merge
      dims.back().stride = t.strides()[i];
    } else {
      dims.push_back({t.shape()[i], t.strides()[i], reduced});
    }
  }
  if (dims.empty() || dims.back().stride != 1 || dims.back().extent < min_run) return std::nullopt;

  StridedReduction plan;
  plan.kind = dims.back().reduced ? StridedReduction::Kind::runs : StridedReduction::Kind::columns;
  plan.run = dims.back().extent;
  dims.pop_back();
  std::vector<Dim> kept, reduced;
  for (const Dim& d : dims) (d.reduced ? reduced : kept).push_back(d);
  plan.out_offsets = offsets_of(kept);
  plan.reduced_offsets = offsets_of(reduced);
  return plan;
}

}  // namespace flowlet::detail
