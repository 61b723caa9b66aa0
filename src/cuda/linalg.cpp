// matmul on CUDA: one cublasGemmStridedBatchedEx call per product, batched or not.
//
// cuBLAS is column-major and flowlet row-major: a row-major C = A B is the column-major
// C^T = B^T A^T, so the operands go in swapped and each row-major matrix is read as its transpose
// with the row stride as leading dimension; a transposed view is then simply "not transposed".
#include "cuda/linalg.hpp"

#include <climits>

#include "core/check.hpp"
#include "core/device_scope_state.hpp"
#include "cuda/check.hpp"
#include "cuda/register.hpp"
#include "cuda/runtime.hpp"
#include "runtime/step_context.hpp"
#include "flowlet/ops/elementwise.hpp"
#include "flowlet/ops/linalg.hpp"
#include "state/variable_ops.hpp"

namespace flowlet::detail::cuda {
namespace {

// One operand as cuBLAS reads it (column-major): its matrices at data + i * batch_stride elements.
struct BlasOperand {
  Tensor keep_alive;
  cublasOperation_t op;
  int64_t leading;
  int64_t batch_stride;  // 0: shared across the batch
};

BlasOperand blas_operand(const Tensor& t) {
  const size_t r = t.shape().size();
  const int64_t rows = t.shape()[r - 2], cols = t.shape()[r - 1];
  const int64_t row_stride = rows == 1 ? cols : t.strides()[r - 2];
  const int64_t col_stride = cols == 1 ? rows : t.strides()[r - 1];
  auto make = [&](const Tensor& source, cublasOperation_t op, int64_t leading) {
    return BlasOperand{source, op, std::max<int64_t>(leading, 1), source.rank() == 3 ? source.strides()[0] : 0};
  };
  if (col_stride == 1 && row_stride >= std::max<int64_t>(cols, 1) && row_stride <= INT_MAX) {
    return make(t, CUBLAS_OP_N, row_stride);  // row-major: column-major of the transpose
  }
  if (row_stride == 1 && col_stride >= std::max<int64_t>(rows, 1) && col_stride <= INT_MAX) {
    return make(t, CUBLAS_OP_T, col_stride);  // a transposed view: column-major as it is
  }
  NoDeviceScope here;
  const Tensor packed = t.contiguous();
  return make(packed, CUBLAS_OP_N, cols);
}

cudaDataType_t blas_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return CUDA_R_32F;
    case DType::f64: return CUDA_R_64F;
    case DType::f16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
    default: fail<DTypeError>("matmul: no CUDA GEMM for dtype {}", dtype);
  }
}

void matmul_kernel(const OpCall& call, std::span<Tensor> out) {
  gemm(call.inputs[0], call.inputs[1], out[0], matmul_tf32());
}

// assign_matmul: value += / -= scale * (a @ b) as one GEMM with beta = 1 into the variable's
// buffer, as the CPU kernel does with BLAS; TF32 as for the matmul it replaced.
void assign_matmul_kernel(const OpCall& call, std::span<Tensor>) {
  OutputSpec checked;
  assign_matmul_op.infer(call, checked);  // shapes may vary between calls (unknown dimensions)
  const auto& attrs = call.attrs<VariableAttrs>();
  VariableState& s = *attrs.state;
  const Tensor& a = call.inputs[0];
  const Tensor& b = call.inputs[1];
  const double alpha = attrs.mode == AssignMode::add ? attrs.scale : -attrs.scale;
  NoDeviceScope here;  // the private copy below stays on the variable's device
  std::lock_guard lock(s.mutex);
  if (a.device() != s.value.device() || b.device() != s.value.device()) {
    fail<DeviceError>("assign_matmul: a on {} and b on {} do not update variable '{}' on {} in place", a.device(),
                      b.device(), s.name, s.value.device());
  }
  // A reader still holding the value keeps it: update a private copy instead. Work queued earlier
  // on the value runs before the GEMM (one stream per device), so an unshared value is updated in place.
  if (!exclusively_owned(s.value)) {
    if (recording_of(call.step) != nullptr) {  // a CUDA Graph writes into the buffer it recorded
      fail<DeviceError>("assign_matmul: variable '{}' on {} is shared with another tensor, so a CUDA Graph cannot "
                        "update it in place; the function runs uncaptured",
                        s.name, s.value.device());
    }
    s.value = cast(s.value, s.value.dtype());
  }
  gemm(a, b, s.value, matmul_tf32(), alpha, 1.0);
}

}  // namespace

void gemm(const Tensor& a, const Tensor& b, Tensor& c, bool tf32, double alpha_value, double beta_value) {
  const int64_t batch = c.rank() == 3 ? c.shape()[0] : 1;
  const int64_t m = c.shape()[c.shape().size() - 2], n = c.shape()[c.shape().size() - 1];
  const int64_t k = a.shape()[a.shape().size() - 1];
  if (c.numel() == 0) return;
  const Launch on = launch_on(c.device());
  if (k == 0) {  // an empty sum: zeros, or c unchanged when accumulating
    if (beta_value != 0.0) return;
    FLOWLET_CUDA_CHECK(on.device, cudaMemsetAsync(c.raw_data(), 0, static_cast<size_t>(c.numel()) * dtype_size(c.dtype()),
                                                  on.stream));
    return;
  }
  if (batch > INT_MAX) fail<ShapeError>("matmul: batch exceeds cuBLAS's int range; got c {}", c.shape());
  const BlasOperand pa = blas_operand(a), pb = blas_operand(b);
  const cudaDataType_t type = blas_type(c.dtype());
  const bool f64 = c.dtype() == DType::f64;
  const cublasComputeType_t compute =
      f64 ? CUBLAS_COMPUTE_64F : (c.dtype() == DType::f32 && tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F);
  // cuBLAS reads the scalars in the compute type: double for f64, float for the rest.
  const auto alpha32 = static_cast<float>(alpha_value), beta32 = static_cast<float>(beta_value);
  const double alpha64 = alpha_value, beta64 = beta_value;
  const void* alpha = f64 ? static_cast<const void*>(&alpha64) : static_cast<const void*>(&alpha32);
  const void* beta = f64 ? static_cast<const void*>(&beta64) : static_cast<const void*>(&beta32);
  // Column-major C^T [n, m] = op(B)^T-as-stored [n, k] times op(A)^T-as-stored [k, m].
  FLOWLET_CUDA_CHECK(on.device,
                     cublasGemmStridedBatchedEx(blas(on.device), pb.op, pa.op, static_cast<int>(n), static_cast<int>(m),
                                                static_cast<int>(k), alpha, pb.keep_alive.raw_data(), type,
                                                static_cast<int>(pb.leading), pb.batch_stride,
                                                pa.keep_alive.raw_data(), type, static_cast<int>(pa.leading),
                                                pa.batch_stride, beta, c.raw_data(), type, static_cast<int>(n), m * n,
                                                static_cast<int>(batch), compute, CUBLAS_GEMM_DEFAULT));
}

void add_linalg_kernels(const OpList& ops) {
  set_kernel(ops, "matmul", &matmul_kernel);
  // assign_matmul is a graph op (the update-fusion pass makes it), not in the op table.
  assign_matmul_op.kernels[static_cast<size_t>(DeviceKind::cuda)] = &assign_matmul_kernel;
}

}  // namespace flowlet::detail::cuda
