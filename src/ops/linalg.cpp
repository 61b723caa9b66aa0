// matmul: rank 2 and batched rank 3, through OpenBLAS. Transposed views go to BLAS as a transpose
// flag, not a copy; other strided inputs are copied once.
#include "flowlet/ops/linalg.hpp"

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "flowlet/dispatch.hpp"
#include "flowlet/ops/reduce.hpp"
#include "flowlet/ops/shape.hpp"
#include "kernels/elementwise_loop.hpp"
#include "ops/registry.hpp"

namespace flowlet {
namespace detail {
namespace {

void matmul_infer(const OpCall& call, OutputSpec& spec) {
  const Tensor& a = call.inputs[0];
  const Tensor& b = call.inputs[1];
  if (a.dtype() != b.dtype()) {
    fail<DTypeError>("matmul: dtypes differ; got {} and {}; convert one with astype", a.dtype(), b.dtype());
  }
  check_dtype("matmul", a.dtype(), kFloatCompute);
  const bool ranks_ok = (a.rank() == 2 || a.rank() == 3) && (b.rank() == 2 || b.rank() == 3);
  if (!ranks_ok) {
    fail<ShapeError>("matmul: expects rank 2 or 3 operands; got a {} and b {}", a.shape(), b.shape());
  }
  const int64_t m = a.shape()[a.shape().size() - 2], k = a.shape()[a.shape().size() - 1];
  const int64_t kb = b.shape()[b.shape().size() - 2], n = b.shape()[b.shape().size() - 1];
  if (k != kb) fail<ShapeError>("matmul: inner dimensions differ; got a {} and b {}", a.shape(), b.shape());
  if (a.rank() == 3 && b.rank() == 3 && a.shape()[0] != b.shape()[0]) {
    fail<ShapeError>("matmul: batch sizes differ; got a {} and b {}", a.shape(), b.shape());
  }
  for (int64_t d : {m, k, n}) {
    if (d > INT_MAX) fail<ShapeError>("matmul: dimension exceeds BLAS's int range; got a {} and b {}", a.shape(), b.shape());
  }
  Shape out;
  if (a.rank() == 3) out.push_back(a.shape()[0]);
  else if (b.rank() == 3) out.push_back(b.shape()[0]);
  out.push_back(m);
  out.push_back(n);
  spec.outputs[0] = {out, a.dtype()};
}

// One operand as BLAS sees it: every matrix of the batch at base + i * batch_stride.
struct BlasOperand {
  Tensor keep_alive;
  const char* base;
  int64_t batch_stride;  // bytes; 0 when shared across the batch
  CBLAS_TRANSPOSE transpose;
  int leading;
};

BlasOperand blas_operand(const Tensor& t) {
  const size_t r = t.shape().size();
  const int64_t rows = t.shape()[r - 2], cols = t.shape()[r - 1];
  int64_t row_stride = rows == 1 ? cols : t.strides()[r - 2];
  int64_t col_stride = cols == 1 ? 1 : t.strides()[r - 1];
  const int64_t element = static_cast<int64_t>(dtype_size(t.dtype()));
  auto make = [&](const Tensor& source, CBLAS_TRANSPOSE transpose, int64_t leading) {
    const int64_t batch = source.rank() == 3 ? source.strides()[0] * element : 0;
    return BlasOperand{source, static_cast<const char*>(source.raw_data()), batch, transpose,
                       static_cast<int>(std::max<int64_t>(leading, 1))};
  };
  if (col_stride == 1 && row_stride >= std::max<int64_t>(cols, 1) && row_stride <= INT_MAX) {
    return make(t, CblasNoTrans, row_stride);
  }
  if (row_stride == 1 && col_stride >= std::max<int64_t>(rows, 1) && col_stride <= INT_MAX) {
    return make(t, CblasTrans, col_stride);  // a transposed view of a row-major matrix
  }
  const Tensor packed = t.contiguous();
  return make(packed, CblasNoTrans, cols);
}

void matmul_kernel(const OpCall& call, std::span<Tensor> out) {
  const Tensor& a = call.inputs[0];
  const Tensor& b = call.inputs[1];
  Tensor& c = out[0];
  const int64_t batch = c.rank() == 3 ? c.shape()[0] : 1;
  const int64_t m = c.shape()[c.shape().size() - 2], n = c.shape()[c.shape().size() - 1], k = a.shape()[a.shape().size() - 1];
  if (c.numel() == 0) return;
  const size_t bytes = static_cast<size_t>(c.numel()) * dtype_size(c.dtype());
  if (k == 0) {  // an empty sum: zeros (BLAS may leave C untouched when k is 0)
    std::memset(c.raw_data(), 0, bytes);
    return;
  }
  const BlasOperand pa = blas_operand(a), pb = blas_operand(b);
  char* pc = static_cast<char*>(c.raw_data());
  const int64_t c_stride = m * n * static_cast<int64_t>(dtype_size(c.dtype()));
  const int M = static_cast<int>(m), N = static_cast<int>(n), K = static_cast<int>(k);
  for (int64_t i = 0; i < batch; ++i) {
    const char* ai = pa.base + i * pa.batch_stride;
    const char* bi = pb.base + i * pb.batch_stride;
    char* ci = pc + i * c_stride;
    if (c.dtype() == f32) {
      cblas_sgemm(CblasRowMajor, pa.transpose, pb.transpose, M, N, K, 1.0f, reinterpret_cast<const float*>(ai),
                  pa.leading, reinterpret_cast<const float*>(bi), pb.leading, 0.0f, reinterpret_cast<float*>(ci), N);
    } else {
      cblas_dgemm(CblasRowMajor, pa.transpose, pb.transpose, M, N, K, 1.0, reinterpret_cast<const double*>(ai),
                  pa.leading, reinterpret_cast<const double*>(bi), pb.leading, 0.0, reinterpret_cast<double*>(ci), N);
    }
  }
}

// The last two dimensions swapped (a view).
Tensor swap_last(const Tensor& t) { return t.rank() == 2 ? transpose(t) : permute(t, {0, 2, 1}); }

// dA = dC B^T, dB = A^T dC; a rank-2 operand shared across a batch sums its batch of gradients.
void matmul_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> dx) {
  const Tensor& a = c.inputs[0];
  const Tensor& b = c.inputs[1];
  if (c.wants(0)) {  // skipped for a first layer's input, which saves a GEMM as large as the forward one
    const Tensor da = matmul(g[0], swap_last(b));
    dx[0] = a.rank() == 2 && da.rank() == 3 ? sum(da, {0}) : da;
  }
  if (c.wants(1)) {
    const Tensor db = matmul(swap_last(a), g[0]);
    dx[1] = b.rank() == 2 && db.rank() == 3 ? sum(db, {0}) : db;
  }
}

Op matmul_op{"matmul", 2, 2, kNoFlags, &matmul_infer, {&matmul_kernel, nullptr}, &matmul_grad};

}  // namespace

void add_linalg_ops(std::vector<Op*>& ops) { ops.push_back(&matmul_op); }

}  // namespace detail

Tensor matmul(const Tensor& a, const Tensor& b) { return dispatch(detail::matmul_op, {a, b}); }

}  // namespace flowlet
