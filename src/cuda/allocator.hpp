// The CUDA caching allocator: one per device, stream-ordered on the device's compute stream, with
// blocks used on other streams fenced by events before they are handed out again.
//
// cudaMalloc and cudaFree synchronize the device and cost tens of microseconds, far more than a
// small kernel, so freed blocks are kept by size class (the CPU allocator's classes, four per
// power of two) and handed out again. Each device keeps two kinds of free block:
//
//   - compute-ordered (`allocate`'s fast path): a block whose every use was queued on the compute
//     stream. One freed by the host while kernels still read it is given to the next `allocate` at
//     once: that allocation's kernels are queued behind the readers on the same stream. This is the
//     path of every eager op, a vector pop under a mutex, and it stays so.
//   - idle: a block that no queued work uses any more: fresh from cudaMalloc, or one whose uses on
//     other streams were fenced when it was freed and whose fences have all completed. An idle block
//     may be written by any stream without waiting (`allocate_idle`, the host-to-device copy) and
//     serves `allocate` too when no compute-ordered block of its class is left.
//
// A block used on a stream other than the compute stream (the copy streams; see copy.cpp) is marked
// with `record_use` before that stream's work is queued, like PyTorch's record_stream. When such a
// block is freed, an event is recorded on each stream that used it and on the compute stream; the
// block waits in a pending list until every one of those events completed (cudaEventQuery, polled
// when `allocate` finds its class empty and on every `allocate_idle`), and then becomes idle. Blocks
// never marked take no part: `deallocate` looks at the (usually empty) map of marked blocks only when
// it is not empty. Events come from the per-device pool in runtime.hpp.
//
// When cudaMalloc runs out of memory the cached blocks are released and the allocation tried once
// more.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace flowlet::detail::cuda {

void* allocate(int device, size_t bytes);  // ResourceExhausted (naming sizes and the cache) when out of memory
void deallocate(int device, void* data, size_t bytes) noexcept;

// The cache itself, without the CUDA Graph pools (cuda/capture_pool.hpp) that allocate and
// deallocate consult first: a recording's pool takes its blocks from here and gives them back.
void* allocate_block(int device, size_t bytes);
void free_block(int device, void* data, size_t bytes) noexcept;
// The size of the block that a request of `bytes` gets.
size_t block_bytes(size_t bytes);

// A block that no queued work uses, for a writer on a stream other than the compute stream (the
// host-to-device copy). It is born marked as used on the compute stream (record_use), so that when
// it is freed its fences cover the compute work that read it, and the work that stream waited for.
void* allocate_idle(int device, size_t bytes);

// Marks `block` (the start of a live block from this allocator on cuda:`device`) as used on
// `on`, a stream of cuda:`on_device`, from now until a matching forget_use (uses are counted per
// stream). While marked, freeing the block fences `on` and the compute stream first (see above).
void record_use(int device, void* block, cudaStream_t on, int on_device);
// Drops one record_use of `block` on `on`, once the host has seen that use complete.
void forget_use(int device, void* block, cudaStream_t on) noexcept;

// Returns every free and idle block of `device` to the driver, after waiting for its streams (blocks
// still waiting on another device's stream stay pending).
void release_cached(int device);
// Bytes held in free, idle and pending blocks of `device`'s cache.
int64_t cached_bytes(int device);

}  // namespace flowlet::detail::cuda
