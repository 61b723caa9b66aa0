// Placement of traced graphs on logical CPU devices: requests, colocation with variables, the
// follow-the-largest-input rule, the reasons each node records, and conflicting constraints.
#include "support/reference.hpp"

namespace {

void ensure_devices() { fl::set_logical_cpu_devices(4); }

const fl::Node& find_node(const fl::Graph& g, std::string_view op_name) {
  for (const fl::Node& n : g.nodes()) {
    if (!n.removed && n.op != nullptr && n.op->name == op_name) return n;
  }
  FAIL("no live node runs " << std::string(op_name));
  throw std::logic_error("unreachable");
}

}  // namespace

TEST_CASE("a DeviceScope inside a traced function places its nodes there, and consumers follow the larger input") {
  ensure_devices();
  fl::TraceOptions options;
  options.fuse_elementwise = false;  // keep exp and add apart, to look at each
  auto f = fl::trace([](fl::Tensor x) {
    fl::Tensor big;
    {
      fl::DeviceScope scope(fl::Device("cpu:2"));
      big = fl::exp(x);
    }
    return big + fl::ones({});  // the scalar is small: the add follows exp's output to cpu:2
  }, options);
  const fl::Tensor x = fl::randn({16, 8}, 1);
  const fl::Graph& g = f.graph(x);
  const fl::Node& exp_node = find_node(g, "exp");
  CHECK(exp_node.device == fl::Device("cpu:2"));
  CHECK(exp_node.placement_reason == "requested");
  const fl::Node& add_node = find_node(g, "add");
  CHECK(add_node.device == fl::Device("cpu:2"));
  CHECK(add_node.placement_reason.find("follows its largest input") != std::string::npos);
  // Same values as eagerly, wherever it ran.
  CHECK(f(x).to_vector<float>() == (fl::exp(x) + 1.0f).to_vector<float>());
  CHECK(g.to_dot().find("cpu:2") != std::string::npos);
}

TEST_CASE("reads and updates of a variable run where the variable lives") {
  ensure_devices();
  fl::Variable w(fl::ones({4}).to(fl::Device("cpu:3")), "w");
  auto step = fl::trace([&](fl::Tensor g) {
    w.assign_sub(g.to(fl::Device("cpu:3")), 0.5);
    return w.value();
  });
  const fl::Tensor g = fl::full({4}, 2.0);
  const fl::Graph& graph = step.graph(g);
  const fl::Node& update = find_node(graph, "assign_variable");
  CHECK(update.device == fl::Device("cpu:3"));
  CHECK(update.placement_reason == "colocated with variable 'w'");
  CHECK(find_node(graph, "read_variable").device == fl::Device("cpu:3"));
  CHECK(step(g).to_vector<float>() == std::vector<float>(4, 0.0f));
  CHECK(w.value().device() == fl::Device("cpu:3"));
}

TEST_CASE("an update requested on another device than its variable is an error naming both") {
  ensure_devices();
  fl::Variable w(fl::ones({4}), "pinned");  // cpu:0
  auto step = fl::trace([&](fl::Tensor g) {
    fl::DeviceScope scope(fl::Device("cpu:1"));
    w.assign_add(g);  // g and w are on cpu:0, but the scope asks for cpu:1
    return g;
  });
  test::check_throws<fl::DeviceError>([&] { step(fl::ones({4})); },
                                      {"placement:", "cpu:1", "pinned", "cpu:0", "share a device"});
  CHECK(w.value().to_vector<float>() == std::vector<float>(4, 1.0f));  // nothing ran
  // Eagerly an update from another device is refused; traced, the placer keeps the update with
  // the variable and the partitioner moves the value there.
  test::check_throws<fl::DeviceError>([&] { w.assign_add(fl::ones({4}, fl::f32, fl::Device("cpu:1"))); },
                                      {"assign_add:", "pinned", "cpu:1", "cpu:0"});
  auto moved = fl::trace([&](fl::Tensor g) {
    w.assign_add(g.to(fl::Device("cpu:1")));
    return g;
  });
  moved(fl::ones({4}));
  CHECK(w.value().to_vector<float>() == std::vector<float>(4, 2.0f));
  CHECK(w.value().device() == fl::Device("cpu:0"));
  CHECK(moved.last_transfer_stats().transfers == 2);  // g to the copy on cpu:1, and its result back
}

TEST_CASE("ColocateWith puts nodes on the variable's device") {
  ensure_devices();
  fl::Variable table(fl::randn({10, 3}, 4).to(fl::Device("cpu:1")), "table");
  auto lookup = fl::trace([&](fl::Tensor ids) {
    fl::ColocateWith near(table);
    return fl::gather(table, ids.to(fl::Device("cpu:1")));
  });
  const fl::Tensor ids = fl::tensor(std::vector<int64_t>{1, 7}, {2});
  const fl::Graph& g = lookup.graph(ids);
  const fl::Node& gather = find_node(g, "gather");
  CHECK(gather.device == fl::Device("cpu:1"));
  CHECK(gather.placement_reason == "colocated with variable 'table'");
  CHECK(lookup(ids).to_vector<float>() == fl::gather(table.value(), ids.to(fl::Device("cpu:1"))).to_vector<float>());
}
