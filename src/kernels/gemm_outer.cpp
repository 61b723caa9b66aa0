// outer_product: the rank-1 GEMM (k = 1) as one pass over C (see gemm_outer.hpp).
#include "kernels/gemm_outer.hpp"

#include <algorithm>
#include <vector>

#include "runtime/thread_pool.hpp"

namespace flowlet::detail {
namespace {

// One row of C: the compiler vectorizes both loops over j (b contiguous, after the gather below).
template <class T>
void outer_rows(int64_t r0, int64_t r1, int64_t n, T alpha, const T* a, int64_t a_step, const T* __restrict b,
                bool accumulate, T* __restrict c) {
  for (int64_t i = r0; i < r1; ++i) {
    const T ai = alpha * a[i * a_step];
    T* __restrict row = c + i * n;
    if (accumulate) {
      for (int64_t j = 0; j < n; ++j) row[j] += ai * b[j];
    } else {
      for (int64_t j = 0; j < n; ++j) row[j] = ai * b[j];
    }
  }
}

template <class T>
void outer(int64_t m, int64_t n, T alpha, const T* a, int64_t a_step, const T* b, int64_t b_step, bool accumulate,
           T* c) {
  // A strided b (a column of a row-major matrix, as x^T is) is gathered once, so every row reads
  // it contiguously (on the stack when short: these are 1-20 us calls, an allocation shows).
  T on_stack[512];
  std::vector<T> on_heap;
  if (b_step != 1) {
    T* to = on_stack;
    if (n > 512) {
      on_heap.resize(static_cast<size_t>(n));
      to = on_heap.data();
    }
    for (int64_t j = 0; j < n; ++j) to[j] = b[j * b_step];
    b = to;
  }
  // Memory-bound: a second thread pays from about the elementwise ops' grain on.
  const int64_t rows_per_chunk = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(n, 1));
  parallel_for(m, rows_per_chunk, [&](int64_t r0, int64_t r1) { outer_rows(r0, r1, n, alpha, a, a_step, b, accumulate, c); });
}

}  // namespace

void outer_product(int64_t m, int64_t n, float alpha, const float* a, int64_t a_step, const float* b, int64_t b_step,
                   bool accumulate, float* c) {
  outer(m, n, alpha, a, a_step, b, b_step, accumulate, c);
}

void outer_product(int64_t m, int64_t n, double alpha, const double* a, int64_t a_step, const double* b,
                   int64_t b_step, bool accumulate, double* c) {
  outer(m, n, alpha, a, a_step, b, b_step, accumulate, c);
}

}  // namespace flowlet::detail
