// Tensor: a cheap handle to (shape, strides, offset, dtype, storage). Copies share the storage.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "flowlet/core/device.hpp"
#include "flowlet/core/dtype.hpp"
#include "flowlet/core/error.hpp"
#include "flowlet/core/ref.hpp"
#include "flowlet/core/shape.hpp"
#include "flowlet/core/storage.hpp"

namespace flowlet {

namespace detail {
// The state behind a Tensor handle. Views share `storage` and differ in shape, strides and offset.
struct TensorImpl final : RefCounted {
  // Pooled per thread: tensors are created and dropped at the rate of eager ops.
  static void* operator new(size_t bytes);
  static void operator delete(void* pointer);

  Shape shape;
  int64_t numel = 0;  // shape.numel(), cached
  Strides strides;
  int64_t offset = 0;  // in elements
  DType dtype = DType::f32;
  // Non-zero while the tensor is symbolic: a value of graph `trace_id` being traced (output
  // `trace_output` of node `trace_node`), with a shape and dtype but no elements yet.
  uint32_t trace_id = 0;
  int32_t trace_node = -1;
  int32_t trace_output = 0;
  Ref<Storage> storage;
};
}  // namespace detail

// Example:
//   Tensor x = tensor({1.0f, 2.0f, 3.0f});
//   Tensor y = x * 2.0f + 1.0f;        // runs now
//   float first = y.to_vector<float>()[0];
class Tensor {
 public:
  Tensor() = default;  // an empty handle; ops reject it with InvalidArgument
  explicit Tensor(Ref<detail::TensorImpl> impl) : impl_(std::move(impl)) {}

  // A new contiguous, uninitialized tensor.
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device());
  // A view of `storage` (no copy). The caller guarantees the view stays inside the storage.
  static Tensor view(Ref<Storage> storage, Shape shape, Strides strides, int64_t offset, DType dtype);

  bool defined() const { return static_cast<bool>(impl_); }
  // True inside trace() for tensors that stand for values the graph computes later: they have a
  // shape, dtype and device, and ops on them record graph nodes, but their elements cannot be read.
  bool is_symbolic() const { return impl().trace_id != 0; }
  const Shape& shape() const { return impl().shape; }
  const Strides& strides() const { return impl().strides; }
  int64_t offset() const { return impl().offset; }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device(); }
  int64_t rank() const { return impl().shape.rank(); }
  int64_t numel() const { return impl().numel; }
  bool is_contiguous() const;
  const Ref<Storage>& storage() const { return impl().storage; }

  // Address of the first element (storage base + offset). For kernels and interop.
  void* raw_data() const {
    return static_cast<char*>(impl().storage->data()) + impl().offset * static_cast<int64_t>(dtype_size(dtype()));
  }
  // Typed address of the first element; DTypeError unless T matches the dtype.
  template <Element T>
  T* data() const {
    check_element_type(dtype_of<T>, "data");
    if (is_symbolic()) throw_symbolic("data");
    return static_cast<T*>(raw_data());
  }

  // The single element of a tensor with one element (any rank). DTypeError if T does not match.
  template <Element T>
  T item() const {
    check_element_type(dtype_of<T>, "item");
    check_single_element();
    T value;
    copy_to_host(&value, "item");
    return value;
  }
  // Row-major copy of all elements. DTypeError if T does not match.
  template <Element T>
  std::vector<T> to_vector() const {
    check_element_type(dtype_of<T>, "to_vector");
    if constexpr (std::is_same_v<T, bool>) {  // std::vector<bool> packs bits: go through bytes
      const auto count = static_cast<size_t>(numel());
      const auto bytes = std::make_unique<uint8_t[]>(count);
      if (count > 0) copy_to_host(bytes.get(), "to_vector");
      return std::vector<bool>(bytes.get(), bytes.get() + count);
    } else {
      std::vector<T> values(static_cast<size_t>(numel()));
      if (!values.empty()) copy_to_host(values.data(), "to_vector");
      return values;
    }
  }

  Tensor to(Device device) const;
  Tensor astype(DType dtype) const;
  Tensor contiguous() const;  // itself when already contiguous, else a row-major copy

  detail::TensorImpl* impl_ptr() const { return impl_.get(); }

 private:
  const detail::TensorImpl& impl() const {
    if (!impl_) throw_undefined();
    return *impl_;
  }
  [[noreturn]] static void throw_undefined();
  [[noreturn]] static void throw_symbolic(const char* op);
  void check_element_type(DType requested, const char* op) const;
  void check_single_element() const;
  void copy_to_host(void* destination, const char* op) const;  // row-major, all elements

  Ref<detail::TensorImpl> impl_;
};

}  // namespace flowlet
