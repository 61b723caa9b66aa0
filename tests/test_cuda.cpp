// The CUDA backend: every op with a CUDA kernel against the CPU result, copies between host and GPU,
// memory accounting, the same random stream on both, and errors.
//
// Tests that need a GPU check for one first and skip with a message when none is visible (CI and
// the development machines have the CUDA toolkit but no GPU); the others, about discovery and the
// errors a machine without a GPU gives, run everywhere. The table below has rows like
// tests/test_op_table.cpp's, but each row only builds inputs and calls the op: the CPU result is
// the reference, and the first test fails when an op gains a CUDA kernel without a row here.
#include <flowlet_config.hpp>

#include <unistd.h>

#include <cstdio>
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "support/cuda_conv_ops.hpp"
#include "support/gpu.hpp"
#include "support/gradient_check.hpp"
#include "support/mlp.hpp"
#include "support/reference.hpp"

using test::Domain;

namespace {

using Inputs = std::vector<fl::Tensor>;

const fl::Device kCpu("cpu");
const fl::Device kGpu("cuda:0");

using test::have_gpu;
using test::skip_without_gpu;

// A row: the op it covers, the dtypes it runs, seeded CPU inputs, and the call, which runs where
// its inputs are (creation ops get the device instead).
struct Row {
  std::string op;
  std::vector<fl::DType> dtypes;
  std::function<Inputs(fl::DType)> make;
  std::function<fl::Tensor(const Inputs&, fl::DType, fl::Device)> run;
  std::optional<test::Tolerance> tolerance = std::nullopt;
  bool strided_inputs = true;  // also run with non-contiguous GPU inputs
};

std::vector<fl::DType> with_halves(std::vector<fl::DType> dtypes) {
  dtypes.push_back(fl::f16);
  dtypes.push_back(fl::bf16);
  return dtypes;
}

const std::vector<fl::DType> kArithmetic = with_halves(test::kNumericDTypes);
const std::vector<fl::DType> kFloating = with_halves(test::kFloatDTypes);

std::function<Inputs(fl::DType)> random_inputs(std::vector<fl::Shape> shapes, std::vector<Domain> domains) {
  return [shapes, domains](fl::DType dt) {
    Inputs in;
    for (size_t i = 0; i < shapes.size(); ++i) in.push_back(test::random_tensor(shapes[i], 11 + 7919 * i, dt, domains[i]));
    return in;
  };
}

Row binary_row(std::string op, std::vector<fl::DType> dtypes, fl::Tensor (*f)(const fl::Tensor&, const fl::Tensor&),
               Domain b_domain = Domain::normal, Domain a_domain = Domain::normal) {
  // [3, 4, 5] with [4, 1]: broadcasting in both directions of the merged layout.
  return {op, std::move(dtypes), random_inputs({{3, 4, 5}, {4, 1}}, {a_domain, b_domain}),
          [f](const Inputs& in, fl::DType, fl::Device) { return f(in[0], in[1]); }};
}

Row unary_row(std::string op, std::vector<fl::DType> dtypes, fl::Tensor (*f)(const fl::Tensor&),
              Domain domain = Domain::normal) {
  return {op, std::move(dtypes), random_inputs({{3, 4, 5}}, {domain}),
          [f](const Inputs& in, fl::DType, fl::Device) { return f(in[0]); }};
}

Row reduce_row(std::string op, std::vector<fl::DType> dtypes, std::vector<int64_t> axes, bool keepdims,
               fl::Shape shape = {3, 4, 5}) {
  const bool is_sum = op == "sum";
  return {op, std::move(dtypes), random_inputs({shape}, {Domain::small_ints}),
          [axes, keepdims, is_sum](const Inputs& in, fl::DType, fl::Device) {
            if (axes.empty()) return is_sum ? fl::sum(in[0]) : fl::max(in[0]);
            return is_sum ? fl::sum(in[0], axes, keepdims) : fl::max(in[0], axes, keepdims);
          }};
}

fl::Tensor indices_i64(const std::vector<int64_t>& values) {
  return fl::tensor(values, fl::Shape{static_cast<int64_t>(values.size())});
}

const std::vector<Row>& table() {
  static const std::vector<Row> rows = [] {
    std::vector<Row> r;
    // Elementwise.
    r.push_back(binary_row("add", kArithmetic, &fl::add));
    r.push_back(binary_row("sub", kArithmetic, &fl::sub));
    r.push_back(binary_row("mul", kArithmetic, &fl::mul));
    r.push_back(binary_row("div", kArithmetic, &fl::div, Domain::nonzero));
    r.push_back(binary_row("pow", kFloating, &fl::pow, Domain::normal, Domain::positive));
    r.push_back(binary_row("maximum", kArithmetic, &fl::maximum));
    r.push_back(binary_row("minimum", kArithmetic, &fl::minimum));
    for (auto [op, f] : std::vector<std::pair<std::string, fl::Tensor (*)(const fl::Tensor&, const fl::Tensor&)>>{
             {"equal", &fl::equal}, {"not_equal", &fl::not_equal}, {"less", &fl::less},
             {"less_equal", &fl::less_equal}, {"greater", &fl::greater}, {"greater_equal", &fl::greater_equal}}) {
      r.push_back(binary_row(op, test::kAllDTypes, f, Domain::small_ints, Domain::small_ints));
    }
    r.push_back(unary_row("neg", kArithmetic, &fl::neg));
    r.push_back(unary_row("abs", kArithmetic, &fl::abs));
    r.push_back(unary_row("square", kArithmetic, &fl::square));
    r.push_back(unary_row("relu", kArithmetic, &fl::relu));
    r.push_back(unary_row("exp", kFloating, &fl::exp));
    r.push_back(unary_row("log", kFloating, &fl::log, Domain::positive));
    r.push_back(unary_row("sqrt", kFloating, &fl::sqrt, Domain::positive));
    r.push_back(unary_row("tanh", kFloating, &fl::tanh));
    r.push_back(unary_row("sigmoid", kFloating, &fl::sigmoid));
    r.push_back(unary_row("log1p", kFloating, &fl::log1p, Domain::positive));
    r.push_back(unary_row("expm1", kFloating, &fl::expm1));
    r.push_back(unary_row("erf", kFloating, &fl::erf));
    r.push_back(unary_row("gelu", kFloating, &fl::gelu));
    r.push_back(unary_row("sign", kArithmetic, &fl::sign));
    r.push_back(unary_row("floor", kFloating, &fl::floor, Domain::castable));
    r.push_back(unary_row("round", kFloating, &fl::round, Domain::castable));  // k + 0.5 values: halves to even
    r.push_back({"clamp", kArithmetic, random_inputs({{3, 4, 5}, {4, 1}, {5}}, {Domain::normal, Domain::normal, Domain::positive}),
                 [](const Inputs& in, fl::DType, fl::Device) { return fl::clamp(in[0], in[1], in[2]); }});
    r.push_back({"where", test::kAllDTypes,
                 [](fl::DType dt) {
                   return Inputs{test::random_tensor({3, 4, 1}, 5, fl::b8, Domain::small_ints),
                                 test::random_tensor({3, 4, 5}, 6, dt, Domain::small_ints),
                                 test::random_tensor({5}, 7, dt, Domain::small_ints)};
                 },
                 [](const Inputs& in, fl::DType, fl::Device) { return fl::where(in[0], in[1], in[2]); }});
    // cast: from every dtype to f32, and from f32 to every dtype.
    r.push_back({"cast", test::kAllDTypes, random_inputs({{3, 4, 5}}, {Domain::castable}),
                 [](const Inputs& in, fl::DType, fl::Device) { return fl::cast(in[0], fl::f32); }});
    r.push_back({"cast", test::kAllDTypes,
                 [](fl::DType) { return Inputs{test::random_tensor({3, 4, 5}, 3, fl::f32, Domain::big)}; },
                 [](const Inputs& in, fl::DType dt, fl::Device) { return fl::cast(in[0], dt); }});
    // Creation (no inputs: the row passes the device).
    r.push_back({"full", test::kAllDTypes, [](fl::DType) { return Inputs{}; },
                 [](const Inputs&, fl::DType dt, fl::Device d) { return fl::full({7, 9}, 1.0, dt, d); }});
    r.push_back({"arange", test::kNumericDTypes, [](fl::DType) { return Inputs{}; },
                 [](const Inputs&, fl::DType dt, fl::Device d) { return fl::arange(100, dt, d); }});
    r.push_back({"randn", kFloating, [](fl::DType) { return Inputs{}; },
                 [](const Inputs&, fl::DType dt, fl::Device d) { return fl::randn({1000, 3}, 42, dt, d); }});
    r.push_back({"uniform", kFloating, [](fl::DType) { return Inputs{}; },
                 [](const Inputs&, fl::DType dt, fl::Device d) { return fl::uniform({1000, 3}, -2.0, 3.0, 43, dt, d); }});
    // Reductions: every axis, one inner axis, non-adjacent axes, a long row that takes two passes.
    // f16/bf16 read as float, sum in f64 (max in float) and round once, as on the CPU, so the two
    // agree within the half dtype's default tolerance (an ulp).
    const std::vector<fl::DType> sum_types = with_halves({fl::f32, fl::f64, fl::i32, fl::i64, fl::u8, fl::b8});
    const std::vector<fl::DType> max_types = with_halves(test::kNumericDTypes);
    r.push_back(reduce_row("sum", sum_types, {}, false));
    r.push_back(reduce_row("sum", sum_types, {1}, true));
    r.push_back(reduce_row("sum", sum_types, {0, 2}, false));
    r.push_back(reduce_row("sum", {fl::f32, fl::i64, fl::bf16}, {1}, false, {2, 300000}));
    r.push_back(reduce_row("sum", {fl::f32, fl::f16}, {0}, false, {100000, 3}));
    r.push_back(reduce_row("max", max_types, {}, false));
    r.push_back(reduce_row("max", max_types, {2}, false));
    r.push_back(reduce_row("max", max_types, {0, 2}, true));
    for (int64_t axis : {0, 1, -1}) {
      r.push_back({"argmax", max_types, random_inputs({{3, 4, 5}}, {Domain::small_ints}),
                   [axis](const Inputs& in, fl::DType, fl::Device) { return fl::argmax(in[0], axis); }});
    }
    // matmul: plain, batched, a rank-2 operand shared across a batch, a transposed view; f16/bf16
    // through cuBLAS with f32 accumulation, as the CPU's f32 GEMM on upcast copies (within an ulp).
    const auto matmul = [](const Inputs& in, fl::DType, fl::Device) { return fl::matmul(in[0], in[1]); };
    r.push_back({"matmul", kFloating, random_inputs({{5, 7}, {7, 3}}, {Domain::normal, Domain::normal}), matmul});
    r.push_back({"matmul", kFloating, random_inputs({{2, 5, 7}, {2, 7, 3}}, {Domain::normal, Domain::normal}),
                 matmul});
    r.push_back({"matmul", kFloating, random_inputs({{2, 5, 7}, {7, 3}}, {Domain::normal, Domain::normal}),
                 matmul});
    r.push_back({"matmul", kFloating, random_inputs({{7, 5}, {7, 3}}, {Domain::normal, Domain::normal}),
                 [](const Inputs& in, fl::DType, fl::Device) { return fl::matmul(fl::transpose(in[0]), in[1]); }});
    // nn.
    for (int64_t axis : {-1, 0}) {
      r.push_back({"softmax", test::kFloatDTypes, random_inputs({{6, 5}}, {Domain::normal}),
                   [axis](const Inputs& in, fl::DType, fl::Device) { return fl::softmax(in[0], axis); }});
      r.push_back({"log_softmax", test::kFloatDTypes, random_inputs({{6, 5}}, {Domain::normal}),
                   [axis](const Inputs& in, fl::DType, fl::Device) { return fl::log_softmax(in[0], axis); }});
    }
    for (fl::DType label_type : {fl::i32, fl::i64}) {
      r.push_back({"softmax_cross_entropy", test::kFloatDTypes,
                   [label_type](fl::DType dt) {
                     return Inputs{test::random_tensor({6, 5}, 9, dt),
                                   indices_i64({0, 4, 2, 2, 1, 3}).astype(label_type)};
                   },
                   [](const Inputs& in, fl::DType, fl::Device) { return fl::softmax_cross_entropy(in[0], in[1]); }});
    }
    r.push_back({"one_hot", {fl::i32, fl::i64}, [](fl::DType dt) { return Inputs{indices_i64({3, 0, 4, 4}).astype(dt)}; },
                 [](const Inputs& in, fl::DType, fl::Device) { return fl::one_hot(in[0], 5); }});
    // Shape ops; views are made contiguous so that the copy kernel runs too.
    r.push_back({"reshape", test::kAllDTypes, random_inputs({{3, 4, 5}}, {Domain::small_ints}),
                 [](const Inputs& in, fl::DType, fl::Device) { return fl::reshape(in[0], {5, -1}); }});
    r.push_back({"permute", test::kAllDTypes, random_inputs({{3, 4, 5}}, {Domain::small_ints}),
                 [](const Inputs& in, fl::DType, fl::Device) { return fl::permute(in[0], {2, 0, 1}).contiguous(); }});
    r.push_back({"slice", test::kAllDTypes, random_inputs({{3, 4, 5}}, {Domain::small_ints}),
                 [](const Inputs& in, fl::DType, fl::Device) { return fl::slice(in[0], 1, 1, 2).contiguous(); }});
    r.push_back({"copy", test::kAllDTypes, random_inputs({{3, 4, 5}}, {Domain::small_ints}),
                 [](const Inputs& in, fl::DType, fl::Device) { return fl::transpose(fl::reshape(in[0], {12, 5})).contiguous(); }});
    r.push_back({"to_device", test::kAllDTypes, random_inputs({{3, 4, 5}}, {Domain::small_ints}),
                 [](const Inputs& in, fl::DType, fl::Device) { return in[0].to(kCpu); }});
    r.push_back({"concat", test::kAllDTypes,
                 random_inputs({{2, 3}, {2, 1}, {2, 4}}, {Domain::small_ints, Domain::small_ints, Domain::small_ints}),
                 [](const Inputs& in, fl::DType, fl::Device) { return fl::concat(in, 1); }});
    for (fl::DType index_type : {fl::i32, fl::i64}) {
      r.push_back({"gather", test::kAllDTypes,
                   [index_type](fl::DType dt) {
                     return Inputs{test::random_tensor({5, 3}, 4, dt, Domain::small_ints),
                                   indices_i64({4, 0, 0, 2}).astype(index_type)};
                   },
                   [](const Inputs& in, fl::DType, fl::Device) { return fl::gather(in[0], in[1]); }});
      r.push_back({"scatter_add", test::kNumericDTypes,
                   [index_type](fl::DType dt) {
                     return Inputs{indices_i64({3, 0, 3, 1, 3, 0}).astype(index_type),
                                   test::random_tensor({6, 3}, 8, dt, Domain::small_ints)};
                   },
                   [](const Inputs& in, fl::DType, fl::Device) { return fl::scatter_add(in[0], in[1], 4); },
                   std::nullopt, /*strided_inputs=*/false});
    }
    return r;
  }();
  return rows;
}

// The same values in a non-contiguous layout on the GPU: a permuted view of a contiguous GPU
// tensor for rank >= 2, else every other element of a GPU buffer.
fl::Tensor noncontiguous_on_gpu(const fl::Tensor& t) {
  if (t.rank() >= 2) {
    std::vector<int64_t> reverse;
    for (int64_t d = t.rank(); d-- > 0;) reverse.push_back(d);
    return fl::permute(fl::permute(t, reverse).contiguous().to(kGpu), reverse);
  }
  const fl::Tensor host = test::strided_view(t);
  const int64_t buffer = static_cast<int64_t>(host.storage()->bytes() / fl::dtype_size(t.dtype()));
  const fl::Tensor base = fl::Tensor::view(host.storage(), {buffer}, {1}, 0, t.dtype()).to(kGpu);
  return fl::Tensor::view(base.storage(), host.shape(), host.strides(), host.offset(), t.dtype());
}

fl::Tensor run_row(const Row& row, const Inputs& in, fl::DType dt, fl::Device device) {
  return row.run(in, dt, device);
}

// The GPU result of `row` equals the CPU result: shape, dtype, device and values (floats within
// the dtype's tolerance, or the row's own).
void check_row(const Row& row, fl::DType dt, bool strided) {
  CAPTURE(row.op);
  CAPTURE(dt);
  CAPTURE(strided);
  const Inputs cpu_inputs = row.make(dt);
  Inputs gpu_inputs;
  for (const fl::Tensor& t : cpu_inputs) gpu_inputs.push_back(strided ? noncontiguous_on_gpu(t) : t.to(kGpu));
  const fl::Tensor want = run_row(row, cpu_inputs, dt, kCpu);
  const fl::Tensor got = run_row(row, gpu_inputs, dt, kGpu);
  if (row.op != "to_device") CHECK(got.device() == kGpu);
  CHECK(got.shape() == want.shape());
  CHECK(got.dtype() == want.dtype());
  // GPU transcendentals and summation order differ from the CPU's in the last bits.
  test::Tolerance tolerance = row.tolerance.value_or(test::default_tolerance(want.dtype()));
  if (want.dtype() == fl::f32) tolerance = {std::max(tolerance.rel, 1e-5), std::max(tolerance.abs, 1e-5)};
  if (want.dtype() == fl::f64) tolerance = {std::max(tolerance.rel, 1e-11), std::max(tolerance.abs, 1e-11)};
  test::check_values(test::values(got), test::values(want), tolerance);
  for (size_t i = 0; i < cpu_inputs.size(); ++i) {  // inputs unchanged
    test::check_values(test::values(gpu_inputs[i]), test::values(cpu_inputs[i]), {0, 0});
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Without a GPU (these run everywhere).

TEST_CASE("device_count(cuda) is 0 without a GPU, and never more than the devices a build can have") {
  const int count = fl::device_count(fl::DeviceKind::cuda);
  CHECK(count >= 0);
  CHECK(count <= 16);
  if (!FLOWLET_HAVE_CUDA) CHECK(count == 0);
  const std::string build = FLOWLET_HAVE_CUDA ? "built with CUDA" : "built without CUDA";
  MESSAGE("CUDA devices visible: " << count << " (" << build << ")");
}

TEST_CASE("every op with a CUDA kernel has a row in the CUDA table, and a build with CUDA covers every op") {
  std::set<std::string> rows;
  for (const Row& row : table()) rows.insert(row.op);
  // Ops checked on CUDA by the traced tests below instead of a row (they exist only in graphs, or
  // print and call host code), and ops that never run on a GPU.
  const std::set<std::string> traced_below = {"read_variable", "assign_variable", "assign_matmul", "send",
                                              "recv",          "print",           "host_callback"};
  // The collectives' one kernel hands the tensor to the participant's communicator (NCCL for GPUs):
  // tests/test_collective_ops.cpp and the transport's tests check them per backend.
  const std::set<std::string> collectives = {"all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier"};
  // The parameter-server ops' one kernel hands host bytes to the worker's client, which puts a
  // pulled value on the worker's device: tests/test_ps_worker.cpp checks them.
  const std::set<std::string> parameter_server = {"ps_pull", "ps_lookup", "ps_push"};
  const std::set<std::string> host_only = {
      "fused_elementwise",               // the fusion pass fuses CPU nodes only
      "matmul_bias", "relu_bias_grad",   // the dense-layer fusion passes fuse CPU nodes only
      "softmax_cross_entropy_grad",      // so does the cross-entropy gradient fusion,
      "softmax_cross_entropy_with_probs", "softmax_cross_entropy_grad_from_probs",  // and its softmax sharing
      "queue_enqueue", "queue_dequeue",  // a queue lives on the host; its items stay where they are
      "optimizer_update",                // the fused optimizer step: CPU only so far; Optimizer::apply
                                         // keeps the per-op update for variables on a GPU
  };
  std::vector<std::string> without_kernel;
  for (const fl::Op* op : fl::all_ops()) {
    const std::string name(op->name);
    const bool has_kernel = op->runs_on(fl::DeviceKind::cuda);
    if (!FLOWLET_HAVE_CUDA) {
      CHECK_MESSAGE(!has_kernel, "op '" << name << "' has a CUDA kernel in a build without CUDA");
      continue;
    }
    if (host_only.count(name) == 1) {
      CHECK_MESSAGE(!has_kernel, "op '" << name << "' has a CUDA kernel: take it off host_only");
      continue;
    }
    if (!has_kernel) without_kernel.push_back(name);
    // The issue 15 ops (convolutions, pooling, normalization, dropout) have their rows in
    // tests/test_cuda_conv.cpp.
    if (has_kernel && traced_below.count(name) == 0 && collectives.count(name) == 0 &&
        parameter_server.count(name) == 0 && test::kCudaConvOps.count(name) == 0) {
      CHECK_MESSAGE(rows.count(name) == 1, "op '" << name << "' needs a row in tests/test_cuda.cpp");
    }
  }
  // src/cuda/README.md lists the ops that still lack a CUDA kernel; there are none (host_only aside).
  CHECK_MESSAGE(without_kernel.empty(), "ops without a CUDA kernel: " << fmt::format("{}", fmt::join(without_kernel, ", ")));
  for (const std::string& name : rows) CHECK_MESSAGE(fl::find_op(name) != nullptr, "row '" << name << "' names no op");
}

TEST_CASE("every kAnyDevice op serves each backend of the build with its CPU kernel, and no other op borrows it") {
  (void)fl::device_count(fl::DeviceKind::cuda);  // the backends have registered
  const auto cpu = static_cast<size_t>(fl::DeviceKind::cpu);
  const auto cuda = static_cast<size_t>(fl::DeviceKind::cuda);
  int any_device = 0;
  for (const fl::Op* op : fl::all_ops()) {
    const std::string name(op->name);
    CAPTURE(name);
    if (op->has_flag(fl::kAnyDevice)) {
      ++any_device;
      CHECK(op->runs_on(fl::DeviceKind::cpu));
      if (FLOWLET_HAVE_CUDA) {
        const bool same_kernel = op->kernels[cuda] == op->kernels[cpu];
        const bool same_async_kernel = op->async_kernels[cuda] == op->async_kernels[cpu];
        CHECK(same_kernel);
        CHECK(same_async_kernel);
      } else {
        CHECK_FALSE(op->runs_on(fl::DeviceKind::cuda));
      }
    } else if (op->kernels[cpu] != nullptr) {
      const bool borrows_cpu_kernel = op->kernels[cuda] == op->kernels[cpu];
      CHECK_FALSE(borrows_cpu_kernel);  // a shared kernel says so with the flag
    }
  }
  // The views, the variable read and update, send and recv, print and host_callback, the five
  // collectives (their kernel calls the communicator, which serves its participant's device) and
  // the three parameter-server ops (ps_pull, ps_lookup, ps_push: their kernels call the worker's
  // client, which moves host bytes and puts pulled values on the worker's device).
  CHECK(any_device == 17);
}

TEST_CASE("the graph-only ops of a traced training step run on CUDA in a build with CUDA; fused_elementwise stays on the CPU") {
  (void)fl::device_count(fl::DeviceKind::cuda);  // as any use of a GPU does first: the backend registers its kernels
  fl::Variable w(fl::randn({4, 3}, 1), "w");
  fl::Variable steps(fl::zeros({}), "steps");
  auto step = fl::trace([&](fl::Tensor x) {
    fl::GradientTape tape;
    const fl::Tensor loss = fl::sum(fl::exp(fl::tanh(fl::matmul(x, w.value()))) * 2.0f);  // a chain the CPU fuses
    w.assign_sub(tape.gradient(loss, {w})[0], 0.1);  // w -= 0.1 * (x^T @ dy): assign_matmul
    steps.assign_add(fl::ones({}));                   // assign_variable
    fl::host_callback([](const std::vector<fl::Tensor>&) {}, {loss});
    return fl::print(loss, "loss");
  });
  std::set<std::string> seen;
  for (const fl::Node& n : step.graph(fl::randn({5, 4}, 2)).nodes()) {
    if (n.removed || n.kind != fl::NodeKind::op) continue;
    const std::string name(n.op->name);
    seen.insert(name);
    const bool on_cuda = n.op->runs_on(fl::DeviceKind::cuda);
    if (name == "fused_elementwise") {
      CHECK_MESSAGE(!on_cuda, "fused_elementwise has a CUDA kernel, but the fusion pass fuses CPU nodes only");
    } else if (FLOWLET_HAVE_CUDA) {
      CHECK_MESSAGE(on_cuda, "op '" << name << "' of a traced step has no CUDA kernel");
    }
  }
  for (const std::string name : {"read_variable", "assign_variable", "assign_matmul", "print", "host_callback"}) {
    CHECK_MESSAGE(seen.count(name) == 1, "the traced step has no '" << name << "' node");
  }
}

TEST_CASE("to(cuda:0) without a GPU throws DeviceError that says there are no CUDA devices and why") {
  if (have_gpu()) {
    MESSAGE("skipped: a CUDA device is visible");
    return;
  }
  const fl::Tensor t = fl::ones({2, 3});
  const std::string why = FLOWLET_HAVE_CUDA ? "no CUDA device visible" : "built without CUDA";
  test::check_throws<fl::DeviceError>([&] { (void)t.to(kGpu); }, {"to_device", "cuda:0", "no cuda devices", why});
  test::check_throws<fl::DeviceError>([] { (void)fl::zeros({2}, fl::f32, kGpu); }, {"full", "cuda:0"});
  test::check_throws<fl::DeviceError>([] { (void)fl::memory_stats(kGpu); }, {"memory_stats", "cuda:0"});
  test::check_throws<fl::DeviceError>([] { fl::synchronize(kGpu); }, {"synchronize", "cuda:0"});
}

TEST_CASE("a CUDA device index beyond the visible ones throws DeviceError naming it") {
  const fl::Device missing("cuda:7");
  if (fl::device_count(fl::DeviceKind::cuda) > 7) {
    MESSAGE("skipped: this machine has cuda:7");
    return;
  }
  test::check_throws<fl::DeviceError>([&] { (void)fl::ones({2}).to(missing); }, {"to_device", "cuda:7"});
  test::check_throws<fl::DeviceError>([&] { (void)fl::randn({2}, 1, fl::f32, missing); }, {"randn", "cuda:7"});
  test::check_throws<fl::DeviceError>([&] { (void)fl::memory_stats(missing); }, {"memory_stats", "cuda:7"});
  test::check_throws<fl::DeviceError>([] { (void)fl::Device("cuda:x"); }, {"cuda:x"});
}

TEST_CASE("synchronize on a CPU device returns at once, and the TF32 switch reads back what was set") {
  fl::synchronize(kCpu);
  CHECK_FALSE(fl::matmul_tf32());
  fl::set_matmul_tf32(true);
  CHECK(fl::matmul_tf32());
  fl::set_matmul_tf32(false);
  CHECK_FALSE(fl::matmul_tf32());
}

// ---------------------------------------------------------------------------------------------
// With a GPU.

TEST_CASE("every CUDA op matches the CPU on contiguous inputs") {
  if (skip_without_gpu()) return;
  for (const Row& row : table()) {
    for (fl::DType dt : row.dtypes) check_row(row, dt, /*strided=*/false);
  }
}

TEST_CASE("every CUDA op matches the CPU on non-contiguous GPU inputs") {
  if (skip_without_gpu()) return;
  for (const Row& row : table()) {
    if (!row.strided_inputs) continue;
    for (fl::DType dt : row.dtypes) check_row(row, dt, /*strided=*/true);
  }
}

TEST_CASE("tensors of every dtype go to the GPU and back unchanged, also from strided views") {
  if (skip_without_gpu()) return;
  for (fl::DType dt : test::kAllDTypes) {
    CAPTURE(dt);
    const fl::Tensor host = test::random_tensor({4, 5, 6}, 3, dt, Domain::small_ints);
    const fl::Tensor gpu = host.to(kGpu);
    CHECK(gpu.device() == kGpu);
    test::check_values(test::values(gpu.to(kCpu)), test::values(host), {0, 0});
    const fl::Tensor view = fl::permute(host, {2, 0, 1});
    test::check_values(test::values(view.to(kGpu)), test::values(view), {0, 0});
    test::check_values(test::values(fl::permute(gpu, {2, 0, 1}).to(kCpu)), test::values(view), {0, 0});
  }
  const fl::Tensor empty = fl::zeros({0, 3}).to(kGpu);
  CHECK(empty.to(kCpu).numel() == 0);
}

TEST_CASE("copies between two GPUs keep the values") {
  if (skip_without_gpu()) return;
  if (fl::device_count(fl::DeviceKind::cuda) < 2) {
    MESSAGE("skipped: needs two CUDA devices");
    return;
  }
  const fl::Tensor host = test::random_tensor({64, 33}, 5, fl::f32);
  const fl::Tensor on_second = host.to(kGpu).to(fl::Device("cuda:1"));
  CHECK(on_second.device() == fl::Device("cuda:1"));
  test::check_values(test::values(on_second), test::values(host), {0, 0});
}

TEST_CASE("memory_stats counts the bytes that tensors hold on a GPU, and freed blocks are reused") {
  if (skip_without_gpu()) return;
  fl::synchronize(kGpu);
  const fl::DeviceMemoryStats before = fl::memory_stats(kGpu);
  {
    const fl::Tensor t = fl::zeros({1024, 256}, fl::f32, kGpu);
    const fl::DeviceMemoryStats during = fl::memory_stats(kGpu);
    CHECK(during.bytes_in_use == before.bytes_in_use + 1024 * 256 * 4);
    CHECK(during.allocations == before.allocations + 1);
  }
  CHECK(fl::memory_stats(kGpu).bytes_in_use == before.bytes_in_use);
  // A loop that makes a tensor of one size per step keeps reusing one block: no growth.
  for (int step = 0; step < 100; ++step) (void)(fl::ones({4096}, fl::f32, kGpu) * 2.0f);
  CHECK(fl::memory_stats(kGpu).bytes_in_use == before.bytes_in_use);
}

TEST_CASE("randn and uniform give the same stream on the GPU as on the CPU for a seed") {
  if (skip_without_gpu()) return;
  for (fl::DType dt : {fl::f32, fl::f64}) {
    CAPTURE(dt);
    const fl::Tensor cpu = fl::randn({100000}, 7, dt);
    const fl::Tensor gpu = fl::randn({100000}, 7, dt, kGpu);
    // GPU log/cos are within 2 ulp of glibc's: f64 may differ in the last bits, f32 rarely at all.
    test::check_values(test::values(gpu), test::values(cpu), {dt == fl::f64 ? 1e-14 : 1e-7, 1e-14});
    const fl::Tensor prefix = fl::randn({10}, 7, dt, kGpu);  // a smaller tensor is a prefix
    test::check_values(test::values(prefix), test::values(fl::slice(cpu, 0, 0, 10)), {dt == fl::f64 ? 1e-14 : 1e-7, 1e-14});
  }
}

TEST_CASE("a long f32 sum on the GPU is accurate (f64 accumulation)") {
  if (skip_without_gpu()) return;
  const fl::Tensor x = fl::full({1 << 24}, 0.1, fl::f32, kGpu);
  const double want = (1 << 24) * static_cast<double>(0.1f);
  CHECK(std::abs(fl::sum(x).item<float>() - want) <= 1e-6 * want);
  CHECK(std::abs(fl::mean(x).item<float>() - 0.1f) <= 1e-7);
}

TEST_CASE("data-dependent errors on the GPU throw the CPU's error classes and messages") {
  if (skip_without_gpu()) return;
  const fl::Tensor params = fl::ones({4, 2}, fl::f32, kGpu);
  const fl::Tensor bad = indices_i64({1, 9, 2}).to(kGpu);
  test::check_throws<fl::OutOfRange>([&] { (void)fl::gather(params, bad); },
                                     {"gather: index out of range [0, 4); got index 9 at position 1"});
  test::check_throws<fl::OutOfRange>([&] { (void)fl::scatter_add(bad, fl::ones({3, 2}, fl::f32, kGpu), 4); },
                                     {"scatter_add", "got index 9 at position 1"});
  test::check_throws<fl::OutOfRange>([&] { (void)fl::one_hot(bad, 4); }, {"one_hot", "got index 9 at position 1"});
  test::check_throws<fl::OutOfRange>(
      [&] { (void)fl::softmax_cross_entropy(fl::zeros({3, 4}, fl::f32, kGpu), bad); },
      {"softmax_cross_entropy", "got label 9 at position 1"});
  const fl::Tensor a = fl::tensor(std::vector<int32_t>{4, 5}, fl::Shape{2}).to(kGpu);
  const fl::Tensor zero = fl::tensor(std::vector<int32_t>{1, 0}, fl::Shape{2}).to(kGpu);
  test::check_throws<fl::InvalidArgument>([&] { (void)fl::div(a, zero); }, {"div: integer division by zero"});
  // The device still works after each of them.
  CHECK(fl::sum(params).item<float>() == 8.0f);
}

TEST_CASE("an op on a GPU tensor and a CPU tensor throws DeviceError naming both devices") {
  if (skip_without_gpu()) return;
  test::check_throws<fl::DeviceError>([] { (void)(fl::ones({2}, fl::f32, kGpu) + fl::ones({2})); },
                                      {"add", "cuda:0", "cpu:0"});
}

TEST_CASE("TF32 matmul is close to f32, and off by default") {
  if (skip_without_gpu()) return;
  const fl::Tensor a = fl::randn({256, 512}, 1, fl::f32, kGpu);
  const fl::Tensor b = fl::randn({512, 128}, 2, fl::f32, kGpu);
  const fl::Tensor exact = fl::matmul(a.to(kCpu), b.to(kCpu));
  test::check_values(test::values(fl::matmul(a, b)), test::values(exact), {1e-4, 1e-3});
  fl::set_matmul_tf32(true);
  const fl::Tensor fast = fl::matmul(a, b);
  fl::set_matmul_tf32(false);
  test::check_values(test::values(fast), test::values(exact), {2e-2, 0.15});
}

TEST_CASE("gradients of a small model computed on the GPU match the CPU") {
  if (skip_without_gpu()) return;
  auto loss_and_grads = [](fl::Device device) {
    fl::Variable w(fl::randn({8, 4}, 3).to(device), "w");
    const fl::Tensor x = fl::randn({16, 8}, 4).to(device);
    const fl::Tensor labels = indices_i64({0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3}).to(device);
    fl::GradientTape tape;
    const fl::Tensor loss = fl::mean(fl::softmax_cross_entropy(fl::relu(fl::matmul(x, w)), labels));
    const fl::Tensor grad = tape.gradient(loss, {w})[0];
    return std::pair{loss.item<float>(), test::values(grad)};
  };
  const auto [cpu_loss, cpu_grad] = loss_and_grads(kCpu);
  const auto [gpu_loss, gpu_grad] = loss_and_grads(kGpu);
  CHECK(gpu_loss == doctest::Approx(cpu_loss).epsilon(1e-5));
  test::check_values(gpu_grad, cpu_grad, {1e-4, 1e-6});
}

TEST_CASE("f16 and bf16 matmul and its gradients on the GPU match the CPU") {
  if (skip_without_gpu()) return;
  for (fl::DType dt : test::kHalfDTypes) {
    CAPTURE(dt);
    // Big enough for cuBLAS's tensor-core kernels; both sides accumulate in f32, so they differ by
    // the rounding of differently ordered f32 sums: at most an ulp of the half result.
    const fl::Tensor a = fl::randn({256, 320}, 5, dt);
    const fl::Tensor b = fl::randn({320, 96}, 6, dt);
    const fl::Tensor cpu = fl::matmul(a, b);
    const fl::Tensor gpu = fl::matmul(a.to(kGpu), b.to(kGpu));
    CHECK(gpu.dtype() == dt);
    test::check_values(test::values(gpu), test::values(cpu), test::default_tolerance(dt));
    // Gradients: x [3, 16, 8] @ w [8, 4] sums w's batch of gradients (a half sum, f64 accumulation).
    auto grads = [dt](fl::Device device) {
      const fl::Tensor x = fl::randn({3, 16, 8}, 7, dt).to(device);
      const fl::Tensor w = fl::randn({8, 4}, 8, dt).to(device);
      fl::GradientTape tape;
      tape.watch(x);
      tape.watch(w);
      const fl::Tensor loss = fl::sum(fl::tanh(fl::matmul(x, w).astype(fl::f32)));
      std::vector<std::vector<double>> out;
      for (const fl::Tensor& g : tape.gradient(loss, {x, w})) out.push_back(test::values(g));
      return out;
    };
    const auto want = grads(kCpu), got = grads(kGpu);
    REQUIRE(got.size() == 2);
    const double eps = dt == fl::f16 ? 0x1p-10 : 0x1p-7;
    for (size_t i = 0; i < 2; ++i) test::check_values(got[i], want[i], {4 * eps, 16 * eps});
  }
}

TEST_CASE("gradients on cuda:0 match central finite differences in f64, as test_autodiff checks them on the CPU") {
  if (skip_without_gpu()) return;
  // A representative set from the CPU's case table: elementwise ops with broadcasting, matmul
  // (plain, batched, a shared rank-2 operand, a transposed view), sum and max, the softmax family,
  // gather, concat and where. Every input, op, tape and finite-difference loss runs on cuda:0.
  const std::map<std::string, test::gradient::Builder> builders = test::gradient::build_cases();
  int cases_run = 0;
  for (const char* name : {"add", "mul", "div", "maximum", "tanh", "sigmoid", "cast", "matmul", "sum", "max", "softmax",
                           "log_softmax", "softmax_cross_entropy", "gather", "concat", "where"}) {
    for (const test::gradient::GradCase& c : builders.at(name)()) {
      INFO("op ", name, ", case ", c.label);
      try {
        test::gradient::check_case(c, kGpu);
      } catch (const std::exception& e) {
        FAIL_CHECK("threw " << test::error_kind(e) << ": " << e.what());
      }
      ++cases_run;
    }
  }
  CHECK(cases_run >= 50);
}

TEST_CASE("a bf16 and an f16 MLP training step on cuda:0, eager and traced, matches the CPU") {
  if (skip_without_gpu()) return;
  for (fl::DType dt : test::kHalfDTypes) {
    for (bool traced : {false, true}) {
      CAPTURE(dt);
      CAPTURE(traced);
      test::MlpOptions o;
      o.dtype = o.init_dtype = dt;
      o.steps = 2;
      o.traced = traced;
      const test::MlpRun cpu = test::train_mlp(o);
      o.device = kGpu;
      const test::MlpRun gpu = test::train_mlp(o);
      // cuBLAS and the CPU's f32 GEMM on upcast copies both accumulate in f32, in different orders,
      // so half results differ by at most an ulp; a step then moves each weight by at most an ulp
      // of it more (2u |w| per step, u the half dtype's unit roundoff).
      const double u = dt == fl::bf16 ? 0x1p-8 : 0x1p-11;
      REQUIRE(gpu.losses.size() == cpu.losses.size());
      for (size_t s = 0; s < cpu.losses.size(); ++s) CHECK(gpu.losses[s] == doctest::Approx(cpu.losses[s]).epsilon(4 * u));
      for (size_t i = 0; i < cpu.values.size(); ++i) {
        double largest = 0;
        for (double v : cpu.values[i]) largest = std::max(largest, std::abs(v));
        test::check_values(gpu.values[i], cpu.values[i], {0, o.steps * 2 * u * largest});
      }
      CHECK(gpu.fused_updates == cpu.fused_updates);  // half weight updates fuse on cuda:0 too
    }
  }
}

TEST_CASE("a GPU tensor formats with its values and device") {
  if (skip_without_gpu()) return;
  const std::string text = fmt::format("{}", fl::arange(3, fl::i64, kGpu));
  CHECK(text.find("0") != std::string::npos);
  CHECK(text.find("device=cuda:0") != std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Variables, optimizers and traced graphs on a GPU.

namespace {

// What a few training steps leave: the losses and the final values of the variables.
struct Trained {
  std::vector<float> losses;
  std::vector<std::vector<double>> values;
  int fused_updates = 0;  // assign_matmul nodes in the traced graph
};

// A two-layer model trained for three steps on `device` with optimizer `which` (0: SGD, whose
// weight updates the traced graph fuses into assign_matmul; 1: SGD with momentum; 2: Adam), traced
// or eager. Same seeds on every device.
Trained train(fl::Device device, int which, bool traced) {
  std::vector<fl::Variable> vars = {fl::Variable((fl::randn({6, 8}, 1) * 0.3f).to(device), "w1"),
                                    fl::Variable(fl::zeros({8}).to(device), "b1"),
                                    fl::Variable((fl::randn({8, 3}, 2) * 0.3f).to(device), "w2")};
  std::unique_ptr<fl::optim::Optimizer> opt;
  if (which == 0) opt = std::make_unique<fl::optim::SGD>(0.1);
  if (which == 1) opt = std::make_unique<fl::optim::SGD>(0.1, 0.9);
  if (which == 2) opt = std::make_unique<fl::optim::Adam>(0.01);
  const fl::Tensor x = fl::randn({16, 6}, 3).to(device);
  const fl::Tensor labels = indices_i64({0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0}).to(device);
  auto step = [&](fl::Tensor xb, fl::Tensor yb) {
    fl::GradientTape tape;
    const fl::Tensor h = fl::relu(fl::matmul(xb, vars[0].value()) + vars[1].value());
    const fl::Tensor loss = fl::mean(fl::softmax_cross_entropy(fl::matmul(h, vars[2].value()), yb));
    opt->apply(tape.gradient(loss, vars), vars);
    return loss;
  };
  auto traced_step = fl::trace(step);
  Trained out;
  for (int s = 0; s < 3; ++s) out.losses.push_back((traced ? traced_step(x, labels) : step(x, labels)).item<float>());
  for (const fl::Variable& v : vars) {
    CHECK(v.device() == device);  // a variable never changes device
    out.values.push_back(test::values(v.value()));
  }
  CHECK(opt->iterations().value().item<int64_t>() == 3);
  if (traced) {
    for (const fl::Node& n : traced_step.graph(x, labels).nodes()) {
      out.fused_updates += !n.removed && n.op != nullptr && n.op->name == "assign_matmul";
    }
  }
  return out;
}

// Runs fn with standard error going to a temporary file; returns what was written there.
template <class F>
std::string capture_stderr(F fn) {
  std::fflush(stderr);
  FILE* file = std::tmpfile();
  REQUIRE(file != nullptr);
  const int saved = dup(STDERR_FILENO);
  dup2(fileno(file), STDERR_FILENO);
  fn();
  std::fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(saved);
  std::string text;
  std::rewind(file);
  for (int c = std::fgetc(file); c != EOF; c = std::fgetc(file)) text += static_cast<char>(c);
  std::fclose(file);
  return text;
}

}  // namespace

TEST_CASE("SGD, SGD with momentum and Adam on cuda:0 variables, traced and eager, match the CPU") {
  if (skip_without_gpu()) return;
  for (int which = 0; which < 3; ++which) {
    for (bool traced : {false, true}) {
      CAPTURE(which);
      CAPTURE(traced);
      const Trained cpu = train(kCpu, which, traced);
      const Trained gpu = train(kGpu, which, traced);
      REQUIRE(gpu.losses.size() == cpu.losses.size());
      for (size_t s = 0; s < cpu.losses.size(); ++s) CHECK(gpu.losses[s] == doctest::Approx(cpu.losses[s]).epsilon(1e-4));
      for (size_t i = 0; i < cpu.values.size(); ++i) test::check_values(gpu.values[i], cpu.values[i], {1e-4, 1e-5});
      // Plain SGD: the GPU graph fuses both weight updates into cuBLAS GEMMs, as the CPU graph does.
      CHECK(gpu.fused_updates == cpu.fused_updates);
      if (traced) CHECK(gpu.fused_updates == (which == 0 ? 2 : 0));
    }
  }
}

TEST_CASE("assign, assign_add and assign_sub on a cuda:0 variable, eager and traced") {
  if (skip_without_gpu()) return;
  fl::Variable v(fl::arange(4, fl::f32, kGpu), "v");
  CHECK(v.device() == kGpu);
  v.assign_add(fl::ones({4}, fl::f32, kGpu));
  CHECK(test::values(v.value()) == std::vector<double>{1, 2, 3, 4});
  const fl::Tensor held = v.value();  // a reader keeps the value it read
  v.assign_sub(fl::full({4}, 2.0, fl::f32, kGpu), 0.5);
  CHECK(test::values(v.value()) == std::vector<double>{0, 1, 2, 3});
  CHECK(test::values(held) == std::vector<double>{1, 2, 3, 4});
  v.assign(fl::full({4}, 5.0, fl::f32, kGpu));
  CHECK(test::values(v.value()) == std::vector<double>{5, 5, 5, 5});
  // An update on another device is an error outside a device scope, as on the CPU.
  test::check_throws<fl::DeviceError>([&] { v.assign_add(fl::ones({4})); }, {"assign_add", "'v'", "cuda:0"});
  auto bump = fl::trace([&] { v.assign_add(fl::ones({4}, fl::f32, kGpu), 2.0); });
  bump();
  bump();
  CHECK(test::values(v.value()) == std::vector<double>{9, 9, 9, 9});
  CHECK(v.device() == kGpu);
  for (const fl::Node& n : bump.graph().nodes()) {
    if (!n.removed && n.op != nullptr && n.op->name == "assign_variable") CHECK(n.device == kGpu);
  }
}

TEST_CASE("print of a cuda:0 tensor writes its values, eagerly and in a traced function, and returns it") {
  if (skip_without_gpu()) return;
  const fl::Tensor t = fl::tensor({1.5f, -2.0f}).to(kGpu);
  fl::Tensor returned;
  const std::string eager = capture_stderr([&] { returned = fl::print(t, "gpu"); });
  CHECK(eager.find("gpu: tensor([1.5, -2]") != std::string::npos);
  CHECK(eager.find("device=cuda:0") != std::string::npos);
  CHECK(returned.device() == kGpu);
  CHECK(test::values(returned) == std::vector<double>{1.5, -2});
  auto f = fl::trace([](fl::Tensor x) { return fl::print(x * 2.0f, "doubled"); });
  fl::Tensor out;
  const std::string traced = capture_stderr([&] { out = f(t); });
  CHECK(traced.find("doubled: tensor([3, -4]") != std::string::npos);
  CHECK(traced.find("device=cuda:0") != std::string::npos);
  CHECK(out.device() == kGpu);
  CHECK(test::values(out) == std::vector<double>{3, -4});
}

TEST_CASE("a host callback on cuda:0 tensors gets host copies, eagerly and in a traced function") {
  if (skip_without_gpu()) return;
  std::vector<float> seen;
  auto look = [&](const std::vector<fl::Tensor>& v) {
    REQUIRE(v.size() == 1);
    CHECK(v[0].device() == kCpu);
    seen.push_back(v[0].data<float>()[1]);  // an element read on the host
  };
  fl::host_callback(look, {fl::tensor({1.0f, 2.0f}).to(kGpu)});
  auto f = fl::trace([&](fl::Tensor x) {
    const fl::Tensor y = x * 3.0f;
    fl::host_callback(look, {y});
    return y + 1.0f;
  });
  const fl::Tensor out = f(fl::tensor({1.0f, 2.0f}).to(kGpu));
  f(fl::tensor({3.0f, 4.0f}).to(kGpu));
  CHECK(seen == std::vector<float>{2, 6, 12});
  CHECK(out.device() == kGpu);
  CHECK(test::values(out) == std::vector<double>{4, 7});
  // The callback node runs where its input is, not on the CPU by soft placement.
  for (const fl::Node& n : f.graph(fl::tensor({1.0f, 2.0f}).to(kGpu)).nodes()) {
    if (!n.removed && n.op != nullptr && n.op->name == "host_callback") CHECK(n.device == kGpu);
  }
}
