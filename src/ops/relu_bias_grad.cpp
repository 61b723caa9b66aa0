// relu_bias_grad: dz = where(y > 0, g, 0) and db = column sums of dz in one pass (see
// relu_bias_grad.hpp): shape and dtype rule, the kernel, and its registration.
#include "ops/relu_bias_grad.hpp"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/check.hpp"
#include "core/dtype_visit.hpp"
#include "kernels/dtypes.hpp"
#include "ops/registry.hpp"
#include "runtime/thread_pool.hpp"

namespace flowlet::detail {
namespace {

void relu_bias_grad_infer(const OpCall& call, OutputSpec& spec) {
  const Tensor& y = call.inputs[0];
  const Tensor& g = call.inputs[1];
  if (y.dtype() != g.dtype()) {
    fail<DTypeError>("relu_bias_grad: y and g must have one dtype; got {} and {}", y.dtype(), g.dtype());
  }
  check_dtype("relu_bias_grad", y.dtype(), kFloatCompute);
  if (y.rank() != 2 || y.shape() != g.shape()) {
    fail<ShapeError>("relu_bias_grad: expects y and g of one shape [m, n]; got y {} and g {}", y.shape(), g.shape());
  }
  spec.count = 2;
  spec.outputs[0] = {y.shape(), y.dtype()};
  spec.outputs[1] = {Shape{1, y.shape()[1]}, y.dtype()};
}

// Rows [begin, end): dz = where(y > 0, g, 0) and its column sums added to `sums`. The test and the
// select run on the bits, so that the loop vectorizes: as floats, GCC keeps `y > 0 ? g : 0` a
// branch per element (a compare may trap, -ftrapping-math), mispredicted on random signs, and that
// first version ran 15x slower than where + sum. y > 0 exactly when y's bits, read as a signed
// integer, lie in (0, bits of +inf]: -0, +0, negatives and NaNs of either sign fall outside.
template <class T>
void relu_grad_rows(const T* __restrict y, const T* __restrict g, T* __restrict dz, double* __restrict sums,
                    int64_t begin, int64_t end, int64_t n) {
  using Bits = std::conditional_t<sizeof(T) == 4, int32_t, int64_t>;
  static_assert(sizeof(Bits) == sizeof(T));
  const Bits infinity = std::bit_cast<Bits>(std::numeric_limits<T>::infinity());
  for (int64_t r = begin; r < end; ++r) {
    const T* yr = y + r * n;
    const T* gr = g + r * n;
    T* dr = dz + r * n;
    for (int64_t j = 0; j < n; ++j) {
      const Bits yb = std::bit_cast<Bits>(yr[j]);
      const Bits keep = -static_cast<Bits>(yb > 0 && yb <= infinity);  // all ones where y > 0
      const T d = std::bit_cast<T>(static_cast<Bits>(std::bit_cast<Bits>(gr[j]) & keep));  // g, or +0
      dr[j] = d;
      sums[j] += static_cast<double>(d);
    }
  }
}

void relu_bias_grad_kernel(const OpCall& call, std::span<Tensor> out) {
  const Tensor y = call.inputs[0].contiguous();
  const Tensor g = call.inputs[1].contiguous();
  const int64_t m = y.shape()[0], n = y.shape()[1];
  if (n == 0) return;
  // Row blocks: one per thread that pays (kParallelGrain elements each), each with its own f64
  // column sums, added in block order afterwards.
  const int64_t blocks = std::clamp<int64_t>(m * n / kParallelGrain, 1, intra_op_threads());
  std::vector<double> partial(static_cast<size_t>(blocks * n), 0.0);
  visit_dtype<kFloatCompute>(y.dtype(), [&]<class T>(TypeTag<T>) {
    const T* ys = static_cast<const T*>(y.raw_data());
    const T* gs = static_cast<const T*>(g.raw_data());
    T* dz = static_cast<T*>(out[0].raw_data());
    auto block = [&](int64_t b) {
      relu_grad_rows(ys, gs, dz, partial.data() + b * n, m * b / blocks, m * (b + 1) / blocks, n);
    };
    if (blocks == 1) {
      block(0);
    } else {
      run_chunks(blocks, FunctionRef<void(int64_t)>(block));
    }
    T* db = static_cast<T*>(out[1].raw_data());
    for (int64_t j = 0; j < n; ++j) {
      double total = 0.0;
      for (int64_t b = 0; b < blocks; ++b) total += partial[static_cast<size_t>(b * n + j)];
      db[j] = static_cast<T>(total);
    }
  });
}

}  // namespace

Op relu_bias_grad_op{"relu_bias_grad", 2, 2, kNoFlags, &relu_bias_grad_infer, {&relu_bias_grad_kernel, nullptr}};

void add_relu_bias_grad_ops(std::vector<Op*>& ops) { ops.push_back(&relu_bias_grad_op); }

}  // namespace flowlet::detail
