// The collective ops across processes: run under `mpirun -np N` (N = 2 and 3), every process runs
// every test case in the same order, so call k of each process forms one collective.
//
// World collectives (one participant per process, on its default device cpu:0), eager and traced,
// against values computed here from every rank's input; gradients against central finite
// differences of the SPMD loss (the sum over ranks of each rank's loss, itself all-reduced so that
// every rank sees it); ranks that disagree all fail, and the job goes on (no hang); and a
// communicator of two local participants per process (threads under ReplicaScopes, as
// MirroredStrategy runs its replicas), eager, traced and differentiated. Assertions never
// abort a case (no REQUIRE): a rank that left a case early would skip collectives its peers make.
#include <cmath>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "collective/communicator.hpp"
#include "collective/replica_context.hpp"
#include "flowlet/trace.hpp"
#include "support/reference.hpp"

using fl::ReduceOp;

namespace {

int rank() { return fl::process_index(); }
int ranks() { return fl::process_count(); }

// Rank r's input: small distinct values (exact sums in every dtype), negative for signed dtypes.
std::vector<double> input_values(int r, int64_t count, fl::DType dt) {
  std::vector<double> v;
  for (int64_t i = 0; i < count; ++i) {
    double x = static_cast<double>((3 * r + 5 * i) % 7 + r);
    if (dt == fl::b8) x = ((r + i) % 3 == 0) ? 1 : 0;
    if (dt != fl::u8 && dt != fl::b8 && (i + r) % 2 == 1) x = -x;
    v.push_back(x);
  }
  return v;
}

fl::Tensor input_of(int r, const fl::Shape& shape, fl::DType dt) {
  return test::make(input_values(r, shape.numel(), dt), shape, dt);
}

std::vector<double> all_reduce_ref(int64_t count, ReduceOp op, fl::DType dt) {
  std::vector<double> out;
  for (int64_t i = 0; i < count; ++i) {
    double acc = input_values(0, count, dt)[static_cast<size_t>(i)];
    for (int r = 1; r < ranks(); ++r) {
      const double x = input_values(r, count, dt)[static_cast<size_t>(i)];
      if (op == ReduceOp::sum || op == ReduceOp::mean) acc += x;
      if (op == ReduceOp::max) acc = std::max(acc, x);
      if (op == ReduceOp::min) acc = std::min(acc, x);
    }
    if (op == ReduceOp::mean) {
      acc /= ranks();
      if (!test::is_float(dt)) acc = std::trunc(acc);
    }
    out.push_back(test::round_to(acc, dt));
  }
  return out;
}

const std::vector<fl::DType> kEvery = {fl::f32, fl::f64, fl::i32, fl::i64, fl::u8, fl::b8, fl::f16, fl::bf16};

std::vector<ReduceOp> reductions_for(fl::DType dt) {
  if (dt == fl::b8) return {ReduceOp::max, ReduceOp::min};
  return {ReduceOp::sum, ReduceOp::mean, ReduceOp::max, ReduceOp::min};
}

// Runs `call`, turning an exception into a failed check (the other ranks go on with the job).
template <class F>
void guarded(F call) {
  try {
    call();
  } catch (const std::exception& e) {
    FAIL_CHECK("rank " << rank() << " threw " << test::error_kind(e) << ": " << e.what());
  }
}

}  // namespace

TEST_CASE("the job's processes: one participant each") {
  CHECK(ranks() >= 2);
  CHECK(rank() >= 0);
  CHECK(rank() < ranks());
  MESSAGE("process " << rank() << " of " << ranks());
}

TEST_CASE("all_reduce: every reduction in every dtype") {
  const fl::Shape shape{2, 3};
  for (fl::DType dt : kEvery) {
    for (ReduceOp op : reductions_for(dt)) {
      INFO("dtype ", fl::dtype_name(dt), ", op ", fl::to_string(op));
      guarded([&] {
        test::check_tensor(fl::all_reduce(input_of(rank(), shape, dt), op), all_reduce_ref(6, op, dt), shape, dt);
      });
    }
  }
}

TEST_CASE("broadcast, all_gather and reduce_scatter in every dtype; barrier") {
  const fl::Shape shape{2, 3};
  for (fl::DType dt : kEvery) {
    INFO("dtype ", fl::dtype_name(dt));
    for (int root = 0; root < ranks(); ++root) {
      guarded([&] {
        test::check_tensor(fl::broadcast(input_of(rank(), shape, dt), root), input_values(root, 6, dt), shape, dt);
      });
    }
    guarded([&] {
      std::vector<double> want;
      for (int r = 0; r < ranks(); ++r) {
        const std::vector<double> v = input_values(r, 6, dt);
        want.insert(want.end(), v.begin(), v.end());
      }
      test::check_tensor(fl::all_gather(input_of(rank(), shape, dt)), want, fl::Shape{2 * ranks(), 3}, dt);
    });
    for (ReduceOp op : reductions_for(dt)) {
      guarded([&] {
        const int64_t rows = 2 * ranks();
        const std::vector<double> full = all_reduce_ref(rows * 2, op, dt);
        const std::vector<double> part(full.begin() + 4 * rank(), full.begin() + 4 * (rank() + 1));
        test::check_tensor(fl::reduce_scatter(input_of(rank(), fl::Shape{rows, 2}, dt), op), part, fl::Shape{2, 2}, dt);
      });
    }
  }
  guarded([] {
    test::check_tensor(
        fl::all_gather(fl::scalar(static_cast<int64_t>(rank()))),
        [] {
          std::vector<double> v;
          for (int r = 0; r < ranks(); ++r) v.push_back(r);
          return v;
        }(),
        fl::Shape{ranks()}, fl::i64);
    test::check_tensor(fl::all_reduce(fl::zeros(fl::Shape{0, 3})), {}, fl::Shape{0, 3}, fl::f32);
    fl::barrier();
  });
}

TEST_CASE("traced world collectives give the eager results at every call") {
  auto step = [](const fl::Tensor& x) {
    const fl::Tensor summed = fl::all_reduce(x * 2.0f);
    const fl::Tensor gathered = fl::all_gather(summed - fl::all_reduce(x, ReduceOp::max));
    fl::barrier();
    return fl::broadcast(fl::reduce_scatter(gathered, ReduceOp::mean) + 1.0f, ranks() - 1);
  };
  auto traced = fl::trace([&](fl::Tensor x) { return step(x); });
  for (int call = 0; call < 3; ++call) {
    CAPTURE(call);
    guarded([&] {
      const fl::Tensor x = input_of(rank(), fl::Shape{2, 3}, fl::f32) + static_cast<float>(call);
      const fl::Tensor want = step(x);
      const fl::Tensor got = traced(x);
      test::check_tensor(got, test::values(want), want.shape(), fl::f32, test::Tolerance{0, 0});
    });
  }
  CHECK(traced.trace_count() == 1);
}

TEST_CASE("gradients across processes match finite differences of the SPMD loss") {
  using Fn = std::function<fl::Tensor(const fl::Tensor&)>;
  const std::vector<std::pair<std::string, Fn>> cases = {
      {"all_reduce sum", [](const fl::Tensor& x) { return fl::all_reduce(x); }},
      {"all_reduce mean", [](const fl::Tensor& x) { return fl::all_reduce(x, ReduceOp::mean); }},
      {"all_reduce max", [](const fl::Tensor& x) { return fl::all_reduce(x, ReduceOp::max); }},
      {"broadcast from the last rank", [](const fl::Tensor& x) { return fl::broadcast(x, fl::process_count() - 1); }},
      {"all_gather", [](const fl::Tensor& x) { return fl::all_gather(x); }},
      {"reduce_scatter min", [](const fl::Tensor& x) { return fl::reduce_scatter(x, ReduceOp::min); }},
  };
  const fl::Shape shape{ranks()};
  for (const auto& [label, fn] : cases) {
    INFO(label);
    guarded([&] {
      // Normal values, distinct over ranks (no ties for max and min).
      const std::vector<double> mine =
          test::random_values(shape.numel(), 500 + 17 * static_cast<uint64_t>(rank()), fl::f64);
      auto weights = [&](const fl::Tensor& y) {
        return test::random_tensor(y.shape(), 900 + static_cast<uint64_t>(rank()), fl::f64);
      };
      // The SPMD loss with element i of rank `who`'s input moved by `delta`, on every rank.
      auto total_loss = [&](int who, int64_t i, double delta) {
        std::vector<double> v = mine;
        if (who == rank()) v[static_cast<size_t>(i)] += delta;
        const fl::Tensor y = fn(test::make(v, shape, fl::f64));
        return test::values(fl::all_reduce(fl::sum(y * weights(y)))).at(0);
      };
      const fl::Tensor x = test::make(mine, shape, fl::f64);
      fl::GradientTape tape;
      tape.watch(x);
      const fl::Tensor y = fn(x);
      const fl::Tensor grad = tape.gradient(fl::sum(y * weights(y)), {x})[0];
      std::vector<double> want(static_cast<size_t>(shape.numel()));
      const double h = 1e-6;
      for (int who = 0; who < ranks(); ++who) {
        for (int64_t i = 0; i < shape.numel(); ++i) {
          const double slope = (total_loss(who, i, h) - total_loss(who, i, -h)) / (2 * h);
          if (who == rank()) want[static_cast<size_t>(i)] = slope;
        }
      }
      test::check_tensor(grad, want, shape, fl::f64, test::Tolerance{1e-6, 1e-6});
    });
  }
}

TEST_CASE("ranks that disagree all fail with an error naming the difference, and the job goes on") {
  struct Disagreement {
    const char* what;
    std::function<fl::Tensor()> call;
  };
  const std::vector<Disagreement> cases = {
      {"shape",
       [] {
         return fl::all_reduce(fl::ones(rank() == 1 ? fl::Shape{7, 5} : fl::Shape{5, 7}));
       }},
      {"dtype", [] { return fl::all_reduce(fl::ones(fl::Shape{4}, rank() == 1 ? fl::f64 : fl::f32)); }},
      {"reduction", [] { return fl::all_reduce(fl::ones(fl::Shape{4}), rank() == 1 ? ReduceOp::max : ReduceOp::sum); }},
      {"collective",
       [] { return rank() == 1 ? fl::broadcast(fl::ones(fl::Shape{4})) : fl::all_reduce(fl::ones(fl::Shape{4})); }},
  };
  // Signatures no rank has completed before: eager calls check headers on a signature's first
  // successful use (src/collective/ops/header_checks.hpp), and a failed call does not count.
  for (const Disagreement& d : cases) {
    INFO("ranks disagree on the ", d.what);
    test::check_throws<fl::Error>([&] { (void)d.call(); }, {std::string("disagree on the ") + d.what});
    // The next collective works on every rank.
    guarded([] {
      test::check_tensor(fl::all_reduce(fl::ones(fl::Shape{2})),
                         {static_cast<double>(ranks()), static_cast<double>(ranks())}, fl::Shape{2}, fl::f32);
    });
  }
  // Traced: each rank's node checks its header on its first run.
  auto traced = fl::trace([](fl::Tensor x) { return fl::all_gather(x); });
  test::check_throws<fl::Error>([&] { (void)traced(fl::ones(rank() == 0 ? fl::Shape{2} : fl::Shape{3})); },
                                {"disagree on the shape"});
  guarded([] { fl::barrier(); });
}

// ---------------------------------------------------------------------------------------------
// Two local participants per process (what MirroredStrategy builds): the in-process stage, then
// the processes; participant = process * 2 + local.

namespace {

const bool two_local_devices = (fl::set_logical_cpu_devices(2), true);

// Runs fn(local) on one thread per local participant, under its replica scope; collects results.
std::vector<fl::Tensor> run_local_replicas(const std::shared_ptr<fl::detail::Communicator>& communicator,
                                           const std::function<fl::Tensor(int)>& fn, std::vector<std::string>& errors) {
  std::vector<fl::Tensor> results(2);
  std::vector<std::string> failures(2);
  std::vector<std::thread> threads;
  for (int local = 0; local < 2; ++local) {
    threads.emplace_back([&, local] {
      const fl::detail::ReplicaContext replica{communicator, local, nullptr};
      const fl::detail::ReplicaScope scope(&replica);
      try {
        results[static_cast<size_t>(local)] = fn(local);
      } catch (const std::exception& e) {
        failures[static_cast<size_t>(local)] = test::error_kind(e) + ": " + e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::string& f : failures)
    if (!f.empty()) errors.push_back(f);
  return results;
}

}  // namespace

TEST_CASE("collectives over two local participants per process: eager, traced and gradients") {
  (void)two_local_devices;
  const auto communicator = fl::detail::make_communicator({fl::Device("cpu:0"), fl::Device("cpu:1")});
  const int participants = 2 * ranks();
  CHECK(communicator->size() == participants);
  auto participant = [](int local) { return rank() * 2 + local; };
  auto input = [&](int local) {
    return input_of(participant(local), fl::Shape{participants, 2}, fl::f32).to(fl::Device(fl::DeviceKind::cpu, local));
  };
  std::vector<std::string> errors;

  // all_reduce sum and max, all_gather in participant order, reduce_scatter part per participant.
  const auto sums = run_local_replicas(
      communicator, [&](int local) { return fl::all_reduce(input(local)); }, errors);
  const auto maxima = run_local_replicas(
      communicator, [&](int local) { return fl::all_reduce(input(local), ReduceOp::max); }, errors);
  const auto gathered = run_local_replicas(
      communicator, [&](int local) { return fl::all_gather(input(local)); }, errors);
  const auto parts = run_local_replicas(
      communicator, [&](int local) { return fl::reduce_scatter(input(local)); }, errors);
  const int64_t count = 2 * participants;
  std::vector<double> sum(static_cast<size_t>(count), 0), maximum(static_cast<size_t>(count), -1e9), all;
  for (int p = 0; p < participants; ++p) {
    const std::vector<double> v = input_values(p, count, fl::f32);
    for (int64_t i = 0; i < count; ++i) {
      sum[static_cast<size_t>(i)] += v[static_cast<size_t>(i)];
      maximum[static_cast<size_t>(i)] = std::max(maximum[static_cast<size_t>(i)], v[static_cast<size_t>(i)]);
    }
    all.insert(all.end(), v.begin(), v.end());
  }
  for (int local = 0; local < 2; ++local) {
    CAPTURE(local);
    const size_t l = static_cast<size_t>(local);
    if (errors.empty()) {
      test::check_tensor(sums[l], sum, fl::Shape{participants, 2}, fl::f32);
      CHECK(sums[l].device() == fl::Device(fl::DeviceKind::cpu, local));
      test::check_tensor(maxima[l], maximum, fl::Shape{participants, 2}, fl::f32);
      test::check_tensor(gathered[l], all, fl::Shape{participants * participants, 2}, fl::f32);
      const std::vector<double> part(sum.begin() + 2 * participant(local), sum.begin() + 2 * (participant(local) + 1));
      test::check_tensor(parts[l], part, fl::Shape{1, 2}, fl::f32);
    }
  }

  // Traced: each local replica traces its own step; the same results at every call.
  std::vector<std::function<fl::Tensor(fl::Tensor)>> steps;
  for (int local = 0; local < 2; ++local) {
    steps.push_back(fl::trace([](fl::Tensor x) { return fl::all_gather(fl::reduce_scatter(x, ReduceOp::sum)); }));
  }
  for (int call = 0; call < 2; ++call) {
    const auto got = run_local_replicas(
        communicator, [&](int local) { return steps[static_cast<size_t>(local)](input(local)); }, errors);
    for (int local = 0; local < 2 && errors.empty(); ++local)
      test::check_tensor(got[static_cast<size_t>(local)], sum, fl::Shape{participants, 2}, fl::f32);
  }

  // Gradient of L = sum over participants of sum(all_reduce(x, mean) * (participant + 1)):
  // dL/dx = sum_p (p + 1) / participants, the same for every participant.
  const auto grads = run_local_replicas(
      communicator,
      [&](int local) {
        const fl::Tensor x = input(local);
        fl::GradientTape tape;
        tape.watch(x);
        const fl::Tensor loss = fl::sum(fl::all_reduce(x, ReduceOp::mean) * static_cast<float>(participant(local) + 1));
        return tape.gradient(loss, {x})[0];
      },
      errors);
  const double slope = (participants + 1) / 2.0;
  for (int local = 0; local < 2 && errors.empty(); ++local) {
    test::check_tensor(grads[static_cast<size_t>(local)], std::vector<double>(static_cast<size_t>(count), slope),
                       fl::Shape{participants, 2}, fl::f32);
  }
  for (const std::string& e : errors) FAIL_CHECK("a local replica threw " << e);
}
