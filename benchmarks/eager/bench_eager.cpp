// Eager per-op overhead on tiny f32 tensors: flowlet against libtorch (at::add and friends under
// NoGradGuard), each call producing a new tensor. Target: at most 1/3 of libtorch's time, aim 1/5.
#include <cmath>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include <flowlet/flowlet.hpp>

#include "../harness.hpp"
#include "../torch_peer.hpp"

namespace fl = flowlet;
namespace bench = flowlet_bench;

namespace {

const bench::Target overhead_target = bench::Target::at_most(0.33, "aim 0.20");

std::vector<float> ramp(int64_t n, float start, float step) {
  std::vector<float> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[static_cast<size_t>(i)] = start + step * static_cast<float>(i);
  return values;
}

// Checks flowlet's answer once before timing it: a fast wrong answer is not a result.
void check(const std::string& label, const fl::Tensor& got, const std::vector<float>& expected) {
  std::vector<float> values = got.to_vector<float>();
  bool ok = values.size() == expected.size();
  for (size_t i = 0; ok && i < values.size(); ++i) {
    ok = std::fabs(values[i] - expected[i]) <= 1e-5f * std::max(1.0f, std::fabs(expected[i]));
  }
  if (!ok) fmt::print("   WARNING: flowlet {} gave a wrong result; its timing below means little\n", label);
}

#ifdef FLOWLET_BENCH_HAVE_TORCH
at::Tensor to_torch(std::vector<float> values) {
  return at::from_blob(values.data(), {static_cast<int64_t>(values.size())}, at::kFloat).clone();
}
#endif

// One problem: flowlet, libtorch under NoGradGuard (the peer with the target), and libtorch under
// InferenceMode (its fastest eager path, for information).
template <class Ours, class Torch>
void compare_op(const std::string& label, Ours ours_body, [[maybe_unused]] Torch torch_body,
                const std::optional<bench::Target>& target) {
  bench::Section section(label, bench::Metric::time(), "time per call, a new tensor each call");
  bench::Result ours = section.run("flowlet", ours_body);
#ifdef FLOWLET_BENCH_HAVE_TORCH
  bench::Result peer;
  {
    at::NoGradGuard no_grad;
    peer = section.run("libtorch", torch_body);
  }
  bench::Result inference;
  {
    c10::InferenceMode inference_mode;
    inference = section.run("libtorch-inference-mode", torch_body);
  }
  section.compare(ours, peer, target);
  section.compare(ours, inference, std::nullopt);
#else
  bench::Result peer = section.skip("libtorch");
  section.compare(ours, peer, target);
#endif
}

void run_all() {
  for (int64_t n : {int64_t{1}, int64_t{64}}) {
    std::vector<float> a_values = ramp(n, 0.5f, 0.01f);
    std::vector<float> b_values = ramp(n, -0.25f, 0.02f);
    fl::Tensor a = fl::tensor(a_values, fl::Shape{n});
    fl::Tensor b = fl::tensor(b_values, fl::Shape{n});
    std::vector<float> expected(a_values.size());
    for (size_t i = 0; i < expected.size(); ++i) expected[i] = a_values[i] + b_values[i];
    std::string label = fmt::format("add {}-element", n);
    try {
      check(label, a + b, expected);
    } catch (const std::exception& error) {
      fmt::print("   flowlet {} failed its check: {}\n", label, error.what());
    }
#ifdef FLOWLET_BENCH_HAVE_TORCH
    at::Tensor ta = to_torch(a_values);
    at::Tensor tb = to_torch(b_values);
    auto torch_body = [&] { bench::do_not_optimize(at::add(ta, tb)); };
#else
    auto torch_body = [] {};
#endif
    compare_op(label, [&] { bench::do_not_optimize(a + b); }, torch_body, overhead_target);
  }

  const int64_t n = 64;
  std::vector<float> values = ramp(n, -1.0f, 0.03f);
  fl::Tensor x = fl::tensor(values, fl::Shape{n});
#ifdef FLOWLET_BENCH_HAVE_TORCH
  at::Tensor tx = to_torch(values);
#endif

  {
    std::vector<float> expected(values.size());
    for (size_t i = 0; i < values.size(); ++i) expected[i] = std::exp(values[i]);
    try {
      check("exp", fl::exp(x), expected);
    } catch (const std::exception& error) {
      fmt::print("   flowlet exp failed its check: {}\n", error.what());
    }
#ifdef FLOWLET_BENCH_HAVE_TORCH
    auto torch_body = [&] { bench::do_not_optimize(at::exp(tx)); };
#else
    auto torch_body = [] {};
#endif
    compare_op("exp 64-element", [&] { bench::do_not_optimize(fl::exp(x)); }, torch_body, overhead_target);
  }
  {
    double total = 0;
    for (float v : values) total += v;
    try {
      check("sum", fl::sum(x), {static_cast<float>(total)});
    } catch (const std::exception& error) {
      fmt::print("   flowlet sum failed its check: {}\n", error.what());
    }
#ifdef FLOWLET_BENCH_HAVE_TORCH
    auto torch_body = [&] { bench::do_not_optimize(at::sum(tx)); };
#else
    auto torch_body = [] {};
#endif
    compare_op("sum 64-element", [&] { bench::do_not_optimize(fl::sum(x)); }, torch_body, overhead_target);
  }
  {
    // A host scalar on one side: flowlet wraps it in a rank-0 tensor per call.
    std::vector<float> expected(values.size());
    for (size_t i = 0; i < values.size(); ++i) expected[i] = values[i] * 2.0f;
    try {
      check("x * 2.0f", x * 2.0f, expected);
    } catch (const std::exception& error) {
      fmt::print("   flowlet x * 2.0f failed its check: {}\n", error.what());
    }
#ifdef FLOWLET_BENCH_HAVE_TORCH
    auto torch_body = [&] { bench::do_not_optimize(at::mul(tx, 2.0)); };
#else
    auto torch_body = [] {};
#endif
    compare_op("x * 2.0f 64-element", [&] { bench::do_not_optimize(x * 2.0f); }, torch_body, overhead_target);
  }
}

}  // namespace

int main() {
  return bench::run_benchmark("bench_eager", "eager per-op overhead (f32, a new tensor per call)", /*torch_uses_all_threads=*/false, run_all);
}
