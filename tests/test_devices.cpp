// Logical CPU devices, per-device memory statistics, copies between devices, device scopes (eager
// and traced) and colocation hints.
#include <thread>

#include "support/reference.hpp"

namespace {

// The device count is process-wide and doctest does not promise an order, so every test case
// calls this first.
void ensure_devices() {
  static const bool configured = [] {
    fl::set_logical_cpu_devices(4);
    return true;
  }();
  (void)configured;
}

const fl::Device cpu0("cpu:0");
const fl::Device cpu1("cpu:1");
const fl::Device cpu2("cpu:2");
const fl::Device cpu3("cpu:3");

std::vector<float> values(const fl::Tensor& t) { return t.to_vector<float>(); }

// The live op nodes of a graph named `op`.
std::vector<const fl::Node*> op_nodes(const fl::Graph& graph, std::string_view op) {
  std::vector<const fl::Node*> found;
  for (const fl::Node& n : graph.nodes()) {
    if (!n.removed && n.kind == fl::NodeKind::op && n.op->name == op) found.push_back(&n);
  }
  return found;
}

fl::TraceOptions unoptimized() {
  fl::TraceOptions options;
  options.optimize = false;
  options.fuse_elementwise = false;
  return options;
}

}  // namespace

TEST_CASE("set_logical_cpu_devices makes cpu:0 .. cpu:3 and nothing beyond") {
  ensure_devices();
  CHECK(fl::device_count(fl::DeviceKind::cpu) == 4);
  for (int i = 0; i < 4; ++i) CHECK_NOTHROW(fl::check_device_exists("test", fl::Device(fl::DeviceKind::cpu, i)));
  CHECK(test::check_op_throws<fl::DeviceError>("test", [] { fl::check_device_exists("test", fl::Device("cpu:4")); },
                                               {"cpu:4", "available: cpu:0 .. cpu:3"}));
  CHECK(test::check_op_throws<fl::DeviceError>("full", [] { (void)fl::zeros({2}, fl::f32, "cpu:4"); },
                                               {"cpu:4", "cpu:0 .. cpu:3"}));
  CHECK(test::check_op_throws<fl::DeviceError>("to_device", [] { (void)fl::ones({2}).to(fl::Device("cpu:7")); },
                                               {"cpu:7", "cpu:0 .. cpu:3"}));
  CHECK(test::check_op_throws<fl::InvalidArgument>("set_logical_cpu_devices",
                                                   [] { fl::set_logical_cpu_devices(0); }, {"got 0"}));
  CHECK(test::check_op_throws<fl::InvalidArgument>(
      "set_logical_cpu_devices", [] { fl::set_logical_cpu_devices(fl::kMaxLogicalCpuDevices + 1); }, {"65"}));
  CHECK_NOTHROW(fl::set_logical_cpu_devices(4));  // the same count again: a no-op
}

TEST_CASE("changing the device count after a logical device was used throws, and changes nothing") {
  ensure_devices();
  const fl::Tensor used = fl::ones({2}, fl::f32, cpu1);
  CHECK(test::check_op_throws<fl::InvalidArgument>("set_logical_cpu_devices",
                                                   [] { fl::set_logical_cpu_devices(2); }, {"before first use"}));
  CHECK(fl::device_count(fl::DeviceKind::cpu) == 4);
  CHECK_NOTHROW(fl::set_logical_cpu_devices(4));
}

TEST_CASE("to() copies between CPU devices, and each device accounts its own bytes") {
  ensure_devices();
  const fl::Tensor a = fl::arange(6, fl::f32);
  CHECK(a.to(cpu0).impl_ptr() == a.impl_ptr());  // the same device: the tensor itself
  const fl::DeviceMemoryStats before = fl::memory_stats(cpu2);
  const fl::DeviceMemoryStats before0 = fl::memory_stats(cpu0);
  {
    const fl::Tensor b = a.to(cpu2);
    CHECK(b.device() == cpu2);
    CHECK(b.storage().get() != a.storage().get());
    CHECK(values(b) == values(a));
    const fl::DeviceMemoryStats during = fl::memory_stats(cpu2);
    CHECK(during.bytes_in_use == before.bytes_in_use + 24);
    CHECK(during.allocations == before.allocations + 1);
    CHECK(during.peak_bytes_in_use >= during.bytes_in_use);
    CHECK(fl::memory_stats(cpu0).bytes_in_use == before0.bytes_in_use);  // nothing moved on cpu:0

    const fl::Tensor back = b.to(cpu0);  // and back again
    CHECK(back.device() == cpu0);
    CHECK(values(back) == values(a));
  }
  const fl::DeviceMemoryStats after = fl::memory_stats(cpu2);
  CHECK(after.bytes_in_use == before.bytes_in_use);
  CHECK(after.peak_bytes_in_use >= before.bytes_in_use + 24);
  fl::reset_peak_memory_stats(cpu2);
  CHECK(fl::memory_stats(cpu2).peak_bytes_in_use == after.bytes_in_use);

  CHECK(test::check_op_throws<fl::DeviceError>("memory_stats", [] { (void)fl::memory_stats(fl::Device("cpu:4")); },
                                               {"cpu:4"}));
  CHECK(test::check_op_throws<fl::DeviceError>("reset_peak_memory_stats",
                                               [] { fl::reset_peak_memory_stats(fl::Device("cuda:0")); }, {"cuda:0"}));
}

TEST_CASE("symbolic tensors are not counted as memory") {
  ensure_devices();
  const fl::Tensor x = fl::ones({256}, fl::f32, cpu3);
  const fl::DeviceMemoryStats before = fl::memory_stats(cpu3);
  auto f = fl::trace([](fl::Tensor x) { return x * 2.0f + 1.0f; }, unoptimized());  // no folding: nothing runs
  const fl::Graph& graph = f.graph(x);
  CHECK(graph.node(graph.outputs()[0].node).device == cpu3);
  CHECK(fl::memory_stats(cpu3).allocations == before.allocations);
  CHECK(fl::memory_stats(cpu3).bytes_in_use == before.bytes_in_use);
}

TEST_CASE("an op on tensors of two devices throws DeviceError outside a scope") {
  ensure_devices();
  const fl::Tensor a = fl::ones({3});
  const fl::Tensor b = fl::ones({3}, fl::f32, cpu1);
  CHECK(test::check_op_throws<fl::DeviceError>("add", [&] { (void)(a + b); },
                                               {"different devices", "cpu:0", "cpu:1"}));
  CHECK(!fl::current_device_scope());
}

TEST_CASE("inside a DeviceScope an op on tensors of other devices runs on the scope's device") {
  ensure_devices();
  const fl::Tensor a = fl::arange(4, fl::f32);
  const fl::Tensor b = fl::full({4}, 0.5, fl::f32, cpu1);
  const fl::Tensor want = a + fl::full({4}, 0.5);
  fl::Tensor got, same, moved;
  {
    fl::DeviceScope scope(cpu2);
    CHECK(fl::current_device_scope() == cpu2);
    got = a + b;
    same = a * a;  // inputs on one device, but not the scope's: they move too
    moved = a.to(cpu3);  // an explicit device wins over the scope
  }
  CHECK(!fl::current_device_scope());
  CHECK(got.device() == cpu2);
  CHECK(values(got) == values(want));
  CHECK(same.device() == cpu2);
  CHECK(values(same) == values(a * a));
  CHECK(moved.device() == cpu3);
  CHECK(a.device() == cpu0);  // the inputs stay where they were
  CHECK(b.device() == cpu1);
}

TEST_CASE("creation ops inside a DeviceScope land on the scope's device unless given one") {
  ensure_devices();
  fl::DeviceScope scope(cpu3);
  const std::vector<fl::Tensor> created = {
      fl::zeros({2}), fl::ones({2}), fl::full({2}, 7.0), fl::arange(3), fl::randn({4}, 1), fl::uniform({4}, 0, 1, 2),
      fl::tensor({1.0f, 2.0f}), fl::tensor(std::vector<double>{1, 2, 3, 4}, fl::Shape{2, 2}), fl::scalar(3),
      fl::tensor({true, false})};
  for (const fl::Tensor& t : created) CHECK(t.device() == cpu3);
  CHECK(fl::default_device() == cpu3);
  CHECK(values(fl::randn({4}, 1)) == values(fl::randn({4}, 1, fl::f32, cpu0)));  // same numbers anywhere
  CHECK(values(fl::tensor({1.0f, 2.0f})) == std::vector<float>{1.0f, 2.0f});
  CHECK(fl::zeros({2}, fl::f32, cpu1).device() == cpu1);
  CHECK(fl::zeros_like(fl::ones({2}, fl::f32, cpu1)).device() == cpu1);  // like its argument
}

TEST_CASE("device scopes nest, the innermost wins, and each thread has its own") {
  ensure_devices();
  {
    fl::DeviceScope outer(cpu1);
    CHECK(fl::zeros({1}).device() == cpu1);
    {
      fl::DeviceScope inner(cpu3);
      CHECK(fl::zeros({1}).device() == cpu3);
      CHECK(fl::current_device_scope() == cpu3);
      fl::Device other_thread;
      std::thread([&] { other_thread = fl::zeros({1}).device(); }).join();
      CHECK(other_thread == cpu0);
    }
    CHECK(fl::zeros({1}).device() == cpu1);
    CHECK(fl::current_device_scope() == cpu1);
  }
  CHECK(fl::zeros({1}).device() == cpu0);
  CHECK(fl::default_device() == cpu0);
}

TEST_CASE("a DeviceScope on a device that does not exist throws DeviceError and leaves no scope") {
  ensure_devices();
  CHECK(test::check_op_throws<fl::DeviceError>("DeviceScope", [] { fl::DeviceScope scope(fl::Device("cpu:9")); },
                                               {"cpu:9", "cpu:0 .. cpu:3"}));
  CHECK(test::check_op_throws<fl::DeviceError>("DeviceScope", [] { fl::DeviceScope scope(fl::Device("cuda:0")); },
                                               {"cuda:0"}));
  CHECK(!fl::current_device_scope());
}

TEST_CASE("gradients flow back through a scope's copies to the source's device") {
  ensure_devices();
  const fl::Tensor x = fl::tensor({1.0f, 2.0f, 3.0f});
  SUBCASE("gradient asked for inside the scope") {
    fl::GradientTape tape;
    tape.watch(x);
    fl::DeviceScope scope(cpu2);
    const fl::Tensor y = fl::sum(x * x * 3.0f);
    CHECK(y.device() == cpu2);
    const fl::Tensor g = tape.gradient(y, {x})[0];
    CHECK(g.device() == cpu0);
    CHECK(values(g) == std::vector<float>{6.0f, 12.0f, 18.0f});
  }
  SUBCASE("gradient asked for after the scope") {
    fl::GradientTape tape;
    tape.watch(x);
    fl::Tensor y;
    {
      fl::DeviceScope scope(cpu1);
      y = x * fl::full({3}, 2.0, fl::f32, cpu3);  // both inputs are copied to cpu:1
    }
    const fl::Tensor g = tape.gradient(y, {x})[0];
    CHECK(g.device() == cpu0);
    CHECK(values(g) == std::vector<float>{2.0f, 2.0f, 2.0f});
  }
}

TEST_CASE("a variable keeps its device when it is read and updated inside a scope") {
  ensure_devices();
  fl::Variable w(fl::tensor({1.0f, 2.0f}), "w");
  {
    fl::DeviceScope scope(cpu1);
    fl::GradientTape tape;
    const fl::Tensor loss = fl::sum(w.value() * fl::tensor({3.0f, 4.0f}));
    CHECK(loss.device() == cpu1);
    const fl::Tensor g = tape.gradient(loss, {w})[0];
    CHECK(g.device() == cpu0);
    w.assign_sub(g * 0.5f);  // computed on cpu:1, moved to the variable
    w.assign_add(g, 0.25);
  }
  CHECK(w.device() == cpu0);
  CHECK(values(w.value()) == std::vector<float>{1.0f - 1.5f + 0.75f, 2.0f - 2.0f + 1.0f});
  CHECK(test::check_op_throws<fl::DeviceError>("assign", [&] { w.assign(fl::zeros({2}, fl::f32, cpu1)); },
                                               {"cpu:1", "cpu:0"}));  // outside a scope it is an error
}

TEST_CASE("tracing inside a DeviceScope copies nothing and records the request on the nodes") {
  ensure_devices();
  auto f = fl::trace(
      [](fl::Tensor x) {
        fl::Tensor y = x * 2.0f;
        {
          fl::DeviceScope scope(cpu1);
          y = fl::matmul(y, y) + fl::ones({2, 2});
        }
        return y;
      },
      unoptimized());
  const fl::Tensor x = fl::tensor(std::vector<float>{1, 2, 3, 4}, fl::Shape{2, 2});
  const fl::Graph& graph = f.graph(x);
  CHECK(op_nodes(graph, "to_device").empty());
  const auto mul = op_nodes(graph, "mul");
  REQUIRE(mul.size() == 1);
  CHECK(!mul[0]->requested_device);
  for (std::string_view op : {"matmul", "add"}) {
    const auto nodes = op_nodes(graph, op);
    REQUIRE(nodes.size() == 1);
    REQUIRE(nodes[0]->requested_device);
    CHECK(*nodes[0]->requested_device == cpu1);
    CHECK(nodes[0]->colocate_with == nullptr);
  }
  // ones({2, 2}) inside the scope requests cpu:1; the 2.0f outside requests nothing.
  for (const fl::Node* full : op_nodes(graph, "full")) {
    CHECK(full->requested_device.has_value() == (full->outputs[0].shape == fl::Shape{2, 2}));
  }
  CHECK(graph.to_dot().find("requested cpu:1") != std::string::npos);
  const std::string json = graph.to_json();
  CHECK(json.find("\"requested_device\":\"cpu:1\"") != std::string::npos);
  CHECK(json.find("\"requested_device\":null") != std::string::npos);

  const fl::Tensor got = f(x);  // wherever placement put it, the values are the eager ones
  const fl::Tensor y = x * 2.0f;
  CHECK(values(got) == values(fl::matmul(y, y) + 1.0f));
}

TEST_CASE("ColocateWith places eager ops on the variable's device and marks traced nodes") {
  ensure_devices();
  fl::Variable v(fl::zeros({2, 2}, fl::f32, cpu3), "v");
  CHECK(v.device() == cpu3);
  {
    fl::ColocateWith with_v(v);
    CHECK(fl::current_device_scope() == cpu3);
    CHECK(fl::zeros({2}).device() == cpu3);
    CHECK((fl::ones({2}, fl::f32, cpu0) + fl::ones({2}, fl::f32, cpu1)).device() == cpu3);
  }
  CHECK(!fl::current_device_scope());

  auto f = fl::trace(
      [&](fl::Tensor x) {
        fl::Tensor y;
        {
          fl::ColocateWith with_v(v);
          y = fl::matmul(x, x);
        }
        {
          fl::DeviceScope scope(cpu3);  // agrees with the variable (a conflict is the placer's error)
          fl::ColocateWith with_v(v);
          y = y - 1.0f;
        }
        return y;
      },
      unoptimized());
  const fl::Graph& graph = f.graph(fl::ones({2, 2}));
  const auto matmul = op_nodes(graph, "matmul");
  REQUIRE(matmul.size() == 1);
  CHECK(matmul[0]->colocate_with == v.identity());
  CHECK(!matmul[0]->requested_device);
  const auto sub = op_nodes(graph, "sub");
  REQUIRE(sub.size() == 1);
  CHECK(sub[0]->colocate_with == v.identity());  // the inner ColocateWith keeps the outer request
  REQUIRE(sub[0]->requested_device);
  CHECK(*sub[0]->requested_device == cpu3);
  const fl::Tensor ones = fl::ones({2, 2});
  CHECK(values(f(ones)) == values(fl::matmul(ones, ones) - 1.0f));

  CHECK(test::check_op_throws<fl::InvalidArgument>("ColocateWith", [] { fl::ColocateWith with(fl::Variable{}); }));
}
