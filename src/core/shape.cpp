// Shape printing and the shape checks shared by every op.
#include <limits>

#include "core/check.hpp"

namespace flowlet {

std::string Shape::str() const {
  return fmt::format("[{}]", fmt::join(begin(), end(), ", "));
}

namespace detail {

void check_shape(std::string_view op, const Shape& shape) {
  int64_t count = 1;
  bool overflow = false;
  for (int64_t d : shape) {
    if (d < 0) fail<ShapeError>("{}: dimensions must be >= 0; got shape {}", op, shape);
    if (d != 0 && count > std::numeric_limits<int64_t>::max() / d) overflow = true;
    count *= overflow ? 1 : d;
  }
  // The product of the non-zero dimensions must fit even when a zero dimension makes the count 0,
  // so that strides derived from the shape stay representable.
  if (overflow) fail<ShapeError>("{}: element count overflows int64; got shape {}", op, shape);
}

int64_t normalize_axis(std::string_view op, int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank) {
    fail<InvalidArgument>("{}: axis out of range for rank {}; got axis {}", op, rank, axis);
  }
  return axis < 0 ? axis + rank : axis;
}

}  // namespace detail
}  // namespace flowlet
