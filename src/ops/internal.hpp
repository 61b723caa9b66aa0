// Library-internal entry points that back Tensor's methods (contiguous, to).
#pragma once

#include "flowlet/core/tensor.hpp"

namespace flowlet::detail {

Tensor copy_to_contiguous(const Tensor& t);
Tensor copy_to_device(const Tensor& t, Device device);

}  // namespace flowlet::detail
