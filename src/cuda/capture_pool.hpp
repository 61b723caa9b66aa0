// The memory of a CUDA Graph: a pool of device blocks that a recording allocates from and that
// stays the graph's until the graph is destroyed, because every replay writes the addresses the
// recording saw (exec/graph_capture.hpp).
//
// From start until stop, the recording thread's allocations on the pool's device come from the
// pool: a block freed inside the recording is reused by a later allocation of the same recording
// (safe: the recorded work runs in recording order on one stream), and a block the pool lacks is
// taken from the device's cache (with the thread switched to relaxed capture mode for the call, so
// cudaMalloc is allowed whatever mode the recording uses). A block another thread frees goes to its owner's pool wherever it was allocated.
// When the graph is destroyed its pool is released: free blocks go back to the cache at once, and
// blocks still held by tensors go back when those are freed. Replays run on the compute stream, so
// a released block handed to eager work there is ordered after the graph's last launch.
#pragma once

#include <cstddef>
#include <memory>

namespace flowlet::detail::cuda {

class CapturePool {
 public:
  explicit CapturePool(int device);
  ~CapturePool();  // releases
  CapturePool(const CapturePool&) = delete;
  CapturePool& operator=(const CapturePool&) = delete;

  void start();    // the calling thread allocates from this pool (one pool per thread at a time)
  void stop();     // it allocates from the cache again
  void release();  // the graph is gone: every block returns to the cache (held ones when freed)

  struct State;

 private:
  std::shared_ptr<State> state_;
};

// The hooks at the top of cuda::allocate and cuda::deallocate: null / false when no pool applies.
void* capture_pool_allocate(int device, size_t bytes);
bool capture_pool_take(int device, void* data, size_t bytes) noexcept;

}  // namespace flowlet::detail::cuda
