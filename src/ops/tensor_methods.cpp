// The Tensor methods that run ops (to, astype, contiguous) and element addressing for code that
// inspects single elements: they live with the ops, so core's Tensor needs nothing above core.
#include "flowlet/core/tensor.hpp"
#include "flowlet/ops/elementwise.hpp"
#include "ops/internal.hpp"

namespace flowlet {

Tensor Tensor::to(Device target) const { return detail::copy_to_device(*this, target); }

Tensor Tensor::astype(DType target) const { return cast(*this, target); }

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : detail::copy_to_contiguous(*this); }

namespace detail {

const char* element_address(const Tensor& t, int64_t index) {
  int64_t offset = 0;
  for (int64_t d = t.rank() - 1; d >= 0; --d) {
    const auto axis = static_cast<size_t>(d);
    offset += (index % t.shape()[axis]) * t.strides()[axis];
    index /= t.shape()[axis];
  }
  return static_cast<const char*>(t.raw_data()) + offset * static_cast<int64_t>(dtype_size(t.dtype()));
}

}  // namespace detail
}  // namespace flowlet
