// The checks a server makes on pushes and pulls before it touches a piece (request_checks.hpp).
#include "ps/server/request_checks.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "flowlet/core/format.hpp"

namespace flowlet::detail::ps {
namespace {

std::string describe(const Tensor& t) {
  return t.defined() ? fmt::format("{} {}", t.dtype(), t.shape()) : std::string("an empty handle");
}

// "" when `rows` is an i64 vector whose values lie in [0, limit) (and, with `unique`, differ).
std::string rows_problem(const Tensor& rows, int64_t limit, bool unique) {
  if (!rows.defined() || rows.dtype() != i64 || rows.rank() != 1) {
    return fmt::format("rows must be an i64 vector; got {}", describe(rows));
  }
  std::vector<int64_t> values = rows.to_vector<int64_t>();
  for (int64_t r : values) {
    if (r < 0 || r >= limit) return fmt::format("row {} is outside the piece's rows [0, {})", r, limit);
  }
  if (unique) {
    std::sort(values.begin(), values.end());
    auto repeated = std::adjacent_find(values.begin(), values.end());
    if (repeated != values.end()) return fmt::format("row {} appears more than once", *repeated);
  }
  return {};
}

}  // namespace

Shape piece_shape(const VariablePlacement& placement, const ShardPiece& rows) {
  if (placement.shape.rank() == 0) return placement.shape;
  Shape shape = placement.shape;
  shape[0] = rows.rows();
  return shape;
}

bool is_dense(const PushEntry& entry, const Shape& piece_shape) {
  return !entry.rows.defined() ||
         (entry.rows.numel() == 0 && entry.grad.defined() && entry.grad.shape() == piece_shape);
}

std::string push_entry_problem(const PushEntry& entry, const HeldPiece& piece) {
  const VariablePlacement& p = *piece.placement;
  if (!is_floating(p.dtype)) return fmt::format("variable is {} and takes no gradient", p.dtype);
  if (!entry.grad.defined()) return "the gradient is an empty handle";
  if (entry.grad.dtype() != p.dtype) {
    return fmt::format("gradient dtype {} differs from the variable's {}", entry.grad.dtype(), p.dtype);
  }
  if (is_dense(entry, piece.shape)) {
    if (!(entry.grad.shape() == piece.shape)) {
      return fmt::format("dense gradient shape {} differs from the piece's {} (rows [{}, {}) of {})",
                         entry.grad.shape(), piece.shape, piece.rows.row_begin, piece.rows.row_end, p.shape);
    }
    return {};
  }
  if (p.shape.rank() == 0) return "a scalar variable takes no sparse gradient";
  if (std::string problem = rows_problem(entry.rows, piece.rows.rows(), /*unique=*/true); !problem.empty()) {
    return problem;
  }
  Shape expected = piece.shape;
  expected[0] = entry.rows.shape()[0];
  if (!(entry.grad.shape() == expected)) {
    return fmt::format("sparse gradient shape {} does not fit {} rows of the piece's {}; expected {}",
                       entry.grad.shape(), entry.rows.shape()[0], piece.shape, expected);
  }
  return {};
}

std::string pull_rows_problem(const Tensor& rows, const HeldPiece& piece) {
  if (piece.placement->shape.rank() == 0) return "a scalar variable has no rows to pull";
  return rows_problem(rows, piece.rows.rows(), /*unique=*/false);
}

}  // namespace flowlet::detail::ps
