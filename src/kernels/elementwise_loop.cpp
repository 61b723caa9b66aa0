// Broadcasting rules shared by every elementwise op, and dtype-set names for error messages.
#include "kernels/elementwise_loop.hpp"

namespace flowlet::detail {

std::string dtype_set_text(DTypeSet set) {
  std::string text;
  for (int i = 0; i < kNumDTypes; ++i) {
    if (!(set & (DTypeSet{1} << i))) continue;
    if (!text.empty()) text += ", ";
    text += dtype_name(static_cast<DType>(i));
  }
  return text;
}

Shape broadcast_shapes(std::string_view op, const Shape& a, const Shape& b) {
  if (a == b) return a;
  const size_t rank = std::max(a.size(), b.size());
  Shape result;
  for (size_t i = 0; i < rank; ++i) {
    const int64_t da = i + a.size() >= rank ? a[i + a.size() - rank] : 1;
    const int64_t db = i + b.size() >= rank ? b[i + b.size() - rank] : 1;
    if (da != db && da != 1 && db != 1) {
      fail<ShapeError>("{}: cannot broadcast; got a {} and b {}", op, a, b);
    }
    result.push_back(da == 1 ? db : da);
  }
  return result;
}

Strides broadcast_strides(const Tensor& t, const Shape& shape) {
  const size_t rank = shape.size();
  const size_t own = t.shape().size();
  Strides strides(rank, 0);
  for (size_t i = 0; i < own; ++i) {
    const size_t d = rank - own + i;
    strides[d] = t.shape()[i] == 1 && shape[d] != 1 ? 0 : t.strides()[i];
  }
  return strides;
}

}  // namespace flowlet::detail
