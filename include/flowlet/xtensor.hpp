// Zero-copy interop with xtensor, for users who already hold xtensor arrays. Opt-in: the umbrella
// header does not include it, so ordinary users never compile xtensor's templates.
//
//   xt::xarray<float> a = {{1, 2}, {3, 4}};
//   fl::Tensor t = fl::from_xtensor(std::move(a));   // adopts the buffer, no copy
//   auto view = fl::as_xtensor<float>(t);             // an xtensor view of t's memory, no copy
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include <xtensor/xadapt.hpp>
#include <xtensor/xarray.hpp>

#include "flowlet/core/tensor.hpp"

namespace flowlet {

// An xtensor adaptor over t's elements (honouring its strides). Writes through it change t.
// DTypeError unless T matches; DeviceError unless t is on a CPU device.
template <Element T>
auto as_xtensor(const Tensor& t) {
  T* data = t.data<T>();
  if (t.device().kind() != DeviceKind::cpu) {
    throw DeviceError("as_xtensor: tensor must be on a CPU device; got " + t.device().str());
  }
  std::vector<size_t> shape;
  std::vector<std::ptrdiff_t> strides;
  size_t extent = t.numel() == 0 ? 0 : 1;
  for (size_t d = 0; d < t.shape().size(); ++d) {
    shape.push_back(static_cast<size_t>(t.shape()[d]));
    strides.push_back(static_cast<std::ptrdiff_t>(t.strides()[d]));
    if (t.shape()[d] > 0) extent += static_cast<size_t>((t.shape()[d] - 1) * t.strides()[d]);
  }
  return xt::adapt(data, extent, xt::no_ownership(), shape, strides);
}

// Adopts an xtensor array's buffer without copying; the tensor keeps the array alive.
template <Element T>
Tensor from_xtensor(xt::xarray<T>&& array) {
  auto owner = std::make_shared<xt::xarray<T>>(std::move(array));
  Shape shape;
  Strides strides;
  for (size_t d = 0; d < owner->dimension(); ++d) {
    shape.push_back(static_cast<int64_t>(owner->shape()[d]));
    strides.push_back(static_cast<int64_t>(owner->strides()[d]));
  }
  auto storage = make_ref<Storage>(owner->data(), owner->size() * sizeof(T), Device(), owner);
  return Tensor::view(std::move(storage), std::move(shape), std::move(strides), 0, dtype_of<T>);
}

// Evaluates any xtensor expression into a new tensor (one copy).
template <class E>
Tensor from_xtensor(const xt::xexpression<E>& expression) {
  using T = typename E::value_type;
  return from_xtensor(xt::xarray<T>(expression));
}

}  // namespace flowlet
