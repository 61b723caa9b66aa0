// softmax_cross_entropy_grad: dx = g * (softmax(logits) - one_hot(labels)) in one pass (see
// cross_entropy_grad.hpp): shape and dtype rule, the kernel, and its registration.
#include "ops/cross_entropy_grad.hpp"

#include <algorithm>
#include <cstdint>
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

void cross_entropy_grad_infer(const OpCall& call, OutputSpec& spec) {
  const Tensor& logits = call.inputs[0];
  const Tensor& labels = call.inputs[1];
  const Tensor& g = call.inputs[2];
  check_dtype(kName, logits.dtype(), kFloatCompute);
  check_dtype(kName, labels.dtype(), bit(i32) | bit(i64));
  if (g.dtype() != logits.dtype()) {
    fail<DTypeError>("{}: g must have the logits' dtype; got logits {} and g {}", kName, logits.dtype(), g.dtype());
  }
  if (logits.rank() != 2 || labels.shape() != Shape{logits.shape()[0]} ||
      g.shape() != Shape{logits.shape()[0], 1}) {
    fail<ShapeError>("{}: expects logits [N, C], labels [N] and g [N, 1]; got logits {}, labels {} and g {}", kName,
                     logits.shape(), labels.shape(), g.shape());
  }
  spec.outputs[0] = {logits.shape(), logits.dtype()};
}

// The labels as int64, each checked against [0, classes).
std::vector<int64_t> checked_labels(const Tensor& labels, int64_t classes) {
  std::vector<int64_t> label(static_cast<size_t>(labels.numel()));
  visit_dtype<bit(i32) | bit(i64)>(labels.dtype(), [&]<class L>(TypeTag<L>) {
    const Tensor packed = labels.contiguous();
    const L* data = static_cast<const L*>(packed.raw_data());
    for (size_t i = 0; i < label.size(); ++i) {
      label[i] = static_cast<int64_t>(data[i]);
      if (label[i] < 0 || label[i] >= classes) {
        fail<OutOfRange>("{}: label out of range [0, {}); got label {} at position {}", kName, classes, label[i], i);
      }
    }
  });
  return label;
}

void cross_entropy_grad_kernel(const OpCall& call, std::span<Tensor> out) {
  const Tensor logits = call.inputs[0].contiguous();
  const Tensor g = call.inputs[2].contiguous();
  const int64_t rows = logits.shape()[0], classes = logits.shape()[1];
  const std::vector<int64_t> label = checked_labels(call.inputs[1], classes);
  if (rows == 0 || classes == 0) return;
  visit_dtype<kFloatCompute>(logits.dtype(), [&]<class T>(TypeTag<T>) {
    const T* x = static_cast<const T*>(logits.raw_data());
    const T* gs = static_cast<const T*>(g.raw_data());
    T* dx = static_cast<T*>(out[0].raw_data());
    parallel_for(rows, std::max<int64_t>(1, kParallelGrain / classes), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        T* row = dx + r * classes;
        softmax_line<false>(x + r * classes, row, classes, 1);
        // Eager: sub(softmax, one_hot) then mul(g, that), each rounded in T; the same here.
        const int64_t hot = label[static_cast<size_t>(r)];
        for (int64_t c = 0; c < classes; ++c) row[c] = gs[r] * (row[c] - (c == hot ? T(1) : T(0)));
      }
    });
  });
}

}  // namespace

Op cross_entropy_grad_op{kName, 3, 3, kNoFlags, &cross_entropy_grad_infer, {&cross_entropy_grad_kernel, nullptr}};

void add_cross_entropy_grad_ops(std::vector<Op*>& ops) { ops.push_back(&cross_entropy_grad_op); }

}  // namespace flowlet::detail
