// Tensor handles: allocation, views, host reads, and the methods that forward to ops.
#include "flowlet/core/tensor.hpp"

#include <cstring>
#include <new>
#include <utility>

#include "core/allocator.hpp"
#include "core/backend.hpp"
#include "core/check.hpp"
#include "core/device_scope_state.hpp"

namespace flowlet {
namespace {

// A per-thread free list of fixed-size blocks for the small objects every op creates. The hot
// path touches only trivially destructible initial-exec TLS; a reaper frees the list at thread exit.
template <size_t BlockSize>
class BlockPool {
 public:
  static void* take() {
    if (head_) {
      --count_;
      return std::exchange(head_, head_->next);
    }
    return ::operator new(BlockSize);
  }
  static void give(void* pointer) {
    if (gone_ || count_ >= kMaxBlocks) {
      ::operator delete(pointer);
      return;
    }
    if (!reaper_registered_) register_reaper();
    ++count_;
    head_ = new (pointer) Node{head_};
  }

 private:
  struct Node {
    Node* next;
  };
  struct Reaper {
    ~Reaper() {
      gone_ = true;
      while (head_) ::operator delete(std::exchange(head_, head_->next));
      count_ = 0;
    }
  };
  static void register_reaper() {
    static thread_local Reaper reaper;
    (void)reaper;
    reaper_registered_ = true;
  }
  static constexpr size_t kMaxBlocks = 4096;
  [[gnu::tls_model("initial-exec")]] static inline thread_local Node* head_ = nullptr;
  [[gnu::tls_model("initial-exec")]] static inline thread_local size_t count_ = 0;
  [[gnu::tls_model("initial-exec")]] static inline thread_local bool gone_ = false;
  [[gnu::tls_model("initial-exec")]] static inline thread_local bool reaper_registered_ = false;
};

using TensorImplPool = BlockPool<sizeof(detail::TensorImpl)>;
using StoragePool = BlockPool<sizeof(Storage)>;

}  // namespace

void* detail::TensorImpl::operator new(size_t) { return TensorImplPool::take(); }
void detail::TensorImpl::operator delete(void* pointer) { TensorImplPool::give(pointer); }
void* Storage::operator new(size_t) { return StoragePool::take(); }
void Storage::operator delete(void* pointer) { StoragePool::give(pointer); }

Storage::Storage(size_t bytes, Device device) : bytes_(bytes), device_(device) {
  if (device.kind() != DeviceKind::cpu) [[unlikely]] {
    data_ = allocate_on_backend(bytes, device);
    return;
  }
  if (device.index() != 0) check_device_exists("storage", device);  // also fixes the logical device count
  data_ = detail::cpu_allocate(bytes, device);
  detail::count_allocation(device.index(), bytes);
}

// Off the CPU hot path: memory of another device kind comes from its backend (core/backend.hpp).
void* Storage::allocate_on_backend(size_t bytes, Device device) {
  check_device_exists("storage", device);
  if (bytes > detail::kLargestAllocation) detail::fail_allocation_too_large(bytes, device);  // past the size classes
  void* data = detail::backend(device.kind()).allocate(device.index(), bytes);
  detail::count_allocation(detail::memory_counters(device), bytes);
  return data;
}

Storage::Storage(void* data, size_t bytes, Device device, std::shared_ptr<void> owner)
    : data_(data), bytes_(bytes), device_(device), owner_(std::move(owner)) {}

Storage::~Storage() {
  if (!owner_ && data_ != nullptr) {  // ours (symbolic tensors own none; adopted memory has an owner)
    if (device_.kind() != DeviceKind::cpu) [[unlikely]] {
      detail::count_release(detail::memory_counters(device_), bytes_);
      detail::backend(device_.kind()).deallocate(device_.index(), data_, bytes_);
      return;
    }
    detail::count_release(device_.index(), bytes_);
    detail::cpu_deallocate(data_, bytes_);
  }
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  // One pass over the dimensions, as every op's output comes here: the row-major strides
  // (contiguous_strides), the element count, and the size rule (detail::check_size). The eager
  // dispatcher relies on this check for the outputs it allocates (and names the op).
  auto impl = make_ref<detail::TensorImpl>();
  impl->strides = Strides(shape.size(), 1);
  int64_t step = 1;  // the product of the non-zero dimensions so far
  bool has_zero = false;
  for (size_t i = shape.size(); i-- > 0;) {
    impl->strides[i] = step;
    const int64_t d = shape[i];
    if (d <= 0) [[unlikely]] {
      if (d < 0) throw detail::UnnamedSizeError(shape, dtype);
      has_zero = true;
    } else if (__builtin_mul_overflow(step, d, &step)) [[unlikely]] {
      throw detail::UnnamedSizeError(shape, dtype);
    }
  }
  int64_t bytes = 0;
  if (__builtin_mul_overflow(step, static_cast<int64_t>(dtype_size(dtype)), &bytes)) [[unlikely]] {
    throw detail::UnnamedSizeError(shape, dtype);
  }
  impl->shape = shape;
  impl->numel = has_zero ? 0 : step;
  impl->dtype = dtype;
  impl->storage = make_ref<Storage>(has_zero ? 0 : static_cast<size_t>(bytes), device);
  return Tensor(std::move(impl));
}

Tensor Tensor::view(Ref<Storage> storage, Shape shape, Strides strides, int64_t offset, DType dtype) {
  auto impl = make_ref<detail::TensorImpl>();
  impl->numel = shape.numel();
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = dtype;
  impl->storage = std::move(storage);
  return Tensor(std::move(impl));
}

bool Tensor::is_contiguous() const {
  const auto& s = shape();
  const auto& st = strides();
  int64_t expected = 1;
  for (size_t i = s.size(); i-- > 0;) {
    if (s[i] == 1) continue;  // the stride of a size-1 dimension never matters
    if (s[i] == 0) return true;  // no elements: any layout is contiguous
    if (st[i] != expected) return false;
    expected *= s[i];
  }
  return true;
}

void Tensor::throw_undefined() {
  throw InvalidArgument("tensor: this is an empty Tensor handle (default-constructed); assign a tensor first");
}

void Tensor::check_element_type(DType requested, const char* op) const {
  if (requested != dtype()) {
    detail::fail<DTypeError>("{}: element type does not match the tensor; got {} requested for a {} tensor", op,
                             requested, dtype());
  }
}

void Tensor::check_single_element() const {
  if (numel() != 1) {
    detail::fail<InvalidArgument>("item: tensor must have exactly one element; got shape {} ({} elements)", shape(),
                                  numel());
  }
}

void Tensor::throw_symbolic(const char* op) {
  detail::fail<InvalidArgument>(
      "{}: cannot read the elements of a symbolic tensor while tracing; got a tensor that the traced graph "
      "computes later. The C++ code of a traced function runs once, when it is traced, before any values "
      "exist: return the tensor from the function and read the result, or use flowlet::print / "
      "flowlet::host_callback to see values each time the graph runs",
      op);
}

void Tensor::copy_to_host(void* destination, const char* op) const {
  if (is_symbolic()) throw_symbolic(op);
  detail::NoDeviceScope here;  // a read needs no copy to the scope's device first
  const Tensor host = device().kind() == DeviceKind::cpu ? contiguous() : to(Device("cpu")).contiguous();
  std::memcpy(destination, host.raw_data(), static_cast<size_t>(numel()) * dtype_size(dtype()));
}

// to, astype and contiguous run ops: they are defined with the ops (src/ops/tensor_methods.cpp).

}  // namespace flowlet
