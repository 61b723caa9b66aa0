// trace(): traced calls equal eager calls; signatures, retracing and its reasons; symbolic tensors;
// variables as ordered stateful nodes; training steps; errors inside graphs; timelines; the bounded
// graph cache and concurrent first calls.
#include <atomic>
#include <chrono>
#include <thread>
#include <tuple>

#include "support/reference.hpp"

namespace {

fl::Tensor affine(const fl::Tensor& x, const fl::Tensor& w) { return fl::tanh(fl::matmul(x, w) * 2.0f + 1.0f); }

std::vector<float> values(const fl::Tensor& t) { return t.to_vector<float>(); }

void check_close(const fl::Tensor& got, const fl::Tensor& want, double tolerance) {
  REQUIRE(got.shape() == want.shape());
  const std::vector<float> g = values(got), w = values(want);
  for (size_t i = 0; i < g.size(); ++i) CHECK(g[i] == doctest::Approx(w[i]).epsilon(tolerance));
}

}  // namespace

TEST_CASE("a traced call equals the eager call, and a known signature does not retrace") {
  const fl::Tensor w = fl::randn({5, 3}, 7);
  auto f = fl::trace([&](fl::Tensor x) { return affine(x, w); });
  const fl::Tensor x = fl::randn({8, 5}, 1);
  CHECK(values(f(x)) == values(affine(x, w)));
  const fl::Tensor x2 = fl::randn({8, 5}, 2);
  CHECK(values(f(x2)) == values(affine(x2, w)));
  CHECK(f.trace_count() == 1);
  CHECK(f.last_retrace_reason() == "first call");
}

TEST_CASE("a new shape, dtype or value retraces, and the reason is a diff against the cached signature") {
  int traced = 0;
  auto f = fl::trace([&](fl::Tensor x, int power) {
    ++traced;  // C++ side effects run at trace time only
    fl::Tensor y = x;
    for (int i = 1; i < power; ++i) y = y * x;
    return y;
  });
  const fl::Tensor x85 = fl::ones({8, 5});
  const fl::Tensor x165 = fl::ones({16, 5});
  f(x85, 2);
  f(x85, 2);
  CHECK(traced == 1);
  f(x165, 2);
  CHECK(f.trace_count() == 2);
  CHECK(f.last_retrace_reason() == "argument 0: shape [8, 5] -> [16, 5]");
  f(x85, 3);
  CHECK(f.last_retrace_reason() == "argument 1: value 2 -> 3");
  f(x85.astype(fl::f64), 3);
  CHECK(f.last_retrace_reason() == "argument 0: dtype f32 -> f64");
  CHECK(traced == 4);
  CHECK(f.trace_count() == 4);
  // Earlier signatures stay cached.
  f(x165, 2);
  CHECK(f.trace_count() == 4);
  CHECK(values(f(fl::full({2}, 3.0), 3)) == std::vector<float>{27, 27});
}

TEST_CASE("lambdas returning a vector or a tuple of tensors, and taking tensor lists") {
  auto pair = fl::trace([](fl::Tensor a, fl::Tensor b) { return std::tuple<fl::Tensor, fl::Tensor>{a + b, a * b}; });
  auto [s, p] = pair(fl::tensor({1.0f, 2.0f}), fl::tensor({3.0f, 4.0f}));
  CHECK(values(s) == std::vector<float>{4, 6});
  CHECK(values(p) == std::vector<float>{3, 8});

  auto list = fl::trace([](std::vector<fl::Tensor> ts) {
    std::vector<fl::Tensor> out;
    for (const auto& t : ts) out.push_back(-t);
    out.push_back(ts[0]);  // an argument returned as is
    return out;
  });
  const std::vector<fl::Tensor> outs = list(std::vector<fl::Tensor>{fl::tensor({1.0f}), fl::tensor({2.0f, 5.0f})});
  REQUIRE(outs.size() == 3);
  CHECK(values(outs[0]) == std::vector<float>{-1});
  CHECK(values(outs[1]) == std::vector<float>{-2, -5});
  CHECK(values(outs[2]) == std::vector<float>{1});
}

TEST_CASE("reading a symbolic tensor while tracing throws and says what to do instead") {
  auto f = fl::trace([](fl::Tensor x) {
    if (x.is_symbolic()) (void)fl::sum(x).item<float>();
    return x;
  });
  test::check_throws<fl::InvalidArgument>([&] { f(fl::ones({3})); },
                                          {"item:", "symbolic tensor", "flowlet::print", "return the tensor"});
  auto g = fl::trace([](fl::Tensor x) { return fl::Tensor(x.data<float>() ? x : x); });
  test::check_throws<fl::InvalidArgument>([&] { g(fl::ones({3})); }, {"data:", "symbolic tensor"});
}

TEST_CASE("a symbolic tensor kept past its trace is rejected when used eagerly") {
  fl::Tensor leaked;
  auto f = fl::trace([&](fl::Tensor x) {
    leaked = x * 2.0f;
    return leaked;
  });
  f(fl::ones({2}));
  CHECK(leaked.is_symbolic());
  test::check_throws<fl::InvalidArgument>([&] { (void)(leaked + 1.0f); }, {"symbolic tensor", "outside the trace"});
}

TEST_CASE("variable reads and updates run at every call, in program order") {
  fl::Variable v(fl::zeros({2}), "counter");
  auto step = fl::trace([&]() {
    const fl::Tensor before = v.value();
    v.assign_add(fl::ones({2}));
    const fl::Tensor after = v.value();
    v.assign(after * 2.0f);
    return std::vector<fl::Tensor>{before, after, v.value()};
  });
  // Eagerly: before 0, after 1, then 2. Traced calls continue from there: 2 -> 3 -> 6, and so on.
  for (float expected_before : {0.0f, 2.0f, 6.0f}) {
    const auto out = step();
    CHECK(values(out[0]) == std::vector<float>(2, expected_before));
    CHECK(values(out[1]) == std::vector<float>(2, expected_before + 1));
    CHECK(values(out[2]) == std::vector<float>(2, 2 * (expected_before + 1)));
  }
  CHECK(step.trace_count() == 1);
  CHECK(values(v.value()) == std::vector<float>(2, 14));
}

TEST_CASE("an update nobody reads still runs; a function may return nothing") {
  fl::Variable v(fl::zeros({}), "ticks");
  auto tick = fl::trace([&]() { v.assign_add(fl::ones({})); });
  tick();
  tick();
  tick();
  CHECK(v.value().item<float>() == 3.0f);
  const fl::Graph& g = tick.graph();
  bool has_assign = false;
  for (const fl::Node& n : g.nodes()) has_assign |= !n.removed && n.op && n.op->name == "assign_variable";
  CHECK(has_assign);
}

TEST_CASE("host callbacks run at every call, in order, with concrete values") {
  std::vector<float> seen;
  auto f = fl::trace([&](fl::Tensor x) {
    fl::Tensor y = x * 3.0f;
    fl::host_callback([&](const std::vector<fl::Tensor>& v) { seen.push_back(fl::sum(v[0]).item<float>()); }, {y});
    fl::host_callback([&](const std::vector<fl::Tensor>& v) { seen.push_back(v[0].item<float>() * 100); }, {x});
    return fl::print(y, "y");
  });
  f(fl::tensor({1.0f}));
  f(fl::tensor({2.0f}));
  CHECK(seen == std::vector<float>{3, 100, 6, 200});
}

TEST_CASE("a traced training step matches the eager one, step after step (SGD, SGD with momentum, Adam)") {
  const fl::Tensor x = fl::randn({16, 6}, 11);
  const fl::Tensor labels = fl::tensor(std::vector<int64_t>{0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0}, {16});
  for (int which = 0; which < 3; ++which) {
    CAPTURE(which);
    auto make = [&](std::vector<fl::Variable>& vars) {
      vars = {fl::Variable(fl::randn({6, 8}, 1) * 0.3f, "w1"), fl::Variable(fl::zeros({8}), "b1"),
              fl::Variable(fl::randn({8, 3}, 2) * 0.3f, "w2")};
    };
    std::vector<fl::Variable> eager_vars, traced_vars;
    make(eager_vars);
    make(traced_vars);
    std::unique_ptr<fl::optim::Optimizer> eager_opt, traced_opt;
    if (which == 0) {
      eager_opt = std::make_unique<fl::optim::SGD>(0.1, 0.9);
      traced_opt = std::make_unique<fl::optim::SGD>(0.1, 0.9);
    } else if (which == 1) {
      eager_opt = std::make_unique<fl::optim::Adam>(0.01);
      traced_opt = std::make_unique<fl::optim::Adam>(0.01);
    } else {
      eager_opt = std::make_unique<fl::optim::SGD>(0.1);
      traced_opt = std::make_unique<fl::optim::SGD>(0.1);
    }
    auto loss_of = [](const std::vector<fl::Variable>& v, const fl::Tensor& xb, const fl::Tensor& yb) {
      const fl::Tensor h = fl::relu(fl::matmul(xb, v[0]) + v[1]);
      return fl::mean(fl::softmax_cross_entropy(fl::matmul(h, v[2]), yb));
    };
    auto step = [&](std::vector<fl::Variable>& v, fl::optim::Optimizer& opt, const fl::Tensor& xb, const fl::Tensor& yb) {
      fl::GradientTape tape;
      const fl::Tensor loss = loss_of(v, xb, yb);
      opt.apply(tape.gradient(loss, v), v);
      return loss;
    };
    auto traced = fl::trace([&](fl::Tensor xb, fl::Tensor yb) { return step(traced_vars, *traced_opt, xb, yb); });
    for (int s = 0; s < 4; ++s) {
      const float eager_loss = step(eager_vars, *eager_opt, x, labels).item<float>();
      const float traced_loss = traced(x, labels).item<float>();
      CHECK(traced_loss == doctest::Approx(eager_loss).epsilon(1e-6));
    }
    for (size_t i = 0; i < eager_vars.size(); ++i) {
      check_close(traced_vars[i].value(), eager_vars[i].value(), 1e-5);
    }
    CHECK(traced_opt->iterations().value().item<int64_t>() == 4);
    CHECK(traced.trace_count() == 1);
    // Plain SGD: each weight's update `w -= lr * (a @ b)` became one GEMM into the weight.
    int fused_updates = 0;
    for (const fl::Node& n : traced.graph(x, labels).nodes()) {
      fused_updates += !n.removed && n.op != nullptr && n.op->name == "assign_matmul";
    }
    CHECK(fused_updates == (which == 2 ? 2 : 0));
  }
}

TEST_CASE("a traced batch-norm gradient skips the unused statistics' terms, as the eager one does") {
  // The tape hands a rule zeros for outputs nobody used; batch_norm_training's rule then skips the
  // mean and var terms (x * slope + offset: three passes over x). Traced, those zeros are symbolic;
  // the graph must skip them too, and must keep them when the statistics are used.
  const fl::Tensor x = fl::randn({4, 3, 5, 5}, 21);
  const fl::Tensor w = fl::randn({4, 3, 5, 5}, 22);
  const fl::Tensor v = fl::randn({3}, 23);
  for (const bool use_mean : {false, true}) {
    CAPTURE(use_mean);
    auto grads = [&](fl::Tensor xs, fl::Tensor gamma, fl::Tensor beta) {
      fl::GradientTape tape;
      tape.watch(xs);
      tape.watch(gamma);
      tape.watch(beta);
      const fl::BatchNormOutput o = fl::batch_norm_training(xs, gamma, beta);
      fl::Tensor loss = fl::sum(o.y * w);
      if (use_mean) loss = loss + fl::sum(o.mean * v) + fl::sum(o.var * v);
      return tape.gradient(loss, {xs, gamma, beta});
    };
    const fl::Tensor gamma = fl::randn({3}, 24) + 1.5f, beta = fl::randn({3}, 25);
    auto traced = fl::trace(grads);
    const std::vector<fl::Tensor> want = grads(x, gamma, beta), got = traced(x, gamma, beta);
    REQUIRE(got.size() == 3);
    for (size_t i = 0; i < 3; ++i) check_close(got[i], want[i], 1e-5);
    // Ops over x's shape that read x itself: the forward and backward kernels, plus x * slope only
    // when the statistics are used.
    const fl::Graph& g = traced.graph(x, gamma, beta);
    int readers_of_x = 0;
    for (const fl::Node& n : g.nodes()) {
      if (n.removed || n.kind != fl::NodeKind::op || n.outputs.empty() || n.outputs[0].shape != x.shape()) continue;
      for (const fl::ValueRef& in : n.inputs) {
        if (g.node(in.node).kind == fl::NodeKind::argument && g.node(in.node).argument == 0) {
          ++readers_of_x;
          break;
        }
      }
    }
    CHECK(readers_of_x == (use_mean ? 3 : 2));
  }
}

TEST_CASE("an op failing inside a graph throws its own error type, naming the node and the source line") {
  const fl::Tensor table = fl::randn({4, 3}, 5);
  auto lookup = fl::trace([&](fl::Tensor ids) { return fl::gather(table, ids) * 2.0f; });
  const fl::Tensor good = fl::tensor(std::vector<int64_t>{0, 3}, {2});
  const fl::Tensor bad = fl::tensor(std::vector<int64_t>{0, 9}, {2});
  CHECK(values(lookup(good)) == values(fl::gather(table, good) * 2.0f));
  test::check_throws<fl::OutOfRange>([&] { lookup(bad); }, {"node 'gather", "gather:"});
  try {
    lookup(bad);
  } catch (const fl::OutOfRange& e) {
    // Where the user's code recorded it, when debug information has it (test builds have -g).
    const std::string message = e.what();
    CAPTURE(message);
    CHECK(message.find("recorded at") != std::string::npos);
  }
  // The function keeps working.
  CHECK(values(lookup(good)) == values(fl::gather(table, good) * 2.0f));
}

TEST_CASE("independent branches give the eager result, whichever thread runs them") {
  const fl::Tensor a = fl::randn({160, 160}, 1);
  const fl::Tensor b = fl::randn({160, 160}, 2);
  auto f = fl::trace([](fl::Tensor x, fl::Tensor y) {
    const fl::Tensor left = fl::matmul(x, y) + 1.0f;
    const fl::Tensor right = fl::matmul(y, x) - 1.0f;
    const fl::Tensor third = fl::exp(x * 0.01f);
    return left * right + third;
  });
  for (int i = 0; i < 20; ++i) {
    CHECK(values(f(a, b)) == values((fl::matmul(a, b) + 1.0f) * (fl::matmul(b, a) - 1.0f) + fl::exp(a * 0.01f)));
  }
}

TEST_CASE("a traced function calling another inlines it into one graph") {
  auto inner = fl::trace([](fl::Tensor x) { return x * 2.0f; });
  auto outer = fl::trace([&](fl::Tensor x) { return inner(x) + 1.0f; });
  CHECK(values(outer(fl::tensor({1.0f, 2.0f}))) == std::vector<float>{3, 5});
  CHECK(inner.trace_count() == 0);
}

TEST_CASE("step statistics become a Chrome trace-event timeline") {
  fl::TraceOptions options;
  options.collect_step_stats = true;
  auto f = fl::trace([](fl::Tensor x) { return fl::exp(x) + fl::sqrt(x); }, options);
  f(fl::ones({10}));
  const std::string json = f.timeline_json();
  CHECK(json.find("\"traceEvents\"") != std::string::npos);
  CHECK(json.find("\"ph\":\"X\"") != std::string::npos);
}

TEST_CASE("the graph shows what was traced") {
  const fl::Tensor w = fl::randn({5, 3}, 7);
  auto f = fl::trace([&](fl::Tensor x) { return affine(x, w); });
  const fl::Graph& g = f.graph(fl::ones({2, 5}));
  CHECK(g.num_nodes() >= 3);
  const std::string dot = g.to_dot();
  CHECK(dot.find("matmul") != std::string::npos);
  CHECK(dot.find("digraph") != std::string::npos);
  CHECK(f.trace_count() == 1);
}

TEST_CASE("an unknown dimension lets one graph serve every batch size, checked by a probe trace") {
  const fl::Tensor w = fl::randn({5, 3}, 7);
  fl::TraceOptions options;
  options.unknown_dims = {{0, 0}};
  auto forward = fl::trace([&](fl::Tensor x) { return fl::relu(fl::matmul(x, w) + 1.0f); }, options);
  for (int64_t batch : {4, 7, 9, 2}) {
    const fl::Tensor x = fl::randn({batch, 5}, static_cast<uint64_t>(batch));
    CHECK(values(forward(x)) == values(fl::relu(fl::matmul(x, w) + 1.0f)));
  }
  CHECK(forward.trace_count() == 1);
  // Size 1 broadcasts differently from larger sizes, so it gets a graph of its own.
  const fl::Tensor one = fl::randn({1, 5}, 3);
  CHECK(values(forward(one)) == values(fl::relu(fl::matmul(one, w) + 1.0f)));
  CHECK(forward.trace_count() == 2);

  // mean divides by the batch size, which tracing turns into a constant: the probe sees that, so
  // each size gets its own (correct) graph instead of one silently wrong one.
  auto average = fl::trace([](fl::Tensor x) { return fl::mean(x); }, options);
  CHECK(average(fl::ones({4, 2}) * 3.0f).item<float>() == 3.0f);
  CHECK(average(fl::ones({6, 2}) * 3.0f).item<float>() == 3.0f);
  CHECK(average.trace_count() == 2);
  CHECK(average.last_retrace_reason() == "argument 0: shape [4, 2] -> [6, 2]");

  fl::TraceOptions bad;
  bad.unknown_dims = {{0, 5}};
  auto f = fl::trace([](fl::Tensor x) { return x; }, bad);
  test::check_throws<fl::InvalidArgument>([&] { f(fl::ones({2, 2})); }, {"unknown_dims", "dimension 5", "[2, 2]"});
}

TEST_CASE("a batch-1 SGD step (rank-1 weight updates fused into the weights) matches the eager step") {
  fl::Variable w_eager(fl::randn({7, 4}, 1), "w"), w_traced(fl::randn({7, 4}, 1), "w");
  fl::optim::SGD eager_opt(0.5), traced_opt(0.5);
  auto step = [](fl::Variable& w, fl::optim::SGD& opt, const fl::Tensor& x) {
    fl::GradientTape tape;
    const fl::Tensor loss = fl::sum(fl::square(fl::tanh(fl::matmul(x, w))));
    opt.apply(tape.gradient(loss, {w}), {w});
    return loss;
  };
  auto traced = fl::trace([&](fl::Tensor x) { return step(w_traced, traced_opt, x); });
  for (int i = 0; i < 3; ++i) {
    const fl::Tensor x = fl::randn({1, 7}, static_cast<uint64_t>(10 + i));
    CHECK(traced(x).item<float>() == doctest::Approx(step(w_eager, eager_opt, x).item<float>()).epsilon(1e-6));
  }
  check_close(w_traced.value(), w_eager.value(), 1e-6);
}

namespace {

// An error type that no part of the library names: the executor must still put the node in front
// of its message and keep its type.
class QuotaExceeded : public fl::Error {
 public:
  using fl::Error::Error;
};

fl::TraceOptions cache_of(int64_t graphs) {
  fl::TraceOptions options;
  options.max_cached_graphs = graphs;
  options.retrace_warning_after = 1000;  // these tests retrace on purpose
  return options;
}

}  // namespace

TEST_CASE("an error type the library never names keeps its type and gets the node in front") {
  auto f = fl::trace([](fl::Tensor x) {
    fl::host_callback([](const std::vector<fl::Tensor>&) { throw QuotaExceeded("quota: 3 of 2 used"); }, {x});
    return x + 1.0f;
  });
  test::check_throws<QuotaExceeded>([&] { f(fl::ones({2})); }, {"node 'host_callback", "quota: 3 of 2 used"});
  // Each call raises a new error and names the node once.
  try {
    f(fl::ones({2}));
    FAIL("no error");
  } catch (const QuotaExceeded& e) {
    const std::string message = e.what();
    CHECK(message.rfind("node '", 0) == 0);
    CHECK(message.find("node '", 1) == std::string::npos);
  }
}

TEST_CASE("an error locates once: a second location leaves the message as it was") {
  QuotaExceeded e("quota: over");
  e.locate("node 'a'");
  e.locate("node 'b'");
  CHECK(std::string(e.what()) == "node 'a': quota: over");
  const QuotaExceeded copy = e;
  CHECK(std::string(copy.what()) == "node 'a': quota: over");
}

TEST_CASE("the trace cache drops the least recently called signature first; a dropped one retraces") {
  auto f = fl::trace([](fl::Tensor x) { return x * 2.0f + 1.0f; }, cache_of(2));
  const fl::Tensor a = fl::ones({2}), b = fl::ones({3}), c = fl::ones({4});
  f(a);
  f(b);
  f(a);  // a is now the most recent, b the least
  f(c);  // drops b
  CHECK(f.trace_count() == 3);
  CHECK(f.cache_stats().graphs == 2);
  CHECK(f.cache_stats().evictions == 1);
  f(a);
  f(c);
  CHECK(f.trace_count() == 3);  // both still cached
  const fl::Tensor x = fl::tensor({1.0f, 2.0f, 3.0f});
  CHECK(values(f(x)) == values(x * 2.0f + 1.0f));  // b's signature again: traced anew, same result
  CHECK(f.trace_count() == 4);
  CHECK(f.cache_stats().evictions == 2);  // a was the least recent then
  CHECK(f.cache_stats().capacity == 2);
}

TEST_CASE("the trace cache is bounded, and a lookup compares a constant number of signatures") {
  auto f = fl::trace([](fl::Tensor x) { return x + 1.0f; }, cache_of(64));
  for (int64_t n = 2; n < 2 + 100; ++n) f(fl::ones({n}));
  CHECK(f.trace_count() == 100);
  CHECK(f.cache_stats().graphs == 64);
  CHECK(f.cache_stats().evictions == 36);
  // Looking up an old (least recently called) signature: the most recent one, then its hash bucket.
  const int64_t before = f.cache_stats().signature_comparisons;
  const fl::Tensor oldest = fl::full({101 - 63}, 2.0f);
  CHECK(values(f(oldest)) == values(oldest + 1.0f));
  CHECK(f.trace_count() == 100);
  CHECK(f.cache_stats().signature_comparisons - before <= 3);
}

TEST_CASE("the default trace cache bound is documented, and a negative one is rejected") {
  auto f = fl::trace([](fl::Tensor x) { return x + 1.0f; });
  CHECK(f.cache_stats().capacity == 256);
  test::check_throws<fl::InvalidArgument>([] { (void)fl::trace([](fl::Tensor x) { return x; }, cache_of(-1)); },
                                          {"max_cached_graphs", "got -1"});
}

TEST_CASE("threads calling with one new signature at once trace it once and all get the eager result") {
  std::atomic<int> traced{0};
  auto f = fl::trace([&](fl::Tensor x) {
    ++traced;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the others arrive while this traces
    return fl::exp(x) * 3.0f;
  });
  const fl::Tensor x = fl::randn({16}, 3);
  const std::vector<float> want = values(fl::exp(x) * 3.0f);
  constexpr int kThreads = 8;
  std::atomic<int> arrived{0};
  std::vector<std::vector<float>> got(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ++arrived;
      while (arrived.load() < kThreads) std::this_thread::yield();
      got[static_cast<size_t>(t)] = values(f(x));
    });
  }
  for (std::thread& t : threads) t.join();
  CHECK(traced.load() == 1);
  CHECK(f.trace_count() == 1);
  for (const auto& g : got) CHECK(g == want);
}

TEST_CASE("a trace that throws lets a waiting or later call trace again") {
  bool fail = true;
  auto f = fl::trace([&](fl::Tensor x) {
    if (fail) throw fl::InvalidArgument("f: not yet");
    return x + 1.0f;
  });
  test::check_throws<fl::InvalidArgument>([&] { f(fl::ones({2})); }, {"not yet"});
  fail = false;
  CHECK(values(f(fl::ones({2}))) == std::vector<float>{2, 2});
  CHECK(f.trace_count() == 1);
}
