// Dtype checks for op rules on the host: DTypeError naming the op and the dtypes it supports. The
// dtype sets, the visitor and the conversions themselves are in core/dtype_visit.hpp.
#pragma once

#include <cmath>
#include <string>
#include <string_view>

#include "core/check.hpp"
#include "core/dtype_visit.hpp"

namespace flowlet::detail {

std::string dtype_set_text(DTypeSet set);  // "f32, f64"

// DTypeError unless `dt` is in `allowed`.
inline void check_dtype(std::string_view op, DType dt, DTypeSet allowed) {
  if (!(allowed & bit(dt))) {
    fail<DTypeError>("{}: unsupported dtype; got {}, supported: {}", op, dt, dtype_set_text(allowed));
  }
}

}  // namespace flowlet::detail
