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

// Philox-4x32-10 (src/kernels/philox.hpp) for kLanes consecutive counters at once, round by round
// across the lanes: eight independent dependency chains keep the multipliers busy (18 -> 14 ms per
// 1.6M elements on one thread). words[j][lane] is word j of block base + lane. The same
// values as philox4x32(base + lane, seed); the tests check the mask against an independent Philox.
constexpr uint64_t kLanes = 8;
using PhiloxLanes = std::array<std::array<uint32_t, kLanes>, 4>;

void philox_lanes(uint64_t base, uint64_t seed, PhiloxLanes& c) {
  for (uint64_t l = 0; l < kLanes; ++l) {
    const uint64_t counter = base + l;
    c[0][l] = static_cast<uint32_t>(counter);
    c[1][l] = static_cast<uint32_t>(counter >> 32);
    c[2][l] = 0;
    c[3][l] = 0;
  }
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    for (uint64_t l = 0; l < kLanes; ++l) {
      const uint64_t p0 = uint64_t{0xD2511F53u} * c[0][l];
      const uint64_t p1 = uint64_t{0xCD9E8D57u} * c[2][l];
      const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c[1][l] ^ k0;
      const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c[3][l] ^ k1;
      c[0][l] = n0;
      c[1][l] = static_cast<uint32_t>(p1);
      c[2][l] = n2;
      c[3][l] = static_cast<uint32_t>(p0);
    }
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
}

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
      // dropout_keep for stream indices offset + [begin, end), eight Philox blocks (32 indices) at a
      // time; a group wholly inside the range takes the loop without bounds checks.
      const uint64_t first = (offset + static_cast<uint64_t>(begin)) >> 2;
      const uint64_t last = (offset + static_cast<uint64_t>(end) - 1) >> 2;
      for (uint64_t base = first; base <= last; base += kLanes) {
        PhiloxLanes words;
        philox_lanes(base, seed, words);
        const uint64_t first_index = base << 2;  // stream index of word 0, lane 0
        const auto i0 = static_cast<int64_t>(first_index - offset);
        if (first_index >= offset && i0 >= begin && i0 + static_cast<int64_t>(4 * kLanes) <= end) {
          for (uint64_t j = 0; j < 4 * kLanes; ++j) {
            const C v = convert<C>(xs[i0 + static_cast<int64_t>(j)]);
            y[i0 + static_cast<int64_t>(j)] = convert<T>(words[j & 3][j >> 2] >= threshold ? static_cast<C>(v * scale) : C{0});
          }
          continue;
        }
        for (uint64_t lane = 0; lane < kLanes && base + lane <= last; ++lane) {
          for (uint64_t w = 0; w < 4; ++w) {
            const uint64_t k = ((base + lane) << 2) + w;
            const auto i = static_cast<int64_t>(k - offset);
            if (k < offset || i < begin || i >= end) continue;
            y[i] = words[w][lane] >= threshold ? convert<T>(static_cast<C>(convert<C>(xs[i]) * scale)) : convert<T>(C{0});
          }
        }
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
