// matmul_bias: y = act(a @ w + bias) as one node (see matmul_bias.hpp): shape and dtype rule, the
// kernel (bias rows, GEMM accumulating into them, relu in place) and its registration.
#include "ops/matmul_bias.hpp"

#include <algorithm>
#include <climits>

#include "core/check.hpp"
#include "core/dtype_visit.hpp"
#include "kernels/dtypes.hpp"
#include "kernels/elementwise_functors.hpp"
#include "ops/gemm.hpp"
#include "ops/registry.hpp"
#include "runtime/thread_pool.hpp"

namespace flowlet::detail {
namespace {

void matmul_bias_infer(const OpCall& call, OutputSpec& spec) {
  const Tensor& a = call.inputs[0];
  const Tensor& w = call.inputs[1];
  const Tensor& bias = call.inputs[2];
  if (a.dtype() != w.dtype() || a.dtype() != bias.dtype()) {
    fail<DTypeError>("matmul_bias: a, w and bias must have one dtype; got {}, {} and {}", a.dtype(), w.dtype(),
                     bias.dtype());
  }
  check_dtype("matmul_bias", a.dtype(), kFloatCompute);
  if (a.rank() != 2 || w.rank() != 2 || bias.rank() != 1 || a.shape()[1] != w.shape()[0] ||
      bias.shape()[0] != w.shape()[1]) {
    fail<ShapeError>("matmul_bias: expects a [m, k], w [k, n] and bias [n]; got a {}, w {} and bias {}", a.shape(),
                     w.shape(), bias.shape());
  }
  for (int64_t d : {a.shape()[0], a.shape()[1], w.shape()[1]}) {
    if (d > INT_MAX) {
      fail<ShapeError>("matmul_bias: dimension exceeds BLAS's int range; got a {} and w {}", a.shape(), w.shape());
    }
  }
  spec.outputs[0] = {Shape{a.shape()[0], w.shape()[1]}, a.dtype()};
}

void matmul_bias_kernel(const OpCall& call, std::span<Tensor> out) {
  Tensor& y = out[0];
  const int64_t m = y.shape()[0], n = y.shape()[1];
  if (y.numel() == 0) return;
  const Tensor bias = call.inputs[2].contiguous();
  const bool relu = call.attributes != nullptr && call.attrs<MatmulBiasAttrs>().activation == DenseActivation::relu;
  visit_dtype<kFloatCompute>(y.dtype(), [&]<class T>(TypeTag<T>) {
    const T* b = static_cast<const T*>(bias.raw_data());
    T* rows = static_cast<T*>(y.raw_data());
    parallel_for(m, std::max<int64_t>(1, kParallelGrain / n), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) std::copy(b, b + n, rows + r * n);
    });
  });
  // beta = 1: the product is added to the bias rows inside the GEMM (k = 0 leaves the bias).
  gemm_into(call.inputs[0], call.inputs[1], y, 1.0, 1.0);
  if (!relu) return;
  visit_dtype<kFloatCompute>(y.dtype(), [&]<class T>(TypeTag<T>) {
    T* values = static_cast<T*>(y.raw_data());
    parallel_for(y.numel(), kParallelGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) values[i] = Relu{}(values[i]);  // relu's own functor: NaN stays NaN
    });
  });
}

}  // namespace

Op matmul_bias_op{"matmul_bias", 3, 3, kContraction, &matmul_bias_infer, {&matmul_bias_kernel, nullptr}, nullptr,
                  &copy_attributes<MatmulBiasAttrs>, &describe_attributes<MatmulBiasAttrs>};

void add_matmul_bias_ops(std::vector<Op*>& ops) { ops.push_back(&matmul_bias_op); }

}  // namespace flowlet::detail
