// flowlet-bench's per-op table (op_table.hpp). Ops without attributes are called through
// dispatch_all() directly, so every such op of the registry works with no entry here; ops with
// attributes need an entry that turns --attr values into their call.
#include "op_table.hpp"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "flowlet/dispatch.hpp"
#include "ops/conv_attrs.hpp"  // the attribute structs of conv2d, the pools, the norms and dropout

namespace flowlet_bench {
namespace fl = flowlet;
namespace {

using fl::Tensor;

// Ops whose attribute struct flowlet-bench cannot fill from --attr, and why.
std::string backward_reason(std::string_view name) {
  if (name.ends_with("_backward") || name.ends_with("_backward_input") || name.ends_with("_backward_weight")) {
    return "is a gradient op whose attributes carry the forward's sizes; benchmark the forward op and its "
           "gradient through a training step instead";
  }
  return "";
}

std::vector<Tensor> one(Tensor t) { return {std::move(t)}; }

OpCallFn dispatch_with(const fl::Op& op, std::shared_ptr<const void> attributes) {
  return [&op, attributes](const std::vector<Tensor>& inputs) {
    return fl::dispatch_all(op, std::span<const Tensor>(inputs), attributes.get());
  };
}

fl::detail::Conv2dAttrs conv_attrs(const Attributes& a) {
  fl::detail::Conv2dAttrs c;
  const auto stride = a.get_ints("stride", {1});
  const auto padding = a.get_string("padding", "") == "same" ? std::vector<int64_t>{0} : a.get_ints("padding", {0});
  const auto dilation = a.get_ints("dilation", {1});
  if (stride.size() > 2 || padding.size() > 2 || dilation.size() > 2) {
    throw UsageError("--attr stride/padding/dilation: one value or H:W");
  }
  c.stride_h = stride[0];
  c.stride_w = stride.back();
  c.pad_top = c.pad_bottom = padding[0];
  c.pad_left = c.pad_right = padding.back();
  c.dilation_h = dilation[0];
  c.dilation_w = dilation.back();
  c.groups = a.get_int("groups", 1);
  return c;
}

fl::detail::Pool2dAttrs pool_attrs(const Attributes& a) {
  fl::detail::Pool2dAttrs p;
  const auto kernel = a.get_ints("kernel", {2});
  const auto stride = a.get_ints("stride", kernel);
  const auto padding = a.get_ints("padding", {0});
  if (kernel.size() > 2 || stride.size() > 2 || padding.size() > 2) {
    throw UsageError("--attr kernel/stride/padding: one value or H:W");
  }
  p.kernel_h = kernel[0];
  p.kernel_w = kernel.back();
  p.stride_h = stride[0];
  p.stride_w = stride.back();
  p.pad_top = p.pad_bottom = padding[0];
  p.pad_left = p.pad_right = padding.back();
  p.count_include_pad = a.get_bool("count_include_pad", false);
  return p;
}

template <class T>
std::shared_ptr<const void> shared(T value) {
  return std::make_shared<const T>(std::move(value));
}

fl::DType dtype_attr(const Attributes& a) {
  const std::string name = a.get_string("dtype", "f32");
  for (int i = 0; i < fl::kNumDTypes; ++i) {
    if (fl::dtype_name(static_cast<fl::DType>(i)) == name) return static_cast<fl::DType>(i);
  }
  throw UsageError(fmt::format("--attr dtype: unknown dtype '{}'", name));
}

}  // namespace

std::string unsupported_reason(const fl::Op& op) {
  if (op.has_flag(fl::kGraphOnly)) return "exists only in traced graphs";
  if (op.has_flag(fl::kStateful)) return "has effects beyond its outputs (variables, queues, collectives, printing)";
  if (op.has_flag(fl::kPlacesOutput)) return "copies between devices; time it with --device and the 'copy' op";
  if (op.min_inputs == 0) return "creates tensors from attributes alone (no input shapes to give)";
  if (const std::string reason = backward_reason(op.name); !reason.empty()) return reason;
  if (op.name == "fused_elementwise") return "is built by the fusion pass; compare the fused and traced rows instead";
  return "";
}

PreparedOp prepare_op(const fl::Op& op, const Attributes& a, size_t count, fl::DType dtype) {
  if (const std::string reason = unsupported_reason(op); !reason.empty()) {
    throw UsageError(fmt::format("{} cannot be benchmarked: it {}", op.name, reason));
  }
  PreparedOp p;
  p.input_dtypes.assign(count, dtype);
  p.index_inputs.assign(count, false);
  auto index_input = [&](size_t i, fl::DType index_dtype = fl::i64) {
    if (i < count) {
      p.input_dtypes[i] = index_dtype;
      p.index_inputs[i] = true;
    }
  };
  const std::string_view name = op.name;
  std::vector<std::string> keys;
  auto takes = [&](std::initializer_list<const char*> names) { keys.assign(names.begin(), names.end()); };

  if (name == "sum" || name == "max") {
    takes({"axes", "keepdims"});
    const bool is_sum = name == "sum";
    const bool all = !a.has("axes");
    const auto axes = a.get_ints("axes", {});
    const bool keepdims = a.get_bool("keepdims", false);
    p.call = [=](const std::vector<Tensor>& in) {
      if (all) return one(is_sum ? fl::sum(in.at(0)) : fl::max(in.at(0)));
      return one(is_sum ? fl::sum(in.at(0), axes, keepdims) : fl::max(in.at(0), axes, keepdims));
    };
  } else if (name == "argmax") {
    takes({"axis"});
    const int64_t axis = a.get_int("axis", -1);
    p.call = [=](const std::vector<Tensor>& in) { return one(fl::argmax(in.at(0), axis)); };
  } else if (name == "softmax" || name == "log_softmax") {
    takes({"axis"});
    const int64_t axis = a.get_int("axis", -1);
    const bool log = name == "log_softmax";
    p.call = [=](const std::vector<Tensor>& in) {
      return one(log ? fl::log_softmax(in.at(0), axis) : fl::softmax(in.at(0), axis));
    };
  } else if (name == "cast") {
    takes({"dtype"});
    const fl::DType to = dtype_attr(a);
    p.call = [=](const std::vector<Tensor>& in) { return one(fl::cast(in.at(0), to)); };
  } else if (name == "reshape") {
    takes({"shape"});
    const bool flatten = !a.has("shape");
    const fl::Shape shape = flatten ? fl::Shape{} : parse_shape(a.get_string("shape", ""));
    p.call = [=](const std::vector<Tensor>& in) {
      return one(fl::reshape(in.at(0), flatten ? fl::Shape{in.at(0).numel()} : shape));
    };
  } else if (name == "permute") {
    takes({"perm"});
    const auto perm = a.get_ints("perm", {});
    p.call = [=](const std::vector<Tensor>& in) {
      std::vector<int64_t> order = perm;
      if (order.empty()) {  // reversed axes by default
        order.resize(static_cast<size_t>(in.at(0).rank()));
        std::iota(order.rbegin(), order.rend(), 0);
      }
      return one(fl::permute(in.at(0), order));
    };
  } else if (name == "slice") {
    takes({"axis", "start", "length"});
    const int64_t axis = a.get_int("axis", 0), start = a.get_int("start", 0), length = a.get_int("length", -1);
    p.call = [=](const std::vector<Tensor>& in) {
      const Tensor& x = in.at(0);
      const int64_t ax = axis < 0 ? axis + x.rank() : axis;  // slice() itself rejects a bad axis
      const int64_t n = length >= 0 || ax < 0 || ax >= x.rank() ? std::max<int64_t>(length, 1)
                                                                 : x.shape()[static_cast<size_t>(ax)] - start;
      return one(fl::slice(x, axis, start, n));
    };
  } else if (name == "concat") {
    takes({"axis"});
    const int64_t axis = a.get_int("axis", 0);
    p.call = [=](const std::vector<Tensor>& in) { return one(fl::concat(in, axis)); };
  } else if (name == "one_hot") {
    takes({"depth"});
    index_input(0);
    const int64_t depth = a.get_int("depth", 2);
    p.call = [=](const std::vector<Tensor>& in) { return one(fl::one_hot(in.at(0), depth)); };
  } else if (name == "scatter_add") {
    takes({"rows"});
    index_input(0);
    const int64_t rows = a.get_int("rows", 2);
    p.call = [=](const std::vector<Tensor>& in) { return one(fl::scatter_add(in.at(0), in.at(1), rows)); };
  } else if (name == "conv2d") {
    takes({"stride", "padding", "dilation", "groups"});
    const fl::detail::Conv2dAttrs base = conv_attrs(a);
    if (a.get_string("padding", "") != "same") {
      p.call = dispatch_with(op, shared(base));
    } else {
      // "same" (output size ceil(input / stride)), resolved per call as conv2d() does: the total
      // padding split with the odd one at the bottom/right.
      p.call = [&op, base](const std::vector<Tensor>& in) {
        fl::detail::Conv2dAttrs c = base;
        if (in.size() >= 2 && in[0].rank() == 4 && in[1].rank() == 4) {
          auto total = [](int64_t size, int64_t kernel, int64_t stride, int64_t dilation) {
            const int64_t out = (size + stride - 1) / stride;
            return std::max<int64_t>(0, (out - 1) * stride + (kernel - 1) * dilation + 1 - size);
          };
          const int64_t th = total(in[0].shape()[2], in[1].shape()[2], c.stride_h, c.dilation_h);
          const int64_t tw = total(in[0].shape()[3], in[1].shape()[3], c.stride_w, c.dilation_w);
          c.pad_top = th / 2, c.pad_bottom = th - th / 2, c.pad_left = tw / 2, c.pad_right = tw - tw / 2;
        }
        return fl::dispatch_all(op, std::span<const Tensor>(in), &c);
      };
    }
  } else if (name == "max_pool2d" || name == "avg_pool2d") {
    takes({"kernel", "stride", "padding", "count_include_pad"});
    p.call = dispatch_with(op, shared(pool_attrs(a)));
  } else if (name == "batch_norm_training" || name == "batch_norm_inference" || name == "layer_norm") {
    fl::detail::NormAttrs n;
    if (name == "layer_norm") {
      takes({"eps", "normalized_dims"});
      n.normalized_dims = a.get_int("normalized_dims", 1);
    } else {
      takes({"eps"});
    }
    n.eps = a.get_double("eps", 1e-5);
    p.call = dispatch_with(op, shared(n));
  } else if (name == "dropout") {
    takes({"rate"});
    index_input(1);  // the random state: i64 [2] (seed, offset)
    fl::detail::DropoutAttrs d;
    d.rate = a.get_double("rate", 0.5);
    p.call = dispatch_with(op, shared(d));
  } else if (op.copy_attributes != nullptr) {
    throw UsageError(fmt::format("{} takes attributes flowlet-bench does not fill yet (no entry in "
                                 "tools/flowlet_bench/op_table.cpp)", name));
  } else {
    p.call = dispatch_with(op, nullptr);
    if (name == "gather") index_input(1);
    if (name == "softmax_cross_entropy") index_input(1);
    if (name == "where") {
      p.input_dtypes[0] = fl::b8;
    }
  }
  a.check_all_read(std::string(name), keys);
  return p;
}

Tensor make_input(const fl::Shape& shape, fl::DType dtype, bool index, fl::Device device, uint64_t seed) {
  Tensor t;
  if (index) {
    t = fl::cast(fl::uniform(shape, 0.0, 1.999, seed), fl::i32);  // 0 or 1: valid for any axis of length >= 2
    t = fl::cast(t, dtype);
  } else if (dtype == fl::b8) {
    t = fl::randn(shape, seed) > 0.0f;
  } else if (fl::is_floating(dtype)) {
    t = fl::cast(fl::randn(shape, seed, dtype == fl::f64 ? fl::f64 : fl::f32), dtype);
  } else {
    t = fl::cast(fl::uniform(shape, 0.0, 9.999, seed), dtype);
  }
  return device == fl::Device() ? t : t.to(device);
}

double flop_count(const fl::Op& op, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) {
  if (inputs.empty() || outputs.empty()) return 0;
  const auto out = static_cast<double>(outputs[0].numel());
  const auto in = static_cast<double>(inputs[0].numel());
  const std::string_view name = op.name;
  if (op.has_flag(fl::kContraction)) {  // matmul: 2 M N K
    return inputs[0].rank() == 0 ? 0 : 2.0 * out * static_cast<double>(inputs[0].shape()[inputs[0].shape().size() - 1]);
  }
  if (name == "conv2d" && inputs.size() >= 2 && inputs[1].rank() == 4) {
    const auto& w = inputs[1].shape();
    return 2.0 * out * static_cast<double>(w[1] * w[2] * w[3]);
  }
  if (op.has_flag(fl::kElementwise)) return name == "copy" || name == "cast" ? 0 : out;
  if (name == "sum" || name == "max" || name == "argmax") return in;
  if (name == "softmax" || name == "log_softmax") return 4 * in;  // max, subtract + exp, sum, divide
  if (name == "softmax_cross_entropy") return 4 * in;
  if (name == "batch_norm_training" || name == "layer_norm") return 7 * in;  // mean, variance, normalize, scale
  if (name == "batch_norm_inference") return 2 * in;
  if (name == "avg_pool2d" || name == "max_pool2d") return in;
  if (name == "dropout") return in;
  return 0;  // data movement: reshape, permute, slice, concat, gather, scatter, one_hot
}

std::vector<fl::Shape> probe_shapes(const fl::Op& op) {
  const std::string_view name = op.name;
  if (name == "conv2d") return {{1, 2, 4, 4}, {2, 2, 3, 3}};
  if (name == "max_pool2d" || name == "avg_pool2d") return {{1, 1, 4, 4}};
  if (name == "batch_norm_training") return {{2, 2, 2, 2}, {2}, {2}};
  if (name == "batch_norm_inference") return {{2, 2, 2, 2}, {2}, {2}, {2}, {2}};
  if (name == "layer_norm") return {{2, 2}, {2}, {2}};
  if (name == "dropout") return {{4}, {2}};
  if (name == "gather" || name == "softmax_cross_entropy") return {{2, 2}, {2}};
  if (name == "scatter_add") return {{2}, {2, 2}};
  if (name == "one_hot") return {{2}};
  const int count = std::max(1, op.min_inputs);
  return std::vector<fl::Shape>(static_cast<size_t>(count), fl::Shape{2, 2});
}

}  // namespace flowlet_bench
