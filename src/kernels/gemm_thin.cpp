// thin_sgemm: oneDNN's sgemm for thin f32 products, held to the calling thread (see gemm_thin.hpp).
#include "kernels/gemm_thin.hpp"

#ifdef FLOWLET_HAVE_DNNL
#include <dnnl.h>
#include <omp.h>
#endif

namespace flowlet::detail {

bool thin_sgemm_pays(int64_t m, int64_t n, int64_t k) {
#ifdef FLOWLET_HAVE_DNNL
  return m >= 2 && n >= 2 && k >= 2 && (m <= 16 || n <= 16 || k <= 16);
#else
  (void)m, (void)n, (void)k;
  return false;
#endif
}

bool thin_sgemm_beats_small(int64_t m, int64_t n, int64_t k, bool transpose_a, bool transpose_b) {
#ifdef FLOWLET_HAVE_DNNL
  return !transpose_a && !transpose_b && n <= 16 && static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) >= kThinOverSmallWork;
#else
  (void)m, (void)n, (void)k, (void)transpose_a, (void)transpose_b;
  return false;
#endif
}

bool thin_sgemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
#ifdef FLOWLET_HAVE_DNNL
  // oneDNN (OpenMP build) splits a call over omp_get_max_threads() threads, a per-thread setting:
  // 1 for this call keeps it inside flowlet's thread budget (the pool already split the work), and
  // the caller's own value (libtorch sets it in the same process) comes back afterwards.
  const int caller_threads = omp_get_max_threads();
  if (caller_threads != 1) omp_set_num_threads(1);
  const dnnl_status_t status = dnnl_sgemm(transpose_a ? 'T' : 'N', transpose_b ? 'T' : 'N', m, n, k, alpha, a, lda, b,
                                          ldb, beta, c, ldc);
  if (caller_threads != 1) omp_set_num_threads(caller_threads);
  return status == dnnl_success;
#else
  (void)transpose_a, (void)transpose_b, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)lda, (void)b, (void)ldb,
      (void)beta, (void)c, (void)ldc;
  return false;
#endif
}

}  // namespace flowlet::detail
