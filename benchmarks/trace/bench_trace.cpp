// flowlet::trace against eager flowlet, libtorch and TensorFlow 2 (eager, tf.function, XLA), in
// three problems. Targets (ratios of median times; lower is better):
//   1. MLP training step (784-256-10 ReLU, mean softmax cross-entropy, SGD lr 0.01; the model of
//      bench_training, ../mlp_step.hpp), ONE thread, the eager step lambda wrapped in trace():
//        batch 1:  traced <= 1/3 of flowlet eager (at least 3x faster); traced <= 0.1x libtorch
//                  (aim 0.05); traced < 1.0x TensorFlow tf.function
//        batch 64: traced <= 0.6x libtorch; traced < 1.0x TensorFlow tf.function
//   2. Executor overhead, ONE thread: 1000 chained `t = t + 1.0f` on a 1-element f32 tensor, traced
//      with elementwise fusion off (it would merge the chain into one node; the scalars fold into
//      one constant), so 1000 add nodes run: time per node (call / 1000) <= 300 ns. Peers
//      for information: the same chain eagerly (per op) and TensorFlow tf.function without Grappler
//      (tf_peer.py tiny_chain).
//   3. Elementwise fusion, DEFAULT threads (every hardware thread; run in a child process, because
//      flowlet reads its thread count once per process): the 8-op chain of tf_peer.py's `chain`
//      case over 16M f32. Traced with fusion <= 0.25x eager (at least 4x faster); traced without
//      fusion, TensorFlow eager, tf.function and XLA for information.
//   (Two concurrent GEMMs are measured by linalg/bench_linalg, so not here.)
// Every traced result is checked against the eager one before timing. libtorch and TensorFlow are
// optional peers: without them their rows say "not available".
#include <cblas.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <flowlet/flowlet.hpp>

#include "../harness.hpp"
#include "../mlp_step.hpp"
#include "../tf_peer.hpp"
#include "../torch_peer.hpp"

extern char** environ;

namespace fl = flowlet;
namespace bench = flowlet_bench;

namespace {

using namespace flowlet_bench::mlp;

// The first argument that makes this program run only section 3 (how the parent starts its child).
constexpr std::string_view kFusionChildFlag = "--fusion-section";

// --- small helpers ---

// `result` with its times divided by `n` (a chain of n ops -> time per op).
bench::Result per_op(const bench::Result& result, double n, std::string name) {
  bench::Result out{std::move(name), result.stats, result.missing};
  if (out.stats) {
    out.stats->median_ns /= n;
    out.stats->p10_ns /= n;
    out.stats->p90_ns /= n;
  }
  return out;
}

// A fixed figure to compare against (an absolute budget expressed as a "peer").
bench::Result budget(std::string name, double ns) {
  bench::Stats stats;
  stats.median_ns = stats.p10_ns = stats.p90_ns = ns;
  return bench::Result{std::move(name), stats, {}};
}

// A row for a figure derived from a measured one (e.g. per node), in Section's layout.
void print_derived_row(const bench::Result& result, std::string_view how) {
  if (!result.stats) {
    fmt::print("   {:<32} {}\n", result.name, result.missing);
    return;
  }
  const bench::Stats& s = *result.stats;
  fmt::print("   {:<32} {:>12}  [{}, {}]  ({})\n", result.name, bench::format_time_ns(s.median_ns),
             bench::format_time_ns(s.p10_ns), bench::format_time_ns(s.p90_ns), how);
}

// One tf_peer.py case, or the reason it is missing printed; nullopt without the peer.
std::optional<bench::TfRecord> tf_case(bool have_tf, const std::vector<std::string>& args) {
  if (!have_tf) return std::nullopt;
  std::string why;
  auto record = bench::run_tf_peer(args, &why);
  if (!record) bench::print_tf_unavailable(why);
  return record;
}

// The TensorFlow result for `mode`, printed as a row ("not available" without the peer).
bench::Result tf_row(const std::optional<bench::TfRecord>& record, const std::string& mode, std::string name) {
  bench::Result result =
      record ? bench::tf_result(*record, mode, std::move(name)) : bench::unavailable(std::move(name));
  bench::print_peer_row(result);
  return result;
}

double max_abs_diff(const fl::Tensor& a, const fl::Tensor& b) {
  return flowlet_bench::mlp::max_abs_difference(a.to_vector<float>(), b.to_vector<float>());
}

// TraceOptions by field (designated initializers trip -Wmissing-field-initializers).
fl::TraceOptions trace_options(std::string name, bool optimize = true, bool fuse_elementwise = true) {
  fl::TraceOptions options;
  options.name = std::move(name);
  options.optimize = optimize;
  options.fuse_elementwise = fuse_elementwise;
  return options;
}

// Live nodes of a graph by kind.
struct NodeCounts {
  int live = 0, ops = 0, constants = 0, arguments = 0;
};

NodeCounts count_nodes(const fl::Graph& graph) {
  NodeCounts counts;
  counts.live = static_cast<int>(graph.num_nodes());
  for (const fl::Node& node : graph.nodes()) {
    if (node.removed) continue;
    if (node.kind == fl::NodeKind::op) ++counts.ops;
    if (node.kind == fl::NodeKind::constant) ++counts.constants;
    if (node.kind == fl::NodeKind::argument) ++counts.arguments;
  }
  return counts;
}

// "N live nodes (A op, C constant, G argument)"
std::string describe_graph(const fl::Graph& graph) {
  const NodeCounts c = count_nodes(graph);
  return fmt::format("{} live nodes ({} op, {} constant, {} argument)", c.live, c.ops, c.constants, c.arguments);
}

// --- 1. MLP training step ---

// The step every flowlet row runs: eagerly as it is, traced wrapped in fl::trace.
auto make_step(FlowletMlp& model, fl::optim::SGD& sgd) {
  return [&model, &sgd](fl::Tensor x, fl::Tensor labels) { return model.train_step(sgd, x, labels); };
}

void compare_mlp_step(int64_t batch, bool have_tf) {
  const std::string label = fmt::format("MLP train step, batch {}", batch);
  const Batch data(batch);

  FlowletMlp eager_model, traced_model;  // identical fresh weights (same seeds)
  fl::optim::SGD eager_sgd(learning_rate), traced_sgd(learning_rate);
  auto eager_step = make_step(eager_model, eager_sgd);
  auto traced_step = fl::trace(make_step(traced_model, traced_sgd), trace_options("mlp step"));

  // Three steps each from the same weights: equal losses mean the graph computes the step and
  // applies each update exactly once per call.
  try {
    std::string losses;
    double worst_loss = 0;
    for (int step = 1; step <= 3; ++step) {
      float eager_loss = eager_step(data.x, data.labels).to_vector<float>()[0];
      float traced_loss = traced_step(data.x, data.labels).to_vector<float>()[0];
      double diff = std::fabs(static_cast<double>(eager_loss) - traced_loss);
      worst_loss = std::max(worst_loss, diff);
      losses += fmt::format("{}step {}: eager {:.6f} traced {:.6f} |diff| {:.2e}", step == 1 ? "" : "; ", step,
                            eager_loss, traced_loss, diff);
    }
    double weight_diff = max_abs_diff(eager_model.hidden->weight.value(), traced_model.hidden->weight.value());
    fmt::print("   check {}: {}\n", label, losses);
    fmt::print("   check {}: hidden/weight after 3 steps max |diff| {:.2e}; traced graph {}, traced {} time(s){}\n",
               label, weight_diff, describe_graph(traced_step.graph(data.x, data.labels)), traced_step.trace_count(),
               worst_loss <= 1e-5 && weight_diff <= 1e-5 ? "" : "  WARNING: over 1e-5, the timing below means little");
  } catch (const std::exception& error) {
    fmt::print("   check {} failed: {}\n", label, error.what());
  }

  bench::Section section(label, bench::Metric::time(),
                         "time per step (forward, backward, SGD update), 784-256-10 ReLU, 1 thread");
  bench::Result eager = section.run("flowlet eager", [&] { bench::do_not_optimize(eager_step(data.x, data.labels)); });
  bench::Result traced =
      section.run("flowlet traced", [&] { bench::do_not_optimize(traced_step(data.x, data.labels)); });
  if (traced_step.trace_count() != 1) {
    fmt::print("   WARNING: the traced step was traced {} times ({})\n", traced_step.trace_count(),
               traced_step.last_retrace_reason());
  }
#ifdef FLOWLET_BENCH_HAVE_TORCH
  FlowletMlp initial;  // libtorch starts from the same fresh weights
  TorchMlp peer(initial);
  at::Tensor tx = to_torch(data.x);
  at::Tensor tlabels = to_torch(data.labels);
  bench::Result torch = section.run("libtorch eager", [&] { bench::do_not_optimize(peer.train_step(tx, tlabels)); });
#else
  bench::Result torch = section.skip("libtorch eager");
#endif
  auto tf = tf_case(have_tf, {"mlp_step", "--batch", std::to_string(batch), "--threads", "1"});
  bench::Result tf_eager = tf_row(tf, "eager", "TensorFlow eager");
  bench::Result tf_function = tf_row(tf, "function", "TensorFlow tf.function");
  bench::Result tf_xla = tf_row(tf, "xla", "TensorFlow XLA (information)");
  if (tf) {
    fmt::print("   (TensorFlow's first-step loss {:.4f}: its own Glorot draw from numpy, not flowlet's weights)\n",
               tf->number("loss_first_step").value_or(NAN));
  }

  if (batch == 1) {
    section.compare(traced, eager, bench::Target::at_most(1.0 / 3.0, "at least 3x faster"));
    section.compare(traced, torch, bench::Target::at_most(0.1, "aim 0.05"));
  } else {
    section.compare(traced, eager, std::nullopt);
    section.compare(traced, torch, bench::Target::at_most(0.6));
  }
  section.compare(traced, tf_function, bench::Target::at_most(1.0));
  section.compare(traced, tf_eager, std::nullopt);
  section.compare(traced, tf_xla, std::nullopt);
}

// --- 2. executor overhead ---

constexpr int kChainOps = 1000;

fl::Tensor tiny_chain(fl::Tensor t) {
  for (int i = 0; i < kChainOps; ++i) t = t + 1.0f;
  return t;
}

void compare_executor_overhead(bool have_tf) {
  const std::string label = fmt::format("executor overhead, {} chained adds", kChainOps);
  const fl::Tensor x = fl::tensor(std::vector<float>{0.0f}, fl::Shape{1});
  // Fusion off: it would merge the chain into one node. The scalars fold into one constant.
  auto traced = fl::trace(tiny_chain, trace_options("tiny chain", /*optimize=*/true, /*fuse_elementwise=*/false));

  int op_nodes = 0;  // what the executor runs per call: each add, and the scalar it adds when recorded as an op
  try {
    float eager_value = tiny_chain(x).to_vector<float>()[0];
    float traced_value = traced(x).to_vector<float>()[0];
    op_nodes = count_nodes(traced.graph(x)).ops;
    fmt::print("   check {}: eager {} traced {} (expected {}); traced graph {}{}\n", label, eager_value, traced_value,
               kChainOps, describe_graph(traced.graph(x)),
               eager_value == kChainOps && traced_value == kChainOps ? "" : "  WARNING: wrong result");
  } catch (const std::exception& error) {
    fmt::print("   check {} failed: {}\n", label, error.what());
  }

  bench::Section section(label, bench::Metric::time(),
                         "`t = t + 1.0f` on 1 f32 element, time per whole chain, 1 thread");
  bench::Result traced_chain =
      section.run("flowlet traced (no fusion)", [&] { bench::do_not_optimize(traced(x)); });
  bench::Result eager_chain = section.run("flowlet eager", [&] { bench::do_not_optimize(tiny_chain(x)); });
  auto tf = tf_case(have_tf, {"tiny_chain", "--n", std::to_string(kChainOps), "--threads", "1"});
  bench::Result tf_chain = tf_row(tf, "function", "TensorFlow tf.function");
  tf_row(tf, "function_grappler", "TF tf.function, Grappler on");

  bench::Section per_node(label + " per node", bench::Metric::time(), fmt::format("the chain's time / {}", kChainOps));
  const std::string how = fmt::format("chain / {}", kChainOps);
  bench::Result traced_node = per_op(traced_chain, kChainOps, "flowlet traced");
  bench::Result eager_node = per_op(eager_chain, kChainOps, "flowlet eager");
  bench::Result tf_node = per_op(tf_chain, kChainOps, "TensorFlow tf.function");
  for (const bench::Result* row : {&traced_node, &eager_node, &tf_node}) print_derived_row(*row, how);
  if (op_nodes > 0 && op_nodes != kChainOps) {  // e.g. 2000: every `+ 1.0f` also records its scalar
    print_derived_row(per_op(traced_chain, op_nodes, "flowlet traced, per op node"),
                      fmt::format("chain / {} op nodes the executor runs; information", op_nodes));
  }
  per_node.compare(traced_node, budget("budget", 300), bench::Target::at_most(1.0, "300 ns per node"));
  per_node.compare(traced_node, eager_node, std::nullopt);
  per_node.compare(traced_node, tf_node, std::nullopt);
}

// --- 3. elementwise fusion (default threads; runs in the child process) ---

constexpr int64_t kChainElements = int64_t{16} << 20;

// tf_peer.py's `chain` case, op for op.
fl::Tensor elementwise_chain(fl::Tensor x) {
  fl::Tensor t = x * 1.5f;
  t = t + 0.5f;
  t = fl::tanh(t);
  t = t * t;
  t = t - 0.25f;
  t = fl::exp(t);
  t = t * 0.5f;
  t = fl::maximum(t, fl::scalar_like(t, 0.1, "maximum"));
  return t;
}

void compare_fusion(bool have_tf) {
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  const std::string label = "8-op elementwise chain, 16M f32";
  const fl::Tensor x = fl::randn(fl::Shape{kChainElements}, /*seed=*/0);
  auto fused = fl::trace(elementwise_chain, trace_options("chain fused"));
  auto unfused =
      fl::trace(elementwise_chain, trace_options("chain unfused", /*optimize=*/true, /*fuse_elementwise=*/false));

  try {
    fl::Tensor expected = elementwise_chain(x);
    double fused_diff = max_abs_diff(expected, fused(x));
    double unfused_diff = max_abs_diff(expected, unfused(x));
    fmt::print("   check {}: max |eager - traced| fused {:.2e}, without fusion {:.2e}{}\n", label, fused_diff,
               unfused_diff, fused_diff <= 1e-5 && unfused_diff <= 1e-5 ? "" : "  WARNING: over 1e-5");
    fmt::print("   graph with fusion: {}\n   graph without fusion: {}\n", describe_graph(fused.graph(x)),
               describe_graph(unfused.graph(x)));
  } catch (const std::exception& error) {
    fmt::print("   check {} failed: {}\n", label, error.what());
  }

  bench::Section section(label, bench::Metric::time(),
                         fmt::format("x*1.5, +0.5, tanh, t*t, -0.25, exp, *0.5, maximum(t, 0.1); time per call, "
                                     "default threads ({} hardware threads, FLOWLET_NUM_THREADS unset; "
                                     "TensorFlow --threads {})",
                                     threads, threads));
  bench::Result eager = section.run("flowlet eager", [&] { bench::do_not_optimize(elementwise_chain(x)); });
  bench::Result traced = section.run("flowlet traced (fused)", [&] { bench::do_not_optimize(fused(x)); });
  bench::Result traced_unfused =
      section.run("flowlet traced (no fusion)", [&] { bench::do_not_optimize(unfused(x)); });
  auto tf = tf_case(have_tf, {"chain", "--threads", std::to_string(threads)});
  bench::Result tf_eager = tf_row(tf, "eager", "TensorFlow eager");
  bench::Result tf_function = tf_row(tf, "function", "TensorFlow tf.function");
  bench::Result tf_xla = tf_row(tf, "xla", "TensorFlow XLA");

  section.compare(traced, eager, bench::Target::at_most(0.25, "at least 4x faster"));
  section.compare(traced_unfused, eager, std::nullopt);
  section.compare(traced, tf_function, std::nullopt);
  section.compare(traced, tf_xla, std::nullopt);
}

// Section 3 in a child process with FLOWLET_NUM_THREADS removed from its environment: flowlet reads
// its thread count once per process, and this one is pinned to one thread.
void run_fusion_in_child(bool have_tf) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) {
    if (std::strncmp(*e, "FLOWLET_NUM_THREADS=", 20) != 0) env_strings.emplace_back(*e);
  }
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string self = "/proc/self/exe", flag(kFusionChildFlag), tf_flag = have_tf ? "tf" : "no-tf";
  char* argv[] = {self.data(), flag.data(), tf_flag.data(), nullptr};

  std::fflush(nullptr);  // our output first, then the child's
  pid_t pid = 0;
  if (int error = posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv, envp.data()); error != 0) {
    fmt::print("\n-- fusion section: could not start the child process: {}\n", std::strerror(error));
    return;
  }
  int status = 0;
  if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fmt::print("   fusion section: child process ended abnormally (status {})\n", status);
  }
}

void run_all() {
  const char* flowlet_threads = std::getenv("FLOWLET_NUM_THREADS");
  fmt::print("   threads: sections 1-2 FLOWLET_NUM_THREADS={}, openblas {}; section 3 default threads\n",
             flowlet_threads ? flowlet_threads : "(unset)", openblas_get_num_threads());
  const bool have_tf = bench::print_tf_setup();
  compare_mlp_step(1, have_tf);
  compare_mlp_step(64, have_tf);
  compare_executor_overhead(have_tf);
  run_fusion_in_child(have_tf);
  fmt::print("\n-- two concurrent GEMMs: measured by linalg/bench_linalg (\"two at once\"), not repeated here\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && argv[1] == kFusionChildFlag) {
    try {
      compare_fusion(argc >= 3 && std::string_view(argv[2]) == "tf");
    } catch (const std::exception& error) {
      fmt::print("bench_trace (fusion): stopped early: {}\n", error.what());
    }
    return 0;
  }
  // One thread for sections 1 and 2, set before any flowlet call (its pool reads the variable once).
  setenv("FLOWLET_NUM_THREADS", "1", /*overwrite=*/1);
  openblas_set_num_threads(1);
#ifdef FLOWLET_BENCH_HAVE_TORCH
  at::set_num_threads(1);
#endif
  return bench::run_benchmark("bench_trace", "traced functions vs eager, libtorch and TensorFlow (f32)",
                              /*torch_uses_all_threads=*/false, run_all);
}
