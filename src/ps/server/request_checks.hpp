// What a server checks in a worker's request before it acts on it: that a push entry's gradient or
// a pull's rows fit the piece of the variable held here (dtype, shape, rows in range and, for
// pushes, unique). A request that fails is answered with an ErrorReply and changes nothing.
#pragma once

#include <string>

#include "flowlet/core/shape.hpp"
#include "flowlet/core/tensor.hpp"
#include "ps/sharding.hpp"
#include "ps/wire/messages.hpp"

namespace flowlet::detail::ps {

// The rows of a variable one server holds.
struct HeldPiece {
  const VariablePlacement* placement = nullptr;
  ShardPiece rows;
  Shape shape;  // rows x the variable's row shape (a rank-0 variable: its own shape, [])
};

// The shape of `rows` of `placement` (rank 0: the variable's own shape).
Shape piece_shape(const VariablePlacement& placement, const ShardPiece& rows);

// A dense entry: no rows (an empty handle, or an empty rows tensor with a gradient of the piece's
// whole shape). Otherwise the entry is sparse.
bool is_dense(const PushEntry& entry, const Shape& piece_shape);

// Why `entry` cannot be applied to `piece`, or "" when it can: the gradient's dtype and shape;
// for a sparse entry an i64 vector of unique rows, each in [0, piece rows), and a gradient of
// [rows, row shape...]. Non-floating variables take no gradient.
std::string push_entry_problem(const PushEntry& entry, const HeldPiece& piece);

// Why `rows` (a sparse pull) cannot be read from `piece`, or "": an i64 vector, each in
// [0, piece rows) (repeats allowed), of a variable of rank >= 1.
std::string pull_rows_problem(const Tensor& rows, const HeldPiece& piece);

}  // namespace flowlet::detail::ps
