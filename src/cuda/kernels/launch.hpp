// The interface between the host side of the CUDA backend (src/cuda/*.cpp, compiled by the C++
// compiler, which sees Tensor, Op and fmt) and its kernels (src/cuda/kernels/*.cu, compiled by nvcc,
// which see only this header and the host-device ones in src/kernels/): plain structs describing
// operands, and one launch function per kernel family. Keeping flowlet's heavier headers out of
// nvcc's way keeps the .cu files quick to compile.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "flowlet/core/dtype.hpp"

namespace flowlet::detail {
enum class ElementwiseOp : uint8_t;  // a row of kernels/elementwise_functors.hpp
}  // namespace flowlet::detail

namespace flowlet::detail::cuda {

// Element types as the kernels see them: DType itself, so there is no second numbering to keep in step.
using ElementType = DType;

// Where and how a launch runs.
struct Launch {
  int device = 0;
  cudaStream_t stream = nullptr;
  int max_blocks = 1024;  // enough blocks to fill the GPU several times over; grid-stride loops do the rest
};

// An elementwise operation over up to kMaxOperands operands (output first), after broadcasting and
// merging dimensions (kernels/elementwise_loop.hpp's merge_dimensions): `dims` sizes, innermost
// last, and each operand's element strides. Contiguous operands and scalars merge into one
// dimension, which the kernels walk without any division.
inline constexpr int kMaxDims = 8;
inline constexpr int kMaxOperands = 4;
struct ElementwiseArgs {
  int64_t numel = 0;
  int dims = 0;
  int64_t sizes[kMaxDims] = {};
  void* data[kMaxOperands] = {};
  int64_t strides[kMaxOperands][kMaxDims] = {};
};

// The CUDA launcher of one elementwise op, built from its row of kernels/elementwise_functors.hpp
// (operands: out, then the op's inputs; `type` is the inputs' element type). A launcher throws
// DeviceError on a launch failure and DTypeError for a dtype it was not built for. When the row's
// functor reports integer errors (`error_message` not null) and `error` is not null, an element
// that fails stores 0 there (set to UINT64_MAX first) and the host throws "<op>: <error_message>".
struct ElementwiseLauncher {
  void (*launch)(const char* op, const ElementwiseArgs& args, ElementType type, const Launch& where,
                 uint64_t* error) = nullptr;
  const char* error_message = nullptr;
};
// The launcher of `id`: binary.cu builds the binary, comparison and ternary ops, unary.cu the unary
// ones; each returns an empty launcher for the other's rows.
ElementwiseLauncher binary_launcher(ElementwiseOp id);
ElementwiseLauncher unary_launcher(ElementwiseOp id);

// out = in converted (operands: out, in).
void launch_cast(const ElementwiseArgs& args, ElementType to, ElementType from, const Launch& where);
// Moves elements of `bytes` bytes each (operands: out, in): copies, to contiguous and between layouts.
void launch_copy(const ElementwiseArgs& args, int bytes, const Launch& where);
// out = condition ? a : b (operands: out, condition (b8), a, b), elements of `bytes` bytes.
void launch_where(const ElementwiseArgs& args, int bytes, const Launch& where);

// Creation ops (contiguous outputs of n elements).
void launch_fill(void* out, int64_t n, ElementType type, double value, const Launch& where);
void launch_arange(void* out, int64_t n, ElementType type, const Launch& where);
// Element i of the Philox stream for `seed` (kernels/philox.hpp), as the CPU kernels compute it:
// standard normal, or uniform in [lo, hi).
void launch_randn(void* out, int64_t n, ElementType type, uint64_t seed, const Launch& where);
void launch_uniform(void* out, int64_t n, ElementType type, double lo, double hi, uint64_t seed, const Launch& where);

// Reductions of a contiguous [outer, reduced, inner] block into out[outer, inner]. Sums of floating
// types (f16/bf16 read as float) accumulate in f64 and of integers in i64 (wrapping), written as the
// op's output dtype; max keeps NaN. `scratch` has room for reduce_scratch_bytes(...) bytes (null when that is 0):
// partial results of a first pass when the input is too long for one pass to fill the GPU.
enum class Reduction : uint8_t { sum, max };
int64_t reduce_scratch_bytes(Reduction op, ElementType type, int64_t outer, int64_t reduced, int64_t inner,
                             const Launch& where);
void launch_reduce(Reduction op, const void* in, void* out, ElementType type, int64_t outer, int64_t reduced,
                   int64_t inner, void* scratch, const Launch& where);
// out[outer, inner] (i64) = index of the first maximum (the first NaN if any) along `reduced`.
void launch_argmax(const void* in, int64_t* out, ElementType type, int64_t outer, int64_t reduced, int64_t inner,
                   const Launch& where);

// Softmax (log form when `log`) along the middle axis of a contiguous [outer, extent, inner] block.
void launch_softmax(const void* in, void* out, ElementType type, int64_t outer, int64_t extent, int64_t inner,
                    bool log, const Launch& where);
// loss[r] = logsumexp(logits[r]) - logits[r, label[r]] for contiguous logits [rows, classes]; labels
// are i32 or i64. A label outside [0, classes) records its position in `error` (atomicMin).
void launch_cross_entropy(const void* logits, const void* labels, ElementType label_type, void* loss,
                          ElementType type, int64_t rows, int64_t classes, uint64_t* error, const Launch& where);
// out[i, :] = one-hot row of index[i] (f32, out zeroed by the kernel).
void launch_one_hot(const void* indices, ElementType index_type, float* out, int64_t count, int64_t depth,
                    uint64_t* error, const Launch& where);
// out[i, :] = params[index[i], :] for contiguous params [rows, row] of `element_bytes`-byte elements.
// An index outside [0, rows) records its position in `error` (atomicMin) and writes zeros.
void launch_gather(const void* params, const void* indices, ElementType index_type, void* out, int64_t count,
                   int64_t rows, int64_t row, int element_bytes, uint64_t* error, const Launch& where);
// out[index[i], :] += updates[i, :] (out zeroed first by the caller); atomics, so float sums may
// differ from the CPU's serial order in the last bits.
void launch_scatter_add(const void* indices, ElementType index_type, const void* updates, void* out,
                        ElementType type, int64_t count, int64_t rows, int64_t row, uint64_t* error,
                        const Launch& where);

// value[i] += scale * update[i] over n contiguous elements of a number type (scale integral for
// integers), in place (variable updates: kernels/update.cu).
void launch_axpy(void* value, const void* update, int64_t n, ElementType type, double scale, const Launch& where);

}  // namespace flowlet::detail::cuda
