// Text form of tensors: nested brackets, abbreviated past 1000 elements, then shape and dtype.
#include <string>

#include "core/check.hpp"
#include "core/dtype_visit.hpp"

namespace flowlet {
namespace {

constexpr int64_t kSummarizeAbove = 1000;
constexpr int64_t kEdgeItems = 3;

template <class T>
void append_value(std::string& out, T value) {
  if constexpr (std::is_same_v<T, bool>) out += value ? "true" : "false";
  else if constexpr (std::is_same_v<T, uint8_t>) fmt::format_to(std::back_inserter(out), "{}", static_cast<int>(value));
  else if constexpr (std::is_same_v<T, f16_t> || std::is_same_v<T, bf16_t>) fmt::format_to(std::back_inserter(out), "{}", static_cast<float>(value));
  else fmt::format_to(std::back_inserter(out), "{}", value);
}

template <class T>
void append_dim(std::string& out, const T* data, const Shape& shape, const Strides& strides, size_t dim, bool summarize) {
  if (dim == shape.size()) {
    append_value(out, *data);
    return;
  }
  out += '[';
  const int64_t extent = shape[dim];
  const bool skip = summarize && extent > 2 * kEdgeItems;
  const std::string separator = dim + 1 == shape.size() ? ", " : ",\n" + std::string(dim + 8, ' ');
  for (int64_t i = 0; i < extent; ++i) {
    if (skip && i == kEdgeItems) {
      out += "..." + separator;
      i = extent - kEdgeItems;
    }
    append_dim(out, data + i * strides[dim], shape, strides, dim + 1, summarize);
    if (i + 1 < extent) out += separator;
  }
  out += ']';
}

}  // namespace

std::string to_string(const Tensor& t) {
  if (!t.defined()) return "tensor(undefined)";
  const Tensor host = t.device().kind() == DeviceKind::cpu ? t : t.to(Device("cpu"));
  std::string out = "tensor(";
  detail::visit_dtype<detail::kAll>(host.dtype(), [&]<class T>(detail::TypeTag<T>) {
    append_dim(out, static_cast<const T*>(host.raw_data()), host.shape(), host.strides(), 0,
               host.numel() > kSummarizeAbove);
  });
  fmt::format_to(std::back_inserter(out), ", shape={}, dtype={}", t.shape(), t.dtype());
  if (t.device() != Device()) fmt::format_to(std::back_inserter(out), ", device={}", t.device());
  out += ')';
  return out;
}

}  // namespace flowlet
