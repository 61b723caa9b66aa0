// Ops that move elements without arithmetic: reshape and permute (views), copy, to_device,
// concat and gather.
#include "flowlet/ops/shape.hpp"

#include <algorithm>
#include <cstring>

#include "flowlet/dispatch.hpp"
#include "flowlet/ops/creation.hpp"
#include "kernels/elementwise_loop.hpp"
#include "ops/attributes.hpp"
#include "ops/internal.hpp"
#include "ops/known_ops.hpp"
#include "ops/registry.hpp"
#include "ops/reshape_attrs.hpp"

namespace flowlet {
namespace detail {
namespace {

// dst (any strides, dst's shape) = src broadcast to dst's shape; both of one dtype. Copies bits,
// so one loop per element size serves every dtype.
void copy_elements(const Tensor& dst, const Tensor& src) {
  // Same shape and both row-major (concat's parts along axis 0, the gradient buckets of
  // MirroredStrategy, copies of contiguous tensors): one memcpy instead of the element loop.
  if (dst.shape() == src.shape() && dst.is_contiguous() && src.is_contiguous()) {
    if (src.numel() > 0) {
      std::memcpy(dst.raw_data(), src.raw_data(), static_cast<size_t>(src.numel()) * dtype_size(src.dtype()));
    }
    return;
  }
  visit_bits(src.dtype(), [&]<class T>(TypeTag<T>) { map_elements<T, T>(dst, {&src}, [](T x) { return x; }); });
}

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
    } else if (__builtin_mul_overflow(known, shape[i], &known)) {
      known = -1;  // the requested shape cannot be allocated: check_shape below says so
    }
  }
  if (inferred >= 0) {
    Shape without = shape;
    without[static_cast<size_t>(inferred)] = 1;
    check_shape("reshape", without);
    if (known <= 0 || t.numel() % known != 0) {
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

// The CPU kernel runs copies whose destination is a CPU device. From another device kind it hands
// over to that kind's kernel, the one that knows both memories (a GPU-to-host copy).
void to_device_kernel(const OpCall& call, std::span<Tensor> out) {
  const DeviceKind from = call.inputs[0].device().kind();
  if (from != DeviceKind::cpu) return call.op.kernels[static_cast<size_t>(from)](call, out);
  copy_kernel(call, out);
}

void to_device_infer(const OpCall& call, OutputSpec& spec) {
  same_meta_infer(call, spec);
  spec.device = call.attrs<ToDeviceAttrs>().device;
}

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
    int64_t& extent = shape[static_cast<size_t>(axis)];
    if (__builtin_add_overflow(extent, t.shape()[static_cast<size_t>(axis)], &extent)) {
      fail<ShapeError>("concat: the output's axis {} overflows int64; got {} inputs, input {} of shape {}", axis,
                       call.inputs.size(), i, t.shape());
    }
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

struct SliceAttrs {
  int64_t axis;
  int64_t start;
  int64_t length;
  std::string describe() const { return fmt::format("axis={}, start={}, length={}", axis, start, length); }
};

void slice_infer(const OpCall& call, OutputSpec& spec) {
  const Tensor& t = call.inputs[0];
  const auto& a = call.attrs<SliceAttrs>();
  if (t.rank() == 0) fail<ShapeError>("slice: needs rank >= 1; got shape {}", t.shape());
  const auto axis = static_cast<size_t>(normalize_axis("slice", a.axis, t.rank()));
  if (a.start < 0 || a.length < 0 || a.start > t.shape()[axis] - a.length) {
    fail<OutOfRange>("slice: range of length {} at start {} is outside axis {} of shape {}", a.length, a.start, axis,
                     t.shape());
  }
  Shape shape = t.shape();
  shape[axis] = a.length;
  spec.outputs[0] = {shape, t.dtype()};
}

void slice_kernel(const OpCall& call, std::span<Tensor> out) {
  const Tensor& t = call.inputs[0];
  const auto& a = call.attrs<SliceAttrs>();
  const auto axis = static_cast<size_t>(normalize_axis("slice", a.axis, t.rank()));
  Shape shape = t.shape();
  shape[axis] = a.length;
  out[0] = Tensor::view(t.storage(), shape, t.strides(), t.offset() + a.start * t.strides()[axis], t.dtype());
}

void scatter_add_infer(const OpCall& call, OutputSpec& spec) {
  const Tensor& indices = call.inputs[0];
  const Tensor& updates = call.inputs[1];
  const int64_t rows = call.attrs<int64_t>();
  check_dtype("scatter_add", indices.dtype(), bit(i32) | bit(i64));
  check_dtype("scatter_add", updates.dtype(), kFloatCompute | kIntegers);
  if (rows < 0) fail<InvalidArgument>("scatter_add: rows must be >= 0; got {}", rows);
  bool prefix = updates.rank() >= indices.rank();
  for (size_t d = 0; prefix && d < indices.shape().size(); ++d) prefix = updates.shape()[d] == indices.shape()[d];
  if (!prefix) {
    fail<ShapeError>("scatter_add: updates must start with the indices' shape; got indices {} and updates {}",
                     indices.shape(), updates.shape());
  }
  Shape shape{rows};
  for (size_t d = indices.shape().size(); d < updates.shape().size(); ++d) shape.push_back(updates.shape()[d]);
  check_shape("scatter_add", shape);
  spec.outputs[0] = {shape, updates.dtype()};
}

void scatter_add_kernel(const OpCall& call, std::span<Tensor> out) {
  const Tensor indices = call.inputs[0].contiguous().astype(i64);
  const Tensor updates = call.inputs[1].contiguous();
  const int64_t rows = out[0].shape()[0];
  const auto* index = static_cast<const int64_t*>(indices.raw_data());
  for (int64_t i = 0; i < indices.numel(); ++i) {  // validate all before writing anything
    if (index[i] < 0 || index[i] >= rows) {
      fail<OutOfRange>("scatter_add: index out of range [0, {}); got index {} at position {}", rows, index[i], i);
    }
  }
  const int64_t row = rows == 0 ? 0 : out[0].numel() / rows;
  visit_dtype<kFloatCompute | kIntegers>(updates.dtype(), [&]<class T>(TypeTag<T>) {
    T* target = static_cast<T*>(out[0].raw_data());
    const T* source = static_cast<const T*>(updates.raw_data());
    std::fill(target, target + out[0].numel(), T{0});
    for (int64_t i = 0; i < indices.numel(); ++i) {  // serial: repeated indices accumulate
      T* destination = target + index[i] * row;
      for (int64_t j = 0; j < row; ++j) destination[j] = static_cast<T>(destination[j] + source[i * row + j]);
    }
  });
}

// Gradient rules: each moves the output gradient back to where its input's elements came from.
void reshape_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> dx) {
  dx[0] = reshape(g[0], c.inputs[0].shape());
}
void permute_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> dx) {
  const auto& perm = c.attrs<PermuteAttrs>().perm;
  std::vector<int64_t> inverse(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inverse[static_cast<size_t>(perm[i])] = static_cast<int64_t>(i);
  dx[0] = permute(g[0], inverse);
}
void copy_grad(const GradCall&, std::span<const Tensor> g, std::span<Tensor> dx) { dx[0] = g[0]; }
void to_device_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> dx) {
  dx[0] = g[0].to(c.inputs[0].device());
}
void concat_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> dx) {
  const int64_t axis = normalize_axis("concat", c.attrs<ConcatAttrs>().axis, g[0].rank());
  int64_t start = 0;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const int64_t length = c.inputs[i].shape()[static_cast<size_t>(axis)];
    dx[i] = slice(g[0], axis, start, length);
    start += length;
  }
}
// The slice's gradient sits at its place inside zeros of the input's shape.
void slice_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> dx) {
  const Tensor& t = c.inputs[0];
  const auto& a = c.attrs<SliceAttrs>();
  const auto axis = static_cast<size_t>(normalize_axis("slice", a.axis, t.rank()));
  Shape before = t.shape(), after = t.shape();
  before[axis] = a.start;
  after[axis] = t.shape()[axis] - a.start - a.length;
  dx[0] = concat({zeros(before, g[0].dtype(), g[0].device()), g[0], zeros(after, g[0].dtype(), g[0].device())},
                 static_cast<int64_t>(axis));
}
void gather_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> dx) {
  dx[0] = scatter_add(c.inputs[1], g[0], c.inputs[0].shape()[0]);
}
void scatter_add_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> dx) {
  dx[1] = gather(g[0], c.inputs[0]);
}

// scatter_add's attribute is the bare row count (an int64_t, not a struct).
std::string describe_rows(const void* attributes) {
  return fmt::format("rows={}", *static_cast<const int64_t*>(attributes));
}

// The views make a TensorImpl over the input's storage (and call public ops, such as contiguous,
// which dispatch to the input's device), so their CPU kernels serve every device kind (reshape and
// permute are defined below, outside this namespace: the algebraic pass knows them).
Op slice_op{"slice", 1, 1, kView | kAnyDevice, &slice_infer, {&slice_kernel, nullptr}, &slice_grad, &copy_attributes<SliceAttrs>,
            &describe_attributes<SliceAttrs>};
Op copy_op{"copy", 1, 1, kElementwise, &same_meta_infer, {&copy_kernel, nullptr}, &copy_grad};
// The kernel of the destination's kind runs; the CPU one hands copies from another kind to that
// kind's kernel, so a backend's kernel does both directions.
Op to_device_op{"to_device", 1, 1, kPlacesOutput, &to_device_infer, {&to_device_kernel, nullptr}, &to_device_grad,
                &copy_attributes<ToDeviceAttrs>, &describe_attributes<ToDeviceAttrs>};
Op concat_op{"concat", 1, -1, kNoFlags, &concat_infer, {&concat_kernel, nullptr}, &concat_grad,
             &copy_attributes<ConcatAttrs>, &describe_attributes<ConcatAttrs>};
Op gather_op{"gather", 2, 2, kNoFlags, &gather_infer, {&gather_kernel, nullptr}, &gather_grad};
Op scatter_add_op{"scatter_add", 2, 2, kNoFlags, &scatter_add_infer, {&scatter_add_kernel, nullptr}, &scatter_add_grad,
                  &copy_attributes<int64_t>, &describe_rows};

}  // namespace

Op reshape_op{"reshape", 1, 1, kView | kAnyDevice, &reshape_infer, {&reshape_kernel, nullptr}, &reshape_grad,
              &copy_attributes<ReshapeAttrs>, &describe_attributes<ReshapeAttrs>};
Op permute_op{"permute", 1, 1, kView | kAnyDevice, &permute_infer, {&permute_kernel, nullptr}, &permute_grad,
              &copy_attributes<PermuteAttrs>, &describe_attributes<PermuteAttrs>};

void add_shape_ops(std::vector<Op*>& ops) {
  ops.insert(ops.end(),
             {&reshape_op, &permute_op, &slice_op, &copy_op, &to_device_op, &concat_op, &gather_op, &scatter_add_op});
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

Tensor slice(const Tensor& t, int64_t axis, int64_t start, int64_t length) {
  return dispatch(detail::slice_op, {t}, detail::SliceAttrs{axis, start, length});
}

Tensor scatter_add(const Tensor& indices, const Tensor& updates, int64_t rows) {
  return dispatch(detail::scatter_add_op, {indices, updates}, rows);
}

}  // namespace flowlet
