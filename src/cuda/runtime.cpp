// Device discovery, per-device streams and cuBLAS handles, the current device, error flags.
#include "cuda/runtime.hpp"

#include <array>
#include <mutex>

#include "core/allocator.hpp"
#include "core/check.hpp"
#include "cuda/check.hpp"
#include "exec/graph_capture.hpp"

namespace flowlet::detail::cuda {
namespace {

struct Discovery {
  int count = 0;
  std::string why_none;
};

// cudaGetDeviceCount fails without a driver (cudaErrorInsufficientDriver) or a GPU
// (cudaErrorNoDevice): both mean "no devices here", not an error of the program.
const Discovery& discovery() {
  static const Discovery found = [] {
    Discovery d;
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
      cudaGetLastError();
      d.why_none = fmt::format("no CUDA device visible: cudaGetDeviceCount returned {}: {}", cudaGetErrorName(status),
                               cudaGetErrorString(status));
      return d;
    }
    d.count = std::min(count, kMaxCudaDevices);
    if (count == 0) d.why_none = "no CUDA device visible: cudaGetDeviceCount found 0 GPUs";
    return d;
  }();
  return found;
}

// What one device keeps for the life of the process. Never destroyed: tensors freed during static
// destruction, and streams the driver tears down itself at exit, must not meet a dead object.
struct DeviceState {
  std::once_flag stream_once;
  cudaStream_t stream = nullptr;
  int multiprocessors = 1;
  std::once_flag blas_once;
  cublasHandle_t blas = nullptr;
};

DeviceState& state(int index) {
  static auto* states = new std::array<DeviceState, kMaxCudaDevices>;
  return (*states)[static_cast<size_t>(index)];
}

thread_local int current_device = -1;
constinit thread_local const RecordingStreams* recording = nullptr;

}  // namespace

void set_recording_streams(const RecordingStreams* streams) { recording = streams; }

int device_count() noexcept { return discovery().count; }

std::string why_no_devices() { return discovery().why_none; }

void use_device(int index) {
  if (current_device == index) return;
  FLOWLET_CUDA_CHECK(index, cudaSetDevice(index));
  current_device = index;
}

namespace {

// cuda:index's own compute stream (and its state), created on first use.
cudaStream_t compute_stream(int index) {
  DeviceState& s = state(index);
  std::call_once(s.stream_once, [&] {
    use_device(index);
    FLOWLET_CUDA_CHECK(index, cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
    FLOWLET_CUDA_CHECK(index, cudaDeviceGetAttribute(&s.multiprocessors, cudaDevAttrMultiProcessorCount, index));
  });
  return s.stream;
}

}  // namespace

cudaStream_t stream(int index) {
  if (recording != nullptr && recording->device == index) return recording->stream;
  return compute_stream(index);
}

cublasHandle_t blas(int index) {
  if (recording != nullptr && recording->device == index) return recording->blas;
  DeviceState& s = state(index);
  const cudaStream_t compute = compute_stream(index);
  std::call_once(s.blas_once, [&] {
    use_device(index);
    FLOWLET_CUDA_CHECK(index, cublasCreate(&s.blas));
    FLOWLET_CUDA_CHECK(index, cublasSetStream(s.blas, compute));
  });
  return s.blas;
}

Launch launch_on(Device device) {
  const int index = device.index();
  use_device(index);
  const cudaStream_t compute = compute_stream(index);  // also creates the device's state
  const cudaStream_t to = recording != nullptr && recording->device == index ? recording->stream : compute;
  // Eight 256-thread blocks fill an SM (2048 threads); grid-stride loops cover larger work.
  return Launch{index, to, state(index).multiprocessors * 8};
}

void synchronize(int index) {
  use_device(index);
  FLOWLET_CUDA_CHECK(index, cudaStreamSynchronize(stream(index)));
}

ErrorFlag::ErrorFlag(Device device) : flag_(Tensor::empty(Shape{1}, i64, device)) {
  const Launch on = launch_on(device);
  FLOWLET_CUDA_CHECK(on.device, cudaMemsetAsync(flag_.raw_data(), 0xff, sizeof(uint64_t), on.stream));
}

int64_t ErrorFlag::first_bad() const {
  const int index = flag_.device().index();
  uint64_t value = 0;
  use_device(index);
  FLOWLET_CUDA_CHECK(index, cudaMemcpyAsync(&value, flag_.raw_data(), sizeof value, cudaMemcpyDeviceToHost, stream(index)));
  FLOWLET_CUDA_CHECK(index, cudaStreamSynchronize(stream(index)));
  return value == UINT64_MAX ? -1 : static_cast<int64_t>(value);
}

namespace {

// Element `position` of a CUDA tensor of indices (i32 or i64), read back for an error message.
int64_t read_index(const Tensor& indices, int64_t position) {
  const int index = indices.device().index();
  const Tensor packed = indices.contiguous();
  const size_t size = dtype_size(indices.dtype());
  int64_t value = 0;
  int32_t narrow = 0;
  void* target = size == 8 ? static_cast<void*>(&value) : static_cast<void*>(&narrow);
  use_device(index);
  FLOWLET_CUDA_CHECK(index, cudaMemcpyAsync(target, static_cast<const char*>(packed.raw_data()) + position * size, size,
                                           cudaMemcpyDeviceToHost, stream(index)));
  FLOWLET_CUDA_CHECK(index, cudaStreamSynchronize(stream(index)));
  return size == 8 ? value : narrow;
}

}  // namespace

void ErrorFlag::throw_if_marked(std::string message) const {
  if (capture_recorder != nullptr) {
    return defer_check([flag = *this, message = std::move(message)] { flag.throw_if_marked(message); });
  }
  if (first_bad() >= 0) throw InvalidArgument(message);
}

void ErrorFlag::throw_if_out_of_range(std::string_view op, std::string_view what, int64_t bound,
                                      const Tensor& indices) const {
  if (capture_recorder != nullptr) {
    return defer_check([flag = *this, op = std::string(op), what = std::string(what), bound, indices] {
      flag.throw_if_out_of_range(op, what, bound, indices);
    });
  }
  const int64_t at = first_bad();
  if (at < 0) return;
  fail<OutOfRange>("{}: {} out of range [0, {}); got {} {} at position {}", op, what, bound, what,
                   read_index(indices, at), at);
}

}  // namespace flowlet::detail::cuda
