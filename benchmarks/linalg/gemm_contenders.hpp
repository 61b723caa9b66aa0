// What bench_gemm_shapes and bench_gemm_burst share: the wait for a quiet process before a sample,
// medians, and one product with every BLAS call flowlet's matmul is compared with (OpenBLAS on one
// thread or on the budget's threads, oneDNN's sgemm held to one thread as flowlet calls it,
// libtorch's at::matmul), all on the same stored operands.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <thread>
#include <type_traits>
#include <vector>

#include <flowlet/flowlet.hpp>

#ifdef FLOWLET_HAVE_DNNL
#include <dnnl.h>
#include <omp.h>
#endif

#include "../harness.hpp"
#include "../paced_rounds.hpp"
#include "../torch_peer.hpp"

namespace flowlet_bench::gemm {

using Clock = std::chrono::steady_clock;

inline double us_since(Clock::time_point t0, Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(t - t0).count();
}

// Medians and the quiet-process wait are paced_rounds.hpp's (bench_reduce paces its rounds with
// them too).
inline double median(std::vector<double> v) { return median_of(std::move(v)); }

// Sleeps until no thread of this process burns CPU (at most 0.3 s): threaded OpenBLAS's idle
// threads spin for 2^28 cycles (~0.11 s here) after a call, libtorch's OpenMP threads and flowlet's
// pool workers for shorter. Called before every contender's sample, so each starts on a quiet
// process whatever ran before it (docs/notes19/gemm.md: a spinning peer thread on the second core
// halved the split GEMM of whichever contender came next).
inline void wait_until_process_idle() { wait_until_quiet(2, 0.1, 300); }

// op(A)[m, k] @ op(B)[k, n] in T (float or double); a_t: A is stored [k, m] and used transposed
// (likewise b_t). `a` and `b` are the views flowlet's matmul gets; every call writes `c`.
template <class T>
struct Product {
  Product(int64_t m_, int64_t k_, int64_t n_, bool a_t_, bool b_t_)
      : m(m_), k(k_), n(n_), a_t(a_t_), b_t(b_t_),
        a_stored(flowlet::randn(a_t ? flowlet::Shape{k, m} : flowlet::Shape{m, k}, 1).astype(dtype())),
        b_stored(flowlet::randn(b_t ? flowlet::Shape{n, k} : flowlet::Shape{k, n}, 2).astype(dtype())),
        a(a_t ? flowlet::transpose(a_stored) : a_stored),
        b(b_t ? flowlet::transpose(b_stored) : b_stored),
        c(static_cast<size_t>(m * n)) {
#ifdef FLOWLET_BENCH_HAVE_TORCH
    const auto torch_dtype = std::is_same_v<T, float> ? at::kFloat : at::kDouble;
    torch_a = at::from_blob(const_cast<T*>(pa()), {a_t ? k : m, a_t ? m : k}, torch_dtype);
    torch_b = at::from_blob(const_cast<T*>(pb()), {b_t ? n : k, b_t ? k : n}, torch_dtype);
    if (a_t) torch_a = torch_a.t();
    if (b_t) torch_b = torch_b.t();
#endif
  }

  static flowlet::DType dtype() { return std::is_same_v<T, float> ? flowlet::f32 : flowlet::f64; }
  const T* pa() const { return a_stored.data<T>(); }
  const T* pb() const { return b_stored.data<T>(); }
  int lda() const { return static_cast<int>(a_t ? m : k); }
  int ldb() const { return static_cast<int>(b_t ? k : n); }
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(n); }

  void flowlet_matmul() const { do_not_optimize(flowlet::matmul(a, b)); }

  // cblas_?gemm with `threads` OpenBLAS threads; OpenBLAS is set back to one thread afterwards,
  // as flowlet keeps it.
  void openblas(int threads) {
    const CBLAS_TRANSPOSE ta = a_t ? CblasTrans : CblasNoTrans, tb = b_t ? CblasTrans : CblasNoTrans;
    const int M = static_cast<int>(m), N = static_cast<int>(n), K = static_cast<int>(k);
    openblas_set_num_threads(threads);
    if constexpr (std::is_same_v<T, float>) {
      cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.0f, pa(), lda(), pb(), ldb(), 0.0f, c.data(), N);
    } else {
      cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, 1.0, pa(), lda(), pb(), ldb(), 0.0, c.data(), N);
    }
    if (threads != 1) openblas_set_num_threads(1);
    do_not_optimize(c.data());
  }

#ifdef FLOWLET_HAVE_DNNL
  // oneDNN's sgemm on one thread, as flowlet calls it for thin pieces (src/kernels/gemm_thin.hpp).
  void onednn()
    requires std::is_same_v<T, float>
  {
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    dnnl_sgemm(a_t ? 'T' : 'N', b_t ? 'T' : 'N', m, n, k, 1.0f, pa(), lda(), pb(), ldb(), 0.0f, c.data(), n);
    omp_set_num_threads(threads);
    do_not_optimize(c.data());
  }
#endif

#ifdef FLOWLET_BENCH_HAVE_TORCH
  void torch() const { do_not_optimize(at::matmul(torch_a, torch_b)); }
  at::Tensor torch_a, torch_b;
#endif

  int64_t m, k, n;
  bool a_t, b_t;
  flowlet::Tensor a_stored, b_stored, a, b;
  std::vector<T> c;
};

}  // namespace flowlet_bench::gemm
