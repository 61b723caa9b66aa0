// Shape printing and the shape checks shared by every op.
#include "core/allocator.hpp"
#include "core/check.hpp"

namespace flowlet {

std::string Shape::str() const {
  return fmt::format("[{}]", fmt::join(begin(), end(), ", "));
}

int64_t Shape::numel_slow() const {
  for (int64_t d : dims_) {
    if (d == 0) return 0;
  }
  detail::fail<ShapeError>("numel: element count overflows int64; got shape {}", *this);
}

namespace detail {

void throw_strides_overflow(const Shape& shape) {
  fail<ShapeError>("strides: a stride overflows int64; got shape {}", shape);
}

std::string size_rule_message(std::string_view op, const Shape& shape, DType dtype) {
  for (int64_t d : shape) {
    if (d < 0) return fmt::format("{}: dimensions must be >= 0; got shape {}", op, shape);
  }
  return fmt::format(
      "{}: shape has more bytes than fit in memory (the product of its non-zero dimensions times the item size must "
      "fit in int64); got shape {} of {}",
      op, shape, dtype);
}

void fail_size(std::string_view op, const Shape& shape, DType dtype) { throw ShapeError(size_rule_message(op, shape, dtype)); }

void check_shape(std::string_view op, const Shape& shape) {
  int64_t count = 1;
  for (int64_t d : shape) {
    if (d < 0) fail<ShapeError>("{}: dimensions must be >= 0; got shape {}", op, shape);
    // Zero dimensions are skipped, not multiplied in: the product of the others must fit wherever a
    // zero sits, so that strides derived from the shape stay representable.
    if (d != 0 && __builtin_mul_overflow(count, d, &count)) {
      fail<ShapeError>("{}: element count overflows int64; got shape {}", op, shape);
    }
  }
}

int64_t normalize_axis(std::string_view op, int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank) {
    fail<InvalidArgument>("{}: axis out of range for rank {}; got axis {}", op, rank, axis);
  }
  return axis < 0 ? axis + rank : axis;
}

}  // namespace detail
}  // namespace flowlet
