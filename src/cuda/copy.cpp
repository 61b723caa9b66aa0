// Moving tensors: to_device between the host and a GPU and between GPUs, copy (to contiguous) on a
// GPU, and the view ops, whose kernels only build views and so serve every device.
#include <array>

#include "core/check.hpp"
#include "core/device_scope_state.hpp"
#include "cuda/check.hpp"
#include "cuda/elementwise_args.hpp"
#include "cuda/register.hpp"
#include "cuda/runtime.hpp"

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

// Between two GPUs: the copy runs on the destination's stream once the source's stream reached it,
// and the source's stream then waits for the copy, so the source block is not handed to a later
// allocation on its device while the copy still reads it.
void copy_between_gpus(const Tensor& dst, const Tensor& src) {
  const int from = src.device().index(), to = dst.device().index();
  const cudaStream_t from_stream = stream(from), to_stream = stream(to);
  cudaEvent_t source_ready = nullptr, copy_done = nullptr;
  use_device(from);
  FLOWLET_CUDA_CHECK(from, cudaEventCreateWithFlags(&source_ready, cudaEventDisableTiming));
  FLOWLET_CUDA_CHECK(from, cudaEventRecord(source_ready, from_stream));
  use_device(to);
  FLOWLET_CUDA_CHECK(to, cudaEventCreateWithFlags(&copy_done, cudaEventDisableTiming));
  FLOWLET_CUDA_CHECK(to, cudaStreamWaitEvent(to_stream, source_ready, 0));
  FLOWLET_CUDA_CHECK(to, cudaMemcpyPeerAsync(dst.raw_data(), to, src.raw_data(), from, bytes_of(src), to_stream));
  FLOWLET_CUDA_CHECK(to, cudaEventRecord(copy_done, to_stream));
  use_device(from);
  FLOWLET_CUDA_CHECK(from, cudaStreamWaitEvent(from_stream, copy_done, 0));
  // Destroying an event that work still refers to is allowed: it is released once that work ran.
  FLOWLET_CUDA_CHECK(from, cudaEventDestroy(source_ready));
  FLOWLET_CUDA_CHECK(to, cudaEventDestroy(copy_done));
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
  if (to_gpu) {
    // From pageable host memory: returns once the bytes are staged, so the source may be freed.
    const Launch on = launch_on(target.device());
    FLOWLET_CUDA_CHECK(on.device, cudaMemcpyAsync(target.raw_data(), source.raw_data(), bytes,
                                                  cudaMemcpyHostToDevice, on.stream));
    return;
  }
  // To the host: the caller reads the result right away, so wait for it (and for the kernels
  // before it, which is where an asynchronous kernel failure surfaces).
  const Launch on = launch_on(source.device());
  FLOWLET_CUDA_CHECK(on.device, cudaMemcpyAsync(target.raw_data(), source.raw_data(), bytes,
                                                cudaMemcpyDeviceToHost, on.stream));
  FLOWLET_CUDA_CHECK(on.device, cudaStreamSynchronize(on.stream));
}

}  // namespace

void add_copy_kernels(const OpList& ops) {
  set_kernel(ops, "to_device", &to_device_kernel);
  set_kernel(ops, "copy", &copy_kernel);
  // A view op's kernel makes a TensorImpl over the input's storage (and calls public ops, such as
  // contiguous, which dispatch to this device): the CPU kernel is the CUDA kernel too.
  for (const char* name : {"reshape", "permute", "slice"}) {
    for (Op* op : ops) {
      if (op->name != name) continue;
      if (!op->has_flag(kView)) fail<InvalidArgument>("internal: '{}' is expected to be a view op", name);
      set_kernel(ops, name, op->kernels[static_cast<size_t>(DeviceKind::cpu)]);
    }
  }
}

}  // namespace flowlet::detail::cuda
