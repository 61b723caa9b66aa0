// The CUDA kernels of issue 15 (src/cuda/conv.cpp, pool.cpp, normalization.cpp and their .cu
// files) against the CPU: conv2d through cuDNN over strides, paddings (asymmetric and "same"
// included), dilations and groups; max and average pooling; batch and layer normalization;
// dropout's mask; each forward value and each gradient, f32, f64, f16 and bf16, on contiguous
// and non-contiguous GPU inputs, eagerly and traced; central finite differences in f64 on cuda:0.
//
// The CPU result is the reference. Halves are compared with the CPU's f32 result on the same
// (half-rounded) inputs, rounded once to the half dtype, because the CPU's conv2d takes f32 and
// f64 only; cuDNN accumulates halves in f32 too. Every case that needs a GPU skips with a message
// when none is visible (CI and the development machines have the toolkit but no GPU); the
// registration checks run everywhere.
#include <doctest/doctest.h>

#include <functional>
#include <map>
#include <set>
#include <optional>
#include <string>
#include <vector>

#include <flowlet/flowlet.hpp>

#include "support/cuda_conv_ops.hpp"
#include "support/gpu.hpp"
#include "support/gradient_check.hpp"
#include "support/reference.hpp"

using test::Domain;

namespace {

using Inputs = std::vector<fl::Tensor>;
using Outputs = std::vector<fl::Tensor>;

const fl::Device kCpu("cpu");
const fl::Device kGpu("cuda:0");

// True when the case must stop for want of a GPU; says why once per run, not once per case.
bool skip_without_gpu() {
  if (test::have_gpu()) return false;
  static bool said = false;
  if (!said) said = test::skip_without_gpu();
  return true;
}

// A row: the op it covers, its dtypes, seeded CPU inputs for a dtype, and the call (outputs, and
// gradients when the row covers a backward op), run where its inputs are.
struct Row {
  std::string op;
  std::string label;
  std::vector<fl::DType> dtypes;
  std::function<Inputs(fl::DType)> make;
  std::function<Outputs(const Inputs&)> run;
  double tolerance_scale = 1;  // rows with long sums (large kernels, many channels) allow more
};

const std::vector<fl::DType> kAllFloat = {fl::f32, fl::f64, fl::f16, fl::bf16};

std::function<Inputs(fl::DType)> random_inputs(std::vector<fl::Shape> shapes, std::vector<Domain> domains = {}) {
  return [shapes, domains](fl::DType dt) {
    Inputs in;
    for (size_t i = 0; i < shapes.size(); ++i) {
      in.push_back(test::random_tensor(shapes[i], 31 + 7919 * i, dt, i < domains.size() ? domains[i] : Domain::normal));
    }
    return in;
  };
}

// f's outputs, then the gradients of sum(output 0 * r) (r fixed and random) with respect to every
// floating input: what reaches the op's backward ops.
Outputs with_gradients(const Inputs& in, const std::function<Outputs(const Inputs&)>& f) {
  fl::GradientTape tape;
  for (const fl::Tensor& t : in) tape.watch(t);
  Outputs out = f(in);
  // bf16 values, exact in every float dtype: the f32 reference of a half row weighs by the same r.
  const fl::Tensor r = test::random_tensor(out[0].shape(), 4243, fl::bf16).astype(out[0].dtype()).to(out[0].device());
  const fl::Tensor loss = fl::sum(fl::mul(out[0], r));
  for (const fl::Tensor& g : tape.gradient(loss, std::vector<fl::Tensor>(in.begin(), in.end()))) out.push_back(g);
  return out;
}

// cuDNN's fastest algorithm may be an FFT or a Winograd transform, whose f32 rounding errors are
// some 1e-5 of the inputs' magnitude: conv rows allow 10x the default.
Row conv_row(std::string label, fl::Shape x, fl::Shape w, fl::Conv2dOptions o, bool bias, double scale = 10) {
  std::vector<fl::Shape> shapes = {x, w};
  if (bias) shapes.push_back(fl::Shape{w[0]});
  return {"conv2d", std::move(label), kAllFloat, random_inputs(shapes),
          [o, bias](const Inputs& in) {
            return with_gradients(in, [o, bias](const Inputs& v) {
              return Outputs{bias ? fl::conv2d(v[0], v[1], v[2], o) : fl::conv2d(v[0], v[1], o)};
            });
          },
          scale};
}

Row pool_row(std::string op, std::string label, fl::Shape x, fl::Pool2dOptions o, Domain domain = Domain::normal) {
  const bool max = op == "max_pool2d";
  return {op, std::move(label), kAllFloat, random_inputs({x}, {domain}), [o, max](const Inputs& in) {
            return with_gradients(in, [o, max](const Inputs& v) {
              return Outputs{max ? fl::max_pool2d(v[0], o) : fl::avg_pool2d(v[0], o)};
            });
          }};
}

fl::Pool2dOptions pool(fl::Size2 kernel, fl::Size2 stride, fl::Padding padding = 0, bool ceil_mode = false,
                       bool count_include_pad = false) {
  fl::Pool2dOptions o;
  o.kernel = kernel, o.stride = stride, o.padding = padding, o.ceil_mode = ceil_mode;
  o.count_include_pad = count_include_pad;
  return o;
}

fl::Conv2dOptions conv(fl::Size2 stride, fl::Padding padding, fl::Size2 dilation = 1, int64_t groups = 1) {
  fl::Conv2dOptions o;
  o.stride = stride, o.padding = padding, o.dilation = dilation, o.groups = groups;
  return o;
}

const std::vector<Row>& table() {
  static const std::vector<Row> rows = [] {
    std::vector<Row> r;
    // conv2d and, through its gradient, conv2d_backward_input and conv2d_backward_weight.
    r.push_back(conv_row("3x3 pad 1", {2, 3, 7, 6}, {4, 3, 3, 3}, conv(1, 1), true));
    r.push_back(conv_row("3x3 stride 2, no bias", {2, 4, 9, 9}, {6, 4, 3, 3}, conv(2, 0), false));
    r.push_back(conv_row("stride (2, 1), pad (1, 0)", {2, 3, 8, 7}, {5, 3, 3, 2}, conv({2, 1}, {1, 0}), true));
    r.push_back(conv_row("dilation 2", {1, 2, 9, 8}, {3, 2, 3, 3}, conv(1, 2, 2), true));
    r.push_back(conv_row("groups 2", {2, 4, 6, 6}, {6, 2, 3, 3}, conv(1, 1, 1, 2), true));
    r.push_back(conv_row("depthwise", {2, 4, 5, 5}, {4, 1, 3, 3}, conv(1, 1, 1, 4), false));
    r.push_back(conv_row("asymmetric padding, stride 2", {2, 3, 7, 8}, {4, 3, 3, 3},
                         conv(2, fl::Padding::explicit_sides(0, 1, 2, 1)), true));
    r.push_back(conv_row("same, even kernel", {2, 2, 6, 5}, {3, 2, 2, 2}, conv(1, fl::Padding::same()), true));
    r.push_back(conv_row("same, stride 2", {1, 3, 7, 7}, {2, 3, 3, 3}, conv(2, fl::Padding::same()), false));
    r.push_back(conv_row("1x1", {2, 8, 5, 5}, {4, 8, 1, 1}, conv(1, 0), true));
    r.push_back(conv_row("stride 3 above the kernel, padding as large as the kernel", {1, 2, 5, 5}, {2, 2, 2, 2},
                         conv(3, 2), true));
    r.push_back(conv_row("64 channels 3x3", {2, 64, 10, 10}, {32, 64, 3, 3}, conv(1, 1), true, 30));
    r.push_back(conv_row("empty batch", {0, 3, 5, 5}, {4, 3, 3, 3}, conv(1, 1), true));
    // Pooling and, through the gradient, its backward ops. Small integers make ties: the gradient
    // goes to the first maximum of each window on both devices.
    r.push_back(pool_row("max_pool2d", "2x2", {2, 3, 6, 7}, pool(2, 0)));
    r.push_back(pool_row("max_pool2d", "3x3 stride 2 pad 1, ties", {2, 2, 7, 7}, pool(3, 2, 1), Domain::small_ints));
    r.push_back(pool_row("max_pool2d", "3x3 stride 2 ceil_mode", {1, 2, 8, 8}, pool(3, 2, 0, true)));
    r.push_back(pool_row("max_pool2d", "2x3 stride (1, 2), asymmetric padding", {2, 2, 6, 7},
                         pool({2, 3}, {1, 2}, fl::Padding::explicit_sides(1, 0, 0, 1))));
    r.push_back(pool_row("avg_pool2d", "2x2", {2, 3, 6, 7}, pool(2, 0)));
    r.push_back(pool_row("avg_pool2d", "3x3 stride 2 pad 1", {2, 2, 7, 7}, pool(3, 2, 1)));
    r.push_back(pool_row("avg_pool2d", "3x3 stride 2 pad 1, count_include_pad", {2, 2, 7, 7}, pool(3, 2, 1, false, true)));
    r.push_back(pool_row("avg_pool2d", "3x3 stride 2 ceil_mode, count_include_pad", {1, 2, 8, 8},
                         pool(3, 2, 1, true, true)));
    r.push_back(pool_row("avg_pool2d", "3x3 stride 2 ceil_mode", {1, 2, 8, 8}, pool(3, 2, 1, true, false)));
    r.push_back({"avg_pool2d", "global average", kAllFloat, random_inputs({{2, 3, 5, 4}}), [](const Inputs& in) {
                   return with_gradients(in, [](const Inputs& v) { return Outputs{fl::global_avg_pool2d(v[0])}; });
                 }});
    // Normalization: outputs (y and the statistics), then the gradients (the backward ops).
    // The last two split each channel among several blocks on the GPU (planes, then flat positions).
    for (fl::Shape x : {fl::Shape{4, 3, 5, 6}, fl::Shape{7, 5}, fl::Shape{8, 4, 40, 40}, fl::Shape{20000, 3}}) {
      r.push_back({"batch_norm_training", fmt::format("x {}", x), kAllFloat,
                   random_inputs({x, {x[1]}, {x[1]}}), [](const Inputs& in) {
                     return with_gradients(in, [](const Inputs& v) {
                       const fl::BatchNormOutput o = fl::batch_norm_training(v[0], v[1], v[2], 1e-3);
                       return Outputs{o.y, o.mean, o.var};
                     });
                   }});
    }
    r.push_back({"batch_norm_inference", "x [4, 3, 5, 6]", kAllFloat,
                 random_inputs({{4, 3, 5, 6}, {3}, {3}, {3}, {3}},
                               {Domain::normal, Domain::normal, Domain::normal, Domain::normal, Domain::positive}),
                 [](const Inputs& in) {
                   return with_gradients(in, [](const Inputs& v) {
                     return Outputs{fl::batch_norm_inference(v[0], v[1], v[2], v[3], v[4], 1e-3)};
                   });
                 }});
    for (int64_t dims : {1, 2}) {
      r.push_back({"layer_norm", fmt::format("normalized_dims {}", dims), kAllFloat,
                   random_inputs({{4, 6, 5}, dims == 1 ? fl::Shape{5} : fl::Shape{6, 5},
                                  dims == 1 ? fl::Shape{5} : fl::Shape{6, 5}}),
                   [dims](const Inputs& in) {
                     return with_gradients(in, [dims](const Inputs& v) {
                       return Outputs{fl::layer_norm(v[0], v[1], v[2], dims, 1e-3)};
                     });
                   }});
    }
    // Dropout: a fresh generator per run, so both devices draw at offset 0 of seed 5.
    r.push_back({"dropout", "rate 0.3", kAllFloat, random_inputs({{3, 5, 7}}), [](const Inputs& in) {
                   return with_gradients(in, [](const Inputs& v) {
                     fl::Generator generator(5);
                     return Outputs{fl::dropout(v[0], 0.3, generator)};
                   });
                 }});
    return r;
  }();
  return rows;
}

// Tolerances of GPU against CPU: summation order differs (cuDNN's algorithms, f64 sums reduced in
// another order), and halves round intermediate results the f32 reference keeps.
test::Tolerance tolerance_for(fl::DType dt, double scale) {
  switch (dt) {
    case fl::DType::f64: return {1e-10 * scale, 1e-10 * scale};
    case fl::DType::f32: return {1e-5 * scale, 1e-5 * scale};
    case fl::DType::f16: return {1e-2 * scale, 1e-2 * scale};
    default: return {5e-2 * scale, 5e-2 * scale};
  }
}

bool is_half(fl::DType dt) { return dt == fl::f16 || dt == fl::bf16; }

// The same values in a non-contiguous layout on the GPU (a permuted view of a contiguous copy).
fl::Tensor noncontiguous_on_gpu(const fl::Tensor& t) {
  if (t.rank() < 2) return t.to(kGpu);
  std::vector<int64_t> reverse;
  for (int64_t d = t.rank(); d-- > 0;) reverse.push_back(d);
  return fl::permute(fl::permute(t, reverse).contiguous().to(kGpu), reverse);
}

void check_row(const Row& row, fl::DType dt, bool strided) {
  INFO(row.op, " (", row.label, ") ", fl::dtype_name(dt), strided ? ", non-contiguous GPU inputs" : "");
  const Inputs inputs = row.make(dt);
  Inputs cpu_inputs, gpu_inputs;
  for (const fl::Tensor& t : inputs) {
    cpu_inputs.push_back(is_half(dt) ? t.astype(fl::f32) : t);
    gpu_inputs.push_back(strided ? noncontiguous_on_gpu(t) : t.to(kGpu));
  }
  Outputs want;
  Outputs got;
  try {
    want = row.run(cpu_inputs);
    got = row.run(gpu_inputs);
  } catch (const std::exception& e) {
    FAIL_CHECK("threw " << test::error_kind(e) << ": " << e.what());
    return;
  }
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    const fl::Tensor reference = is_half(dt) ? want[i].astype(dt) : want[i];
    CHECK(got[i].device() == kGpu);
    CHECK(got[i].dtype() == dt);
    CHECK(got[i].shape() == reference.shape());
    test::check_values(test::values(got[i]), test::values(reference), tolerance_for(dt, row.tolerance_scale));
  }
}

bool build_has_cuda() {
  const fl::Op* matmul = fl::find_op("matmul");
  return matmul != nullptr && matmul->runs_on(fl::DeviceKind::cuda);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Without a GPU (these run everywhere).

TEST_CASE("every issue 15 op exists, has a CUDA kernel in a build with CUDA, and has a row here") {
  (void)fl::device_count(fl::DeviceKind::cuda);  // the backends have registered
  std::set<std::string> covered;
  for (const Row& row : table()) covered.insert(row.op);
  // Backward ops are reached through the gradients of the rows of their forward op.
  const std::map<std::string, std::string> through = {
      {"conv2d_backward_input", "conv2d"},       {"conv2d_backward_weight", "conv2d"},
      {"max_pool2d_backward", "max_pool2d"},     {"avg_pool2d_backward", "avg_pool2d"},
      {"batch_norm_backward", "batch_norm_training"}, {"layer_norm_backward", "layer_norm"}};
  MESSAGE(std::string(build_has_cuda() ? "a build with CUDA" : "a build without CUDA"));
  for (const std::string& name : test::kCudaConvOps) {
    CAPTURE(name);
    const fl::Op* op = fl::find_op(name);
    REQUIRE_MESSAGE(op != nullptr, "op '" << name << "' is not in the op table");
    CHECK(op->runs_on(fl::DeviceKind::cuda) == build_has_cuda());
    const auto via = through.find(name);
    CHECK_MESSAGE(covered.count(via == through.end() ? name : via->second) == 1, "no row covers '" << name << "'");
  }
}

// ---------------------------------------------------------------------------------------------
// With a GPU.

TEST_CASE("every issue 15 op on CUDA matches the CPU, values and gradients, on contiguous inputs") {
  if (skip_without_gpu()) return;
  for (const Row& row : table()) {
    for (fl::DType dt : row.dtypes) check_row(row, dt, /*strided=*/false);
  }
}

TEST_CASE("every issue 15 op on CUDA matches the CPU on non-contiguous GPU inputs") {
  if (skip_without_gpu()) return;
  for (const Row& row : table()) check_row(row, fl::f32, /*strided=*/true);
}

TEST_CASE("f32 conv2d on CUDA keeps f32 precision unless TF32 is allowed") {
  if (skip_without_gpu()) return;
  // 1 + 2^-11 is an f32 that TF32 (10 mantissa bits) rounds to 1: every output of the all-ones
  // kernel is 144 (1 + 2^-11) exactly in f32, and 144 under TF32, 4.9e-4 away.
  const double value = 1.0 + 0x1p-11;
  const fl::Tensor x = fl::full({2, 16, 8, 8}, value, fl::f32, kGpu);
  const fl::Tensor w = fl::ones({8, 16, 3, 3}, fl::f32, kGpu);
  for (const fl::Tensor& y : {fl::conv2d(x, w), fl::conv2d(x, w, 1, 0)}) {
    CHECK(y.shape() == fl::Shape{2, 8, 6, 6});
    test::check_values(test::values(y), std::vector<double>(2 * 8 * 6 * 6, 144 * value), {1e-5, 0});
  }
  fl::set_matmul_tf32(true);
  const std::vector<double> tf32 = test::values(fl::conv2d(x, w));
  fl::set_matmul_tf32(false);
  test::check_values(tf32, std::vector<double>(tf32.size(), 144 * value), {1e-3, 0});  // within TF32's reach
}

TEST_CASE("conv2d on CUDA gives the same result on a second call (the cached algorithm), and close to TF32's") {
  if (skip_without_gpu()) return;
  const fl::Tensor x = fl::randn({4, 64, 16, 16}, 1).to(kGpu);
  const fl::Tensor w = fl::randn({64, 64, 3, 3}, 2).to(kGpu);
  const std::vector<double> first = test::values(fl::conv2d(x, w, 1, 1));
  const std::vector<double> second = test::values(fl::conv2d(x, w, 1, 1));
  test::check_values(second, first, {0, 0});
  const std::vector<double> cpu = test::values(fl::conv2d(x.to(kCpu), w.to(kCpu), 1, 1));
  test::check_values(first, cpu, {1e-4, 1e-4});
  fl::set_matmul_tf32(true);
  const std::vector<double> tf32 = test::values(fl::conv2d(x, w, 1, 1));
  fl::set_matmul_tf32(false);
  test::check_values(tf32, cpu, {2e-2, 2e-1});  // TF32 keeps 10 mantissa bits: close, not exact
}

TEST_CASE("gradients of the issue 15 ops on cuda:0 match central finite differences in f64") {
  if (skip_without_gpu()) return;
  using test::gradient::GradCase;
  std::vector<GradCase> cases;
  auto add_conv = [&](std::string label, fl::Shape x, fl::Shape w, fl::Conv2dOptions o) {
    cases.push_back({label, {test::random_tensor(x, 1, fl::f64), test::random_tensor(w, 2, fl::f64),
                             test::random_tensor({w[0]}, 3, fl::f64)},
                     {true, true, true},
                     [o](const Inputs& v) { return fl::conv2d(v[0], v[1], v[2], o); }});
  };
  add_conv("conv2d stride 2 pad 1", {2, 3, 6, 5}, {4, 3, 3, 3}, conv(2, 1));
  add_conv("conv2d dilation 2 groups 2", {1, 4, 7, 7}, {2, 2, 3, 3}, conv(1, 2, 2, 2));
  add_conv("conv2d asymmetric padding", {1, 2, 5, 6}, {3, 2, 2, 3}, conv({2, 1}, fl::Padding::explicit_sides(1, 0, 0, 2)));
  add_conv("conv2d same", {1, 2, 6, 6}, {2, 2, 4, 4}, conv(2, fl::Padding::same()));
  cases.push_back({"max_pool2d 3x3 stride 2 pad 1", {test::random_tensor({2, 2, 7, 7}, 4, fl::f64)}, {true},
                   [](const Inputs& v) { return fl::max_pool2d(v[0], pool(3, 2, 1)); }});
  cases.push_back({"avg_pool2d ceil_mode count_include_pad", {test::random_tensor({1, 2, 8, 8}, 5, fl::f64)}, {true},
                   [](const Inputs& v) { return fl::avg_pool2d(v[0], pool(3, 2, 1, true, true)); }});
  cases.push_back({"batch_norm_training",
                   {test::random_tensor({3, 2, 4, 3}, 6, fl::f64), test::random_tensor({2}, 7, fl::f64),
                    test::random_tensor({2}, 8, fl::f64)},
                   {true, true, true},
                   [](const Inputs& v) { return fl::batch_norm_training(v[0], v[1], v[2]).y; }});
  cases.push_back({"layer_norm",
                   {test::random_tensor({3, 4, 5}, 9, fl::f64), test::random_tensor({4, 5}, 10, fl::f64),
                    test::random_tensor({4, 5}, 11, fl::f64)},
                   {true, true, true},
                   [](const Inputs& v) { return fl::layer_norm(v[0], v[1], v[2], 2); }});
  for (const GradCase& c : cases) {
    INFO(c.label);
    try {
      test::gradient::check_case(c, kGpu);
    } catch (const std::exception& e) {
      FAIL_CHECK("threw " << test::error_kind(e) << ": " << e.what());
    }
  }
}

TEST_CASE("a small CNN step on cuda:0 traced equals eager, and matches the CPU") {
  if (skip_without_gpu()) return;
  // conv + bias + relu, max pool, batch norm, dropout, a second conv, global average, loss and
  // gradients: every new CUDA kernel in one traced graph (and the conv fusion pass, when present).
  // One generator, reseeded before every call, so every call draws the same mask (its state is a
  // variable per device: the traced graph reads it when it runs).
  fl::Generator generator(11);
  auto step = [&generator](fl::Tensor x, fl::Tensor w1, fl::Tensor b1, fl::Tensor gamma, fl::Tensor beta,
                           fl::Tensor w2) {
    fl::GradientTape tape;
    for (const fl::Tensor& t : {w1, b1, gamma, beta, w2}) tape.watch(t);
    fl::Tensor h = fl::relu(fl::conv2d(x, w1, b1, conv(1, 1)));
    h = fl::max_pool2d(h, 2);
    h = fl::batch_norm_training(h, gamma, beta).y;
    h = fl::dropout(h, 0.25, generator);
    h = fl::conv2d(h, w2, conv(2, fl::Padding::same()));
    const fl::Tensor loss = fl::mean(fl::square(fl::global_avg_pool2d(h)));
    std::vector<fl::Tensor> out = tape.gradient(loss, {w1, b1, gamma, beta, w2});
    out.insert(out.begin(), loss);
    return out;
  };
  auto args = [](fl::Device d) {
    return std::vector<fl::Tensor>{fl::randn({4, 3, 12, 12}, 1).to(d), fl::randn({8, 3, 3, 3}, 2).to(d),
                                   fl::randn({8}, 3).to(d),           fl::randn({8}, 4).to(d),
                                   fl::randn({8}, 5).to(d),           fl::randn({6, 8, 3, 3}, 6).to(d)};
  };
  const std::vector<fl::Tensor> g = args(kGpu), c = args(kCpu);
  generator.manual_seed(11);
  const auto eager = step(g[0], g[1], g[2], g[3], g[4], g[5]);
  auto traced_step = fl::trace(step);
  std::vector<fl::Tensor> traced;
  for (int call = 0; call < 3; ++call) {  // from the second call on, a CUDA Graph replays
    generator.manual_seed(11);
    traced = traced_step(g[0], g[1], g[2], g[3], g[4], g[5]);
  }
  generator.manual_seed(11);
  const auto cpu = step(c[0], c[1], c[2], c[3], c[4], c[5]);
  REQUIRE(traced.size() == eager.size());
  for (size_t i = 0; i < eager.size(); ++i) {
    CAPTURE(i);
    test::check_values(test::values(traced[i]), test::values(eager[i]), {1e-5, 1e-6});
    test::check_values(test::values(eager[i]), test::values(cpu[i]), {1e-3, 1e-4});  // cuDNN vs im2col sums
  }
}

TEST_CASE("dropout on cuda:0 draws the CPU's mask for a seed, a new one each call, and the same again after reseeding") {
  if (skip_without_gpu()) return;
  const fl::Tensor ones = fl::ones({1001}, fl::f32);  // odd: draws end mid Philox block
  fl::Generator cpu_gen(123), gpu_gen(123);
  const auto first_cpu = test::values(fl::dropout(ones, 0.4, cpu_gen));
  const auto first_gpu = test::values(fl::dropout(ones.to(kGpu), 0.4, gpu_gen));
  test::check_values(first_gpu, first_cpu, {0, 0});
  const auto second_cpu = test::values(fl::dropout(ones, 0.4, cpu_gen));  // offset 1001: unaligned
  const auto second_gpu = test::values(fl::dropout(ones.to(kGpu), 0.4, gpu_gen));
  test::check_values(second_gpu, second_cpu, {0, 0});
  CHECK(second_gpu != first_gpu);
  gpu_gen.manual_seed(123);
  test::check_values(test::values(fl::dropout(ones.to(kGpu), 0.4, gpu_gen)), first_cpu, {0, 0});
  // A traced dropout on the GPU draws a new mask on every call.
  fl::Generator traced_gen(123);
  auto f = fl::trace([&](fl::Tensor x) { return fl::dropout(x, 0.4, traced_gen); });
  const auto t1 = test::values(f(ones.to(kGpu)));
  const auto t2 = test::values(f(ones.to(kGpu)));
  const auto t3 = test::values(f(ones.to(kGpu)));
  test::check_values(t1, first_cpu, {0, 0});
  test::check_values(t2, second_cpu, {0, 0});
  CHECK(t3 != t2);
}

TEST_CASE("bad arguments on cuda:0 throw the CPU's errors, and mixing devices throws DeviceError") {
  if (skip_without_gpu()) return;
  const fl::Tensor x = fl::randn({2, 3, 5, 5}, 1).to(kGpu);
  CHECK_THROWS_AS(fl::conv2d(x, fl::randn({4, 2, 3, 3}, 2).to(kGpu)), fl::ShapeError);  // channels 3 vs 2
  CHECK_THROWS_AS(fl::conv2d(x, fl::randn({4, 3, 3, 3}, 2)), fl::DeviceError);            // w on the CPU
  CHECK_THROWS_AS(fl::conv2d(x.astype(fl::i32), fl::randn({4, 3, 3, 3}, 2).astype(fl::i32).to(kGpu)), fl::DTypeError);
  CHECK_THROWS_AS(fl::max_pool2d(x, 7), fl::ShapeError);  // a kernel larger than the padded input
  CHECK_THROWS_AS(fl::batch_norm_training(x, fl::ones({4}).to(kGpu), fl::zeros({3}).to(kGpu)), fl::ShapeError);
  CHECK_THROWS_AS(fl::dropout(x, 1.0), fl::InvalidArgument);
}
