// Device discovery, per-device streams, event pools and cuBLAS handles, the current device, error flags.
#include "cuda/runtime.hpp"

#include <array>
#include <atomic>
#include <mutex>
#include <vector>

#include "core/allocator.hpp"
#include "core/check.hpp"
#include "cuda/check.hpp"

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
  std::once_flag stream_once[kStreamKinds];
  // Set once, inside its call_once; synchronize() reads them without creating the copy streams.
  std::atomic<cudaStream_t> streams[kStreamKinds] = {};
  int multiprocessors = 1;  // set with the compute stream
  std::once_flag blas_once;
  cublasHandle_t blas = nullptr;
  std::mutex events_mutex;  // a leaf lock: nothing else is taken or called while it is held
  std::vector<cudaEvent_t> events;
};

DeviceState& state(int index) {
  static auto* states = new std::array<DeviceState, kMaxCudaDevices>;
  return (*states)[static_cast<size_t>(index)];
}

thread_local int current_device = -1;
constinit thread_local const RecordingStreams* recording = nullptr;

}  // namespace

int device_count() noexcept { return discovery().count; }

std::string why_no_devices() { return discovery().why_none; }

void use_device(int index) {
  if (current_device == index) return;
  FLOWLET_CUDA_CHECK(index, cudaSetDevice(index));
  current_device = index;
}

cudaStream_t device_stream(int index, StreamKind kind) {
  DeviceState& s = state(index);
  const auto k = static_cast<size_t>(kind);
  std::call_once(s.stream_once[k], [&] {
    use_device(index);
    if (kind == StreamKind::compute) {
      FLOWLET_CUDA_CHECK(index, cudaDeviceGetAttribute(&s.multiprocessors, cudaDevAttrMultiProcessorCount, index));
    }
    cudaStream_t created = nullptr;
    FLOWLET_CUDA_CHECK(index, cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking));
    s.streams[k].store(created, std::memory_order_release);
  });
  return s.streams[k].load(std::memory_order_relaxed);  // call_once ordered the store before us
}

void set_recording_streams(const RecordingStreams* streams) { recording = streams; }

cudaStream_t stream(int index) {
  if (recording != nullptr && recording->device == index) return recording->stream;
  return device_stream(index, StreamKind::compute);
}

cudaEvent_t take_event(int index) {
  DeviceState& s = state(index);
  {
    std::lock_guard lock(s.events_mutex);
    if (!s.events.empty()) {
      cudaEvent_t event = s.events.back();
      s.events.pop_back();
      return event;
    }
  }
  // cudaEventCreate makes the event on the current device; callers may be between choosing their
  // device and launching there (a block freed in between lands here), so the device is put back.
  const int previous = current_device;
  use_device(index);
  cudaEvent_t event = nullptr;
  FLOWLET_CUDA_CHECK(index, cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  if (previous >= 0) use_device(previous);
  return event;
}

void give_event(int index, cudaEvent_t event) noexcept {
  DeviceState& s = state(index);
  try {
    std::lock_guard lock(s.events_mutex);
    s.events.push_back(event);
  } catch (...) {  // no memory for the pool: let the event go instead (destroying a recorded event is allowed)
    cudaEventDestroy(event);
  }
}

cudaEvent_t record_event(int index, cudaStream_t on) {
  cudaEvent_t event = take_event(index);
  const cudaError_t status = cudaEventRecord(event, on);
  if (status != cudaSuccess) give_event(index, event);
  check(status, index, {__func__, "cudaEventRecord(event, on)", __FILE__, __LINE__});
  return event;
}

cublasHandle_t blas(int index) {
  if (recording != nullptr && recording->device == index) return recording->blas;
  DeviceState& s = state(index);
  const cudaStream_t compute = device_stream(index, StreamKind::compute);
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
  const cudaStream_t compute = device_stream(index, StreamKind::compute);  // also creates the device's state
  const cudaStream_t to = recording != nullptr && recording->device == index ? recording->stream : compute;
  // Eight 256-thread blocks fill an SM (2048 threads); grid-stride loops cover larger work.
  return Launch{index, to, state(index).multiprocessors * 8};
}

void synchronize(int index) {
  use_device(index);
  FLOWLET_CUDA_CHECK(index, cudaStreamSynchronize(device_stream(index, StreamKind::compute)));
  // The copy streams exist only once a transfer used them; one that was never created has nothing queued.
  for (const auto kind : {StreamKind::host_to_device, StreamKind::device_to_host}) {
    const cudaStream_t copies = state(index).streams[static_cast<size_t>(kind)].load(std::memory_order_acquire);
    if (copies != nullptr) FLOWLET_CUDA_CHECK(index, cudaStreamSynchronize(copies));
  }
}

ErrorFlag::ErrorFlag(const OpCall& call, Device device)
    : flag_(Tensor::empty(Shape{1}, i64, device)), recording_(recording_of(call.step)) {
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

ErrorFlag ErrorFlag::after_replay() const {
  ErrorFlag copy = *this;
  copy.recording_ = nullptr;  // the deferred check reads the flag then, instead of deferring again
  return copy;
}

void ErrorFlag::throw_if_marked(std::string message) const {
  if (recording_ != nullptr) {
    return recording_->defer_check(
        [flag = after_replay(), message = std::move(message)] { flag.throw_if_marked(message); });
  }
  if (first_bad() >= 0) throw InvalidArgument(message);
}

void ErrorFlag::throw_if_out_of_range(std::string_view op, std::string_view what, int64_t bound,
                                      const Tensor& indices) const {
  if (recording_ != nullptr) {
    return recording_->defer_check(
        [flag = after_replay(), op = std::string(op), what = std::string(what), bound, indices] {
          flag.throw_if_out_of_range(op, what, bound, indices);
        });
  }
  const int64_t at = first_bad();
  if (at < 0) return;
  fail<OutOfRange>("{}: {} out of range [0, {}); got {} {} at position {}", op, what, bound, what,
                   read_index(indices, at), at);
}

}  // namespace flowlet::detail::cuda
