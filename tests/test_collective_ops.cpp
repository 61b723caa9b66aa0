// The collective ops (all_reduce, broadcast, all_gather, reduce_scatter, barrier) in one process:
// participants on logical CPU devices, each on its own thread under its own ReplicaScope (what
// MirroredStrategy::run sets up), over an in-process communicator from detail::make_communicator.
//
// Results are compared with values computed here from the participants' inputs, in every dtype the
// op takes; traced calls with eager ones; gradients with central finite differences of the SPMD
// loss (the sum over participants of each participant's loss). Errors: participants that disagree
// all fail, a participant that never arrives makes the others fail after the timeout, and argument
// errors name the op and what is wrong. A plain run's world collectives (one participant) too.
#include <algorithm>
#include <cmath>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collective/communicator.hpp"
#include "collective/ops/collective_attrs.hpp"
#include "collective/ops/header_checks.hpp"
#include "collective/replica_context.hpp"
#include "flowlet/collective.hpp"
#include "flowlet/trace.hpp"
#include "support/reference.hpp"

namespace fd = flowlet::detail;
using fl::ReduceOp;

namespace {

// Before any device is used: the participants live on cpu:0 .. cpu:3.
const bool devices_ready = (fl::set_logical_cpu_devices(4), true);

// P participants on cpu:0 .. cpu:P-1 of one communicator, one ReplicaContext each.
struct Group {
  std::shared_ptr<fd::Communicator> communicator;
  std::vector<fd::ReplicaContext> replicas;
  int size() const { return static_cast<int>(replicas.size()); }
  fl::Device device(int p) const { return replicas[static_cast<size_t>(p)].communicator->device(p); }
};

Group make_group(int participants, double timeout_seconds = 20) {
  (void)devices_ready;
  std::vector<fl::Device> devices;
  for (int p = 0; p < participants; ++p) devices.emplace_back(fl::DeviceKind::cpu, p);
  Group g;
  g.communicator = fd::make_communicator(devices, fd::CommunicatorOptions{timeout_seconds});
  for (int p = 0; p < participants; ++p) g.replicas.push_back(fd::ReplicaContext{g.communicator, p, nullptr});
  return g;
}

// What one participant's function returned or threw.
struct Outcome {
  fl::Tensor value;
  std::exception_ptr error;
};

// Runs fn(p) for every participant p on its own thread under its replica scope; doctest assertions
// stay on the test's thread, so the outcomes come back for it to check.
std::vector<Outcome> run_spmd(const Group& g, const std::function<fl::Tensor(int)>& fn) {
  std::vector<Outcome> outcomes(static_cast<size_t>(g.size()));
  std::vector<std::thread> threads;
  for (int p = 0; p < g.size(); ++p) {
    threads.emplace_back([&, p] {
      fd::ReplicaScope scope(&g.replicas[static_cast<size_t>(p)]);
      try {
        outcomes[static_cast<size_t>(p)].value = fn(p);
      } catch (...) {
        outcomes[static_cast<size_t>(p)].error = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return outcomes;
}

std::string describe_error(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return test::error_kind(e) + ": " + e.what();
  }
}

// The values of every participant's result; fails the test for a participant that threw.
std::vector<fl::Tensor> values_of(const std::vector<Outcome>& outcomes) {
  std::vector<fl::Tensor> values;
  for (size_t p = 0; p < outcomes.size(); ++p) {
    if (outcomes[p].error) FAIL_CHECK("participant " << p << " threw " << describe_error(outcomes[p].error));
    values.push_back(outcomes[p].value);
  }
  return values;
}

// Every participant threw E with a message holding each of `parts`.
template <class E>
void check_all_threw(const std::vector<Outcome>& outcomes, const std::vector<std::string>& parts) {
  for (size_t p = 0; p < outcomes.size(); ++p) {
    CAPTURE(p);
    if (!outcomes[p].error) {
      FAIL_CHECK("participant " << p << " returned instead of throwing " << test::expected_kind<E>());
      continue;
    }
    test::check_throws<E>([&] { std::rethrow_exception(outcomes[p].error); }, parts);
  }
}

// Participant p's input: element i is small and distinct per participant, negative for signed
// dtypes, so sums stay exact in every dtype (u8 included) and mean's truncation shows.
std::vector<double> input_values(int p, int64_t count, fl::DType dt) {
  std::vector<double> v;
  for (int64_t i = 0; i < count; ++i) {
    double x = static_cast<double>((3 * p + 5 * i) % 7 + p);
    if (dt == fl::b8) x = ((p + i) % 3 == 0) ? 1 : 0;
    if (dt != fl::u8 && dt != fl::b8 && (i + p) % 2 == 1) x = -x;
    v.push_back(x);
  }
  return v;
}

fl::Tensor input_of(int p, const fl::Shape& shape, fl::DType dt) {
  return test::make(input_values(p, shape.numel(), dt), shape, dt).to(fl::Device(fl::DeviceKind::cpu, p));
}

double reduce_ref(const std::vector<double>& xs, ReduceOp op, fl::DType dt) {
  double r = xs[0];
  for (size_t k = 1; k < xs.size(); ++k) {
    if (op == ReduceOp::max) r = std::max(r, xs[k]);
    if (op == ReduceOp::min) r = std::min(r, xs[k]);
    if (op == ReduceOp::sum || op == ReduceOp::mean) r += xs[k];
  }
  if (op == ReduceOp::mean) {
    r /= static_cast<double>(xs.size());
    if (!test::is_float(dt)) r = std::trunc(r);  // integers truncate toward zero
  }
  return test::round_to(r, dt);
}

// The element-wise reduction over participants of their inputs (input_values).
std::vector<double> all_reduce_ref(int participants, int64_t count, ReduceOp op, fl::DType dt) {
  std::vector<double> out;
  for (int64_t i = 0; i < count; ++i) {
    std::vector<double> xs;
    for (int p = 0; p < participants; ++p) xs.push_back(input_values(p, count, dt)[static_cast<size_t>(i)]);
    out.push_back(reduce_ref(xs, op, dt));
  }
  return out;
}

const std::vector<fl::DType> kEvery = {fl::f32, fl::f64, fl::i32, fl::i64, fl::u8, fl::b8, fl::f16, fl::bf16};
const std::vector<ReduceOp> kReductions = {ReduceOp::sum, ReduceOp::mean, ReduceOp::max, ReduceOp::min};

// The reductions a dtype takes: b8 reduces as logic (max is any, min is all).
std::vector<ReduceOp> reductions_for(fl::DType dt) {
  if (dt == fl::b8) return {ReduceOp::max, ReduceOp::min};
  return kReductions;
}

const fl::Shape kShape{2, 3};

}  // namespace

TEST_CASE("all_reduce: every reduction in every dtype over 2, 3 and 4 participants, on each participant's device") {
  for (int participants : {2, 3, 4}) {
    const Group g = make_group(participants);
    for (fl::DType dt : kEvery) {
      for (ReduceOp op : reductions_for(dt)) {
        INFO("participants ", participants, ", dtype ", fl::dtype_name(dt), ", op ", fl::to_string(op));
        const auto got = values_of(run_spmd(g, [&](int p) { return fl::all_reduce(input_of(p, kShape, dt), op); }));
        const std::vector<double> want = all_reduce_ref(participants, kShape.numel(), op, dt);
        for (int p = 0; p < participants; ++p) {
          CAPTURE(p);
          if (!got[static_cast<size_t>(p)].defined()) continue;
          test::check_tensor(got[static_cast<size_t>(p)], want, kShape, dt);
          CHECK(got[static_cast<size_t>(p)].device() == g.device(p));
        }
      }
    }
  }
}

TEST_CASE("all_reduce: the default reduction is a sum; a strided view reduces its elements") {
  const Group g = make_group(2);
  const auto got = values_of(run_spmd(g, [&](int p) {
    const fl::Tensor x = input_of(p, fl::Shape{3, 2}, fl::f32);
    return fl::all_reduce(fl::transpose(x));  // a non-contiguous view
  }));
  std::vector<double> want(6);
  for (int p = 0; p < 2; ++p) {
    const std::vector<double> v = input_values(p, 6, fl::f32);
    for (int r = 0; r < 2; ++r)
      for (int c = 0; c < 3; ++c) want[static_cast<size_t>(r * 3 + c)] += v[static_cast<size_t>(c * 2 + r)];
  }
  for (const fl::Tensor& t : got) test::check_tensor(t, want, fl::Shape{2, 3}, fl::f32);
}

TEST_CASE("broadcast: every root's value reaches every participant, in every dtype") {
  const Group g = make_group(3);
  for (fl::DType dt : kEvery) {
    for (int root = 0; root < 3; ++root) {
      INFO("dtype ", fl::dtype_name(dt), ", root ", root);
      const auto got = values_of(run_spmd(g, [&](int p) { return fl::broadcast(input_of(p, kShape, dt), root); }));
      for (int p = 0; p < 3; ++p) {
        CAPTURE(p);
        test::check_tensor(got[static_cast<size_t>(p)], input_values(root, kShape.numel(), dt), kShape, dt);
      }
    }
  }
}

TEST_CASE("all_gather: axis 0 concatenated in participant order, in every dtype; scalars become [P]") {
  const Group g = make_group(3);
  for (fl::DType dt : kEvery) {
    INFO("dtype ", fl::dtype_name(dt));
    const auto got = values_of(run_spmd(g, [&](int p) { return fl::all_gather(input_of(p, kShape, dt)); }));
    std::vector<double> want;
    for (int p = 0; p < 3; ++p) {
      const std::vector<double> v = input_values(p, kShape.numel(), dt);
      want.insert(want.end(), v.begin(), v.end());
    }
    for (const fl::Tensor& t : got) test::check_tensor(t, want, fl::Shape{6, 3}, dt);
  }
  const auto scalars = values_of(run_spmd(g, [&](int p) { return fl::all_gather(input_of(p, fl::Shape{}, fl::i64)); }));
  for (const fl::Tensor& t : scalars) test::check_tensor(t, {0, -4, 8}, fl::Shape{3}, fl::i64);
}

TEST_CASE("reduce_scatter: participant i gets part i of the reduction, for every reduction in every dtype") {
  const Group g = make_group(3);
  const fl::Shape shape{6, 2};
  for (fl::DType dt : kEvery) {
    for (ReduceOp op : reductions_for(dt)) {
      INFO("dtype ", fl::dtype_name(dt), ", op ", fl::to_string(op));
      const auto got = values_of(run_spmd(g, [&](int p) { return fl::reduce_scatter(input_of(p, shape, dt), op); }));
      const std::vector<double> full = all_reduce_ref(3, shape.numel(), op, dt);
      for (int p = 0; p < 3; ++p) {
        CAPTURE(p);
        const std::vector<double> part(full.begin() + 4 * p, full.begin() + 4 * (p + 1));
        test::check_tensor(got[static_cast<size_t>(p)], part, fl::Shape{2, 2}, dt);
      }
    }
  }
}

TEST_CASE("every collective takes 0-size tensors") {
  const Group g = make_group(2);
  const fl::Shape empty{0, 3};
  for (fl::DType dt : {fl::f32, fl::i64, fl::bf16}) {
    INFO("dtype ", fl::dtype_name(dt));
    for (const fl::Tensor& t : values_of(run_spmd(g, [&](int p) { return fl::all_reduce(input_of(p, empty, dt)); })))
      test::check_tensor(t, {}, empty, dt);
    for (const fl::Tensor& t : values_of(run_spmd(g, [&](int p) { return fl::broadcast(input_of(p, empty, dt), 1); })))
      test::check_tensor(t, {}, empty, dt);
    for (const fl::Tensor& t : values_of(run_spmd(g, [&](int p) { return fl::all_gather(input_of(p, empty, dt)); })))
      test::check_tensor(t, {}, empty, dt);
    for (const fl::Tensor& t :
         values_of(run_spmd(g, [&](int p) { return fl::reduce_scatter(input_of(p, empty, dt)); })))
      test::check_tensor(t, {}, empty, dt);
    for (const fl::Tensor& t : values_of(run_spmd(g, [&](int p) {
           return fl::all_gather(input_of(p, fl::Shape{3, 0}, dt));
         })))
      test::check_tensor(t, {}, fl::Shape{6, 0}, dt);
  }
}

TEST_CASE("barrier: returns on every participant once all have called it") {
  const Group g = make_group(3);
  std::atomic<int> arrived{0};
  std::atomic<bool> early{false};
  const auto outcomes = run_spmd(g, [&](int p) {
    // The last participant arrives late: nobody may leave before it arrived.
    if (p == 2) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    arrived.fetch_add(1);
    fl::barrier();
    if (arrived.load() != 3) early.store(true);
    return fl::Tensor();
  });
  for (const Outcome& o : outcomes) CHECK_FALSE(o.error);
  CHECK_FALSE(early.load());

  // Traced: the barrier node has no outputs and runs at every call.
  std::vector<std::function<fl::Tensor(fl::Tensor)>> traced;
  for (int p = 0; p < 3; ++p)
    traced.push_back(fl::trace([](fl::Tensor x) {
      fl::barrier();
      return x * 2.0f;
    }));
  for (int call = 0; call < 3; ++call) {
    CAPTURE(call);
    arrived.store(0);
    const auto traced_outcomes = run_spmd(g, [&](int p) {
      const fl::Tensor x = input_of(p, kShape, fl::f32);
      if (p == call) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      arrived.fetch_add(1);
      const fl::Tensor y = traced[static_cast<size_t>(p)](x);
      if (arrived.load() != 3) early.store(true);
      return y;
    });
    for (const Outcome& o : traced_outcomes) CHECK_FALSE(o.error);
    CHECK_FALSE(early.load());
  }
}

TEST_CASE("traced collectives give the eager results, at every call, in program order") {
  const Group g = make_group(3);
  // Each participant traces its own function (its own graph), as MirroredStrategy::run does.
  auto step = [](const fl::Tensor& x) {
    const fl::Tensor summed = fl::all_reduce(x * 2.0f, ReduceOp::sum);
    const fl::Tensor biggest = fl::all_reduce(x, ReduceOp::max);
    const fl::Tensor gathered = fl::all_gather(summed - biggest);
    const fl::Tensor scattered = fl::reduce_scatter(gathered, ReduceOp::mean);
    fl::barrier();
    return fl::broadcast(scattered + fl::sum(gathered), 2);
  };
  const auto eager = values_of(run_spmd(g, [&](int p) { return step(input_of(p, kShape, fl::f32)); }));
  std::vector<std::function<fl::Tensor(fl::Tensor)>> traced;
  for (int p = 0; p < 3; ++p) traced.push_back(fl::trace([&](fl::Tensor x) { return step(x); }));
  for (int call = 0; call < 3; ++call) {
    CAPTURE(call);
    const auto got = values_of(run_spmd(g, [&](int p) {
      return traced[static_cast<size_t>(p)](input_of(p, kShape, fl::f32) + static_cast<float>(call));
    }));
    const auto want =
        values_of(run_spmd(g, [&](int p) { return step(input_of(p, kShape, fl::f32) + static_cast<float>(call)); }));
    for (int p = 0; p < 3; ++p) {
      CAPTURE(p);
      test::check_tensor(got[static_cast<size_t>(p)], test::values(want[static_cast<size_t>(p)]),
                         want[static_cast<size_t>(p)].shape(), fl::f32, test::Tolerance{0, 0});
    }
    if (call == 0) {
      for (int p = 0; p < 3; ++p)
        test::check_tensor(want[static_cast<size_t>(p)], test::values(eager[static_cast<size_t>(p)]),
                           eager[static_cast<size_t>(p)].shape(), fl::f32);
    }
  }
}

TEST_CASE("traced collectives equal eager ones in every dtype") {
  const Group g = make_group(3);
  // Every collective and reduction the dtype takes, in one function.
  auto every_collective = [](const fl::Tensor& x) {
    std::vector<fl::Tensor> out;
    for (ReduceOp op : reductions_for(x.dtype())) {
      out.push_back(fl::all_reduce(x, op));
      out.push_back(fl::reduce_scatter(x, op));
    }
    out.push_back(fl::broadcast(x, 1));
    out.push_back(fl::all_gather(x));
    return out;
  };
  for (fl::DType dt : kEvery) {
    INFO("dtype ", fl::dtype_name(dt));
    // A function per participant and dtype (one signature each: no retrace warnings).
    std::vector<std::function<std::vector<fl::Tensor>(fl::Tensor)>> traced;
    for (int p = 0; p < 3; ++p) traced.push_back(fl::trace([&](fl::Tensor x) { return every_collective(x); }));
    std::vector<std::vector<fl::Tensor>> eager(3), got(3);
    std::vector<std::string> errors(3);
    std::vector<std::thread> threads;
    for (int p = 0; p < 3; ++p) {
      threads.emplace_back([&, p] {
        const fd::ReplicaScope scope(&g.replicas[static_cast<size_t>(p)]);
        try {
          const fl::Tensor x = input_of(p, fl::Shape{6, 2}, dt);
          eager[static_cast<size_t>(p)] = every_collective(x);
          got[static_cast<size_t>(p)] = traced[static_cast<size_t>(p)](x);
        } catch (const std::exception& e) {
          errors[static_cast<size_t>(p)] = test::error_kind(e) + ": " + e.what();
        }
      });
    }
    for (std::thread& t : threads) t.join();
    for (int p = 0; p < 3; ++p) {
      CAPTURE(p);
      CHECK(errors[static_cast<size_t>(p)] == "");
      const auto& want = eager[static_cast<size_t>(p)];
      REQUIRE(got[static_cast<size_t>(p)].size() == want.size());
      for (size_t k = 0; k < want.size(); ++k) {
        CAPTURE(k);
        test::check_tensor(got[static_cast<size_t>(p)][k], test::values(want[k]), want[k].shape(), dt,
                           test::Tolerance{0, 0});
      }
    }
  }
}

TEST_CASE("a traced collective is a stateful node on the participant's device: never pruned, merged or folded") {
  const Group g = make_group(2);
  std::vector<int> collectives(2, 0), on_device(2, 0);
  const auto outcomes = run_spmd(g, [&](int p) {
    // The results are unused: the nodes must still run (the peers wait for them).
    const fl::Tensor constant = input_of(p, kShape, fl::f32);
    auto fn = fl::trace([&constant](fl::Tensor x) {
      (void)fl::all_reduce(x);
      (void)fl::all_reduce(x);              // the same call twice: never merged
      fl::barrier();                        // no outputs at all
      return x + fl::all_reduce(constant);  // a constant input: never folded
    });
    const fl::Tensor x = input_of(p, kShape, fl::f32);
    fl::Tensor out = fn(x);
    out = fn(x);  // every node runs at every call
    for (const fl::Node& n : fn.graph(x).nodes()) {
      if (n.removed || n.op == nullptr || (n.op->name != "all_reduce" && n.op->name != "barrier")) continue;
      ++collectives[static_cast<size_t>(p)];
      on_device[static_cast<size_t>(p)] += n.device == g.device(p) ? 1 : 0;
    }
    return out;
  });
  const std::vector<double> sum = all_reduce_ref(2, kShape.numel(), ReduceOp::sum, fl::f32);
  const auto got = values_of(outcomes);
  for (int p = 0; p < 2; ++p) {
    CHECK(collectives[static_cast<size_t>(p)] == 4);
    CHECK(on_device[static_cast<size_t>(p)] == 4);
    std::vector<double> want = input_values(p, kShape.numel(), fl::f32);
    for (size_t i = 0; i < want.size(); ++i) want[i] += sum[i];
    test::check_tensor(got[static_cast<size_t>(p)], want, kShape, fl::f32);
  }
}

// ---------------------------------------------------------------------------------------------
// Gradients: the tape's gradient of each participant's input against central finite differences of
// the SPMD loss L = sum_p sum(f(x_p) * w_p), perturbing one element of one participant's input at a
// time and running every participant again.

namespace {

using CollectiveFn = std::function<fl::Tensor(const fl::Tensor&)>;

fl::Tensor weights_for(const fl::Tensor& y, int p) {
  return test::random_tensor(y.shape(), 9100 + static_cast<uint64_t>(p), fl::f64).to(y.device());
}

double spmd_loss(const Group& g, const CollectiveFn& fn, const std::vector<std::vector<double>>& inputs,
                 const fl::Shape& shape) {
  const auto losses = values_of(run_spmd(g, [&](int p) {
    const fl::Tensor x = test::make(inputs[static_cast<size_t>(p)], shape, fl::f64).to(g.device(p));
    const fl::Tensor y = fn(x);
    return fl::sum(y * weights_for(y, p));
  }));
  double total = 0;
  for (const fl::Tensor& l : losses) total += test::values(l).at(0);
  return total;
}

void check_spmd_gradient(const Group& g, const CollectiveFn& fn, const fl::Shape& shape,
                         const std::vector<std::vector<double>>& inputs) {
  const auto grads = values_of(run_spmd(g, [&](int p) {
    const fl::Tensor x = test::make(inputs[static_cast<size_t>(p)], shape, fl::f64).to(g.device(p));
    fl::GradientTape tape;
    tape.watch(x);
    const fl::Tensor y = fn(x);
    const fl::Tensor loss = fl::sum(y * weights_for(y, p));
    return tape.gradient(loss, {x})[0];
  }));
  const double h = 1e-6;
  for (int p = 0; p < g.size(); ++p) {
    CAPTURE(p);
    std::vector<double> want;
    for (int64_t i = 0; i < shape.numel(); ++i) {
      auto plus = inputs, minus = inputs;
      plus[static_cast<size_t>(p)][static_cast<size_t>(i)] += h;
      minus[static_cast<size_t>(p)][static_cast<size_t>(i)] -= h;
      want.push_back((spmd_loss(g, fn, plus, shape) - spmd_loss(g, fn, minus, shape)) / (2 * h));
    }
    if (!grads[static_cast<size_t>(p)].defined()) continue;
    test::check_tensor(grads[static_cast<size_t>(p)], want, shape, fl::f64, test::Tolerance{1e-6, 1e-6});
    CHECK(grads[static_cast<size_t>(p)].device() == g.device(p));
  }
}

// Normal values per participant: distinct across participants, so max and min have no ties.
std::vector<std::vector<double>> random_inputs(int participants, int64_t count, uint64_t seed) {
  std::vector<std::vector<double>> inputs;
  for (int p = 0; p < participants; ++p)
    inputs.push_back(test::random_values(count, seed + 31 * static_cast<uint64_t>(p), fl::f64));
  return inputs;
}

}  // namespace

TEST_CASE("gradients of every collective match finite differences of the SPMD loss") {
  for (int participants : {2, 3}) {
    const Group g = make_group(participants);
    const fl::Shape shape{static_cast<int64_t>(2 * participants)};
    const auto inputs = random_inputs(participants, shape.numel(), 40 + static_cast<uint64_t>(participants));
    for (ReduceOp op : kReductions) {
      INFO("participants ", participants, ", reduction ", fl::to_string(op));
      check_spmd_gradient(
          g, [op](const fl::Tensor& x) { return fl::all_reduce(x, op); }, shape, inputs);
      check_spmd_gradient(
          g, [op](const fl::Tensor& x) { return fl::reduce_scatter(x, op); }, shape, inputs);
    }
    INFO("participants ", participants);
    check_spmd_gradient(
        g, [](const fl::Tensor& x) { return fl::broadcast(x, 1); }, shape, inputs);
    check_spmd_gradient(
        g, [](const fl::Tensor& x) { return fl::all_gather(x); }, shape, inputs);
    // A scalar gathers into [P]; its gradient comes back as a scalar.
    check_spmd_gradient(
        g, [](const fl::Tensor& x) { return fl::all_gather(x); }, fl::Shape{}, random_inputs(participants, 1, 77));
    // Collectives composed with other ops, differentiated through each other.
    check_spmd_gradient(
        g, [](const fl::Tensor& x) { return fl::all_gather(fl::tanh(fl::all_reduce(x * x, ReduceOp::mean))); }, shape,
        inputs);
  }
}

TEST_CASE("all_reduce max: tied participants share the summed gradient evenly") {
  const Group g = make_group(3);
  // Element 0: participants 0 and 2 hold the maximum 5; element 1: only participant 1 holds 7.
  const std::vector<std::vector<double>> inputs = {{5, 1}, {2, 7}, {5, 3}};
  const auto grads = values_of(run_spmd(g, [&](int p) {
    const fl::Tensor x = test::make(inputs[static_cast<size_t>(p)], fl::Shape{2}, fl::f64).to(g.device(p));
    fl::GradientTape tape;
    tape.watch(x);
    const fl::Tensor loss = fl::sum(fl::all_reduce(x, ReduceOp::max) * static_cast<double>(p + 1));
    return tape.gradient(loss, {x})[0];
  }));
  // dL/dy summed over participants: 1 + 2 + 3 = 6 per element.
  test::check_tensor(grads[0], {3, 0}, fl::Shape{2}, fl::f64);
  test::check_tensor(grads[1], {0, 6}, fl::Shape{2}, fl::f64);
  test::check_tensor(grads[2], {3, 0}, fl::Shape{2}, fl::f64);
}

TEST_CASE("second derivatives through a collective: nested tapes") {
  // y = all_reduce(x * x) on each of 2 participants, L = sum_p sum(y * w_p): dL/dx_r = 2 x_r W with
  // W = w_0 + w_1. Then M = sum_r sum(dL/dx_r * v_r) gives dM/dx_r = 2 W v_r.
  const Group g = make_group(2);
  auto weights = [](int p) { return test::make({1.0 + p, -2.0 * p, 0.5}, fl::Shape{3}, fl::f64); };
  auto probes = [](int p) { return test::make({3.0, 1.0 - p, -1.0}, fl::Shape{3}, fl::f64); };
  const auto outcomes = run_spmd(g, [&](int p) {
    const fl::Device here = g.device(p);
    const fl::Tensor x = test::make({0.5, -1.5 + p, 2.0}, fl::Shape{3}, fl::f64).to(here);
    fl::GradientTape outer;
    outer.watch(x);
    fl::Tensor first;
    {
      fl::GradientTape inner;
      inner.watch(x);
      const fl::Tensor loss = fl::sum(fl::all_reduce(x * x) * weights(p).to(here));
      first = inner.gradient(loss, {x})[0];
    }
    const fl::Tensor second = outer.gradient(fl::sum(first * probes(p).to(here)), {x})[0];
    return fl::concat({first, second}, 0);
  });
  const std::vector<double> w_total = {1 + 2, 0 - 2, 0.5 + 0.5};
  for (int p = 0; p < 2; ++p) {
    CAPTURE(p);
    const std::vector<double> x = {0.5, -1.5 + p, 2.0};
    const std::vector<double> v = test::values(probes(p));
    std::vector<double> want;
    for (size_t i = 0; i < 3; ++i) want.push_back(2 * x[i] * w_total[i]);
    for (size_t i = 0; i < 3; ++i) want.push_back(2 * w_total[i] * v[i]);
    if (outcomes[static_cast<size_t>(p)].error) {
      FAIL_CHECK(describe_error(outcomes[static_cast<size_t>(p)].error));
      continue;
    }
    test::check_tensor(outcomes[static_cast<size_t>(p)].value, want, fl::Shape{6}, fl::f64);
  }
}

TEST_CASE("a traced training step differentiates through its collectives like the eager one") {
  const Group g = make_group(2);
  auto step = [](const fl::Tensor& x) {
    fl::GradientTape tape;
    tape.watch(x);
    const fl::Tensor loss = fl::sum(fl::all_gather(fl::all_reduce(x * x, ReduceOp::mean)) * 3.0);
    return tape.gradient(loss, {x})[0];
  };
  const auto eager = values_of(run_spmd(g, [&](int p) { return step(input_of(p, kShape, fl::f64)); }));
  std::vector<std::function<fl::Tensor(fl::Tensor)>> traced;
  for (int p = 0; p < 2; ++p) traced.push_back(fl::trace([&](fl::Tensor x) { return step(x); }));
  for (int call = 0; call < 2; ++call) {
    const auto got =
        values_of(run_spmd(g, [&](int p) { return traced[static_cast<size_t>(p)](input_of(p, kShape, fl::f64)); }));
    for (int p = 0; p < 2; ++p) {
      CAPTURE(p);
      test::check_tensor(got[static_cast<size_t>(p)], test::values(eager[static_cast<size_t>(p)]), kShape, fl::f64);
    }
  }
  // By hand: y = mean_p x_p^2 on each participant, gathered twice; L = sum_p 3 * sum(gathered) = 2 * 3 * 2 * sum(y),
  // so dL/dx_p = 12 * (2 x_p / 2) = 12 x_p.
  for (int p = 0; p < 2; ++p) {
    std::vector<double> want = input_values(p, kShape.numel(), fl::f64);
    for (double& v : want) v *= 12;
    test::check_tensor(eager[static_cast<size_t>(p)], want, kShape, fl::f64);
  }
}

// ---------------------------------------------------------------------------------------------
// Errors

TEST_CASE("participants that disagree all fail, whatever they disagree on, and never hang") {
  struct Disagreement {
    const char* what;
    std::function<fl::Tensor(int)> call;
  };
  const std::vector<Disagreement> cases = {
      {"shape",
       [](int p) {
         return fl::all_reduce(input_of(p, p == 1 ? fl::Shape{3, 2} : kShape, fl::f32));
       }},
      {"dtype", [](int p) { return fl::all_reduce(input_of(p, kShape, p == 1 ? fl::f64 : fl::f32)); }},
      {"reduction",
       [](int p) { return fl::all_reduce(input_of(p, kShape, fl::f32), p == 1 ? ReduceOp::max : ReduceOp::sum); }},
      {"collective",
       [](int p) {
         const fl::Tensor x = input_of(p, kShape, fl::f32);
         return p == 1 ? fl::broadcast(x, 0) : fl::all_reduce(x);
       }},
      {"root", [](int p) { return fl::broadcast(input_of(p, kShape, fl::f32), p == 1 ? 1 : 0); }},
  };
  for (const Disagreement& d : cases) {
    INFO("participants disagree on the ", d.what);
    const Group g = make_group(3);
    const auto outcomes = run_spmd(g, d.call);
    check_all_threw<fl::Error>(outcomes, {std::string("participants disagree on the ") + d.what});
    // The same communicator still works afterwards.
    for (const fl::Tensor& t :
         values_of(run_spmd(g, [](int p) { return fl::all_reduce(input_of(p, kShape, fl::f32)); })))
      test::check_tensor(t, all_reduce_ref(3, kShape.numel(), ReduceOp::sum, fl::f32), kShape, fl::f32);
  }
}

TEST_CASE("traced participants that disagree all fail too") {
  const Group g = make_group(2);
  std::vector<std::function<fl::Tensor(fl::Tensor)>> traced;
  for (int p = 0; p < 2; ++p) traced.push_back(fl::trace([](fl::Tensor x) { return fl::all_reduce(x); }));
  const auto outcomes = run_spmd(g, [&](int p) {
    return traced[static_cast<size_t>(p)](input_of(p, p == 1 ? fl::Shape{3} : fl::Shape{2}, fl::f32));
  });
  check_all_threw<fl::Error>(outcomes, {"all_reduce"});
}

TEST_CASE("a participant that never calls makes the others fail with DeadlineExceeded after the timeout") {
  const Group g = make_group(3, /*timeout_seconds=*/0.5);
  const auto outcomes = run_spmd(g, [](int p) {
    if (p == 2) return fl::Tensor();  // never arrives
    return fl::all_reduce(input_of(p, kShape, fl::f32));
  });
  for (int p = 0; p < 2; ++p) {
    CAPTURE(p);
    REQUIRE(outcomes[static_cast<size_t>(p)].error);
    test::check_throws<fl::DeadlineExceeded>([&] { std::rethrow_exception(outcomes[static_cast<size_t>(p)].error); },
                                             {"all_reduce"});
  }
}

TEST_CASE("a traced collective whose peer never arrives fails its step with DeadlineExceeded") {
  const Group g = make_group(2, /*timeout_seconds=*/0.5);
  auto fn = fl::trace([](fl::Tensor x) { return fl::all_gather(x) * 2.0f; });
  const auto outcomes = run_spmd(g, [&](int p) {
    if (p == 1) return fl::Tensor();
    return fn(input_of(p, kShape, fl::f32));
  });
  REQUIRE(outcomes[0].error);
  test::check_throws<fl::DeadlineExceeded>([&] { std::rethrow_exception(outcomes[0].error); }, {"all_gather"});
}

TEST_CASE("a traced step that fails before its collective on one participant fails the others by the timeout") {
  // Participant 0's batch holds an index out of range: its step stops before the all_reduce, which
  // its peer then waits for until the communicator's timeout.
  const Group g = make_group(2, /*timeout_seconds=*/0.5);
  const auto make_step = [] {
    return fl::trace([](fl::Tensor params, fl::Tensor index) { return fl::all_reduce(fl::gather(params, index)); });
  };
  std::vector<decltype(make_step())> steps;
  for (int p = 0; p < 2; ++p) steps.push_back(make_step());
  const auto outcomes = run_spmd(g, [&](int p) {
    const fl::Tensor params = input_of(p, fl::Shape{4, 3}, fl::f32);
    const fl::Tensor index = fl::tensor(std::vector<int64_t>{p == 0 ? 9 : 1}, fl::Shape{1}).to(g.device(p));
    return steps[static_cast<size_t>(p)](params, index);
  });
  REQUIRE(outcomes[0].error);
  REQUIRE(outcomes[1].error);
  test::check_throws<fl::OutOfRange>([&] { std::rethrow_exception(outcomes[0].error); }, {"9"});
  test::check_throws<fl::DeadlineExceeded>([&] { std::rethrow_exception(outcomes[1].error); }, {"all_reduce"});
}

TEST_CASE("argument errors name the op and what is wrong") {
  // One participant on cpu:1: every check below fails before anything is sent.
  auto communicator = fd::make_communicator({fl::Device("cpu:1")});
  const fd::ReplicaContext replica{communicator, 0, nullptr};
  const fd::ReplicaScope scope(&replica);
  const fl::Tensor here = fl::ones({4, 2}).to(fl::Device("cpu:1"));
  test::check_op_throws<fl::DeviceError>("all_reduce",
                                         [&] {
                                           (void)fl::all_reduce(fl::ones({4, 2}));
                                         },
                                         {"cpu:0", "cpu:1", "participant 0"});
  test::check_op_throws<fl::DeviceError>("all_gather", [&] { (void)fl::all_gather(fl::ones({4})); },
                                         {"cpu:0", "cpu:1"});
  test::check_op_throws<fl::InvalidArgument>("broadcast", [&] { (void)fl::broadcast(here, 1); }, {"root 1", "[0, 1)"});
  test::check_op_throws<fl::InvalidArgument>("broadcast", [&] { (void)fl::broadcast(here, -1); }, {"root -1"});
  test::check_op_throws<fl::ShapeError>(
      "reduce_scatter", [&] { (void)fl::reduce_scatter(fl::scalar(1.0f).to(here.device())); }, {"[]", "1 equal parts"});
  const fl::Tensor flags = test::make({1, 0}, fl::Shape{2}, fl::b8).to(here.device());
  test::check_op_throws<fl::DTypeError>("all_reduce", [&] { (void)fl::all_reduce(flags, ReduceOp::sum); },
                                        {"b8", "sum"});
  test::check_op_throws<fl::DTypeError>("all_reduce", [&] { (void)fl::all_reduce(flags, ReduceOp::mean); },
                                        {"b8", "mean"});
  test::check_op_throws<fl::DTypeError>("reduce_scatter", [&] { (void)fl::reduce_scatter(flags, ReduceOp::sum); },
                                        {"b8"});
  for (const auto& call : std::vector<std::function<void()>>{
           [] { (void)fl::all_reduce(fl::Tensor()); }, [] { (void)fl::broadcast(fl::Tensor()); },
           [] { (void)fl::all_gather(fl::Tensor()); }, [] { (void)fl::reduce_scatter(fl::Tensor()); }}) {
    test::check_throws<fl::InvalidArgument>(call, {"empty Tensor handle"});
  }
  // b8 reduces as logic with max (any) and min (all).
  test::check_tensor(fl::all_reduce(flags, ReduceOp::max), {1, 0}, fl::Shape{2}, fl::b8);
}

TEST_CASE("reduce_scatter: axis 0 that does not split into P parts is a ShapeError on every participant") {
  const Group g = make_group(3);
  const auto outcomes = run_spmd(g, [](int p) { return fl::reduce_scatter(input_of(p, fl::Shape{4, 2}, fl::f32)); });
  check_all_threw<fl::ShapeError>(outcomes, {"reduce_scatter:", "[4, 2]", "3 equal parts"});
}

// ---------------------------------------------------------------------------------------------
// The world communicator of a plain run: one process, one participant on the default device.

TEST_CASE("a plain run's collectives span one participant: all_reduce is the identity, all_gather adds [1]") {
  CHECK(fl::process_index() == 0);
  CHECK(fl::process_count() == 1);
  CHECK(fl::local_process_index() == 0);
  const fl::Tensor x = test::make({1.5, -2, 3, 4}, fl::Shape{2, 2}, fl::f32);
  for (ReduceOp op : kReductions) {
    CAPTURE(fl::to_string(op));
    test::check_tensor(fl::all_reduce(x, op), {1.5, -2, 3, 4}, fl::Shape{2, 2}, fl::f32);
  }
  test::check_tensor(fl::broadcast(x, 0), {1.5, -2, 3, 4}, fl::Shape{2, 2}, fl::f32);
  test::check_tensor(fl::all_gather(x), {1.5, -2, 3, 4}, fl::Shape{2, 2}, fl::f32);
  test::check_tensor(fl::all_gather(fl::scalar(7.0)), {7}, fl::Shape{1}, fl::f64);
  test::check_tensor(fl::reduce_scatter(x), {1.5, -2, 3, 4}, fl::Shape{2, 2}, fl::f32);
  fl::barrier();
  test::check_op_throws<fl::InvalidArgument>("broadcast", [&] { (void)fl::broadcast(x, 1); }, {"root 1", "[0, 1)"});
  // Traced too, at every call.
  auto fn = fl::trace([](fl::Tensor t) {
    fl::barrier();
    return fl::all_gather(fl::all_reduce(t, ReduceOp::max) + 1.0f);
  });
  for (int call = 0; call < 3; ++call) test::check_tensor(fn(x), {2.5, -1, 4, 5}, fl::Shape{2, 2}, fl::f32);
}

// ---------------------------------------------------------------------------------------------
// When headers are exchanged (collective/ops/header_checks.hpp).

TEST_CASE("headers are checked on an eager signature's first successful call and on a traced node's first run") {
  auto communicator = fd::make_communicator({fl::Device("cpu:2")});
  fd::CollectiveAttrs attrs;
  attrs.communicator = communicator;
  const fl::Tensor x = fl::ones({3}).to(fl::Device("cpu:2"));
  if (fd::always_check_headers()) {
    CHECK(fd::should_check_header(attrs, x, false));
    return;
  }
  CHECK(fd::should_check_header(attrs, x, /*traced=*/false));
  fd::mark_verified(attrs, x, false);
  CHECK_FALSE(fd::should_check_header(attrs, x, false));
  CHECK(fd::should_check_header(attrs, fl::ones({4}).to(x.device()), false));           // another shape
  CHECK(fd::should_check_header(attrs, fl::ones({3}, fl::f64).to(x.device()), false));  // another dtype
  fd::CollectiveAttrs other = attrs;
  other.op = ReduceOp::max;
  CHECK(fd::should_check_header(other, x, false));  // another reduction
  // Another communicator at the same participant starts unverified.
  fd::CollectiveAttrs elsewhere = attrs;
  elsewhere.communicator = fd::make_communicator({fl::Device("cpu:2")});
  CHECK(fd::should_check_header(elsewhere, x, false));
  // A traced node: its first run checks, later runs do not; a copy of its attributes is the same node.
  CHECK(fd::should_check_header(attrs, x, /*traced=*/true));
  const fd::CollectiveAttrs node_copy = attrs;
  fd::mark_verified(node_copy, x, true);
  CHECK_FALSE(fd::should_check_header(attrs, x, true));
  CHECK(fd::should_check_header(fd::CollectiveAttrs{communicator}, x, true));  // a new node
}

TEST_CASE("a collective runs on its participant's device inside a DeviceScope for another device") {
  const Group g = make_group(2);
  std::vector<int> misplaced(2, 0);
  const auto make_step = [] {
    return fl::trace([](fl::Tensor x) {
      const fl::DeviceScope on_cpu3(fl::Device("cpu:3"));
      return fl::all_reduce(x) * 2.0f;  // the multiply may run on cpu:3; the all_reduce may not
    });
  };
  std::vector<decltype(make_step())> traced;
  for (int p = 0; p < 2; ++p) traced.push_back(make_step());
  const auto outcomes = run_spmd(g, [&](int p) {
    const fl::Tensor x = input_of(p, kShape, fl::f32);
    const fl::Tensor y = traced[static_cast<size_t>(p)](x);
    for (const fl::Node& n : traced[static_cast<size_t>(p)].graph(x).nodes()) {
      if (!n.removed && n.op != nullptr && n.op->name == "all_reduce" && n.device != g.device(p))
        ++misplaced[static_cast<size_t>(p)];
    }
    // Eagerly the scope does not move the input either: the participant's device is the op's.
    const fl::Tensor view = fl::transpose(input_of(p, fl::Shape{3, 2}, fl::f32));  // made outside the scope
    const fl::DeviceScope on_cpu3(fl::Device("cpu:3"));
    const fl::Tensor eager = fl::all_reduce(x);
    if (eager.device() != g.device(p)) ++misplaced[static_cast<size_t>(p)];
    // The kernel makes a view contiguous where it is, not on the scope's device.
    const fl::Tensor from_view = fl::all_reduce(view);
    if (from_view.device() != g.device(p)) ++misplaced[static_cast<size_t>(p)];
    return fl::concat({fl::reshape(y.to(x.device()), {6}), fl::reshape(eager, {6})}, 0);
  });
  std::vector<double> sum = all_reduce_ref(2, kShape.numel(), ReduceOp::sum, fl::f32), want;
  for (double v : sum) want.push_back(2 * v);
  want.insert(want.end(), sum.begin(), sum.end());
  for (const fl::Tensor& t : values_of(outcomes)) test::check_tensor(t, want, fl::Shape{12}, fl::f32);
  CHECK(misplaced == std::vector<int>{0, 0});
}
