// OpenBLAS runs single-threaded inside flowlet: the thread pool (src/runtime/thread_pool.hpp) is
// the only source of threads, and large BLAS work is split into its chunks. Left at its default,
// OpenBLAS would start its own threads for every call on top of the pool (two GEMMs from two
// inter-op tasks would each take all cores, and its idle threads spin after a large axpy, taking the
// cores other processes of a job need). oneDNN's sgemm, which takes thin f32 products
// (kernels/gemm_thin.hpp), is held to the calling thread the same way, per call.
#pragma once

#include <cblas.h>

namespace flowlet::detail {

// Call before any BLAS call; the first call sets OpenBLAS to one thread, later ones cost a load.
inline void use_pool_threads_only() {
  static const bool once = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)once;
}

}  // namespace flowlet::detail
