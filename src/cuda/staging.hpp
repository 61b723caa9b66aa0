// Pinned host staging buffers for the copy streams: cudaHostAlloc'd blocks cached by size class (the
// allocators' classes), each handed out again only once the last copy that touched it completed.
//
// A copy from pageable memory makes the driver stage it through its own pinned buffers, and an
// asynchronous copy from pageable memory waits for its stream; staging here lets the host fill (or
// drain) pinned memory while the copy stream moves earlier chunks, and lets the host return before
// the copy ran. Pinned memory is a scarce system resource: a transfer larger than kMaxStagedBytes is
// not staged (copy.cpp copies it from pageable memory), and no more than kMaxCachedPinnedBytes stay
// cached.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace flowlet::detail::cuda {

inline constexpr size_t kMaxStagedBytes = size_t{256} << 20;
inline constexpr size_t kMaxCachedPinnedBytes = size_t{1} << 30;

// A pinned block of at least `bytes`, or an empty one (data == nullptr) when pinned memory cannot be
// had (cudaHostAlloc failed: the caller copies from pageable memory instead). `device` is the GPU the
// copy runs on (cudaHostAlloc needs a current device; the block is portable across devices).
struct PinnedBlock {
  void* data = nullptr;
  int cls = -1;
  explicit operator bool() const { return data != nullptr; }
};
PinnedBlock take_pinned(int device, size_t bytes);

// Gives `block` back once `event` (a pooled event of cuda:`device`, recorded after the last copy that
// touches the block) completed; the event goes back to its pool then. Never throws: without memory
// for the bookkeeping the host waits for the event instead.
void give_pinned_after(PinnedBlock block, int device, cudaEvent_t event) noexcept;
// Gives back a block that no queued copy touches.
void give_pinned(PinnedBlock block) noexcept;

}  // namespace flowlet::detail::cuda
