// Library-internal entry points that back Tensor's methods (contiguous, to).
#pragma once

#include "flowlet/core/tensor.hpp"

namespace flowlet::detail {

Tensor copy_to_contiguous(const Tensor& t);
Tensor copy_to_device(const Tensor& t, Device device);

// Address of element `index` (row-major order) of a host tensor, which may be a strided view.
const char* element_address(const Tensor& t, int64_t index);

}  // namespace flowlet::detail
