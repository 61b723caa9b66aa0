// The conv fusion pass (src/trace/passes/conv_fusion.cpp): where it fires (node counts and the
// convolution's activation in the optimized graph: relu into conv2d in inference and training
// graphs, batch_norm_inference folded into conv2d, both at once), where it must not (the
// convolution's output has another user, another output of the function, the pass switched off),
// and that fused graphs compute what the unfused graph, eager execution and a naive f64 loop do.
#include <cstdlib>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "flowlet/graph.hpp"
#include "flowlet/layers.hpp"
#include "flowlet/ops/conv.hpp"
#include "flowlet/ops/normalization.hpp"
#include "flowlet/trace.hpp"
#include "support/pass_switch.hpp"
#include "support/reference.hpp"

namespace {

using Tensors = std::vector<fl::Tensor>;

// FLOWLET_CONV_FUSION set for a scope (graphs traced inside see it).
struct ConvFusionSetting : test::PassSwitch {
  explicit ConvFusionSetting(bool on) : PassSwitch("FLOWLET_CONV_FUSION", on) {}
};

using test::count_ops;

enum class Act { none, relu, other };

// The activations of the graph's live conv2d nodes, in order, read from their attribute text
// ("..., activation=relu": src/ops/conv_attrs.hpp), so this test needs no internal header.
std::vector<Act> conv_activations(const fl::Graph& graph) {
  std::vector<Act> found;
  for (const fl::Node& node : graph.nodes()) {
    if (node.removed || node.kind != fl::NodeKind::op || node.op->name != "conv2d") continue;
    const std::string text = node.op->describe_attributes(node.attributes.get());
    found.push_back(text.ends_with("activation=relu") ? Act::relu : text.ends_with("activation=none") ? Act::none : Act::other);
  }
  return found;
}

fl::Tensor random(const fl::Shape& shape, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  return fl::uniform(shape, lo, hi, seed, fl::f64);
}

// Naive f64 convolution from the stored values: x [N,C,H,W], w [O,C/g,kH,kW], explicit padding.
std::vector<double> naive_conv(const fl::Tensor& x, const fl::Tensor& w, const std::vector<double>& bias,
                               const fl::Conv2dOptions& o, fl::Shape& out_shape) {
  const std::vector<double> xv = test::values(x), wv = test::values(w);
  const int64_t n = x.shape()[0], c = x.shape()[1], h = x.shape()[2], wd = x.shape()[3];
  const int64_t oc = w.shape()[0], cg = w.shape()[1], kh = w.shape()[2], kw = w.shape()[3];
  const int64_t g = o.groups, og = oc / g;
  const fl::Padding p = o.padding;
  const int64_t oh = (h + p.top + p.bottom - o.dilation.h * (kh - 1) - 1) / o.stride.h + 1;
  const int64_t ow = (wd + p.left + p.right - o.dilation.w * (kw - 1) - 1) / o.stride.w + 1;
  out_shape = fl::Shape{n, oc, oh, ow};
  std::vector<double> y(static_cast<size_t>(n * oc * oh * ow));
  for (int64_t b = 0; b < n; ++b)
    for (int64_t o2 = 0; o2 < oc; ++o2)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          double sum = bias.empty() ? 0.0 : bias[static_cast<size_t>(o2)];
          const int64_t group = o2 / og;
          for (int64_t ci = 0; ci < cg; ++ci)
            for (int64_t a = 0; a < kh; ++a)
              for (int64_t e = 0; e < kw; ++e) {
                const int64_t r = i * o.stride.h - p.top + a * o.dilation.h;
                const int64_t s = j * o.stride.w - p.left + e * o.dilation.w;
                if (r < 0 || r >= h || s < 0 || s >= wd) continue;
                const int64_t channel = group * cg + ci;
                sum += xv[static_cast<size_t>(((b * c + channel) * h + r) * wd + s)] *
                       wv[static_cast<size_t>(((o2 * cg + ci) * kh + a) * kw + e)];
              }
          y[static_cast<size_t>(((b * oc + o2) * oh + i) * ow + j)] = sum;
        }
  (void)c;
  return y;
}

struct ConvCase {
  const char* name;
  fl::Shape x, w;
  fl::Conv2dOptions options;
  bool bias = true;
};

const std::vector<ConvCase> kCases = {
    {"3x3 pad 1", {2, 3, 6, 5}, {4, 3, 3, 3}, {.padding = 1}},
    {"stride 2, no bias", {2, 3, 7, 7}, {4, 3, 3, 3}, {.stride = 2, .padding = 1}, false},
    {"dilation 2, groups 2", {1, 4, 8, 7}, {6, 2, 3, 3}, {.padding = 2, .dilation = 2, .groups = 2}},
    {"5x5 asymmetric padding", {2, 1, 6, 6}, {3, 1, 5, 5}, {.padding = fl::Padding::explicit_sides(2, 1, 0, 2)}},
};

fl::Tensor conv(const fl::Tensor& x, const fl::Tensor& w, const fl::Tensor& b, const ConvCase& c) {
  return c.bias ? fl::conv2d(x, w, b, c.options) : fl::conv2d(x, w, c.options);
}

void check_close(const fl::Tensor& got, const fl::Tensor& want, double tol = 1e-12) {
  REQUIRE(got.shape() == want.shape());
  CHECK(test::check_values(test::values(got), test::values(want), test::Tolerance{tol, tol}));
}

}  // namespace

TEST_CASE("relu(conv2d) becomes one conv2d with activation relu, equal to eager, unfused and a naive loop") {
  for (const ConvCase& c : kCases) {
    const std::string name = c.name;
    CAPTURE(name);
    const fl::Tensor x = random(c.x, 1), w = random(c.w, 2), b = random(fl::Shape{c.w[0]}, 3);
    auto f = [&c](const fl::Tensor& xa, const fl::Tensor& wa, const fl::Tensor& ba) {
      return fl::relu(conv(xa, wa, ba, c));
    };
    auto fused = fl::trace(f);
    const fl::Graph& graph = fused.graph(x, w, b);
    graph.check_invariants();
    CHECK(count_ops(graph, "relu") == 0);
    CHECK(conv_activations(graph) == std::vector{Act::relu});

    const fl::Tensor got = fused(x, w, b);
    check_close(got, f(x, w, b));
    ConvFusionSetting off(false);
    auto unfused = fl::trace(f);
    CHECK(count_ops(unfused.graph(x, w, b), "relu") == 1);
    CHECK(conv_activations(unfused.graph(x, w, b)) == std::vector{Act::none});
    check_close(got, unfused(x, w, b));
    fl::Shape shape;
    std::vector<double> want = naive_conv(x, w, c.bias ? test::values(b) : std::vector<double>{}, c.options, shape);
    for (double& v : want) v = std::max(v, 0.0);
    CHECK(test::check_tensor(got, want, shape, fl::f64, test::Tolerance{1e-12, 1e-12}));
  }
}

TEST_CASE("training graph: relu's gradient reads the fused convolution's output; gradients equal eager and unfused") {
  for (const ConvCase& c : kCases) {
    const std::string name = c.name;
    CAPTURE(name);
    const fl::Tensor x = random(c.x, 11), w = random(c.w, 12), b = random(fl::Shape{c.w[0]}, 13);
    fl::Shape y_shape;
    (void)naive_conv(x, w, {}, c.options, y_shape);
    const fl::Tensor weights = random(y_shape, 14);  // loss = sum(relu(conv) * weights)
    auto step = [&c, &weights](const fl::Tensor& xa, const fl::Tensor& wa, const fl::Tensor& ba) {
      fl::GradientTape tape;
      tape.watch(xa);
      tape.watch(wa);
      tape.watch(ba);
      const fl::Tensor loss = fl::sum(fl::relu(conv(xa, wa, ba, c)) * weights);
      Tensors grads = tape.gradient(loss, Tensors{xa, wa, ba});
      grads.insert(grads.begin(), loss);
      if (!c.bias) grads.pop_back();  // no gradient for an unused bias
      return grads;
    };
    const Tensors eager = step(x, w, b);
    auto fused = fl::trace(step);
    const fl::Graph& graph = fused.graph(x, w, b);
    graph.check_invariants();
    CHECK(count_ops(graph, "relu") == 0);
    CHECK(conv_activations(graph) == std::vector{Act::relu});
    const Tensors got = fused(x, w, b);
    REQUIRE(got.size() == eager.size());
    for (size_t i = 0; i < got.size(); ++i) check_close(got[i], eager[i], 1e-11);
    ConvFusionSetting off(false);
    auto unfused = fl::trace(step);
    CHECK(conv_activations(unfused.graph(x, w, b)) == std::vector{Act::none});  // (its relu may join a fused node)
    const Tensors plain = unfused(x, w, b);
    for (size_t i = 0; i < got.size(); ++i) check_close(got[i], plain[i], 1e-11);
  }
}

TEST_CASE("relu(conv2d) stays unfused when the convolution's output has another user") {
  const fl::Tensor x = random({2, 3, 5, 5}, 21), w = random({4, 3, 3, 3}, 22), b = random({4}, 23);
  SUBCASE("another op reads it") {
    auto f = [](const fl::Tensor& xa, const fl::Tensor& wa, const fl::Tensor& ba) {
      const fl::Tensor y = fl::conv2d(xa, wa, ba, {.padding = 1});
      return fl::relu(y) + y * 0.5;
    };
    auto traced = fl::trace(f);
    const fl::Graph& graph = traced.graph(x, w, b);
    CHECK(conv_activations(graph) == std::vector{Act::none});
    check_close(traced(x, w, b), f(x, w, b));
  }
  SUBCASE("it is also an output") {
    auto f = [](const fl::Tensor& xa, const fl::Tensor& wa, const fl::Tensor& ba) {
      const fl::Tensor y = fl::conv2d(xa, wa, ba, {.padding = 1});
      return Tensors{fl::relu(y), y};
    };
    auto traced = fl::trace(f);
    const fl::Graph& graph = traced.graph(x, w, b);
    CHECK(count_ops(graph, "relu") + count_ops(graph, "fused_elementwise") == 1);
    CHECK(conv_activations(graph) == std::vector{Act::none});
    const Tensors got = traced(x, w, b), want = f(x, w, b);
    check_close(got[0], want[0]);
    check_close(got[1], want[1]);
    CHECK(fl::max(-got[1]).item<double>() > 0.0);  // the output kept its negative values
  }
  SUBCASE("a comparison other than > 0 reads it") {
    auto f = [](const fl::Tensor& xa, const fl::Tensor& wa, const fl::Tensor& ba) {
      const fl::Tensor y = fl::conv2d(xa, wa, ba, {.padding = 1});
      return fl::where(y > -0.25, fl::relu(y), fl::zeros_like(y));
    };
    auto traced = fl::trace(f);
    CHECK(conv_activations(traced.graph(x, w, b)) == std::vector{Act::none});
    check_close(traced(x, w, b), f(x, w, b));
  }
  SUBCASE("switched off: FLOWLET_CONV_FUSION=0 and TraceOptions::optimize = false") {
    auto f = [](const fl::Tensor& xa, const fl::Tensor& wa, const fl::Tensor& ba) {
      return fl::relu(fl::conv2d(xa, wa, ba, {.padding = 1}));
    };
    fl::TraceOptions no_passes;
    no_passes.optimize = false;
    auto plain = fl::trace(f, no_passes);
    CHECK(conv_activations(plain.graph(x, w, b)) == std::vector{Act::none});
    ConvFusionSetting off(false);
    auto traced = fl::trace(f);
    CHECK(conv_activations(traced.graph(x, w, b)) == std::vector{Act::none});
  }
}

TEST_CASE("batch_norm_inference(conv2d) folds into the convolution's weight and bias") {
  for (const ConvCase& c : kCases) {
    const std::string name = c.name;
    CAPTURE(name);
    const int64_t o = c.w[0];
    const fl::Tensor x = random(c.x, 31), w = random(c.w, 32), b = random(fl::Shape{o}, 33);
    const fl::Tensor gamma = random({o}, 34, 0.5, 2.0), beta = random({o}, 35), mean = random({o}, 36);
    const fl::Tensor var = random({o}, 37, 0.1, 3.0);
    for (const bool with_relu : {false, true}) {
      CAPTURE(with_relu);
      auto f = [&c, with_relu](const fl::Tensor& xa, const fl::Tensor& wa, const fl::Tensor& ba, const fl::Tensor& g,
                               const fl::Tensor& be, const fl::Tensor& m, const fl::Tensor& v) {
        const fl::Tensor y = fl::batch_norm_inference(conv(xa, wa, ba, c), g, be, m, v, 1e-3);
        return with_relu ? fl::relu(y) : y;
      };
      auto fused = fl::trace(f);
      const fl::Graph& graph = fused.graph(x, w, b, gamma, beta, mean, var);
      graph.check_invariants();
      CHECK(count_ops(graph, "batch_norm_inference") == 0);
      CHECK(count_ops(graph, "relu") == 0);
      CHECK(conv_activations(graph) ==
            std::vector{with_relu ? Act::relu : Act::none});
      const fl::Tensor got = fused(x, w, b, gamma, beta, mean, var);
      check_close(got, f(x, w, b, gamma, beta, mean, var), 1e-11);
      {
        ConvFusionSetting off(false);
        auto unfused = fl::trace(f);
        CHECK(count_ops(unfused.graph(x, w, b, gamma, beta, mean, var), "batch_norm_inference") == 1);
        check_close(got, unfused(x, w, b, gamma, beta, mean, var), 1e-11);
      }
      // The naive loop: (conv - mean) / sqrt(var + eps) * gamma + beta per channel.
      fl::Shape shape;
      std::vector<double> want = naive_conv(x, w, c.bias ? test::values(b) : std::vector<double>{}, c.options, shape);
      const std::vector<double> g = test::values(gamma), be = test::values(beta), m = test::values(mean),
                                v = test::values(var);
      const int64_t plane = shape[2] * shape[3];
      for (size_t i = 0; i < want.size(); ++i) {
        const auto ch = static_cast<size_t>((static_cast<int64_t>(i) / plane) % o);
        want[i] = (want[i] - m[ch]) / std::sqrt(v[ch] + 1e-3) * g[ch] + be[ch];
        if (with_relu) want[i] = std::max(want[i], 0.0);
      }
      CHECK(test::check_tensor(got, want, shape, fl::f64, test::Tolerance{1e-11, 1e-11}));
    }
  }
}

TEST_CASE("the folded weights are graph nodes: a traced BatchNorm2d model follows its variables between calls") {
  fl::nn::Conv2d layer(3, 4, fl::Size2{3}, /*seed=*/5, {.padding = 1}, "conv", true, fl::f64);
  fl::nn::BatchNorm2d norm(4, 0.1, 1e-5, "bn", fl::f64);
  norm.eval();
  auto f = [&](const fl::Tensor& x) { return fl::relu(norm(layer(x))); };
  const fl::Tensor x = random({2, 3, 5, 5}, 41);
  auto traced = fl::trace(f);
  const fl::Graph& graph = traced.graph(x);
  CHECK(count_ops(graph, "batch_norm_inference") == 0);
  CHECK(conv_activations(graph) == std::vector{Act::relu});
  check_close(traced(x), f(x), 1e-12);
  // New statistics, scale and weights: the same graph must compute with them.
  norm.running_mean.assign(random({4}, 42));
  norm.running_var.assign(random({4}, 43, 0.2, 2.0));
  norm.gamma.assign(random({4}, 44, 0.5, 1.5));
  layer.weight.assign(random({4, 3, 3, 3}, 45));
  const fl::Tensor got = traced(x);
  CHECK(traced.trace_count() == 1);
  check_close(got, f(x), 1e-12);
}

TEST_CASE("batch norm does not fold when the convolution's output has another user, or in training mode") {
  const fl::Tensor x = random({2, 3, 5, 5}, 51), w = random({4, 3, 3, 3}, 52), b = random({4}, 53);
  const fl::Tensor gamma = random({4}, 54, 0.5, 2.0), beta = random({4}, 55), mean = random({4}, 56);
  const fl::Tensor var = random({4}, 57, 0.1, 3.0);
  auto shared = [](const fl::Tensor& xa, const fl::Tensor& wa, const fl::Tensor& ba, const fl::Tensor& g,
                   const fl::Tensor& be, const fl::Tensor& m, const fl::Tensor& v) {
    const fl::Tensor y = fl::conv2d(xa, wa, ba, {.padding = 1});
    return fl::batch_norm_inference(y, g, be, m, v) + y;
  };
  auto traced = fl::trace(shared);
  CHECK(count_ops(traced.graph(x, w, b, gamma, beta, mean, var), "batch_norm_inference") == 1);
  check_close(traced(x, w, b, gamma, beta, mean, var), shared(x, w, b, gamma, beta, mean, var));

  auto training = [](const fl::Tensor& xa, const fl::Tensor& wa, const fl::Tensor& ba, const fl::Tensor& g,
                     const fl::Tensor& be) {
    return fl::batch_norm_training(fl::conv2d(xa, wa, ba, {.padding = 1}), g, be).y;
  };
  auto traced_training = fl::trace(training);
  CHECK(count_ops(traced_training.graph(x, w, b, gamma, beta), "batch_norm_training") == 1);
  check_close(traced_training(x, w, b, gamma, beta), training(x, w, b, gamma, beta));
}
