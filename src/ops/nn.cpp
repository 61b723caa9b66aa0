// Neural-network ops: one_hot, softmax, log_softmax and the fused softmax cross-entropy (with its
// traced-only twin that also writes the softmax, softmax_cross_entropy_with_probs). The
// softmax family is primitive (not composed) so that it subtracts the maximum in one pass and
// stays finite for any finite logits.
#include "flowlet/ops/nn.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "flowlet/dispatch.hpp"
#include "flowlet/ops/elementwise.hpp"
#include "flowlet/ops/reduce.hpp"
#include "flowlet/ops/shape.hpp"
#include "kernels/elementwise_loop.hpp"
#include "ops/attributes.hpp"
#include "ops/cross_entropy_grad.hpp"
#include "ops/registry.hpp"
#include "ops/softmax_line.hpp"

namespace flowlet {
namespace detail {
namespace {

// Reads i32 or i64 indices as int64 (a contiguous copy).
std::vector<int64_t> read_indices(const Tensor& indices) {
  std::vector<int64_t> values(static_cast<size_t>(indices.numel()));
  visit_dtype<bit(i32) | bit(i64)>(indices.dtype(), [&]<class T>(TypeTag<T>) {
    const Tensor packed = indices.contiguous();
    const T* data = static_cast<const T*>(packed.raw_data());
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<int64_t>(data[i]);
  });
  return values;
}

void one_hot_infer(const OpCall& call, OutputSpec& spec) {
  const Tensor& indices = call.inputs[0];
  const int64_t depth = call.attrs<OneHotAttrs>().depth;
  check_dtype("one_hot", indices.dtype(), bit(i32) | bit(i64));
  if (depth < 0) fail<InvalidArgument>("one_hot: depth must be >= 0; got {}", depth);
  Shape shape = indices.shape();
  shape.push_back(depth);
  check_shape("one_hot", shape);
  spec.outputs[0] = {shape, f32};
}

void one_hot_kernel(const OpCall& call, std::span<Tensor> out) {
  const int64_t depth = call.attrs<OneHotAttrs>().depth;
  const auto index = read_indices(call.inputs[0]);
  for (size_t i = 0; i < index.size(); ++i) {
    if (index[i] < 0 || index[i] >= depth) {
      fail<OutOfRange>("one_hot: index out of range [0, {}); got index {} at position {}", depth, index[i], i);
    }
  }
  float* data = static_cast<float*>(out[0].raw_data());
  std::memset(data, 0, static_cast<size_t>(out[0].numel()) * sizeof(float));
  for (size_t i = 0; i < index.size(); ++i) data[static_cast<int64_t>(i) * depth + index[i]] = 1.0f;
}

// The softmax family computes in f32/f64 only. Half logits are cast up by the caller (the gradient
// returns through the cast in the half dtype); the error says so rather than upcasting silently,
// since the loss's precision is the caller's choice.
void check_logits_dtype(std::string_view op, DType dt) {
  if (dt == f16 || dt == bf16) {
    fail<DTypeError>("{}: unsupported dtype; got {}, supported: f32, f64; cast half logits up first, "
                     "e.g. {}(cast(logits, f32), ...), and the gradient returns in {}",
                     op, dt, op, dt);
  }
  check_dtype(op, dt, kFloatCompute);
}

void softmax_infer(const OpCall& call, OutputSpec& spec) {
  const Tensor& t = call.inputs[0];
  check_logits_dtype(call.op.name, t.dtype());
  normalize_axis(call.op.name, call.attrs<AxisAttrs>().axis, t.rank());
  spec.outputs[0] = {t.shape(), t.dtype()};
}

// For each line along the axis: out = x - max - log(sum(exp(x - max))) (log form) or its exp (f32
// over the last axis: exp(x - max) / sum, with the vectorized exp).
template <bool Log>
void softmax_kernel(const OpCall& call, std::span<Tensor> out) {
  const Tensor t = call.inputs[0].contiguous();
  const auto axis = static_cast<size_t>(normalize_axis(call.op.name, call.attrs<AxisAttrs>().axis, t.rank()));
  // Nothing to write; outer * inner may still count billions of empty lines ([2, 2^31] with axis 0 of size 0).
  if (t.numel() == 0) return;
  int64_t outer = 1, inner = 1;
  const int64_t extent = t.shape()[axis];
  for (size_t d = 0; d < axis; ++d) outer *= t.shape()[d];
  for (size_t d = axis + 1; d < t.shape().size(); ++d) inner *= t.shape()[d];
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(extent, 1));
  visit_dtype<kFloatCompute>(t.dtype(), [&]<class T>(TypeTag<T>) {
    const T* x = static_cast<const T*>(t.raw_data());
    T* y = static_cast<T*>(out[0].raw_data());
    if constexpr (!Log && std::is_same_v<T, float>) {
      // f32 softmax over the last axis: rows with the vectorized exp (what the fused cross-entropy
      // gradient also runs, so traced and eager training steps stay equal bit for bit).
      if (const VectorMathF32 exp = vector_exp_f32(); exp != nullptr && inner == 1) {
        parallel_for(outer, grain, [&](int64_t begin, int64_t end) { softmax_rows_f32(exp, x, y, extent, begin, end); });
        return;
      }
    }
    parallel_for(outer * inner, grain,
                 [&](int64_t begin, int64_t end) {
                   for (int64_t line = begin; line < end; ++line) {
                     const int64_t start = (line / inner) * extent * inner + line % inner;
                     softmax_line<Log>(x + start, y + start, extent, inner);
                   }
                 });
  });
}

// softmax_cross_entropy, and softmax_cross_entropy_with_probs (the same loss plus the softmax the
// traced loss gradient reuses; ops/cross_entropy_grad.hpp): one rule and one kernel, told apart by
// their output count.
void cross_entropy_infer(const OpCall& call, OutputSpec& spec) {
  const Tensor& logits = call.inputs[0];
  const Tensor& labels = call.inputs[1];
  const std::string_view name = call.op.name;
  check_logits_dtype(name, logits.dtype());
  check_dtype(name, labels.dtype(), bit(i32) | bit(i64));
  if (logits.rank() != 2 || labels.rank() != 1 || labels.shape()[0] != logits.shape()[0]) {
    fail<ShapeError>("{}: expects logits [N, C] and labels [N]; got logits {} and labels {}", name, logits.shape(),
                     labels.shape());
  }
  spec.outputs[0] = {Shape{logits.shape()[0]}, logits.dtype()};
  if (&call.op == &cross_entropy_probs_op) {
    spec.outputs[1] = {logits.shape(), logits.dtype()};
    spec.count = 2;
  }
}

void cross_entropy_kernel(const OpCall& call, std::span<Tensor> out) {
  const Tensor logits = call.inputs[0].contiguous();
  const auto label = read_indices(call.inputs[1]);
  const int64_t rows = logits.shape()[0], classes = logits.shape()[1];
  for (size_t i = 0; i < label.size(); ++i) {
    if (label[i] < 0 || label[i] >= classes) {
      fail<OutOfRange>("{}: label out of range [0, {}); got label {} at position {}", call.op.name, classes,
                       label[i], i);
    }
  }
  const int64_t grain = std::max<int64_t>(1, kCrossEntropyGrainLogits / std::max<int64_t>(classes, 1));
  visit_dtype<kFloatCompute>(logits.dtype(), [&]<class T>(TypeTag<T>) {
    const T* x = static_cast<const T*>(logits.raw_data());
    T* loss = static_cast<T*>(out[0].raw_data());
    T* probs = out.size() > 1 ? static_cast<T*>(out[1].raw_data()) : nullptr;  // with_probs only
    if constexpr (std::is_same_v<T, float>) {
      // f32: one vectorized exp per element (softmax_line.hpp states the loss's error bound); f64
      // and CPUs without the vector exp keep libm's exp in f64 below.
      if (const VectorMathF32 exp = vector_exp_f32(); exp != nullptr) {
        parallel_for(rows, grain, [&](int64_t begin, int64_t end) {
          cross_entropy_rows_f32(exp, x, label.data(), loss, classes, begin, end, probs);
        });
        return;
      }
    }
    parallel_for(rows, grain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        loss[r] = cross_entropy_line(x + r * classes, label[static_cast<size_t>(r)], classes);
        // The softmax op's own line (what the fused gradient computes when it has no probs).
        if (probs != nullptr) softmax_line<false>(x + r * classes, probs + r * classes, classes, 1);
      }
    });
  });
}

// y = softmax(x): dx = y * (g - sum(g * y)) along the axis.
void softmax_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> dx) {
  const Tensor& y = c.outputs[0];
  dx[0] = y * (g[0] - sum(g[0] * y, {c.attrs<AxisAttrs>().axis}, /*keepdims=*/true));
}
// y = log_softmax(x): dx = g - softmax(x) * sum(g) along the axis.
void log_softmax_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> dx) {
  dx[0] = g[0] - exp(c.outputs[0]) * sum(g[0], {c.attrs<AxisAttrs>().axis}, /*keepdims=*/true);
}
// loss_i = logsumexp(x_i) - x_i[label_i]: dx_i = g_i * (softmax(x_i) - one_hot(label_i)).
void cross_entropy_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> dx) {
  const Tensor& logits = c.inputs[0];
  const Tensor targets = cast(one_hot(c.inputs[1], logits.shape()[1]), logits.dtype());
  dx[0] = reshape(g[0], {logits.shape()[0], 1}) * (softmax(logits) - targets);
}

Op one_hot_op{"one_hot", 1, 1, kNoFlags, &one_hot_infer, {&one_hot_kernel, nullptr}, nullptr,
              &copy_attributes<OneHotAttrs>, &describe_attributes<OneHotAttrs>};
Op softmax_op{"softmax", 1, 1, kNoFlags, &softmax_infer, {&softmax_kernel<false>, nullptr}, &softmax_grad,
              &copy_attributes<AxisAttrs>, &describe_attributes<AxisAttrs>};
Op log_softmax_op{"log_softmax", 1, 1, kNoFlags, &softmax_infer, {&softmax_kernel<true>, nullptr},
                  &log_softmax_grad, &copy_attributes<AxisAttrs>, &describe_attributes<AxisAttrs>};
Op cross_entropy_op{"softmax_cross_entropy", 2, 2, kNoFlags, &cross_entropy_infer, {&cross_entropy_kernel, nullptr},
                    &cross_entropy_grad};

}  // namespace

// No gradient: the pass that makes it runs after gradients were recorded.
Op cross_entropy_probs_op{"softmax_cross_entropy_with_probs", 2, 2, kNoFlags, &cross_entropy_infer,
                          {&cross_entropy_kernel, nullptr}};

void add_nn_ops(std::vector<Op*>& ops) {
  ops.insert(ops.end(), {&one_hot_op, &softmax_op, &log_softmax_op, &cross_entropy_op, &cross_entropy_probs_op});
}

}  // namespace detail

Tensor one_hot(const Tensor& indices, int64_t depth) {
  return dispatch(detail::one_hot_op, {indices}, detail::OneHotAttrs{depth});
}
Tensor softmax(const Tensor& t, int64_t axis) { return dispatch(detail::softmax_op, {t}, detail::AxisAttrs{axis}); }
Tensor log_softmax(const Tensor& t, int64_t axis) {
  return dispatch(detail::log_softmax_op, {t}, detail::AxisAttrs{axis});
}
Tensor softmax_cross_entropy(const Tensor& logits, const Tensor& labels) {
  return dispatch(detail::cross_entropy_op, {logits, labels});
}

}  // namespace flowlet
