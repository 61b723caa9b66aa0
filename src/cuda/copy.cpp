// Moving tensors: to_device between the host and a GPU (on the device's copy streams, through pinned
// staging, ordered against the compute stream with events) and between GPUs, copy (to contiguous) on
// a GPU, and the view ops, whose kernels only build views and so serve every device.
#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <utility>

#include "core/allocator.hpp"
#include "core/check.hpp"
#include "core/device_scope_state.hpp"
#include "cuda/allocator.hpp"
#include "cuda/check.hpp"
#include "cuda/elementwise_args.hpp"
#include "cuda/register.hpp"
#include "cuda/runtime.hpp"
#include "cuda/staging.hpp"
#include "flowlet/core/storage.hpp"

namespace flowlet::detail::cuda {
namespace {

size_t bytes_of(const Tensor& t) { return static_cast<size_t>(t.numel()) * dtype_size(t.dtype()); }

// dst = src element by element on src's GPU (both there, any layouts, one dtype).
void copy_on_device(const Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;
  const Launch on = launch_on(dst.device());
  launch_copy(elementwise_args<2>("copy", dst, {&src}), static_cast<int>(dtype_size(src.dtype())), on);
}

void copy_kernel(const OpCall& call, std::span<Tensor> out) { copy_on_device(out[0], call.inputs[0]); }

// A transfer is cut into at most 8 chunks of at least 1 MiB, so that the host fills (or drains) one
// chunk of the staging buffer while the copy engine moves another.
constexpr int kMaxChunks = 8;
size_t chunk_bytes(size_t bytes) {
  constexpr size_t kMinChunk = size_t{1} << 20, kPage = 4096;
  const size_t share = (bytes + kMaxChunks - 1) / kMaxChunks;
  return std::max(kMinChunk, (share + kPage - 1) / kPage * kPage);
}

// A contiguous tensor on cuda:index over a block from allocate_idle (allocator.hpp): no queued work
// uses it, so a copy stream may write it at once. Counted in memory_stats like any storage.
Tensor idle_tensor(const Shape& shape, DType dtype, int index) {
  const Device device(DeviceKind::cuda, index);
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  void* block = allocate_idle(index, bytes);
  DeviceMemoryCounters& counters = memory_counters(device);
  count_allocation(counters, bytes);
  // If making the owner or the storage throws, the deleter runs and gives the block back.
  std::shared_ptr<void> owner(block, [index, bytes, &counters](void* data) noexcept {
    count_release(counters, bytes);
    deallocate(index, data, bytes);
  });
  return Tensor::view(make_ref<Storage>(block, bytes, device, std::move(owner)), shape, contiguous_strides(shape), 0,
                      dtype);
}

// Host to cuda:index on the device's host-to-device stream. The ordering, which is the point:
//   1. The destination block comes from allocate_idle, not from the compute stream's free list:
//      no queued work (on any stream) uses it, so the copy stream writes it without waiting for
//      the compute stream, and the copy overlaps the kernels queued before it. (The block dispatch
//      allocated for the output is compute-ordered, possibly still read by queued kernels of a
//      tensor freed just before: it goes back unused.)
//   2. The host copies the source into a pinned staging buffer that no queued copy touches (the
//      staging cache hands a buffer out only after the event of the last copy that read it
//      completed), chunk by chunk, each chunk's DMA queued as soon as it is filled.
//   3. An event recorded on the copy stream after the last chunk, and the compute stream waits on
//      it: every kernel that reads the new tensor is queued later (the tensor is not returned
//      before), so it sees the copied bytes. The host returns without waiting for the copy.
//   4. The staging buffer goes back with that event (reused once it completed).
//   5. The block was born marked as used on the compute stream: when the tensor is freed, an event
//      recorded then on the compute stream fences it; that event completes after the compute
//      stream's wait of step 3, hence after the copy, and after every kernel that read the tensor.
//      Only then is the block idle again (allocator.hpp).
void host_to_gpu(Tensor& target, const Tensor& source, size_t bytes) {
  const int index = target.device().index();
  const cudaStream_t compute = stream(index);
  const cudaStream_t copies = device_stream(index, StreamKind::host_to_device);
  const Shape shape = target.shape();
  const DType dtype = target.dtype();
  target = Tensor();  // first, so that memory_stats never counts both blocks
  target = idle_tensor(shape, dtype, index);
  void* block = target.storage()->data();
  char* dst = static_cast<char*>(block);
  const char* src = static_cast<const char*>(source.raw_data());
  PinnedBlock staging = bytes <= kMaxStagedBytes ? take_pinned(index, bytes) : PinnedBlock{};
  bool queued = false;
  try {
    use_device(index);
    if (staging) {
      char* pinned = static_cast<char*>(staging.data);
      const size_t chunk = chunk_bytes(bytes);
      for (size_t at = 0; at < bytes; at += chunk) {
        const size_t n = std::min(chunk, bytes - at);
        std::memcpy(pinned + at, src + at, n);
        queued = true;
        FLOWLET_CUDA_CHECK(index, cudaMemcpyAsync(dst + at, pinned + at, n, cudaMemcpyHostToDevice, copies));
      }
    } else {
      // Too large to stage (or no pinned memory): the driver stages pageable memory itself and
      // returns once it holds the bytes, so the source may be freed; the DMA may still run.
      queued = true;
      FLOWLET_CUDA_CHECK(index, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, copies));
    }
    const cudaEvent_t done = record_event(index, copies);
    const cudaError_t waited = cudaStreamWaitEvent(compute, done, 0);
    // After the wait was issued the event may go (the wait keeps the record it saw).
    if (staging) {
      give_pinned_after(std::exchange(staging, PinnedBlock{}), index, done);
    } else {
      give_event(index, done);
    }
    FLOWLET_CUDA_CHECK(index, waited);
  } catch (...) {
    // Copies may be queued that nothing orders the compute stream after: wait for them, so that
    // neither the staging buffer nor the block is reused while a copy touches it. If even that
    // fails, the device is in an error state: the staging buffer is dropped, and the block marked
    // as used on the copy stream, so that its free fences that stream too.
    const bool drained = !queued || cudaStreamSynchronize(copies) == cudaSuccess;
    if (!drained) {
      cudaGetLastError();
      try {
        record_use(index, block, copies, index);
      } catch (...) {  // no memory to mark it: the free fences the compute stream only
      }
    }
    if (staging && drained) give_pinned(staging);
    throw;
  }
}

// cuda:index to the host on the device's device-to-host stream; returns once the host tensor holds
// the values. The copy stream waits for an event recorded on the compute stream now, so it reads
// what the kernels queued so far wrote, and only that: kernels queued later (by other threads) are
// not waited for. The source block is marked as used on the copy stream while the copy may run
// (record_use): should the source be freed meanwhile (only on an error path: the caller holds it
// until this returns), its free fences the copy stream. Once the host has seen the copy complete
// the mark is dropped, and the block is compute-ordered again.
void gpu_to_host(const Tensor& target, const Tensor& source, size_t bytes) {
  const int index = source.device().index();
  use_device(index);
  const cudaStream_t compute = stream(index);
  const cudaStream_t copies = device_stream(index, StreamKind::device_to_host);
  void* block = source.storage()->data();
  const char* src = static_cast<const char*>(source.raw_data());
  char* dst = static_cast<char*>(target.raw_data());
  const cudaEvent_t ready = record_event(index, compute);
  const cudaError_t waited = cudaStreamWaitEvent(copies, ready, 0);
  give_event(index, ready);
  FLOWLET_CUDA_CHECK(index, waited);
  record_use(index, block, copies, index);
  PinnedBlock staging;
  std::array<cudaEvent_t, kMaxChunks> chunk_done{};
  int chunks = 0;
  try {
    if (bytes <= kMaxStagedBytes) staging = take_pinned(index, bytes);
    if (staging) {
      char* pinned = static_cast<char*>(staging.data);
      const size_t chunk = chunk_bytes(bytes);
      for (size_t at = 0; at < bytes; at += chunk) {
        if (chunks == kMaxChunks) {
          fail<InvalidArgument>("internal: to_device cut {} bytes into more than {} chunks", bytes, kMaxChunks);
        }
        FLOWLET_CUDA_CHECK(index, cudaMemcpyAsync(pinned + at, src + at, std::min(chunk, bytes - at),
                                                  cudaMemcpyDeviceToHost, copies));
        chunk_done[static_cast<size_t>(chunks)] = record_event(index, copies);
        ++chunks;
      }
      // The host drains chunk k while the copy engine moves chunk k + 1.
      for (int k = 0; k < chunks; ++k) {
        const size_t at = static_cast<size_t>(k) * chunk;
        FLOWLET_CUDA_CHECK(index, cudaEventSynchronize(chunk_done[static_cast<size_t>(k)]));
        std::memcpy(dst + at, pinned + at, std::min(chunk, bytes - at));
      }
    } else {
      // Into pageable memory the call returns once the copy completed; the event makes it explicit.
      FLOWLET_CUDA_CHECK(index, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, copies));
      chunk_done[0] = record_event(index, copies);
      chunks = 1;
      FLOWLET_CUDA_CHECK(index, cudaEventSynchronize(chunk_done[0]));
    }
  } catch (...) {
    // A copy may still run: wait for the copy stream before anything it touches is released. If
    // even that fails, the staging buffer is dropped and the source keeps its mark.
    const bool drained = cudaStreamSynchronize(copies) == cudaSuccess;
    if (!drained) cudaGetLastError();
    for (int k = 0; k < chunks; ++k) give_event(index, chunk_done[static_cast<size_t>(k)]);
    if (drained) {
      forget_use(index, block, copies);
      if (staging) give_pinned(staging);
    }
    throw;
  }
  for (int k = 0; k < chunks; ++k) give_event(index, chunk_done[static_cast<size_t>(k)]);
  forget_use(index, block, copies);
  if (staging) give_pinned(staging);
}

// Between two GPUs, on the destination's compute stream (the destination block is compute-ordered
// there): the copy waits for an event recorded on the source's compute stream, and the source's
// compute stream then waits for an event recorded after the copy. That second wait, rather than a
// record_use of the source block, is what keeps the source safe: besides a free and reuse (which
// record_use would cover), a later kernel on the source device may write the source block in place
// (assign_matmul accumulates into a variable's buffer), and only stream order keeps that write
// after the read. The events come from the pools.
void copy_between_gpus(const Tensor& dst, const Tensor& src) {
  const int from = src.device().index(), to = dst.device().index();
  const cudaStream_t from_stream = stream(from), to_stream = stream(to);
  use_device(from);
  const cudaEvent_t source_ready = record_event(from, from_stream);
  use_device(to);
  const cudaError_t waited = cudaStreamWaitEvent(to_stream, source_ready, 0);
  give_event(from, source_ready);
  FLOWLET_CUDA_CHECK(to, waited);
  FLOWLET_CUDA_CHECK(to, cudaMemcpyPeerAsync(dst.raw_data(), to, src.raw_data(), from, bytes_of(src), to_stream));
  cudaEvent_t copy_done = nullptr;
  cudaError_t back = cudaSuccess;
  try {
    copy_done = record_event(to, to_stream);
    use_device(from);
    back = cudaStreamWaitEvent(from_stream, copy_done, 0);
  } catch (...) {
    // The source's stream is not ordered after the copy: wait for it here instead.
    if (cudaStreamSynchronize(to_stream) != cudaSuccess) cudaGetLastError();
    if (copy_done != nullptr) give_event(to, copy_done);
    throw;
  }
  give_event(to, copy_done);
  if (back != cudaSuccess && cudaStreamSynchronize(to_stream) != cudaSuccess) cudaGetLastError();
  FLOWLET_CUDA_CHECK(from, back);
}

// to_device with a GPU on either side (the CPU kernel hands GPU-to-host copies here). The output
// arrives allocated and contiguous on the destination; a strided source is packed first, on its
// own device.
void to_device_kernel(const OpCall& call, std::span<Tensor> out) {
  NoDeviceScope here;  // packing the source stays on its device, whatever scope the caller is in
  const Tensor source = call.inputs[0].contiguous();
  Tensor& target = out[0];
  const size_t bytes = bytes_of(source);
  if (bytes == 0) return;
  const bool from_gpu = source.device().kind() == DeviceKind::cuda;
  const bool to_gpu = target.device().kind() == DeviceKind::cuda;
  if (from_gpu && to_gpu) return copy_between_gpus(target, source);
  if (to_gpu) return host_to_gpu(target, source, bytes);
  gpu_to_host(target, source, bytes);
}

}  // namespace

void copy_in_place(const Tensor& target, const Tensor& source) { copy_on_device(target, source); }

void add_copy_kernels(const OpList& ops) {
  set_kernel(ops, "to_device", &to_device_kernel);
  set_kernel(ops, "copy", &copy_kernel);
  // The views (reshape, permute, slice) are kAnyDevice: the registry gives them their CPU kernel.
}

}  // namespace flowlet::detail::cuda
