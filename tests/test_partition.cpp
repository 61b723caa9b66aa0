// Partitioning traced graphs over logical CPU devices: Send/Recv pairs on every cut edge (one Recv
// per value and destination), control edges across devices, the rendezvous byte counts, sparse
// lookups that move rows and not tables, errors and cancellation across partitions, and the
// executor running partitions concurrently.
#include <atomic>
#include <chrono>
#include <map>
#include <set>
#include <thread>

#include "support/reference.hpp"
#include "exec/executable.hpp"
#include "ops/transfer.hpp"
#include "trace/passes/passes.hpp"

namespace {

void ensure_devices() { fl::set_logical_cpu_devices(8); }

std::vector<const fl::Node*> nodes_running(const fl::Graph& g, std::string_view op_name) {
  std::vector<const fl::Node*> found;
  for (const fl::Node& n : g.nodes()) {
    if (!n.removed && n.op != nullptr && n.op->name == op_name) found.push_back(&n);
  }
  return found;
}

const fl::detail::TransferAttrs& transfer_of(const fl::Node& n) {
  return *static_cast<const fl::detail::TransferAttrs*>(n.attributes.get());
}

int64_t bytes_of(const fl::Tensor& t) { return t.numel() * static_cast<int64_t>(fl::dtype_size(t.dtype())); }

}  // namespace

TEST_CASE("every cut edge becomes one Send/Recv pair, with one Recv per value and destination") {
  ensure_devices();
  fl::TraceOptions options;
  options.fuse_elementwise = false;  // keep the elementwise nodes apart, to count their edges
  auto f = fl::trace([](fl::Tensor x) {
    fl::Tensor a, b, c;
    {
      fl::DeviceScope scope(fl::Device("cpu:1"));
      a = fl::exp(x);  // x crosses cpu:0 -> cpu:1
    }
    {
      fl::DeviceScope scope(fl::Device("cpu:2"));
      b = a * 2.0f;  // a crosses cpu:1 -> cpu:2 once, for both readers there
      c = a - 1.0f;
    }
    return std::vector<fl::Tensor>{b + c, fl::sum(a)};
  }, options);
  const fl::Tensor x = fl::randn({64, 32}, 3);
  const fl::Graph& g = f.graph(x);
  g.check_invariants();
  const auto sends = nodes_running(g, "send");
  const auto recvs = nodes_running(g, "recv");
  REQUIRE(sends.size() == 2);
  REQUIRE(recvs.size() == 2);
  std::set<std::string> keys;
  std::set<int32_t> slots;
  std::map<std::string, int> recvs_into;
  for (const fl::Node* r : recvs) {
    const auto& t = transfer_of(*r);
    keys.insert(t.key);
    slots.insert(t.slot);
    CHECK(r->device == t.destination);
    ++recvs_into[fmt::format("{} {}", t.key.substr(0, t.key.find(' ', 5)), t.destination)];
    CHECK_FALSE(t.control);
  }
  CHECK(keys.size() == 2);                        // unique rendezvous keys
  CHECK(slots == std::set<int32_t>{0, 1});        // slots number the pairs
  for (const auto& [value, count] : recvs_into) CHECK_MESSAGE(count == 1, value);
  for (const fl::Node* s : sends) CHECK(s->device == transfer_of(*s).source);
  // Results equal the eager program's, and the rendezvous counted both tensors.
  const std::vector<fl::Tensor> out = f(x);
  const fl::Tensor a = fl::exp(x);
  CHECK(test::values(out[0]) == test::values(a * 2.0f + (a - 1.0f)));
  CHECK(test::values(out[1]) == test::values(fl::sum(a)));
  const fl::TransferStats moved = f.last_transfer_stats();
  CHECK(moved.transfers == 2);
  CHECK(moved.bytes == 2 * bytes_of(x));
  // The DOT text shows the pairs and their devices.
  const std::string dot = g.to_dot();
  CHECK(dot.find("send") != std::string::npos);
  CHECK(dot.find("recv") != std::string::npos);
}

TEST_CASE("the partitions of a graph are one graph per device, joined only by the rendezvous") {
  ensure_devices();
  auto f = fl::trace([](fl::Tensor x) {
    fl::Tensor y;
    {
      fl::DeviceScope scope(fl::Device("cpu:3"));
      y = fl::tanh(x);
    }
    return y + x;  // follows the larger input: both are as large, so the first (cpu:3)
  });
  const fl::Tensor x = fl::randn({8, 8}, 1);
  const fl::Graph& g = f.graph(x);
  const fl::detail::PartitionedGraph parts = fl::detail::split_partitions(g);
  REQUIRE(parts.partitions.size() == 2);
  CHECK(parts.slots == 1);
  size_t nodes = 0;
  for (const fl::detail::GraphPartition& p : parts.partitions) {
    p.graph->check_invariants();
    nodes += p.graph->num_nodes();
    for (const fl::Node& n : p.graph->nodes()) CHECK(n.device == p.device);
    CHECK(p.global_ids.size() == p.graph->nodes().size());
  }
  CHECK(nodes == g.num_nodes());
  CHECK(test::values(f(x)) == test::values(fl::tanh(x) + x));
}

TEST_CASE("a control edge between devices becomes a pair that moves no tensor, and still orders the nodes") {
  ensure_devices();
  std::string order;
  auto f = fl::trace([&](fl::Tensor x) {
    {
      fl::DeviceScope scope(fl::Device("cpu:0"));
      fl::host_callback([&](const std::vector<fl::Tensor>&) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        order += "a";
      }, {x});
    }
    {
      fl::DeviceScope scope(fl::Device("cpu:1"));
      fl::host_callback([&](const std::vector<fl::Tensor>&) { order += "b"; }, {});
    }
    return x;
  });
  const fl::Tensor x = fl::ones({4});
  const fl::Graph& g = f.graph(x);
  const auto recvs = nodes_running(g, "recv");
  REQUIRE(recvs.size() == 1);
  CHECK(transfer_of(*recvs[0]).control);
  CHECK(recvs[0]->outputs.empty());
  order.clear();
  for (int i = 0; i < 3; ++i) f(x);
  CHECK(order == "ababab");
  CHECK(f.last_transfer_stats().transfers == 1);
  CHECK(f.last_transfer_stats().bytes == 0);
}

TEST_CASE("a constant read on another device is copied there once, not sent at every step") {
  ensure_devices();
  const fl::Tensor table = fl::randn({16, 4}, 9);  // captured: a constant of the graph
  fl::TraceOptions options;
  options.optimize = false;  // keep table + x from folding away
  auto f = fl::trace([&](fl::Tensor x) {
    fl::DeviceScope scope(fl::Device("cpu:2"));
    return table * x;
  }, options);
  const fl::Tensor x = fl::ones({16, 4});
  const fl::Graph& g = f.graph(x);
  int constants_on_2 = 0;
  for (const fl::Node& n : g.nodes()) {
    if (n.kind == fl::NodeKind::constant && n.device == fl::Device("cpu:2")) ++constants_on_2;
  }
  CHECK(constants_on_2 == 1);
  CHECK(test::values(f(x)) == test::values(table));
  CHECK(f.last_transfer_stats().bytes == bytes_of(x));  // only the argument crossed
}

TEST_CASE("a gather on a variable runs where the table lives: only indices and rows cross, in training too") {
  ensure_devices();
  const int64_t rows = 4096, width = 64;
  fl::Variable table(fl::randn({rows, width}, 5).to(fl::Device("cpu:1")), "embedding");
  const fl::Tensor table_before = table.value().to(fl::Device("cpu:0"));
  auto lookup = fl::trace([&](fl::Tensor ids) {
    fl::Tensor picked = fl::gather(table.value(), ids);
    fl::DeviceScope scope(fl::Device("cpu:0"));
    return fl::sum(picked * 2.0f, {1});
  });
  const fl::Tensor ids = test::make({3, 4000, 17, 3, 99}, {5}, fl::i64);
  const fl::Tensor out = lookup(ids);
  CHECK(test::values(out) == test::values(fl::sum(fl::gather(table_before, ids) * 2.0f, {1})));
  const int64_t rows_bytes = 5 * width * 4;
  CHECK(lookup.last_transfer_stats().bytes == bytes_of(ids) + rows_bytes);
  const fl::Graph& g = lookup.graph(ids);
  CHECK(nodes_running(g, "gather").at(0)->device == fl::Device("cpu:1"));

  // A training step: the gradient's scatter-add runs with its forward gather, next to the table.
  fl::optim::SGD opt(0.5);
  auto train = fl::trace([&](fl::Tensor ids) {
    fl::GradientTape tape;
    fl::Tensor picked = fl::gather(table.value(), ids);
    fl::Tensor loss;
    {
      fl::DeviceScope scope(fl::Device("cpu:0"));
      loss = fl::sum(picked * picked);
    }
    opt.apply(tape.gradient(loss, {table}), {table});
    return loss;
  });
  train(ids);
  const fl::TransferStats moved = train.last_transfer_stats();
  const int64_t table_bytes = rows * width * 4;
  MESSAGE("training step moved " << moved.bytes << " bytes in " << moved.transfers << " transfers; table is "
                                 << table_bytes);
  CHECK(moved.bytes < table_bytes / 100);
  CHECK(moved.bytes <= bytes_of(ids) + 2 * rows_bytes + 64);
  const fl::Graph& tg = train.graph(ids);
  for (const fl::Node* n : nodes_running(tg, "scatter_add")) {
    CHECK(n->device == fl::Device("cpu:1"));
    CHECK(n->placement_reason.find("with its forward op 'gather") != std::string::npos);
  }
  // The update matches the same step done eagerly: row r moves by -0.5 * 2 * picked * count(r).
  const std::vector<double> after = test::values(table.value());
  const std::vector<double> before = test::values(table_before);
  for (int64_t c = 0; c < width; ++c) {
    const auto i3 = static_cast<size_t>(3 * width + c), i17 = static_cast<size_t>(17 * width + c);
    CHECK(after[i3] == doctest::Approx(before[i3] - 0.5 * 2.0 * before[i3] * 2).epsilon(1e-5));
    CHECK(after[i17] == doctest::Approx(before[i17] - 0.5 * 2.0 * before[i17]).epsilon(1e-5));
  }
  CHECK(after[5 * width] == before[5 * width]);  // a row nobody looked up is untouched
}

TEST_CASE("a failing node cancels every partition and its error names the node; the function keeps working") {
  ensure_devices();
  auto f = fl::trace([](fl::Tensor params, fl::Tensor ids) {
    fl::Tensor picked;
    {
      fl::DeviceScope scope(fl::Device("cpu:1"));
      picked = fl::gather(params, ids);  // out of range ids fail here
    }
    fl::DeviceScope scope(fl::Device("cpu:2"));
    return fl::exp(picked);  // its partition waits for a Recv that never gets a tensor
  });
  const fl::Tensor params = fl::randn({10, 3}, 2);
  test::check_throws<fl::OutOfRange>([&] { f(params, test::make({1, 12}, {2}, fl::i64)); }, {"node 'gather", "12"});
  const fl::Tensor ok = f(params, test::make({1, 9}, {2}, fl::i64));
  CHECK(test::values(ok) == test::values(fl::exp(fl::gather(params, test::make({1, 9}, {2}, fl::i64)))));
}

TEST_CASE("a partitioned function called from several threads at once keeps each call's tensors apart") {
  ensure_devices();
  auto f = fl::trace([](fl::Tensor x) {
    fl::Tensor y;
    {
      fl::DeviceScope scope(fl::Device("cpu:4"));
      y = x * 3.0f;
    }
    fl::DeviceScope scope(fl::Device("cpu:5"));
    return y + 1.0f;
  });
  f(fl::ones({32}));  // trace once, before the threads race
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const float v = static_cast<float>(t * 1000 + i);
        const fl::Tensor out = f(fl::full({32}, v));
        if (out.to_vector<float>() != std::vector<float>(32, v * 3.0f + 1.0f)) ++wrong;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  CHECK(wrong.load() == 0);
}

TEST_CASE("a long chain of devices runs even though it has more partitions than threads") {
  ensure_devices();
  // Eight partitions, each waiting for the one before: parked Recvs hold no thread, so this
  // finishes on a pool of any size.
  auto f = fl::trace([](fl::Tensor x) {
    for (int d = 7; d >= 1; --d) {
      fl::DeviceScope scope(fl::Device(fmt::format("cpu:{}", d)));
      x = x + 1.0f;
    }
    return x;
  });
  for (int i = 0; i < 20; ++i) CHECK(test::values(f(fl::zeros({4}))) == std::vector<double>(4, 7.0));
  CHECK(f.last_transfer_stats().transfers == 7);  // cpu:0 -> 7 -> 6 -> ... -> 1
}

TEST_CASE("a timeline of a partitioned step names each device") {
  ensure_devices();
  fl::TraceOptions options;
  options.collect_step_stats = true;
  auto f = fl::trace([](fl::Tensor x) {
    fl::DeviceScope scope(fl::Device("cpu:6"));
    return fl::exp(x);
  }, options);
  f(fl::ones({8}));
  const std::string json = f.timeline_json();
  CHECK(json.find("\"process_name\"") != std::string::npos);
  CHECK(json.find("cpu:6") != std::string::npos);
  CHECK(json.find("\"name\":\"recv_0\"") != std::string::npos);
}

TEST_CASE("send and recv outside a graph step are refused with a clear error") {
  fl::detail::TransferAttrs attrs;
  attrs.key = "edge x:0 cpu:0->cpu:1";
  attrs.slot = 0;
  const fl::Tensor x = fl::ones({2});
  const fl::OpCall call{fl::detail::send_op, std::span<const fl::Tensor>(&x, 1), &attrs};
  test::check_throws<fl::InvalidArgument>([&] { fl::detail::send_op.kernels[0](call, {}); },
                                          {"send", "partitioned graph step"});
}

TEST_CASE("a traced function called under another DeviceScope traces again, and says why") {
  ensure_devices();
  auto f = fl::trace([](fl::Tensor x) { return fl::exp(x); });
  const fl::Tensor x = fl::ones({4});
  {
    fl::DeviceScope scope(fl::Device("cpu:1"));
    f(x);
  }
  CHECK(f.trace_count() == 1);
  {
    fl::DeviceScope scope(fl::Device("cpu:2"));
    const fl::Tensor y = f(x);
    CHECK(y.device() == fl::Device("cpu:2"));
    CHECK(test::values(y) == test::values(fl::exp(x)));
  }
  CHECK(f.trace_count() == 2);
  CHECK(f.last_retrace_reason() == "device scope cpu:1 -> cpu:2");
  f(x);  // no scope: a third graph, on cpu:0
  CHECK(f.trace_count() == 3);
  CHECK(f(x).device() == fl::Device("cpu:0"));
  CHECK(f.trace_count() == 3);
}

TEST_CASE("the DOT text of a multi-device graph draws one box per device and the rendezvous edges") {
  ensure_devices();
  auto f = fl::trace([](fl::Tensor x) {
    fl::DeviceScope scope(fl::Device("cpu:1"));
    return fl::exp(x);
  });
  const std::string dot = f.graph(fl::ones({3})).to_dot();
  CHECK(dot.find("subgraph \"cluster_cpu:0\"") != std::string::npos);
  CHECK(dot.find("subgraph \"cluster_cpu:1\"") != std::string::npos);
  CHECK(dot.find("label=\"rendezvous\"") != std::string::npos);
  auto g = fl::trace([](fl::Tensor x) { return fl::exp(x); });
  CHECK(g.graph(fl::ones({3})).to_dot().find("cluster") == std::string::npos);  // one device: no boxes
}

TEST_CASE("gradient ops run where their forward ops ran, and a variable read inside another scope stays home") {
  ensure_devices();
  fl::Variable w(fl::randn({32, 8}, 3).to(fl::Device("cpu:1")), "w1");
  const fl::Tensor w0 = w.value().to(fl::Device("cpu:0"));
  fl::optim::SGD opt(0.1);
  auto step = fl::trace([&](fl::Tensor x) {
    fl::GradientTape tape;
    fl::Tensor h;
    {
      fl::DeviceScope scope(fl::Device("cpu:1"));
      h = fl::relu(fl::matmul(x, w));
    }
    fl::Tensor loss;
    {
      fl::DeviceScope scope(fl::Device("cpu:0"));
      loss = fl::sum(h * fl::matmul(x, w));  // reads w inside cpu:0's scope: fine, the read stays on cpu:1
    }
    opt.apply(tape.gradient(loss, {w}), {w});
    return loss;
  });
  const fl::Tensor x = fl::randn({16, 32}, 4);
  const fl::Tensor loss = step(x);
  // The same step eagerly, on one device.
  const fl::Tensor y = fl::matmul(x, w0);
  CHECK(loss.item<float>() == doctest::Approx(fl::sum(fl::relu(y) * y).item<float>()).epsilon(1e-5));
  const fl::Graph& g = step.graph(x);
  int gradient_matmuls = 0;
  for (const fl::Node& n : g.nodes()) {
    if (n.op == nullptr || n.op->name != "matmul" || n.gradient_of < 0) continue;
    ++gradient_matmuls;
    CHECK(n.placement_reason.find("with its forward op") != std::string::npos);
    CHECK(n.device == g.node(n.gradient_of).device);
  }
  CHECK(gradient_matmuls >= 2);
  for (const fl::Node* r : nodes_running(g, "read_variable")) {
    CHECK(r->device == fl::Device("cpu:1"));
    CHECK_FALSE(r->requested_device.has_value());
  }
  // Eager SGD on the same loss for comparison: dL/dw = x^T (relu'(y) * y + relu(y)) * 2 paths.
  fl::Variable check(w0, "check");
  fl::GradientTape tape;
  fl::Tensor yy = fl::matmul(x, check);
  fl::Tensor eager_loss = fl::sum(fl::relu(yy) * yy);
  const fl::Tensor grad = tape.gradient(eager_loss, {check})[0];
  const std::vector<double> expected = test::values(w0 - grad * 0.1f);
  const std::vector<double> got = test::values(w.value());
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(expected[i]).epsilon(1e-4));
}

TEST_CASE("a partition runs its cheap nodes (the sends others wait for) before its long chain") {
  ensure_devices();
  fl::TraceOptions options;
  options.collect_step_stats = true;
  auto f = fl::trace([](fl::Tensor a, fl::Tensor b, fl::Tensor w) {
    fl::Tensor left = a, right = b;
    {
      fl::DeviceScope scope(fl::Device("cpu:0"));
      for (int i = 0; i < 3; ++i) left = fl::matmul(left, w);
    }
    {
      fl::DeviceScope scope(fl::Device("cpu:1"));
      for (int i = 0; i < 3; ++i) right = fl::matmul(right, w);
    }
    return std::vector<fl::Tensor>{left, right};
  }, options);
  const fl::Tensor a = fl::randn({256, 256}, 1), b = fl::randn({256, 256}, 2), w = fl::randn({256, 256}, 3) * 0.05f;
  f(a, b, w);
  const fl::Graph& g = f.graph(a, b, w);
  // Run several times: the order is decided by the executor, not by timing.
  for (int run = 0; run < 3; ++run) {
    f(a, b, w);
    const std::string json = f.timeline_json();
    // Every send starts before cpu:0's first matmul ends.
    auto field = [&](size_t at, std::string_view key) {
      const size_t k = json.find(fmt::format("\"{}\":", key), at);
      return std::stod(json.substr(k + key.size() + 3));
    };
    double first_matmul_end = 1e300, last_send_start = -1;
    for (size_t at = json.find("\"name\":\""); at != std::string::npos; at = json.find("\"name\":\"", at + 1)) {
      const std::string name = json.substr(at + 8, json.find('"', at + 8) - at - 8);
      if (name.rfind("send_", 0) == 0) last_send_start = std::max(last_send_start, field(at, "ts"));
      if (name.rfind("matmul", 0) == 0) {
        const int id = [&] {
          for (size_t i = 0; i < g.nodes().size(); ++i) {
            if (g.nodes()[i].name == name) return static_cast<int>(i);
          }
          return -1;
        }();
        if (id >= 0 && g.node(id).device == fl::Device("cpu:0")) {
          first_matmul_end = std::min(first_matmul_end, field(at, "ts") + field(at, "dur"));
        }
      }
    }
    REQUIRE(last_send_start >= 0);
    CHECK(last_send_start < first_matmul_end);
  }
}
