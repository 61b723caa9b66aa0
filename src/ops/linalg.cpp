// matmul: rank 2 and batched rank 3, through single-threaded BLAS calls spread over the pool:
// OpenBLAS, or oneDNN's sgemm for thin f32 pieces (kernels/gemm_thin.hpp); narrow (n <= 16) and
// tiny products run our own AVX2 loop instead (kernels/gemm_small.hpp; narrow f32 ones from 2^17
// multiply-adds stay with oneDNN, faster there: thin_sgemm_beats_small), and so does a batch of at
// most 8 rows times a transposed short-k B (dy @ W2^T, kernels/gemm_small_bt.hpp). A single big
// product splits into guided pieces (kernels/gemm_split.hpp), or, for the f32 shapes where it
// measured faster, goes to our packed-panel driver that shares one packed B between the threads
// (kernels/gemm_packed.hpp).
// Transposed views go to BLAS as a transpose flag, not a copy; other strided inputs are copied once.
// f16 and bf16 (storage types, as for elementwise ops) multiply as f32 copies with f32 accumulation
// and round the result back once; CUDA does the same inside cuBLAS (CUBLAS_COMPUTE_32F).
#include "flowlet/ops/linalg.hpp"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>

#include "flowlet/dispatch.hpp"
#include "flowlet/ops/elementwise.hpp"
#include "flowlet/ops/reduce.hpp"
#include "flowlet/ops/shape.hpp"
#include "runtime/thread_pool.hpp"
#include "kernels/blas_threads.hpp"
#include "kernels/elementwise_loop.hpp"
#include "kernels/gemm_outer.hpp"
#include "kernels/gemm_packed.hpp"
#include "kernels/gemm_small.hpp"
#include "kernels/gemm_small_bt.hpp"
#include "kernels/gemm_split.hpp"
#include "kernels/gemm_thin.hpp"
#include "ops/gemm.hpp"
#include "ops/known_ops.hpp"
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
  check_dtype("matmul", a.dtype(), kFloating);
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

// Below this many multiply-adds per thread a product runs as one BLAS call: a worker must wake and
// the shared operand be packed again. Measured on a 2-core VM, splitting 160^3 in two was slower,
// 192^3 even, 224^3 and up faster (up to 1.4x). It also keeps every block above OpenBLAS's
// small-matrix size (about 1e6), whose kernel sums in another order than the blocked one.
constexpr double kGemmWorkPerThread = 160.0 * 160.0 * 160.0;
// Blocks start at multiples of this many rows (columns), a multiple of OpenBLAS's micro-tiles, so
// a block is tiled as in one call. Every block sums the full k, so a split product equals one call
// within rounding; bit for bit too on most kernels, but not all (OpenBLAS's Haswell kernels on an
// AVX-512 machine tile a block's edge in another order).
constexpr int64_t kGemmAlign = 16;
// The shortest guided piece (kernels/gemm_split.hpp): every piece packs the shared operand again.
// One thread running the pieces of 256-1024 x 784 x 256 and 512^3, 1024^3 one after another took
// 0.97-1.03x the time of two halves with 64-row pieces, up to 1.10x with 32-row ones (13:28, load 7).
constexpr int64_t kGemmMinPiece = 64;

// C rows [r0, r1) and columns [c0, c1) of one matrix of the batch: one single-threaded BLAS call
// (oneDNN's sgemm for a thin f32 piece, OpenBLAS otherwise).
void gemm_block(DType dtype, const BlasOperand& pa, const BlasOperand& pb, const char* ai, const char* bi,
                char* ci, int64_t n, int64_t k, int64_t r0, int64_t r1, int64_t c0, int64_t c1, double alpha,
                double beta) {
  const int64_t element = static_cast<int64_t>(dtype_size(dtype));
  // Row r of op(A) starts r rows into A, or r columns into the stored A^T; likewise for B's columns.
  ai += (pa.transpose == CblasNoTrans ? r0 * pa.leading : r0) * element;
  bi += (pb.transpose == CblasNoTrans ? c0 : c0 * pb.leading) * element;
  ci += (r0 * n + c0) * element;
  const int M = static_cast<int>(r1 - r0), N = static_cast<int>(c1 - c0), K = static_cast<int>(k);
  const int ldc = static_cast<int>(n);
  const bool transpose_a = pa.transpose != CblasNoTrans, transpose_b = pb.transpose != CblasNoTrans;
  // kernels/gemm_small.hpp; a larger narrow f32 piece goes to oneDNN, faster there (gemm_thin.hpp).
  if (small_gemm_pays(M, N, K, transpose_a, transpose_b) &&
      !(dtype == f32 && thin_sgemm_beats_small(M, N, K, transpose_a, transpose_b))) {
    if (dtype == f32) {
      small_gemm(transpose_a, transpose_b, M, N, K, static_cast<float>(alpha), reinterpret_cast<const float*>(ai),
                 pa.leading, reinterpret_cast<const float*>(bi), pb.leading, beta != 0.0, reinterpret_cast<float*>(ci), ldc);
    } else {
      small_gemm(transpose_a, transpose_b, M, N, K, alpha, reinterpret_cast<const double*>(ai), pa.leading,
                 reinterpret_cast<const double*>(bi), pb.leading, beta != 0.0, reinterpret_cast<double*>(ci), ldc);
    }
    return;
  }
  if (dtype == f32 && small_sgemm_bt_pays(M, N, K, transpose_b)) {  // kernels/gemm_small_bt.hpp
    small_sgemm_bt(transpose_a, M, N, K, static_cast<float>(alpha), reinterpret_cast<const float*>(ai), pa.leading,
                   reinterpret_cast<const float*>(bi), pb.leading, beta != 0.0, reinterpret_cast<float*>(ci), ldc);
    return;
  }
  if (dtype == f32 && thin_sgemm_pays(M, N, K) &&
      thin_sgemm(transpose_a, transpose_b, M, N, K, static_cast<float>(alpha),
                 reinterpret_cast<const float*>(ai), pa.leading, reinterpret_cast<const float*>(bi), pb.leading,
                 static_cast<float>(beta), reinterpret_cast<float*>(ci), ldc)) {
    return;  // oneDNN took a thin product (kernels/gemm_thin.hpp)
  }
  if (dtype == f32) {
    cblas_sgemm(CblasRowMajor, pa.transpose, pb.transpose, M, N, K, static_cast<float>(alpha),
                reinterpret_cast<const float*>(ai), pa.leading, reinterpret_cast<const float*>(bi), pb.leading,
                static_cast<float>(beta), reinterpret_cast<float*>(ci), ldc);
  } else {
    cblas_dgemm(CblasRowMajor, pa.transpose, pb.transpose, M, N, K, alpha, reinterpret_cast<const double*>(ai),
                pa.leading, reinterpret_cast<const double*>(bi), pb.leading, beta, reinterpret_cast<double*>(ci), ldc);
  }
}

// Vector shapes (a row times a matrix, a matrix times a column, a column times a row) as BLAS-2
// calls, the last as our own pass (kernels/gemm_outer.hpp): OpenBLAS's GEMM path for them is 2-3x
// slower than GEMV/GER, and batch-1 training is made of exactly these (the forward x @ W and the
// weight gradient x^T @ dy). Returns false otherwise.
bool vector_product(DType dtype, const BlasOperand& pa, const BlasOperand& pb, char* pc, int64_t m, int64_t n,
                    int64_t k, double alpha, double beta) {
  if (m != 1 && n != 1 && k != 1) return false;
  const int M = static_cast<int>(m), N = static_cast<int>(n), K = static_cast<int>(k);
  // Element step along a row of op(A) (m == 1) or a column of op(B) (n == 1).
  const int a_row_step = pa.transpose == CblasNoTrans ? 1 : pa.leading;
  const int b_column_step = pb.transpose == CblasNoTrans ? pb.leading : 1;
  auto gemv = [&](CBLAS_TRANSPOSE t, int rows, int cols, const char* matrix, int ld, const char* x, int incx) {
    if (dtype == f32) {
      cblas_sgemv(CblasRowMajor, t, rows, cols, static_cast<float>(alpha), reinterpret_cast<const float*>(matrix), ld,
                  reinterpret_cast<const float*>(x), incx, static_cast<float>(beta), reinterpret_cast<float*>(pc), 1);
    } else {
      cblas_dgemv(CblasRowMajor, t, rows, cols, alpha, reinterpret_cast<const double*>(matrix), ld,
                  reinterpret_cast<const double*>(x), incx, beta, reinterpret_cast<double*>(pc), 1);
    }
  };
  if (m == 1) {  // c[1, n] = a[1, k] @ B[k, n]: B^T times a
    gemv(pb.transpose == CblasNoTrans ? CblasTrans : CblasNoTrans, pb.transpose == CblasNoTrans ? K : N,
         pb.transpose == CblasNoTrans ? N : K, pb.base, pb.leading, pa.base, a_row_step);
    return true;
  }
  if (n == 1) {  // c[m, 1] = A[m, k] @ b[k, 1]
    gemv(pa.transpose, pa.transpose == CblasNoTrans ? M : K, pa.transpose == CblasNoTrans ? K : M, pa.base,
         pa.leading, pb.base, b_column_step);
    return true;
  }
  // k == 1: c = alpha * a b^T (+ c), a rank-1 product in one pass over C (kernels/gemm_outer.hpp).
  const int a_column_step = pa.transpose == CblasNoTrans ? pa.leading : 1;
  const int b_row_step = pb.transpose == CblasNoTrans ? 1 : pb.leading;
  if (dtype == f32) {
    outer_product(m, n, static_cast<float>(alpha), reinterpret_cast<const float*>(pa.base), a_column_step,
                  reinterpret_cast<const float*>(pb.base), b_row_step, beta != 0.0, reinterpret_cast<float*>(pc));
  } else {
    outer_product(m, n, alpha, reinterpret_cast<const double*>(pa.base), a_column_step,
                  reinterpret_cast<const double*>(pb.base), b_row_step, beta != 0.0, reinterpret_cast<double*>(pc));
  }
  return true;
}

// The half-precision product: BLAS has no f16/bf16 GEMM, so a, b (and c when accumulating) go to
// f32, the f32 path below multiplies with f32 accumulation, and the result is rounded back once.
// The copies cost two conversions per element, small beside the O(m n k) product.
void gemm_half(const Tensor& a, const Tensor& b, Tensor& c, double alpha, double beta) {
  const Tensor a32 = cast(a, f32), b32 = cast(b, f32);  // also packs strided views
  Tensor c32 = beta == 0.0 ? Tensor::empty(c.shape(), f32, c.device()) : cast(c, f32);
  gemm_into(a32, b32, c32, alpha, beta);
  // c32 into c's own buffer (cast would allocate a new one; assign_matmul updates c in place).
  const float* in = static_cast<const float*>(c32.raw_data());
  visit_dtype<kHalves>(c.dtype(), [&]<class T>(TypeTag<T>) {
    T* out = static_cast<T*>(c.raw_data());
    parallel_for(c.numel(), 1 << 15, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) out[i] = convert<T>(in[i]);
    });
  });
}

}  // namespace

void gemm_into(const Tensor& a, const Tensor& b, Tensor& c, double alpha, double beta) {
  if (c.dtype() == f16 || c.dtype() == bf16) return gemm_half(a, b, c, alpha, beta);
  const int64_t batch = c.rank() == 3 ? c.shape()[0] : 1;
  const int64_t m = c.shape()[c.shape().size() - 2], n = c.shape()[c.shape().size() - 1], k = a.shape()[a.shape().size() - 1];
  if (c.numel() == 0) return;
  const size_t bytes = static_cast<size_t>(c.numel()) * dtype_size(c.dtype());
  if (k == 0) {  // an empty sum: zeros (BLAS may leave C untouched when k is 0)
    if (beta == 0.0) std::memset(c.raw_data(), 0, bytes);  // beta == 1: C stays as it is
    return;
  }
  use_pool_threads_only();
  const BlasOperand pa = blas_operand(a), pb = blas_operand(b);
  char* pc = static_cast<char*>(c.raw_data());
  // Small vector products stay on one thread; big ones go through the split GEMM below.
  const double size = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  // A row times a narrow matrix (batch 1's h @ W2) goes to small_gemm through the blocks below.
  const bool small = small_gemm_pays(m, n, k, pa.transpose != CblasNoTrans, pb.transpose != CblasNoTrans);
  if (batch == 1 && !small && size < kGemmWorkPerThread * 64 && vector_product(c.dtype(), pa, pb, pc, m, n, k, alpha, beta)) return;
  const int64_t c_stride = m * n * static_cast<int64_t>(dtype_size(c.dtype()));
  auto block = [&](int64_t i, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    gemm_block(c.dtype(), pa, pb, pa.base + i * pa.batch_stride, pb.base + i * pb.batch_stride, pc + i * c_stride, n,
               k, r0, r1, c0, c1, alpha, beta);
  };
  // Threads that pay: each needs kGemmWorkPerThread multiply-adds (double: m * n * k can pass 2^63).
  // Narrow products (h @ W2 at 256-1024 rows) split at a lower threshold ran faster only while the
  // worker was idle on its own core and 1.5-2.5x slower when it was not (docs/notes21/gemm.md).
  const double work = static_cast<double>(batch) * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  const auto parts = static_cast<int64_t>(std::min<double>(intra_op_threads(), work / kGemmWorkPerThread));
  if (parts <= 1) {
    for (int64_t i = 0; i < batch; ++i) block(i, 0, m, 0, n);
    return;
  }
  // A piece is one matrix of the batch, or a block of its rows (of its columns when it is wider
  // than tall): a big batch splits over matrices, a single product into guided pieces
  // (kernels/gemm_split.hpp) so that a late worker holds back little.
  const bool by_rows = m >= n;
  const int64_t extent = by_rows ? m : n;
  const bool transpose_a = pa.transpose != CblasNoTrans, transpose_b = pb.transpose != CblasNoTrans;
  if (batch == 1 && c.dtype() == f32 && packed_sgemm_pays(m, n, k, transpose_a, transpose_b, parts)) {
    // Our packed-panel driver: B packed once and shared, fine tiles (kernels/gemm_packed.hpp).
    packed_sgemm(transpose_a, transpose_b, m, n, k, static_cast<float>(alpha), reinterpret_cast<const float*>(pa.base),
                 pa.leading, reinterpret_cast<const float*>(pb.base), pb.leading, static_cast<float>(beta),
                 reinterpret_cast<float*>(pc), n, static_cast<int>(parts));
    return;
  }
  if (batch == 1) {
    // No piece under kGemmMinPiece rows, nor under a quarter of kGemmWorkPerThread multiply-adds
    // (far above OpenBLAS's small-matrix size, see kGemmAlign).
    const double per_row = static_cast<double>(k) * static_cast<double>(by_rows ? n : m);
    const auto min_piece = std::max<int64_t>(kGemmMinPiece, static_cast<int64_t>(kGemmWorkPerThread / 4 / per_row) + 1);
    const GemmPieces split = guided_gemm_pieces(extent, parts, kGemmAlign, min_piece);
    auto piece = [&](int64_t p) {
      const int64_t lo = split.edges[p], hi = split.edges[p + 1];
      if (by_rows) block(0, lo, hi, 0, n);
      else block(0, 0, m, lo, hi);
    };
    run_chunks(split.count, FunctionRef<void(int64_t)>(piece));
    return;
  }
  // At most extent / kGemmAlign blocks per matrix, so no block is empty.
  const GemmPieces blocks = even_gemm_pieces(extent, (parts + batch - 1) / batch, kGemmAlign);
  const int64_t per_matrix = blocks.count;
  const int64_t pieces = batch * per_matrix;
  parallel_for(pieces, (pieces + parts - 1) / parts, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t i = p / per_matrix, lo = blocks.edges[p % per_matrix], hi = blocks.edges[p % per_matrix + 1];
      if (by_rows) block(i, lo, hi, 0, n);
      else block(i, 0, m, lo, hi);
    }
  });
}

namespace {

void matmul_kernel(const OpCall& call, std::span<Tensor> out) { gemm_into(call.inputs[0], call.inputs[1], out[0], 1.0, 0.0); }

// The last two dimensions swapped (a view).
Tensor swap_last(const Tensor& t) { return t.rank() == 2 ? transpose(t) : permute(t, {0, 2, 1}); }

// The batch of gradients of a shared rank-2 operand, summed (halves accumulate in f64 and round
// once, as every sum does).
Tensor sum_batch(const Tensor& d) { return sum(d, {0}); }

// dA = dC B^T, dB = A^T dC; a rank-2 operand shared across a batch sums its batch of gradients.
void matmul_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> dx) {
  const Tensor& a = c.inputs[0];
  const Tensor& b = c.inputs[1];
  if (c.wants(0)) {  // skipped for a first layer's input, which saves a GEMM as large as the forward one
    const Tensor da = matmul(g[0], swap_last(b));
    dx[0] = a.rank() == 2 && da.rank() == 3 ? sum_batch(da) : da;
  }
  if (c.wants(1)) {
    const Tensor db = matmul(swap_last(a), g[0]);
    dx[1] = b.rank() == 2 && db.rank() == 3 ? sum_batch(db) : db;
  }
}

}  // namespace

Op matmul_op{"matmul", 2, 2, kContraction, &matmul_infer, {&matmul_kernel, nullptr}, &matmul_grad};

void add_linalg_ops(std::vector<Op*>& ops) { ops.push_back(&matmul_op); }

}  // namespace detail

Tensor matmul(const Tensor& a, const Tensor& b) { return dispatch(detail::matmul_op, {a, b}); }

namespace {
std::atomic<bool> tf32_allowed{false};  // read by the CUDA backend's matmul (src/cuda/linalg.cpp)
}  // namespace

void set_matmul_tf32(bool allowed) { tf32_allowed.store(allowed, std::memory_order_relaxed); }
bool matmul_tf32() { return tf32_allowed.load(std::memory_order_relaxed); }

}  // namespace flowlet
