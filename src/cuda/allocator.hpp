// The CUDA caching allocator: one per device, stream-ordered on the device's compute stream.
//
// cudaMalloc and cudaFree synchronize the device and cost tens of microseconds, far more than a
// small kernel, so freed blocks are kept by size class (the CPU allocator's classes, four per
// power of two) and handed out again. Every use of a device's memory is queued on its one compute
// stream, so a block freed by the host while kernels still read it can be given to the next
// allocation at once: that allocation's kernels are queued behind the readers. (Work on other
// streams, such as peer copies, makes the compute stream wait on an event before the host may
// free their operands; see copy.cpp.) When cudaMalloc runs out of memory the cached blocks are
// released and the allocation tried once more.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flowlet::detail::cuda {

void* allocate(int device, size_t bytes);  // DeviceError (naming sizes and the cache) when out of memory
void deallocate(int device, void* data, size_t bytes) noexcept;

// The cache itself, without the CUDA Graph pools (cuda/capture_pool.hpp) that allocate and
// deallocate consult first: a recording's pool takes its blocks from here and gives them back.
void* allocate_block(int device, size_t bytes);
void free_block(int device, void* data, size_t bytes) noexcept;
// The size of the block that a request of `bytes` gets.
size_t block_bytes(size_t bytes);

// Returns every cached block of `device` to the driver (after waiting for its stream).
void release_cached(int device);
// Bytes held in free blocks of `device`'s cache.
int64_t cached_bytes(int device);

}  // namespace flowlet::detail::cuda
