// Ops that move elements without arithmetic: reshape and permute (views), copy, to_device,
// concat and gather.
#include "flowlet/ops/shape.hpp"

#include <algorithm>
#include <cstring>

#include "flowlet/dispatch.hpp"
#include "kernels/elementwise_loop.hpp"
#include "ops/internal.hpp"
#include "ops/registry.hpp"

namespace flowlet {
namespace detail {
namespace {

// dst (any strides, dst's shape) = src broadcast to dst's shape; both of one dtype. Copies bits,
// so one loop per element size serves every dtype.
void copy_elements(const Tensor& dst, const Tensor& src) {
  visit_bits(src.dtype(), [&]<class T>(TypeTag<T>) { map_elements<T, T>(dst, {&src}, [](T x) { return x; }); });
}

struct ReshapeAttrs {
  Shape shape;
};

Shape resolve_reshape(const Tensor& t, const Shape& requested) {
  Shape shape = requested;
  int inferred = -1;
  int64_t known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (inferred >= 0) fail<ShapeError>("reshape: only one dimension may be -1; got {}", requested);
      inferred = static_cast<int>(i);
    } else if (shape[i] < 0) {
      fail<ShapeError>("reshape: dimensions must be >= 0 or -1; got {}", requested);
    } else {
      known *= shape[i];
    }
  }
  if (inferred >= 0) {
    Shape without = shape;
    without[static_cast<size_t>(inferred)] = 1;
    check_shape("reshape", without);
    if (known == 0 || t.numel() % known != 0) {
      fail<ShapeError>("reshape: cannot infer -1; got {} elements of shape {} for shape {}", t.numel(), t.shape(),
                       requested);
    }
    shape[static_cast<size_t>(inferred)] = t.numel() / known;
  }
  check_shape("reshape", shape);
  if (shape.numel() != t.numel()) {
    fail<ShapeError>("reshape: element counts differ; got shape {} ({} elements) for shape {} ({} elements)", t.shape(),
                     t.numel(), requested, shape.numel());
  }
  return shape;
}

void reshape_infer(const OpCall& call, OutputSpec& spec) {
  const Tensor& t = call.inputs[0];
  spec.outputs[0] = {resolve_reshape(t, call.attrs<ReshapeAttrs>().shape), t.dtype()};
}

void reshape_kernel(const OpCall& call, std::span<Tensor> out) {
  const Tensor source = call.inputs[0].contiguous();
  const Shape shape = resolve_reshape(source, call.attrs<ReshapeAttrs>().shape);
  out[0] = Tensor::view(source.storage(), shape, contiguous_strides(shape), source.offset(), source.dtype());
}

struct PermuteAttrs {
  std::vector<int64_t> perm;
};

void permute_infer(const OpCall& call, OutputSpec& spec) {
  const Tensor& t = call.inputs[0];
  const auto& perm = call.attrs<PermuteAttrs>().perm;
  std::vector<bool> seen(perm.size(), false);
  bool valid = static_cast<int64_t>(perm.size()) == t.rank();
  for (int64_t p : perm) {
    valid = valid && p >= 0 && p < t.rank() && !seen[static_cast<size_t>(p)];
    if (valid) seen[static_cast<size_t>(p)] = true;
  }
  if (!valid) {
    fail<InvalidArgument>("permute: perm must be a permutation of 0..{}; got [{}] for shape {}", t.rank() - 1,
                          fmt::join(perm, ", "), t.shape());
  }
  Shape shape;
  for (int64_t p : perm) shape.push_back(t.shape()[static_cast<size_t>(p)]);
  spec.outputs[0] = {shape, t.dtype()};
}

void permute_kernel(const OpCall& call, std::span<Tensor> out) {
  const Tensor& t = call.inputs[0];
  Shape shape;
  Strides strides;
  for (int64_t p : call.attrs<PermuteAttrs>().perm) {
    shape.push_back(t.shape()[static_cast<size_t>(p)]);
    strides.push_back(t.strides()[static_cast<size_t>(p)]);
  }
  out[0] = Tensor::view(t.storage(), shape, strides, t.offset(), t.dtype());
}

void same_meta_infer(const OpCall& call, OutputSpec& spec) {
  spec.outputs[0] = {call.inputs[0].shape(), call.inputs[0].dtype()};
}

void copy_kernel(const OpCall& call, std::span<Tensor> out) { copy_elements(out[0], call.inputs[0]); }

struct ToDeviceAttrs {
  Device device;
};

void to_device_infer(const OpCall& call, OutputSpec& spec) {
  same_meta_infer(call, spec);
  spec.device = call.attrs<ToDeviceAttrs>().device;
}

struct ConcatAttrs {
  int64_t axis;
};

void concat_infer(const OpCall& call, OutputSpec& spec) {
  const Tensor& first = call.inputs[0];
  if (first.rank() == 0) fail<ShapeError>("concat: inputs must have rank >= 1; got shape {}", first.shape());
  const int64_t axis = normalize_axis("concat", call.attrs<ConcatAttrs>().axis, first.rank());
  Shape shape = first.shape();
  shape[static_cast<size_t>(axis)] = 0;
  for (size_t i = 0; i < call.inputs.size(); ++i) {
    const Tensor& t = call.inputs[i];
    if (t.dtype() != first.dtype()) {
      fail<DTypeError>("concat: dtypes differ; got {} for input 0 and {} for input {}", first.dtype(), t.dtype(), i);
    }
    bool fits = t.rank() == first.rank();
    for (size_t d = 0; fits && d < shape.size(); ++d) {
      fits = static_cast<int64_t>(d) == axis || t.shape()[d] == first.shape()[d];
    }
    if (!fits) {
      fail<ShapeError>("concat: shapes differ outside axis {}; got {} for input 0 and {} for input {}", axis,
                       first.shape(), t.shape(), i);
    }
    shape[static_cast<size_t>(axis)] += t.shape()[static_cast<size_t>(axis)];
  }
  spec.outputs[0] = {shape, first.dtype()};
}

void concat_kernel(const OpCall& call, std::span<Tensor> out) {
  const auto axis = static_cast<size_t>(normalize_axis("concat", call.attrs<ConcatAttrs>().axis, out[0].rank()));
  int64_t start = 0;
  for (const Tensor& t : call.inputs) {
    const Tensor slice =
        Tensor::view(out[0].storage(), t.shape(), out[0].strides(), start * out[0].strides()[axis], t.dtype());
    copy_elements(slice, t);
    start += t.shape()[axis];
  }
}

void gather_infer(const OpCall& call, OutputSpec& spec) {
  const Tensor& params = call.inputs[0];
  const Tensor& indices = call.inputs[1];
  if (params.rank() == 0) fail<ShapeError>("gather: params must have rank >= 1; got shape {}", params.shape());
  check_dtype("gather", indices.dtype(), bit(i32) | bit(i64));
  Shape shape = indices.shape();
  for (size_t d = 1; d < params.shape().size(); ++d) shape.push_back(params.shape()[d]);
  spec.outputs[0] = {shape, params.dtype()};
}

void gather_kernel(const OpCall& call, std::span<Tensor> out) {
  const Tensor params = call.inputs[0].contiguous();
  const Tensor indices = call.inputs[1].contiguous().astype(i64);
  const int64_t rows = params.shape()[0];
  const int64_t row_bytes = (rows == 0 ? 0 : params.numel() / rows) * static_cast<int64_t>(dtype_size(params.dtype()));
  const auto* index = static_cast<const int64_t*>(indices.raw_data());
  const auto* source = static_cast<const char*>(params.raw_data());
  auto* target = static_cast<char*>(out[0].raw_data());
  const int64_t count = indices.numel();
  for (int64_t i = 0; i < count; ++i) {  // validate all before writing anything
    if (index[i] < 0 || index[i] >= rows) {
      fail<OutOfRange>("gather: index out of range [0, {}); got index {} at position {}", rows, index[i], i);
    }
  }
  parallel_for(count, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(row_bytes / 4, 1)),
               [&](int64_t begin, int64_t end) {
                 for (int64_t i = begin; i < end; ++i) {
                   std::memcpy(target + i * row_bytes, source + index[i] * row_bytes, static_cast<size_t>(row_bytes));
                 }
               });
}

Op reshape_op{"reshape", 1, 1, kView, &reshape_infer, {&reshape_kernel, nullptr}};
Op permute_op{"permute", 1, 1, kView, &permute_infer, {&permute_kernel, nullptr}};
Op copy_op{"copy", 1, 1, kElementwise, &same_meta_infer, {&copy_kernel, nullptr}};
// The CPU kernel copies between CPU devices; other backends register theirs for their kind.
Op to_device_op{"to_device", 1, 1, kNoFlags, &to_device_infer, {&copy_kernel, nullptr}};
Op concat_op{"concat", 1, -1, kNoFlags, &concat_infer, {&concat_kernel, nullptr}};
Op gather_op{"gather", 2, 2, kNoFlags, &gather_infer, {&gather_kernel, nullptr}};

}  // namespace

void add_shape_ops(std::vector<Op*>& ops) {
  ops.insert(ops.end(), {&reshape_op, &permute_op, &copy_op, &to_device_op, &concat_op, &gather_op});
}

Tensor copy_to_contiguous(const Tensor& t) { return dispatch(copy_op, {t}); }

Tensor copy_to_device(const Tensor& t, Device device) {
  if (t.device() == device) return t;
  return dispatch(to_device_op, {t}, ToDeviceAttrs{device});
}

}  // namespace detail

Tensor reshape(const Tensor& t, const Shape& shape) { return dispatch(detail::reshape_op, {t}, detail::ReshapeAttrs{shape}); }

Tensor permute(const Tensor& t, const std::vector<int64_t>& perm) {
  return dispatch(detail::permute_op, {t}, detail::PermuteAttrs{perm});
}

Tensor transpose(const Tensor& t) {
  if (t.rank() != 2) detail::fail<ShapeError>("transpose: expects rank 2; got shape {}; use permute", t.shape());
  return permute(t, {1, 0});
}

Tensor concat(const std::vector<Tensor>& tensors, int64_t axis) {
  if (tensors.empty()) detail::fail<InvalidArgument>("concat: needs at least one tensor; got an empty list");
  const detail::ConcatAttrs attrs{axis};
  return dispatch(detail::concat_op, std::span<const Tensor>(tensors), &attrs);
}

Tensor gather(const Tensor& params, const Tensor& indices) { return dispatch(detail::gather_op, {params, indices}); }

}  // namespace flowlet
