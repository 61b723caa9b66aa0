// Model parallelism: one wide hidden layer split column-wise over three logical CPU devices.
//
//   x [64, 784] on cpu:0
//   on cpu:d, d = 0, 1, 2:  h_d = relu(x @ W_d + b_d)          W_d [784, 128], b_d [128] live on cpu:d
//   on cpu:0:               h = concat(h_0, h_1, h_2)  [64, 384]
//                           loss = mean(softmax_cross_entropy(h @ V + c, labels))
//
// The whole training step (forward, GradientTape, SGD update) is traced into one graph. The placer
// puts every node on a device (the DeviceScopes below, and each variable's update where the variable
// lives), and every edge between two devices becomes a Send/Recv pair. The program checks that every
// step's loss equals the same model trained on one device from the same initial weights, prints the
// Send/Recv pairs and the bytes they moved per step, and writes the graph as Graphviz DOT.
//
//   model_parallel [--dot PATH] [--steps N]      (default: model_parallel.dot, 5 steps)
//   dot -Tsvg model_parallel.dot > model_parallel.svg   # the send/recv boxes join the devices
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <flowlet/flowlet.hpp>

namespace fl = flowlet;

namespace {

constexpr int kDevices = 3;
constexpr int64_t kBatch = 64, kInputs = 784, kHidden = 384, kClasses = 10;
constexpr int64_t kSlice = kHidden / kDevices;  // hidden units per device

fl::Device cpu(int d) { return fl::Device(fmt::format("cpu:{}", d)); }

// The starting weights, made once on cpu:0 so that both models below begin from the same tensors.
struct InitialWeights {
  std::vector<fl::Tensor> hidden_w, hidden_b;  // one column slice per device
  fl::Tensor out_w, out_b;
};

InitialWeights initial_weights() {
  InitialWeights init;
  for (int d = 0; d < kDevices; ++d) {
    init.hidden_w.push_back(fl::randn({kInputs, kSlice}, /*seed=*/10 + d) * 0.05f);
    init.hidden_b.push_back(fl::zeros({kSlice}));
  }
  init.out_w = fl::randn({kHidden, kClasses}, /*seed=*/20) * 0.05f;
  init.out_b = fl::zeros({kClasses});
  return init;
}

// The split model: slice d of the hidden layer lives on cpu:d and is computed there.
struct SplitModel {
  std::vector<fl::Variable> w, b;
  fl::Variable out_w, out_b;

  explicit SplitModel(const InitialWeights& init) {
    for (int d = 0; d < kDevices; ++d) {  // a variable lives on its initial value's device
      w.emplace_back(init.hidden_w[d].to(cpu(d)), fmt::format("hidden{}/weight", d));
      b.emplace_back(init.hidden_b[d].to(cpu(d)), fmt::format("hidden{}/bias", d));
    }
    out_w = fl::Variable(init.out_w, "out/weight");
    out_b = fl::Variable(init.out_b, "out/bias");
  }

  fl::Tensor loss(const fl::Tensor& x, const fl::Tensor& labels) const {
    std::vector<fl::Tensor> parts;
    for (int d = 0; d < kDevices; ++d) {
      fl::DeviceScope on_d(cpu(d));  // x crosses to cpu:d; the matmul runs beside W_d
      parts.push_back(fl::relu(fl::matmul(x, w[d]) + b[d]));
    }
    fl::DeviceScope on_0(cpu(0));  // the slices come back for the output layer
    const fl::Tensor h = fl::concat(parts, /*axis=*/1);
    return fl::mean(fl::softmax_cross_entropy(fl::matmul(h, out_w) + out_b, labels));
  }

  std::vector<fl::Variable> parameters() const {
    std::vector<fl::Variable> all;
    for (int d = 0; d < kDevices; ++d) all.insert(all.end(), {w[d], b[d]});
    all.insert(all.end(), {out_w, out_b});
    return all;
  }
};

// The reference: the same layer as one [784, 384] matrix on cpu:0 (the slices side by side).
struct WideModel {
  fl::Variable w, b, out_w, out_b;

  explicit WideModel(const InitialWeights& init)
      : w(fl::concat(init.hidden_w, 1), "hidden/weight"),
        b(fl::concat(init.hidden_b, 0), "hidden/bias"),
        out_w(init.out_w, "out/weight"),
        out_b(init.out_b, "out/bias") {}

  fl::Tensor loss(const fl::Tensor& x, const fl::Tensor& labels) const {
    const fl::Tensor h = fl::relu(fl::matmul(x, w) + b);
    return fl::mean(fl::softmax_cross_entropy(fl::matmul(h, out_w) + out_b, labels));
  }

  std::vector<fl::Variable> parameters() const { return {w, b, out_w, out_b}; }
};

// One traced training step for either model: forward, gradients and the update form one graph.
template <class Model>
auto traced_training_step(const Model& model, fl::optim::Optimizer& optimizer) {
  return fl::trace([&model, &optimizer](fl::Tensor x, fl::Tensor labels) {
    fl::GradientTape tape;
    const fl::Tensor loss = model.loss(x, labels);
    optimizer.apply(tape.gradient(loss, model.parameters()), model.parameters());
    return loss;
  });
}

struct Options {
  std::string dot = "model_parallel.dot";
  int steps = 5;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) throw fl::InvalidArgument(arg + " needs a value");
    if (arg == "--dot") o.dot = argv[++i];
    else if (arg == "--steps") o.steps = std::stoi(argv[++i]);
    else throw fl::InvalidArgument("unknown option " + arg + "; usage: model_parallel [--dot PATH] [--steps N]");
  }
  if (o.steps < 1) throw fl::InvalidArgument("--steps must be >= 1");
  return o;
}

int run(const Options& o) {
  const InitialWeights init = initial_weights();
  SplitModel split(init);
  WideModel wide(init);
  fl::optim::SGD split_optimizer(0.1), wide_optimizer(0.1);
  auto split_step = traced_training_step(split, split_optimizer);
  auto wide_step = traced_training_step(wide, wide_optimizer);

  // One batch of random images, labelled by a random linear "teacher", so the loss falls step by step.
  const fl::Tensor x = fl::randn({kBatch, kInputs}, /*seed=*/1);
  const fl::Tensor labels = fl::argmax(fl::matmul(x, fl::randn({kInputs, kClasses}, /*seed=*/2)), 1);
  bool all_equal = true;
  fmt::print("step  loss (3 devices)  loss (1 device)  relative difference\n");
  for (int s = 0; s < o.steps; ++s) {
    const float split_loss = split_step(x, labels).item<float>();
    const float wide_loss = wide_step(x, labels).item<float>();
    const double relative = std::abs(split_loss - wide_loss) / std::max(std::abs(wide_loss), 1e-12f);
    const bool equal = relative <= 1e-5;
    all_equal &= equal;
    fmt::print("{:>4}  {:>16.6f}  {:>15.6f}  {:>19.2e}{}\n", s, split_loss, wide_loss, relative,
               equal ? "" : "  <- differs by more than 1e-5");
  }

  // Count the pairs by device. A Send runs on the device the value leaves, its Recv where it arrives.
  const fl::Graph& graph = split_step.graph(x, labels);
  std::map<int, int> sends, recvs;
  for (const fl::Node& node : graph.nodes()) {
    if (node.removed || node.kind != fl::NodeKind::op) continue;
    if (node.op->name == "send") ++sends[node.device.index()];
    if (node.op->name == "recv") ++recvs[node.device.index()];
  }
  int pairs = 0;
  for (const auto& [device, count] : recvs) pairs += count;  // one Recv per pair
  const fl::TransferStats moved = split_step.last_transfer_stats();
  fmt::print("graph: {} nodes, {} Send/Recv pairs\n", graph.num_nodes(), pairs);
  for (int d = 0; d < kDevices; ++d) fmt::print("  cpu:{}: {} sends, {} recvs\n", d, sends[d], recvs[d]);
  fmt::print("per step: {} transfers moved {} bytes ({:.1f} KiB; zero-copy between logical CPU devices)\n",
             moved.transfers, moved.bytes, static_cast<double>(moved.bytes) / 1024.0);
  std::ofstream(o.dot) << graph.to_dot();
  fmt::print("wrote {} (render it with: dot -Tsvg {} > model_parallel.svg)\n", o.dot, o.dot);

  int failures = 0;
  if (!all_equal) {
    std::fprintf(stderr, "model_parallel: the 3-device losses differ from the 1-device losses by more than 1e-5\n");
    ++failures;
  }
  for (int d = 1; d < kDevices; ++d) {
    if (sends[d] == 0 || recvs[d] == 0) {
      std::fprintf(stderr, "model_parallel: expected at least one send and one recv on cpu:%d; got %d and %d\n", d,
                   sends[d], recvs[d]);
      ++failures;
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    fl::set_logical_cpu_devices(kDevices);  // before any tensor is made: cpu:0 .. cpu:2
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "model_parallel: %s\n", e.what());
    return 1;
  }
}
