// softmax_cross_entropy_grad and softmax_cross_entropy_grad_from_probs: dx = g * (softmax(logits) -
// one_hot(labels)) in one pass, from the logits or from the softmax the forward wrote (see
// cross_entropy_grad.hpp): shape and dtype rule, the kernels, and their registration (with the
// forward softmax_cross_entropy_with_probs, which lives in nn.cpp).
#include "ops/cross_entropy_grad.hpp"

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/check.hpp"
#include "core/dtype_visit.hpp"
#include "kernels/dtypes.hpp"
#include "ops/registry.hpp"
#include "ops/softmax_line.hpp"
#include "runtime/thread_pool.hpp"

namespace flowlet::detail {
namespace {

constexpr const char* kName = "softmax_cross_entropy_grad";

// Both gradient ops: input 0 is the logits or the probs, [N, C] either way.
void cross_entropy_grad_infer(const OpCall& call, OutputSpec& spec) {
  const std::string_view name = call.op.name;
  const Tensor& logits = call.inputs[0];
  const Tensor& labels = call.inputs[1];
  check_dtype(name, logits.dtype(), kFloatCompute);
  check_dtype(name, labels.dtype(), bit(i32) | bit(i64));
  if (logits.rank() != 2 || labels.shape() != Shape{logits.shape()[0]}) {
    fail<ShapeError>("{}: expects logits [N, C] and labels [N]; got logits {} and labels {}", name, logits.shape(),
                     labels.shape());
  }
  if (call.inputs.size() < 3) return void(spec.outputs[0] = {logits.shape(), logits.dtype()});  // g = 1
  const Tensor& g = call.inputs[2];
  if (g.dtype() != logits.dtype()) {
    fail<DTypeError>("{}: g must have the logits' dtype; got logits {} and g {}", name, logits.dtype(), g.dtype());
  }
  if (g.shape() != Shape{logits.shape()[0], 1}) {
    fail<ShapeError>("{}: expects logits [N, C], labels [N] and g [N, 1]; got logits {}, labels {} and g {}", name,
                     logits.shape(), labels.shape(), g.shape());
  }
  spec.outputs[0] = {logits.shape(), logits.dtype()};
}

// The labels as int64, each checked against [0, classes).
std::vector<int64_t> checked_labels(std::string_view name, const Tensor& labels, int64_t classes) {
  std::vector<int64_t> label(static_cast<size_t>(labels.numel()));
  visit_dtype<bit(i32) | bit(i64)>(labels.dtype(), [&]<class L>(TypeTag<L>) {
    const Tensor packed = labels.contiguous();
    const L* data = static_cast<const L*>(packed.raw_data());
    for (size_t i = 0; i < label.size(); ++i) {
      label[i] = static_cast<int64_t>(data[i]);
      if (label[i] < 0 || label[i] >= classes) {
        fail<OutOfRange>("{}: label out of range [0, {}); got label {} at position {}", name, classes, label[i], i);
      }
    }
  });
  return label;
}

// Row r of probabilities p becomes g[r] * (p - one_hot(label[r])), or p - one_hot(label[r]) with no
// g (the loss's gradient 1: eager's mul by 1 changes nothing).
template <class T>
void subtract_target(T* row, const T* g, const int64_t* label, int64_t classes, int64_t r) {
  if (g == nullptr) {
    row[label[r]] -= T(1);
    return;
  }
  for (int64_t c = 0; c < classes; ++c) row[c] = g[r] * (row[c] - (c == label[r] ? T(1) : T(0)));
}

// Rows [begin, end), eager's arithmetic: the softmax line (as the softmax op computes it), then
// g * (p - target) in T (g null: p - target). Bit for bit what one_hot, cast, softmax, sub and mul write.
template <class T>
void exact_rows(const T* x, const T* g, const int64_t* label, T* dx, int64_t classes, int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) {
    T* row = dx + r * classes;
    softmax_line<false>(x + r * classes, row, classes, 1);
    subtract_target(row, g, label, classes, r);
  }
}

// Rows [begin, end) of f32 logits: the softmax rows eager's f32 softmax op computes
// (softmax_rows_f32, one vectorized exp over the block), then g * (p - target) (g null: p - target). The libm version of
// this node cost as much as the softmax it replaced (205 us at 1024 x 10, profile_step, load 8).
void vector_rows(VectorMathF32 exp, const float* x, const float* g, const int64_t* label, float* dx, int64_t classes,
                 int64_t begin, int64_t end) {
  softmax_rows_f32(exp, x, dx, classes, begin, end);
  for (int64_t r = begin; r < end; ++r) subtract_target(dx + r * classes, g, label, classes, r);
}

// Rows [begin, end) of dx = g * (probs - one_hot(labels)) (no g: probs - one_hot): the rows after
// the softmax in vector_rows and exact_rows, so the same bits where probs is the softmax they
// compute. g * (p - 0) is g * p exactly: subtract_target's arithmetic without its compare per element.
template <class T>
void from_probs_rows(const T* p, const T* g, const int64_t* label, T* dx, int64_t classes, int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) {
    const T* pr = p + r * classes;
    T* dr = dx + r * classes;
    const int64_t at = label[r];
    if (g == nullptr) {
      std::copy(pr, pr + classes, dr);
      dr[at] = pr[at] - T(1);
      continue;
    }
    const T gr = g[r];
    for (int64_t c = 0; c < classes; ++c) dr[c] = gr * pr[c];
    dr[at] = gr * (pr[at] - T(1));
  }
}

// Both gradient ops: input 0 is the logits (FromProbs false: the softmax is computed here) or the
// probs the forward wrote.
template <bool FromProbs>
void cross_entropy_grad_kernel(const OpCall& call, std::span<Tensor> out) {
  const Tensor input = call.inputs[0].contiguous();
  const Tensor g = call.inputs.size() > 2 ? call.inputs[2].contiguous() : Tensor();
  const int64_t rows = input.shape()[0], classes = input.shape()[1];
  const std::vector<int64_t> label = checked_labels(call.op.name, call.inputs[1], classes);
  if (rows == 0 || classes == 0) return;
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / classes);
  visit_dtype<kFloatCompute>(input.dtype(), [&]<class T>(TypeTag<T>) {
    const T* x = static_cast<const T*>(input.raw_data());
    const T* gs = g.defined() ? static_cast<const T*>(g.raw_data()) : nullptr;
    T* dx = static_cast<T*>(out[0].raw_data());
    VectorMathF32 exp = nullptr;
    if constexpr (std::is_same_v<T, float> && !FromProbs) exp = vector_exp_f32();
    parallel_for(rows, grain, [&](int64_t begin, int64_t end) {
      if constexpr (FromProbs) {
        from_probs_rows(x, gs, label.data(), dx, classes, begin, end);
      } else {
        if constexpr (std::is_same_v<T, float>) {
          if (exp != nullptr) return vector_rows(exp, x, gs, label.data(), dx, classes, begin, end);
        }
        exact_rows(x, gs, label.data(), dx, classes, begin, end);
      }
    });
  });
}

}  // namespace

Op cross_entropy_grad_op{kName, 2, 3, kNoFlags, &cross_entropy_grad_infer, {&cross_entropy_grad_kernel<false>, nullptr}};
Op cross_entropy_grad_from_probs_op{"softmax_cross_entropy_grad_from_probs", 2, 3, kNoFlags, &cross_entropy_grad_infer,
                                    {&cross_entropy_grad_kernel<true>, nullptr}};

void add_cross_entropy_grad_ops(std::vector<Op*>& ops) {
  ops.insert(ops.end(), {&cross_entropy_grad_op, &cross_entropy_grad_from_probs_op});
}

}  // namespace flowlet::detail
