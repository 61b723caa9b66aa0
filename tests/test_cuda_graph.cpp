// CUDA Graph capture of traced steps (TraceOptions::cuda_graphs): which graphs qualify and why the
// others do not (checked everywhere), and, on a GPU, that a replay gives what running the plan
// gives: the same outputs (never overwritten by a later replay), the same variable updates written
// in place, deferred data checks that refuse a bad step before any variable changes, and a new
// recording when a variable changed its buffer between calls.
#include <memory>
#include <string>
#include <vector>

#include "support/gpu.hpp"
#include "support/reference.hpp"

namespace {

const fl::Device kGpu("cuda:0");

using test::skip_without_gpu;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A chain of small elementwise ops: what launch overhead dominates.
fl::Tensor chain(const fl::Tensor& x, const fl::Tensor& y) {
  fl::Tensor t = x * 2.0f + y;
  for (int i = 0; i < 6; ++i) t = fl::tanh(t) * 0.5f + x;
  return fl::sum(t * t, {1});
}

// A two-layer model and its training step on `device`: SGD (with momentum when `momentum` > 0), or
// Adam when `momentum` is negative.
struct Model {
  std::vector<fl::Variable> vars;
  std::unique_ptr<fl::optim::Optimizer> opt;
  Model(fl::Device device, double momentum)
      : vars{fl::Variable((fl::randn({6, 8}, 1) * 0.3f).to(device), "w1"), fl::Variable(fl::zeros({8}).to(device), "b1"),
             fl::Variable((fl::randn({8, 3}, 2) * 0.3f).to(device), "w2")} {
    if (momentum < 0) {
      opt = std::make_unique<fl::optim::Adam>(0.01);
    } else {
      opt = std::make_unique<fl::optim::SGD>(0.1, momentum);
    }
  }
  fl::Tensor step(const fl::Tensor& x, const fl::Tensor& labels) {
    fl::GradientTape tape;
    const fl::Tensor h = fl::relu(fl::matmul(x, vars[0].value()) + vars[1].value());
    const fl::Tensor loss = fl::mean(fl::softmax_cross_entropy(fl::matmul(h, vars[2].value()), labels));
    opt->apply(tape.gradient(loss, vars), vars);
    return loss;
  }
};

fl::Tensor labels_on(fl::Device device, std::vector<int64_t> values) {
  return fl::tensor(values, fl::Shape{static_cast<int64_t>(values.size())}).to(device);
}

}  // namespace

TEST_CASE("a traced function reports why its graph is not a CUDA Graph: not called, on a CPU, turned off") {
  auto f = fl::trace([](fl::Tensor x) { return x * 2.0f + 1.0f; });
  CHECK(f.cuda_graph_info().why_not == "not called yet");
  f(fl::ones({4}));
  f(fl::ones({4}));
  const fl::CudaGraphInfo info = f.cuda_graph_info();
  CHECK_FALSE(info.captured);
  CHECK(info.replays == 0);
  CHECK(contains(info.why_not, "runs on cpu"));

  fl::TraceOptions off;
  off.cuda_graphs = false;
  auto g = fl::trace([](fl::Tensor x) { return x + 1.0f; }, off);
  g(fl::ones({2}));
  CHECK(contains(g.cuda_graph_info().why_not, "turned off"));

  fl::TraceOptions stats;
  stats.collect_step_stats = true;
  auto h = fl::trace([](fl::Tensor x) { return x + 1.0f; }, stats);
  h(fl::ones({2}));
  CHECK(contains(h.cuda_graph_info().why_not, "turned off"));
}

TEST_CASE("a graph over two devices, or with unknown dimensions, is not captured, and says so") {
  fl::set_logical_cpu_devices(2);
  auto f = fl::trace([](fl::Tensor x) {
    fl::Tensor y;
    {
      fl::DeviceScope on(fl::Device("cpu:1"));
      y = x * 3.0f;
    }
    return y + 1.0f;
  });
  CHECK(test::values(f(fl::ones({2}))) == std::vector<double>{4, 4});
  CHECK(contains(f.cuda_graph_info().why_not, "spans 2 devices"));

  fl::TraceOptions dynamic;
  dynamic.unknown_dims = {{0, 0}};
  auto g = fl::trace([](fl::Tensor x) { return x * 2.0f; }, dynamic);
  g(fl::ones({3}));
  CHECK(contains(g.cuda_graph_info().why_not, "shapes vary"));
}

TEST_CASE("an optimizer's step counter moves to its variables' device before the first apply") {
  // On the CPU it stays; the GPU case below checks that a GPU step is one partition.
  Model m(fl::Device("cpu"), 0.0);
  const fl::Tensor x = fl::randn({4, 6}, 3);
  m.step(x, labels_on(fl::Device("cpu"), {0, 1, 2, 0}));
  CHECK(m.opt->iterations().device() == fl::Device("cpu"));
  CHECK(m.opt->iterations().value().item<int64_t>() == 1);
}

TEST_CASE("a chain of small ops on cuda:0 replays as a CUDA Graph and equals the plan's result") {
  if (skip_without_gpu()) return;
  auto captured = fl::trace(chain);
  fl::TraceOptions off;
  off.cuda_graphs = false;
  auto plain = fl::trace(chain, off);
  std::vector<fl::Tensor> kept;
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    const fl::Tensor x = fl::randn({8, 16}, seed).to(kGpu), y = fl::randn({8, 16}, seed + 100).to(kGpu);
    const fl::Tensor got = captured(x, y);
    test::check_values(test::values(got), test::values(plain(x, y)), {1e-6, 1e-6});
    test::check_values(test::values(got), test::values(chain(x, y)), {1e-5, 1e-5});
    kept.push_back(got);
  }
  const fl::CudaGraphInfo info = captured.cuda_graph_info();
  CHECK(info.captured);
  CHECK(info.why_not.empty());
  CHECK(info.recordings == 1);
  CHECK(info.replays == 4);  // the first call warms up
  // Results handed out earlier are the caller's: later replays did not overwrite them.
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    const fl::Tensor x = fl::randn({8, 16}, seed).to(kGpu), y = fl::randn({8, 16}, seed + 100).to(kGpu);
    test::check_values(test::values(kept[seed - 1]), test::values(chain(x, y)), {1e-5, 1e-5});
  }
  CHECK(contains(plain.cuda_graph_info().why_not, "turned off"));
}

TEST_CASE("SGD, momentum and Adam steps on cuda:0 replay as a CUDA Graph, update in place, and match the plan") {
  if (skip_without_gpu()) return;
  for (double momentum : {0.0, 0.9, -1.0}) {  // -1: Adam
    CAPTURE(momentum);
    Model a(kGpu, momentum), b(kGpu, momentum);
    auto captured = fl::trace([&](fl::Tensor x, fl::Tensor y) { return a.step(x, y); });
    fl::TraceOptions off;
    off.cuda_graphs = false;
    auto plain = fl::trace([&](fl::Tensor x, fl::Tensor y) { return b.step(x, y); }, off);
    const fl::Tensor labels = labels_on(kGpu, {0, 1, 2, 0, 1, 2, 0, 1});
    const void* w1_buffer = nullptr;
    for (int s = 0; s < 6; ++s) {
      const fl::Tensor x = fl::randn({8, 6}, 10 + static_cast<uint64_t>(s)).to(kGpu);
      const float la = captured(x, labels).item<float>(), lb = plain(x, labels).item<float>();
      CHECK(la == doctest::Approx(lb).epsilon(1e-6));
      if (s == 2) w1_buffer = a.vars[0].value().raw_data();
    }
    CHECK(a.vars[0].value().raw_data() == w1_buffer);  // replays wrote into the same buffer
    for (size_t i = 0; i < a.vars.size(); ++i) {
      test::check_values(test::values(a.vars[i].value()), test::values(b.vars[i].value()), {1e-6, 1e-6});
    }
    CHECK(a.opt->iterations().device() == kGpu);
    CHECK(a.opt->iterations().value().item<int64_t>() == 6);
    const fl::CudaGraphInfo info = captured.cuda_graph_info();
    CHECK(info.captured);
    CHECK(info.replays == 5);
  }
}

TEST_CASE("a bad label in a captured step throws the eager error and changes no variable") {
  if (skip_without_gpu()) return;
  Model m(kGpu, 0.0);
  auto step = fl::trace([&](fl::Tensor x, fl::Tensor y) { return m.step(x, y); });
  const fl::Tensor x = fl::randn({4, 6}, 7).to(kGpu);
  step(x, labels_on(kGpu, {0, 1, 2, 0}));
  step(x, labels_on(kGpu, {2, 1, 0, 0}));
  REQUIRE(step.cuda_graph_info().captured);
  std::vector<std::vector<double>> before;
  for (const fl::Variable& v : m.vars) before.push_back(test::values(v.value()));
  test::check_throws<fl::OutOfRange>([&] { step(x, labels_on(kGpu, {0, 7, 1, 2})); },
                                     {"softmax_cross_entropy", "label out of range [0, 3)", "got label 7 at position 1"});
  for (size_t i = 0; i < m.vars.size(); ++i) CHECK(test::values(m.vars[i].value()) == before[i]);
  CHECK(m.opt->iterations().value().item<int64_t>() == 2);
  step(x, labels_on(kGpu, {1, 1, 1, 1}));  // and the function goes on
  CHECK(m.opt->iterations().value().item<int64_t>() == 3);
  CHECK(step.cuda_graph_info().captured);
}

TEST_CASE("an integer division by zero in a captured graph throws InvalidArgument after the replay") {
  if (skip_without_gpu()) return;
  auto f = fl::trace([](fl::Tensor a, fl::Tensor b) { return a / b + a; });
  const fl::Tensor a = fl::tensor<int32_t>({6, 8}).to(kGpu);
  const fl::Tensor b = fl::tensor<int32_t>({3, 2}).to(kGpu);
  f(a, b);
  CHECK(test::values(f(a, b)) == std::vector<double>{8, 12});
  const fl::Tensor zero = fl::tensor<int32_t>({3, 0}).to(kGpu);
  test::check_throws<fl::InvalidArgument>([&] { f(a, zero); }, {"div", "integer division by zero"});
}

TEST_CASE("a variable assigned eagerly, or read and kept, between replays makes the step record again") {
  if (skip_without_gpu()) return;
  fl::Variable v(fl::zeros({4}, fl::f32, kGpu), "v");
  auto bump = fl::trace([&](fl::Tensor d) { v.assign_add(d); });
  const fl::Tensor d = fl::ones({4}, fl::f32, kGpu);
  bump(d);
  bump(d);
  CHECK(bump.cuda_graph_info().recordings == 1);
  v.assign(fl::full({4}, 10.0, fl::f32, kGpu));  // a new buffer
  bump(d);
  CHECK(test::values(v.value()) == std::vector<double>{11, 11, 11, 11});
  CHECK(bump.cuda_graph_info().recordings == 2);
  const fl::Tensor held = v.value();  // a reader keeps the value it read
  bump(d);
  CHECK(test::values(held) == std::vector<double>{11, 11, 11, 11});
  CHECK(test::values(v.value()) == std::vector<double>{12, 12, 12, 12});
}

TEST_CASE("a graph that prints on a GPU is not captured, and says which node acts on the host") {
  if (skip_without_gpu()) return;
  auto f = fl::trace([](fl::Tensor x) { return fl::print(x * 2.0f, "x2") + 1.0f; });
  const fl::Tensor x = fl::ones({2}, fl::f32, kGpu);
  f(x);
  f(x);
  const fl::CudaGraphInfo info = f.cuda_graph_info();
  CHECK_FALSE(info.captured);
  CHECK(contains(info.why_not, "print"));
  CHECK(contains(info.why_not, "acts on the host"));
}

TEST_CASE("a captured graph's memory returns to the device's cache when its function is destroyed") {
  if (skip_without_gpu()) return;
  const int64_t before = fl::memory_stats(kGpu).bytes_in_use;
  {
    auto f = fl::trace(chain);
    const fl::Tensor x = fl::randn({64, 64}, 1).to(kGpu);
    for (int i = 0; i < 3; ++i) f(x, x);
    CHECK(f.cuda_graph_info().captured);
  }
  fl::synchronize(kGpu);
  CHECK(fl::memory_stats(kGpu).bytes_in_use == before);
}
