// libtorch peer rows (torch_peer.hpp): the op -> ATen table, built as the module
// libflowlet-bench-torch.so only when the build found libtorch.
#include "torch_peer.hpp"

#include <fmt/format.h>

#include <ATen/ATen.h>
#include <ATen/DLConvertor.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include "flowlet/dlpack.hpp"

namespace flowlet_bench {
namespace {

using TorchFn = std::function<at::Tensor(const std::vector<at::Tensor>&)>;

at::ScalarType torch_dtype(const std::string& name) {
  if (name == "f32") return at::kFloat;
  if (name == "f64") return at::kDouble;
  if (name == "i32") return at::kInt;
  if (name == "i64") return at::kLong;
  if (name == "u8") return at::kByte;
  if (name == "b8") return at::kBool;
  if (name == "f16") return at::kHalf;
  if (name == "bf16") return at::kBFloat16;
  throw UsageError(fmt::format("--attr dtype: unknown dtype '{}'", name));
}

std::vector<int64_t> pair_of(const std::vector<int64_t>& v) { return {v.at(0), v.back()}; }

// The ATen call for `op`, reading the same --attr keys as op_table.cpp; empty when unmapped.
TorchFn torch_fn(std::string_view op, const Attributes& a) {
  using V = const std::vector<at::Tensor>&;
#define FLOWLET_UNARY(name, expr) \
  if (op == name) return [](V x) { return expr; };
  FLOWLET_UNARY("neg", at::neg(x[0]))
  FLOWLET_UNARY("exp", at::exp(x[0]))
  FLOWLET_UNARY("log", at::log(x[0]))
  FLOWLET_UNARY("sqrt", at::sqrt(x[0]))
  FLOWLET_UNARY("tanh", at::tanh(x[0]))
  FLOWLET_UNARY("sigmoid", at::sigmoid(x[0]))
  FLOWLET_UNARY("relu", at::relu(x[0]))
  FLOWLET_UNARY("abs", at::abs(x[0]))
  FLOWLET_UNARY("square", at::square(x[0]))
  FLOWLET_UNARY("log1p", at::log1p(x[0]))
  FLOWLET_UNARY("expm1", at::expm1(x[0]))
  FLOWLET_UNARY("erf", at::erf(x[0]))
  FLOWLET_UNARY("gelu", at::gelu(x[0]))
  FLOWLET_UNARY("sign", at::sign(x[0]))
  FLOWLET_UNARY("floor", at::floor(x[0]))
  FLOWLET_UNARY("round", at::round(x[0]))
  FLOWLET_UNARY("copy", x[0].clone())
  FLOWLET_UNARY("add", at::add(x[0], x[1]))
  FLOWLET_UNARY("sub", at::sub(x[0], x[1]))
  FLOWLET_UNARY("mul", at::mul(x[0], x[1]))
  FLOWLET_UNARY("div", at::div(x[0], x[1]))
  FLOWLET_UNARY("pow", at::pow(x[0], x[1]))
  FLOWLET_UNARY("maximum", at::maximum(x[0], x[1]))
  FLOWLET_UNARY("minimum", at::minimum(x[0], x[1]))
  FLOWLET_UNARY("equal", at::eq(x[0], x[1]))
  FLOWLET_UNARY("not_equal", at::ne(x[0], x[1]))
  FLOWLET_UNARY("less", at::lt(x[0], x[1]))
  FLOWLET_UNARY("less_equal", at::le(x[0], x[1]))
  FLOWLET_UNARY("greater", at::gt(x[0], x[1]))
  FLOWLET_UNARY("greater_equal", at::ge(x[0], x[1]))
  FLOWLET_UNARY("where", at::where(x[0], x[1], x[2]))  // x[0] converted to bool by the caller
  FLOWLET_UNARY("clamp", at::clamp(x[0], x[1], x[2]))
  FLOWLET_UNARY("matmul", at::matmul(x[0], x[1]))
  FLOWLET_UNARY("gather", at::index_select(x[0], 0, x[1].reshape({-1})))
  FLOWLET_UNARY("softmax_cross_entropy", at::cross_entropy_loss(x[0], x[1], {}, 0 /* none */, -100, 0.0))
#undef FLOWLET_UNARY
  if (op == "softmax" || op == "log_softmax") {
    const int64_t axis = a.get_int("axis", -1);
    if (op == "softmax") return [axis](V x) { return at::softmax(x[0], axis); };
    return [axis](V x) { return at::log_softmax(x[0], axis); };
  }
  if (op == "sum" || op == "max") {
    const bool all = !a.has("axes");
    const auto axes = a.get_ints("axes", {});
    const bool keepdims = a.get_bool("keepdims", false);
    if (op == "sum") return [=](V x) { return all ? x[0].sum() : at::sum(x[0], axes, keepdims); };
    return [=](V x) { return all ? x[0].max() : at::amax(x[0], axes, keepdims); };
  }
  if (op == "argmax") {
    const int64_t axis = a.get_int("axis", -1);
    return [axis](V x) { return at::argmax(x[0], axis); };
  }
  if (op == "cast") {
    const at::ScalarType to = torch_dtype(a.get_string("dtype", "f32"));
    return [to](V x) { return x[0].to(to); };
  }
  if (op == "concat") {
    const int64_t axis = a.get_int("axis", 0);
    return [axis](V x) { return at::cat(x, axis); };
  }
  if (op == "reshape") {  // views on both sides, as in flowlet
    const bool flatten = !a.has("shape");
    const flowlet::Shape shape = flatten ? flowlet::Shape{} : parse_shape(a.get_string("shape", ""));
    const std::vector<int64_t> dims(shape.begin(), shape.end());
    return [=](V x) { return flatten ? x[0].reshape({-1}) : x[0].reshape(dims); };
  }
  if (op == "permute") {
    const auto perm = a.get_ints("perm", {});
    return [=](V x) {
      std::vector<int64_t> order = perm;
      if (order.empty()) {
        for (int64_t i = x[0].dim(); i-- > 0;) order.push_back(i);
      }
      return x[0].permute(order);
    };
  }
  if (op == "slice") {
    const int64_t axis = a.get_int("axis", 0), start = a.get_int("start", 0), length = a.get_int("length", -1);
    return [=](V x) { return x[0].narrow(axis, start, length >= 0 ? length : x[0].size(axis) - start); };
  }
  if (op == "scatter_add") {
    const int64_t rows = a.get_int("rows", 2);
    return [=](V x) {  // updates [indices..., rest...] -> rows of [rows, rest...]
      std::vector<int64_t> sizes{rows}, flat{-1};
      for (int64_t d = x[0].dim(); d < x[1].dim(); ++d) {
        sizes.push_back(x[1].size(d));
        flat.push_back(x[1].size(d));
      }
      return at::zeros(sizes, x[1].options()).index_add_(0, x[0].reshape({-1}), x[1].reshape(flat));
    };
  }
  if (op == "one_hot") {
    const int64_t depth = a.get_int("depth", 2);
    return [depth](V x) { return at::one_hot(x[0], depth); };
  }
  if (op == "conv2d") {
    const auto stride = pair_of(a.get_ints("stride", {1}));
    const bool same = a.get_string("padding", "") == "same";
    const auto padding = same ? std::vector<int64_t>{0, 0} : pair_of(a.get_ints("padding", {0}));
    const auto dilation = pair_of(a.get_ints("dilation", {1}));
    const int64_t groups = a.get_int("groups", 1);
    if (same) {  // libtorch takes "same" for stride 1 only (and refuses the rest itself)
      return [=](V x) {
        return at::conv2d(x[0], x[1], x.size() > 2 ? x[2] : at::Tensor(), stride, "same", dilation, groups);
      };
    }
    return [=](V x) {
      return at::conv2d(x[0], x[1], x.size() > 2 ? x[2] : at::Tensor(), stride, padding, dilation, groups);
    };
  }
  if (op == "max_pool2d" || op == "avg_pool2d") {
    const auto kernel = pair_of(a.get_ints("kernel", {2}));
    const auto stride = pair_of(a.get_ints("stride", a.get_ints("kernel", {2})));
    const auto padding = pair_of(a.get_ints("padding", {0}));
    const bool include_pad = a.get_bool("count_include_pad", false);
    if (op == "max_pool2d") return [=](V x) { return at::max_pool2d(x[0], kernel, stride, padding); };
    return [=](V x) { return at::avg_pool2d(x[0], kernel, stride, padding, false, include_pad); };
  }
  if (op == "layer_norm") {
    const int64_t dims = a.get_int("normalized_dims", 1);
    const double eps = a.get_double("eps", 1e-5);
    return [=](V x) {
      const auto sizes = x[0].sizes();
      return at::layer_norm(x[0], sizes.slice(sizes.size() - static_cast<size_t>(dims)), x[1], x[2], eps);
    };
  }
  if (op == "batch_norm_training" || op == "batch_norm_inference") {
    const double eps = a.get_double("eps", 1e-5);
    if (op == "batch_norm_training") {
      return [=](V x) { return at::batch_norm(x[0], x[1], x[2], {}, {}, true, 0.1, eps, false); };
    }
    return [=](V x) { return at::batch_norm(x[0], x[1], x[2], x[3], x[4], false, 0.1, eps, false); };
  }
  return {};
}

}  // namespace

std::string torch_setup(int threads) {
  at::set_num_threads(threads);
  const std::string config = at::show_config();  // libtorch's build description names its version
  const std::string key = "TORCH_VERSION=";
  std::string version = "(unknown version)";
  if (const auto start = config.find(key); start != std::string::npos) {
    version = config.substr(start + key.size(), config.find_first_of(", \n", start + key.size()) - start - key.size());
  }
  return fmt::format("libtorch {}, {} intra-op threads", version, at::get_num_threads());
}

std::function<void()> torch_make_runner(std::string_view op, const Attributes& attributes,
                                        const std::vector<flowlet::Tensor>& inputs) {
  TorchFn fn = torch_fn(op, attributes);
  if (!fn) return {};
  for (const flowlet::Tensor& t : inputs) {
    if (t.device().kind() != flowlet::DeviceKind::cpu) return {};  // Debian's libtorch is CPU only
  }
  std::vector<at::Tensor> tensors;
  for (const flowlet::Tensor& t : inputs) tensors.push_back(at::fromDLPack(flowlet::to_dlpack(t)));  // no copy
  if (op == "where") tensors[0] = tensors[0].to(at::kBool);  // b8 arrives as uint8 (DLPack 0.6)
  return [fn = std::move(fn), tensors = std::move(tensors)] {
    c10::InferenceMode guard;
    at::Tensor result = fn(tensors);
    (void)result;
  };
}

}  // namespace flowlet_bench

extern "C" const flowlet_bench::TorchPeerApi* flowlet_bench_torch_peer() {
  static const flowlet_bench::TorchPeerApi api{&flowlet_bench::torch_setup, &flowlet_bench::torch_make_runner};
  return &api;
}
