// The CPU caching allocator: freed blocks are kept by size class and reused, so a hot loop that
// makes new tensors neither calls malloc nor page-faults fresh memory.
#pragma once

#include <cstddef>

namespace flowlet::detail {

// 64-byte aligned. Never returns nullptr (throws std::bad_alloc).
void* cpu_allocate(size_t bytes);
void cpu_deallocate(void* pointer, size_t bytes);

}  // namespace flowlet::detail
