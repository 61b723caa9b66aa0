// DLPack exchange (flowlet/dlpack.hpp): the dtype and device maps between flowlet and dlpack.h, and
// the two ownership hand-overs. Zero copy both ways: to_dlpack lends a tensor's storage (kept alive
// by the DLManagedTensor's context until its deleter runs), from_dlpack adopts foreign memory as a
// Storage whose owner calls the producer's deleter when the last view of it dies.
#include "flowlet/dlpack.hpp"

#include <dlpack/dlpack.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/check.hpp"
#include "flowlet/core/device.hpp"
#include "flowlet/core/format.hpp"

namespace flowlet {
namespace {

using detail::fail;

// DLPack 0.8 added kDLBool; Debian's 0.6 has none, so b8 travels as one-byte unsigned (0 or 1;
// libtorch 1.13 reads it as uint8 and refuses to export its own bool) and comes back as u8.
#if DLPACK_VERSION >= 80
constexpr bool kHasDLBool = true;
#else
constexpr bool kHasDLBool = false;
#endif

constexpr std::string_view kSupportedDTypes =
    kHasDLBool ? "kDLFloat 16/32/64, kDLBfloat 16, kDLInt 32/64, kDLUInt 8, kDLBool 8"
               : "kDLFloat 16/32/64, kDLBfloat 16, kDLInt 32/64, kDLUInt 8";

DLDataType dl_dtype_of(DType dtype) {
  DLDataType dl{};
  dl.lanes = 1;
  dl.bits = static_cast<uint8_t>(dtype_size(dtype) * 8);
  switch (dtype) {
    case DType::f32:
    case DType::f64:
    case DType::f16: dl.code = kDLFloat; break;
    case DType::bf16: dl.code = kDLBfloat; break;
    case DType::i32:
    case DType::i64: dl.code = kDLInt; break;
    case DType::u8: dl.code = kDLUInt; break;
    case DType::b8:
#if DLPACK_VERSION >= 80
      dl.code = kDLBool;
#else
      dl.code = kDLUInt;
#endif
      break;
  }
  return dl;
}

std::string_view dl_code_name(uint8_t code) {
  switch (code) {
    case kDLInt: return "kDLInt";
    case kDLUInt: return "kDLUInt";
    case kDLFloat: return "kDLFloat";
    case kDLOpaqueHandle: return "kDLOpaqueHandle";
    case kDLBfloat: return "kDLBfloat";
    case kDLComplex: return "kDLComplex";
#if DLPACK_VERSION >= 80
    case kDLBool: return "kDLBool";
#endif
    default: return "unknown";
  }
}

[[noreturn]] void fail_dtype(DLDataType dl) {
  fail<InvalidArgument>("from_dlpack: dtype code {} ({}) with {} bits and {} lanes has no flowlet dtype; supported: {}, 1 lane",
                        static_cast<int>(dl.code), dl_code_name(dl.code), static_cast<int>(dl.bits),
                        static_cast<int>(dl.lanes), kSupportedDTypes);
}

DType dtype_of_dl(DLDataType dl) {
  if (dl.lanes != 1) fail_dtype(dl);
  switch (dl.code) {
    case kDLFloat:
      if (dl.bits == 16) return f16;
      if (dl.bits == 32) return f32;
      if (dl.bits == 64) return f64;
      break;
    case kDLBfloat:
      if (dl.bits == 16) return bf16;
      break;
    case kDLInt:
      if (dl.bits == 32) return i32;
      if (dl.bits == 64) return i64;
      break;
    case kDLUInt:
      if (dl.bits == 8) return u8;
      break;
#if DLPACK_VERSION >= 80
    case kDLBool:
      if (dl.bits == 8) return b8;
      break;
#endif
    default: break;
  }
  fail_dtype(dl);
}

std::string_view dl_device_name(int32_t type) {
  switch (type) {
    case kDLCPU: return "kDLCPU";
    case kDLCUDA: return "kDLCUDA";
    case kDLCUDAHost: return "kDLCUDAHost";
    case kDLOpenCL: return "kDLOpenCL";
    case kDLVulkan: return "kDLVulkan";
    case kDLMetal: return "kDLMetal";
    case kDLVPI: return "kDLVPI";
    case kDLROCM: return "kDLROCM";
    case kDLROCMHost: return "kDLROCMHost";
    case kDLExtDev: return "kDLExtDev";
    case kDLCUDAManaged: return "kDLCUDAManaged";
    default: return "unknown";
  }
}

Device device_of_dl(DLDevice dl) {
  switch (dl.device_type) {
    // Host memory (pinned or not) is cpu:0's: the logical CPU devices share one memory, and DLPack
    // numbers CPU devices 0 only.
    case kDLCPU:
    case kDLCUDAHost: return Device();
    case kDLCUDA: {
      const Device device(DeviceKind::cuda, dl.device_id);
      check_device_exists("from_dlpack", device);
      return device;
    }
    default:
      fail<InvalidArgument>("from_dlpack: device type {} ({}) id {} is not supported; supported: kDLCPU, kDLCUDA, kDLCUDAHost",
                            static_cast<int>(dl.device_type), dl_device_name(dl.device_type), dl.device_id);
  }
}

// What a DLManagedTensor from to_dlpack carries: the tensor (its storage stays alive) and the
// shape and strides arrays the DLTensor points into.
struct ExportContext {
  Tensor tensor;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  DLManagedTensor managed{};
};

void delete_export(DLManagedTensor* self) {
  delete static_cast<ExportContext*>(self->manager_ctx);
}

}  // namespace

DLManagedTensor* to_dlpack(const Tensor& t) {
  if (!t.defined()) fail<InvalidArgument>("to_dlpack: the tensor is undefined (an empty handle)");
  if (t.is_symbolic()) {
    fail<InvalidArgument>("to_dlpack: tensor {} {} is symbolic (inside trace()); export values outside the trace",
                          t.shape(), t.dtype());
  }
  const Device device = t.device();
  // DLPack has no stream in its C struct: the consumer may read on any stream, so finish the
  // work queued on ours first.
  if (device.kind() == DeviceKind::cuda) synchronize(device);

  auto context = std::make_unique<ExportContext>();
  context->tensor = t;
  context->shape.assign(t.shape().begin(), t.shape().end());
  context->strides.assign(t.strides().begin(), t.strides().end());
  DLTensor& dl = context->managed.dl_tensor;
  // The first element's address with byte_offset 0, as libtorch produces them: libtorch 1.13's
  // fromDLPack ignores byte_offset, so a base + offset pair would be read at the wrong place.
  dl.data = t.numel() == 0 ? nullptr : t.raw_data();
  dl.byte_offset = 0;
  dl.device.device_type = device.kind() == DeviceKind::cuda ? kDLCUDA : kDLCPU;
  dl.device.device_id = device.kind() == DeviceKind::cuda ? device.index() : 0;
  dl.ndim = static_cast<int32_t>(t.rank());
  dl.dtype = dl_dtype_of(t.dtype());
  dl.shape = context->shape.data();
  dl.strides = context->strides.data();
  context->managed.manager_ctx = context.get();
  context->managed.deleter = delete_export;
  return &context.release()->managed;
}

Tensor from_dlpack(DLManagedTensor* managed) {
  if (managed == nullptr) fail<InvalidArgument>("from_dlpack: the DLManagedTensor pointer is null");
  // Ownership passes to us now: this owner runs the producer's deleter exactly once, when the
  // last storage view is gone or, if a check below throws, on the way out.
  std::shared_ptr<void> owner(managed, [](void* pointer) noexcept {
    auto* m = static_cast<DLManagedTensor*>(pointer);
    if (m->deleter != nullptr) m->deleter(m);
  });
  const DLTensor& dl = managed->dl_tensor;
  const DType dtype = dtype_of_dl(dl.dtype);
  const Device device = device_of_dl(dl.device);
  if (dl.ndim < 0 || dl.ndim > 64) fail<InvalidArgument>("from_dlpack: ndim {} is out of range [0, 64]", dl.ndim);
  if (dl.ndim > 0 && dl.shape == nullptr) fail<InvalidArgument>("from_dlpack: ndim {} but a null shape", dl.ndim);

  Shape shape;
  for (int32_t i = 0; i < dl.ndim; ++i) shape.push_back(dl.shape[i]);
  detail::check_size("from_dlpack", shape, dtype);  // names the shape when a dimension is negative
  Strides strides = dl.strides == nullptr ? contiguous_strides(shape) : Strides(dl.strides, dl.strides + dl.ndim);
  const int64_t numel = shape.numel();

  // The storage spans first to last element. Negative strides are refused: flowlet views never
  // have them, and its kernels assume they do not.
  const auto item = static_cast<int64_t>(dtype_size(dtype));
  int64_t last = 0;  // offset of the last element, in elements
  for (size_t i = 0; i < strides.size(); ++i) {
    if (strides[i] < 0) {
      fail<InvalidArgument>("from_dlpack: negative strides are not supported; got shape {} strides {}", shape,
                            fmt::join(strides, ", "));
    }
    int64_t reach = 0;
    if (numel > 0 && (__builtin_mul_overflow(shape[i] - 1, strides[i], &reach) || __builtin_add_overflow(last, reach, &last))) {
      fail<InvalidArgument>("from_dlpack: strides overflow; got shape {} strides {}", shape, fmt::join(strides, ", "));
    }
  }
  int64_t bytes = 0;
  if (numel > 0 && __builtin_mul_overflow(last + 1, item, &bytes)) {
    fail<InvalidArgument>("from_dlpack: strides overflow; got shape {} strides {}", shape, fmt::join(strides, ", "));
  }
  if (numel > 0 && dl.data == nullptr) fail<InvalidArgument>("from_dlpack: {} elements but a null data pointer", numel);
  if (numel > 0 && reinterpret_cast<uintptr_t>(static_cast<char*>(dl.data) + dl.byte_offset) % static_cast<uintptr_t>(item) != 0) {
    fail<InvalidArgument>("from_dlpack: the first element (data {} + byte_offset {}) is not aligned to its {}-byte dtype {}",
                          fmt::ptr(dl.data), dl.byte_offset, item, dtype);
  }

  void* first = numel == 0 ? nullptr : static_cast<char*>(dl.data) + dl.byte_offset;
  auto storage = make_ref<Storage>(first, static_cast<size_t>(bytes), device, std::move(owner));
  return Tensor::view(std::move(storage), std::move(shape), std::move(strides), 0, dtype);
}

}  // namespace flowlet
