// The dropout op: zeroes the elements the Philox mask of its state input drops and scales the rest
// by 1 / (1 - rate). The mask is src/kernels/dropout_mask.hpp's, so the CUDA kernel draws the same
// one for the same state. The op's gradient is the same op applied to dy with the same state: the
// same mask and scale. The state's reads and updates are the Generator's (src/state/random.cpp).
#include "ops/dropout.hpp"

#include <array>
#include <cmath>

#include "core/check.hpp"
#include "core/dtype_visit.hpp"
#include "flowlet/dispatch.hpp"
#include "kernels/dropout_mask.hpp"
#include "ops/conv_attrs.hpp"
#include "ops/registry.hpp"
#include "runtime/thread_pool.hpp"

namespace flowlet::detail {
namespace {

void dropout_infer(const OpCall& call, OutputSpec& spec) {
  const Tensor &x = call.inputs[0], &state = call.inputs[1];
  check_dropout_rate(call.attrs<DropoutAttrs>().rate);
  if ((kFloating & bit(x.dtype())) == 0) {
    fail<DTypeError>("dropout: x must be floating (f32, f64, f16, bf16); got {}", x.dtype());
  }
  if (state.dtype() != i64 || !(state.shape() == Shape{2})) {
    fail<ShapeError>("dropout: the random state must be i64 [2] (seed, offset); got {} {}", state.dtype(), state.shape());
  }
  spec.outputs[0] = {x.shape(), x.dtype()};
}

void dropout_kernel(const OpCall& call, std::span<Tensor> out) {
  const Tensor x = call.inputs[0].contiguous();
  const Tensor state = call.inputs[1].contiguous();
  const auto* words = static_cast<const int64_t*>(state.raw_data());
  const auto seed = static_cast<uint64_t>(words[0]), offset = static_cast<uint64_t>(words[1]);
  const double rate = call.attrs<DropoutAttrs>().rate;
  const uint32_t threshold = dropout_threshold(rate);
  visit_dtype<kFloating>(x.dtype(), [&]<class T>(TypeTag<T>) {
    using C = compute_t<T>;
    const C scale = static_cast<C>(dropout_scale(rate));
    const T* xs = static_cast<const T*>(x.raw_data());
    T* y = static_cast<T*>(out[0].raw_data());
    parallel_for(x.numel(), kParallelGrain / 4, [&](int64_t begin, int64_t end) {
      // dropout_keep, one Philox block per four stream indices.
      uint64_t block_index = ~uint64_t{0};
      std::array<uint32_t, 4> block{};
      for (int64_t i = begin; i < end; ++i) {
        const uint64_t k = offset + static_cast<uint64_t>(i);
        if ((k >> 2) != block_index) {
          block_index = k >> 2;
          block = philox4x32(block_index, seed);
        }
        y[i] = block[k & 3u] >= threshold ? convert<T>(static_cast<C>(convert<C>(xs[i]) * scale)) : convert<T>(C{0});
      }
    });
  });
}

void dropout_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> grads);

Op dropout_op{"dropout", 2, 2, kNoFlags, &dropout_infer, {&dropout_kernel, nullptr}, &dropout_grad,
              &copy_attributes<DropoutAttrs>, &describe_attributes<DropoutAttrs>};

// The same mask and scale for dy (the state input has no gradient).
void dropout_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> grads) {
  grads[0] = dispatch(dropout_op, {g[0], c.inputs[1]}, c.attrs<DropoutAttrs>());
}

}  // namespace

void check_dropout_rate(double rate) {
  if (!(rate >= 0.0 && rate < 1.0)) fail<InvalidArgument>("dropout: rate must be in [0, 1); got {}", rate);
}

Tensor dropout_with_state(const Tensor& x, const Tensor& state, double rate) {
  return dispatch(dropout_op, {x, state}, DropoutAttrs{rate});
}

void add_dropout_ops(std::vector<Op*>& ops) {
  ops.push_back(&dropout_op);
}

}  // namespace flowlet::detail
