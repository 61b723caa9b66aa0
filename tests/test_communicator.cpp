// The communicator (src/collective): the in-process backend over logical CPU devices, the world
// communicator of a 1-process job, and the checks every participant gets. Participants run on
// their own threads, as replicas do. Expected values are worked by hand or computed here in
// double/int64 from the values each participant holds.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <thread>

#include "collective/communicator.hpp"
#include "collective/transport/backends.hpp"
#include "collective/transport/process.hpp"
#include "support/communicator.hpp"
#include "support/gpu.hpp"
#include "support/reference.hpp"
#include "support/replicas.hpp"

namespace {

using fl::detail::CollectiveCall;
using fl::detail::CollectiveKind;
using fl::detail::Communicator;
using test::call_of;
using test::expect;
using test::Outcome;
using test::rethrow;
using test::run_all;

void ensure_devices() { test::ensure_cpu_devices(4); }

std::vector<fl::Device> cpus(int n) { return test::cpu_devices(n); }

std::shared_ptr<Communicator> local_communicator(int n, double timeout = 30) {
  ensure_devices();
  return fl::detail::make_communicator(cpus(n), {.timeout_seconds = timeout});
}

fl::Tensor on(const fl::Tensor& t, int device) { return t.to(fl::Device(fl::DeviceKind::cpu, device)); }

// The participant's error message, or empty when it succeeded.
std::string outcome_error(const Outcome& o) {
  if (!o.error) return "";
  try {
    std::rethrow_exception(o.error);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "unknown error";
}

std::vector<double> results_of(const Outcome& o) {
  if (o.error) {
    try {
      std::rethrow_exception(o.error);
    } catch (const std::exception& e) {
      FAIL("participant failed: " << e.what());
    }
  }
  return test::values(o.result);
}

}  // namespace

TEST_CASE("names: collective_name and to_string(ReduceOp)") {
  CHECK(std::string(fl::detail::collective_name(CollectiveKind::all_reduce)) == "all_reduce");
  CHECK(std::string(fl::detail::collective_name(CollectiveKind::broadcast)) == "broadcast");
  CHECK(std::string(fl::detail::collective_name(CollectiveKind::all_gather)) == "all_gather");
  CHECK(std::string(fl::detail::collective_name(CollectiveKind::reduce_scatter)) == "reduce_scatter");
  CHECK(std::string(fl::detail::collective_name(CollectiveKind::barrier)) == "barrier");
  CHECK(std::string(fl::to_string(fl::ReduceOp::sum)) == "sum");
  CHECK(std::string(fl::to_string(fl::ReduceOp::mean)) == "mean");
  CHECK(std::string(fl::to_string(fl::ReduceOp::max)) == "max");
  CHECK(std::string(fl::to_string(fl::ReduceOp::min)) == "min");
}

TEST_CASE("processes: a plain run is process 0 of 1") {
  // The test binary runs without a launcher (meson test runs it directly).
  CHECK(fl::process_index() == 0);
  CHECK(fl::process_count() == 1);
  CHECK(fl::local_process_index() == 0);
  CHECK(fl::detail::process_placement().source == "none");
}

TEST_CASE("processes: the placement is read from Open MPI's, Hydra's or Slurm's variables, and checked") {
  // Sets the variables for one check and removes them after, whatever happens.
  struct Environment {
    std::vector<std::string> names;
    explicit Environment(const std::vector<std::pair<std::string, std::string>>& values) {
      for (const auto& [name, value] : values) {
        setenv(name.c_str(), value.c_str(), 1);
        names.push_back(name);
      }
    }
    ~Environment() {
      for (const auto& name : names) unsetenv(name.c_str());
    }
  };
  {
    Environment env(
        {{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}});
    const auto p = fl::detail::placement_from_environment();
    CHECK(p.index == 2);
    CHECK(p.count == 4);
    CHECK(p.local_index == 0);
    CHECK(p.source == "Open MPI");
  }
  {
    Environment env({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}});
    const auto p = fl::detail::placement_from_environment();
    CHECK(p.index == 5);
    CHECK(p.count == 8);
    CHECK(p.local_index == 1);
    CHECK(p.source == "Slurm");
  }
  {
    Environment env({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}});
    const auto p = fl::detail::placement_from_environment();
    CHECK(p.index == 1);
    CHECK(p.local_index == 0);  // no local rank given
    CHECK(p.source == "MPICH (Hydra)");
  }
  {
    Environment env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}});  // a 1-process launch stays 1 process
    CHECK(fl::detail::placement_from_environment().count == 1);
  }
  {
    Environment env({{"OMPI_COMM_WORLD_RANK", "4"}, {"OMPI_COMM_WORLD_SIZE", "4"}});
    test::check_op_throws<fl::InvalidArgument>("process_index", [] { fl::detail::placement_from_environment(); },
                                               {"process 4 of 4", "OMPI_COMM_WORLD_RANK"});
  }
  {
    Environment env({{"SLURM_PROCID", "x1"}, {"SLURM_NTASKS", "2"}});
    test::check_op_throws<fl::InvalidArgument>("process_index", [] { fl::detail::placement_from_environment(); },
                                               {"SLURM_PROCID", "'x1'"});
  }
  CHECK(fl::detail::placement_from_environment().source == "none");
}

TEST_CASE("world communicator of a 1-process job: one participant on cpu:0") {
  ensure_devices();
  auto world = fl::detail::world_communicator();
  CHECK(world == fl::detail::world_communicator());
  CHECK(world->size() == 1);
  CHECK(world->local_size() == 1);
  CHECK(world->processes() == 1);
  CHECK(world->process_rank() == 0);
  CHECK(world->device(0) == fl::Device("cpu:0"));
  CHECK(world->describe() == "communicator of 1 participant (1 process x [cpu:0])");
  const fl::Tensor x = test::make({1.5, -2, 3}, fl::Shape{3});
  CHECK(expect(world->run(0, call_of(CollectiveKind::all_reduce, x)), {1.5, -2, 3}, {3}));
  CHECK(expect(world->run(0, call_of(CollectiveKind::all_reduce, x, fl::ReduceOp::mean)), {1.5, -2, 3}, {3}));
  CHECK(expect(world->run(0, call_of(CollectiveKind::broadcast, x)), {1.5, -2, 3}, {3}));
  CHECK(expect(world->run(0, call_of(CollectiveKind::all_gather, x)), {1.5, -2, 3}, {3}));
  CHECK(expect(world->run(0, call_of(CollectiveKind::all_gather, fl::scalar(4.0f))), {4}, {1}));
  CHECK(expect(world->run(0, call_of(CollectiveKind::reduce_scatter, x)), {1.5, -2, 3}, {3}));
  CHECK_FALSE(world->run(0, call_of(CollectiveKind::barrier, fl::Tensor())).defined());
  // A non-distributed program pays nothing: MPI was never started.
  CHECK_FALSE(fl::detail::mpi_started());
}

TEST_CASE("all_reduce over 4 participants: sum, mean, max, min, worked by hand") {
  auto comm = local_communicator(4);
  CHECK(comm->describe() == "communicator of 4 participants (1 process x [cpu:0, cpu:1, cpu:2, cpu:3])");
  const std::vector<std::vector<double>> inputs = {{1, -4, 0.5}, {2, 8, 0.25}, {3, -1, 4}, {10, 2, -0.75}};
  auto make_call = [&](fl::ReduceOp op) {
    return [&, op](int i) { return call_of(CollectiveKind::all_reduce, on(test::make(inputs[i]), i), op); };
  };
  const std::vector<std::pair<fl::ReduceOp, std::vector<double>>> cases = {
      {fl::ReduceOp::sum, {16, 5, 4}},
      {fl::ReduceOp::mean, {4, 1.25, 1}},
      {fl::ReduceOp::max, {10, 8, 4}},
      {fl::ReduceOp::min, {1, -4, -0.75}},
  };
  for (const auto& [op, want] : cases) {
    CAPTURE(fl::to_string(op));
    const auto outcomes = run_all(*comm, make_call(op));
    for (int i = 0; i < 4; ++i) {
      CHECK(expect(outcomes[i].result, want, {3}));
      CHECK(outcomes[i].result.device() == fl::Device(fl::DeviceKind::cpu, i));
    }
  }
}

TEST_CASE("all_reduce in every dtype matches a sum computed here") {
  auto comm = local_communicator(3);
  for (fl::DType dt : test::kAllDTypes) {
    CAPTURE(dt);
    std::vector<std::vector<double>> inputs = {{1, 0, 5, 7}, {2, 0, 0, 9}, {4, 1, 0, 11}};
    if (dt == fl::b8) inputs = {{1, 0, 1, 0}, {1, 0, 0, 0}, {1, 1, 0, 0}};
    for (fl::ReduceOp op : {fl::ReduceOp::sum, fl::ReduceOp::mean, fl::ReduceOp::max, fl::ReduceOp::min}) {
      CAPTURE(fl::to_string(op));
      std::vector<double> want(4);
      for (size_t k = 0; k < 4; ++k) {
        double s = 0, mx = -1e300, mn = 1e300;
        for (const auto& in : inputs) {
          s += in[k];
          mx = std::max(mx, in[k]);
          mn = std::min(mn, in[k]);
        }
        if (dt == fl::b8) {
          // b8: sum and max are "any", min and mean "all".
          want[k] = (op == fl::ReduceOp::sum || op == fl::ReduceOp::max) ? (mx > 0) : (mn > 0);
        } else if (op == fl::ReduceOp::sum) {
          want[k] = s;
        } else if (op == fl::ReduceOp::mean) {
          want[k] = test::is_float(dt) ? test::round_to(s / 3, dt) : std::trunc(s / 3);
        } else {
          want[k] = op == fl::ReduceOp::max ? mx : mn;
        }
      }
      const auto outcomes = run_all(
          *comm, [&](int i) { return call_of(CollectiveKind::all_reduce, on(test::make(inputs[i], dt), i), op); });
      for (int i = 0; i < 3; ++i) {
        REQUIRE_FALSE(outcomes[i].error);
        CHECK(outcomes[i].result.dtype() == dt);
        CHECK(expect(outcomes[i].result, want, {4}));
      }
    }
  }
}

TEST_CASE("f16 and bf16 accumulate in f32 and round once") {
  auto comm = local_communicator(4);
  // f16 holds even integers only at 2048: step by step in f16, 2048 + 1 rounds back to 2048 each
  // time; accumulated in f32 the sum is 2051, which rounds (to even) to 2052.
  auto outcomes = run_all(*comm, [&](int i) {
    return call_of(CollectiveKind::all_reduce, on(test::make({i == 0 ? 2048.0 : 1.0}, fl::f16), i));
  });
  for (int i = 0; i < 4; ++i) CHECK(results_of(outcomes[i]) == std::vector<double>{2052});
  // bf16 holds 256 and 258 but not 257: 256 + 1 + 1 + 1 = 259 rounds to 260 (f32 accumulation),
  // not to 256 (bf16 step by step).
  outcomes = run_all(*comm, [&](int i) {
    return call_of(CollectiveKind::all_reduce, on(test::make({i == 0 ? 256.0 : 1.0}, fl::bf16), i));
  });
  for (int i = 0; i < 4; ++i) CHECK(results_of(outcomes[i]) == std::vector<double>{260});
  // mean divides in f32 before the one rounding: (2048 + 3) / 4 = 512.75, halfway between f16's
  // 512.5 and 513 (step 0.5 there): ties to even give 513. (Step by step in f16: 2048 / 4 = 512.)
  outcomes = run_all(*comm, [&](int i) {
    return call_of(CollectiveKind::all_reduce, on(test::make({i == 0 ? 2048.0 : 1.0}, fl::f16), i), fl::ReduceOp::mean);
  });
  for (int i = 0; i < 4; ++i) CHECK(results_of(outcomes[i]) == std::vector<double>{513});
}

TEST_CASE("integers: sums wrap, mean truncates toward zero") {
  auto comm = local_communicator(4);
  auto outcomes = run_all(*comm, [&](int i) {
    const int32_t v = i == 0 ? std::numeric_limits<int32_t>::max() : (i == 1 ? 1 : 0);
    return call_of(CollectiveKind::all_reduce, on(fl::tensor(std::vector<int32_t>{v}, fl::Shape{1}), i));
  });
  for (int i = 0; i < 4; ++i) CHECK(outcomes[i].result.to_vector<int32_t>()[0] == std::numeric_limits<int32_t>::min());
  // -5 / 4 = -1.25 -> -1, 5 / 4 -> 1.
  outcomes = run_all(*comm, [&](int i) {
    const std::vector<int64_t> v = {i == 0 ? -8 : 1, i == 0 ? 2 : 1};
    return call_of(CollectiveKind::all_reduce, on(fl::tensor(v, fl::Shape{2}), i), fl::ReduceOp::mean);
  });
  for (int i = 0; i < 4; ++i) CHECK(outcomes[i].result.to_vector<int64_t>() == std::vector<int64_t>{-1, 1});
}

TEST_CASE("results are bit-identical on every participant and reduce in participant order") {
  auto comm = local_communicator(4);
  std::vector<fl::Tensor> inputs;
  for (int i = 0; i < 4; ++i) inputs.push_back(on(test::random_tensor(fl::Shape{1000}, 100 + i), i));
  const auto outcomes = run_all(*comm, [&](int i) { return call_of(CollectiveKind::all_reduce, inputs[i]); });
  std::vector<float> want(1000);
  for (int k = 0; k < 1000; ++k) {
    float s = inputs[0].data<float>()[k];
    for (int i = 1; i < 4; ++i) s += inputs[i].data<float>()[k];
    want[k] = s;
  }
  for (int i = 0; i < 4; ++i) {
    const auto got = outcomes[i].result.to_vector<float>();
    CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("broadcast, all_gather and reduce_scatter, worked by hand") {
  auto comm = local_communicator(4);
  SUBCASE("broadcast from root 2") {
    const auto outcomes = run_all(*comm, [&](int i) {
      return call_of(CollectiveKind::broadcast, on(test::make({10.0 * i, 1.0 + i}), i), fl::ReduceOp::sum, 2);
    });
    for (int i = 0; i < 4; ++i) {
      CHECK(expect(outcomes[i].result, {20, 3}, {2}));
      CHECK(outcomes[i].result.device() == fl::Device(fl::DeviceKind::cpu, i));
    }
  }
  SUBCASE("broadcast gives each participant its own tensor, not the root's") {
    fl::Tensor root_input = on(test::make({7}), 1);
    const auto outcomes = run_all(*comm, [&](int i) {
      return call_of(CollectiveKind::broadcast, i == 1 ? root_input : on(test::make({0}), i), fl::ReduceOp::sum, 1);
    });
    CHECK(outcomes[1].result.raw_data() != root_input.raw_data());
  }
  SUBCASE("all_gather concatenates along axis 0 in participant order") {
    const auto outcomes = run_all(*comm, [&](int i) {
      return call_of(CollectiveKind::all_gather, on(test::make({1.0 * i, 10.0 * i}, fl::Shape{1, 2}), i));
    });
    for (int i = 0; i < 4; ++i) CHECK(expect(outcomes[i].result, {0, 0, 1, 10, 2, 20, 3, 30}, {4, 2}));
  }
  SUBCASE("all_gather of scalars has shape [participants]") {
    const auto outcomes =
        run_all(*comm, [&](int i) { return call_of(CollectiveKind::all_gather, on(fl::scalar(int64_t{5 + i}), i)); });
    for (int i = 0; i < 4; ++i) CHECK(outcomes[i].result.to_vector<int64_t>() == std::vector<int64_t>{5, 6, 7, 8});
  }
  SUBCASE("reduce_scatter: participant i gets part i of the sum") {
    const auto outcomes = run_all(*comm, [&](int i) {
      std::vector<double> v(8);
      for (int k = 0; k < 8; ++k) v[k] = k + 100 * i;  // sum over i: 4k + 600
      return call_of(CollectiveKind::reduce_scatter, on(test::make(v, fl::Shape{4, 2}), i));
    });
    for (int i = 0; i < 4; ++i) {
      CHECK(expect(outcomes[i].result, {4.0 * (2 * i) + 600, 4.0 * (2 * i + 1) + 600}, {1, 2}));
    }
  }
  SUBCASE("reduce_scatter mean in bf16") {
    const auto outcomes = run_all(*comm, [&](int i) {
      return call_of(CollectiveKind::reduce_scatter, on(test::make({1.0 * i, 2, 3, 4, 5, 6, 7, 8}, fl::bf16), i),
                     fl::ReduceOp::mean);
    });
    // Element 0: (0 + 1 + 2 + 3) / 4 = 1.5; the others are the same on every participant.
    const std::vector<std::vector<double>> want = {{1.5, 2}, {3, 4}, {5, 6}, {7, 8}};
    for (int i = 0; i < 4; ++i) CHECK(expect(outcomes[i].result, want[i], {2}));
  }
  SUBCASE("barrier returns an empty handle to everyone") {
    const auto outcomes = run_all(*comm, [&](int) { return call_of(CollectiveKind::barrier, fl::Tensor()); });
    for (int i = 0; i < 4; ++i) {
      CHECK_FALSE(outcomes[i].error);
      CHECK_FALSE(outcomes[i].result.defined());
    }
  }
}

TEST_CASE("0-size tensors pass through every kind") {
  auto comm = local_communicator(2);
  for (CollectiveKind kind : {CollectiveKind::all_reduce, CollectiveKind::broadcast, CollectiveKind::all_gather,
                              CollectiveKind::reduce_scatter}) {
    CAPTURE(fl::detail::collective_name(kind));
    const auto outcomes = run_all(*comm, [&](int i) {
      return call_of(kind, on(fl::zeros(fl::Shape{0, 3}, fl::f16), i));
    });
    for (int i = 0; i < 2; ++i) {
      REQUIRE_FALSE(outcomes[i].error);
      CHECK(outcomes[i].result.shape() == fl::Shape{0, 3});
      CHECK(outcomes[i].result.dtype() == fl::f16);
    }
  }
  const auto gathered = run_all(*comm, [&](int i) {
    return call_of(CollectiveKind::all_gather, on(fl::zeros(fl::Shape{3, 0}), i));
  });
  CHECK(gathered[1].result.shape() == fl::Shape{6, 0});
}

TEST_CASE("non-contiguous inputs are read in row-major order") {
  auto comm = local_communicator(2);
  const auto outcomes = run_all(*comm, [&](int i) {
    return call_of(CollectiveKind::all_gather, on(fl::transpose(test::make({1, 2, 3, 4, 5, 6}, fl::Shape{2, 3})), i));
  });
  CHECK(expect(outcomes[0].result, {1, 4, 2, 5, 3, 6, 1, 4, 2, 5, 3, 6}, {6, 2}));
}

TEST_CASE("participants that disagree all fail with an error naming both") {
  auto comm = local_communicator(4);
  auto all_fail = [&](const std::function<CollectiveCall(int)>& make_call, auto check) {
    const auto outcomes = run_all(*comm, make_call);
    for (int i = 0; i < 4; ++i) check(outcomes[i]);
  };
  SUBCASE("shape") {
    all_fail([&](int i) { return call_of(CollectiveKind::all_reduce, on(fl::zeros(fl::Shape{i == 3 ? 3 : 2}), i)); },
             [](const Outcome& o) {
               test::check_op_throws<fl::ShapeError>(
                   "all_reduce", [&] { rethrow(o); },
                   {"disagree on the shape", "participant 3 (cpu:3) with [3]", "with [2]"});
             });
  }
  SUBCASE("dtype") {
    all_fail(
        [&](int i) {
          return call_of(CollectiveKind::all_gather, on(fl::zeros(fl::Shape{2}, i == 1 ? fl::f64 : fl::f32), i));
        },
        [](const Outcome& o) {
          test::check_op_throws<fl::DTypeError>(
              "all_gather", [&] { rethrow(o); },
              {"disagree on the dtype", "participant 1 (cpu:1) with f64", "with f32"});
        });
  }
  SUBCASE("reduction") {
    all_fail(
        [&](int i) {
          return call_of(CollectiveKind::all_reduce, on(fl::zeros(fl::Shape{2}), i),
                         i == 2 ? fl::ReduceOp::max : fl::ReduceOp::sum);
        },
        [](const Outcome& o) {
          test::check_op_throws<fl::InvalidArgument>("all_reduce", [&] { rethrow(o); },
                                                     {"disagree on the reduction", "(cpu:2) with max", "with sum"});
        });
  }
  SUBCASE("collective") {
    all_fail(
        [&](int i) {
          return call_of(i == 0 ? CollectiveKind::broadcast : CollectiveKind::all_reduce,
                         on(fl::zeros(fl::Shape{2}), i));
        },
        [](const Outcome& o) {
          test::check_throws<fl::InvalidArgument>(
              [&] { rethrow(o); },
              {"disagree on the collective", "participant 0 (cpu:0) with broadcast", "with all_reduce"});
        });
  }
  SUBCASE("root") {
    all_fail(
        [&](int i) {
          return call_of(CollectiveKind::broadcast, on(fl::zeros(fl::Shape{2}), i), fl::ReduceOp::sum, i == 0 ? 1 : 0);
        },
        [](const Outcome& o) {
          test::check_op_throws<fl::InvalidArgument>("broadcast", [&] { rethrow(o); },
                                                     {"disagree on the root", "root 1", "root 0"});
        });
  }
  // The failed call is over for everyone: the next one works.
  const auto next =
      run_all(*comm, [&](int i) { return call_of(CollectiveKind::all_reduce, on(test::make({1.0 * i}), i)); });
  for (int i = 0; i < 4; ++i) CHECK(expect(next[i].result, {6}, {1}));
}

TEST_CASE("participants that do not arrive: DeadlineExceeded names them, late ones fail too") {
  auto comm = local_communicator(4, 0.2);
  const auto begin = std::chrono::steady_clock::now();
  const auto outcomes =
      run_all(*comm, [&](int i) { return call_of(CollectiveKind::all_reduce, on(test::make({1}), i)); }, {0, 2});
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  CHECK(waited >= 0.19);
  CHECK(waited < 5);
  for (int i : {0, 2}) {
    test::check_op_throws<fl::DeadlineExceeded>(
        "all_reduce", [&] { rethrow(outcomes[i]); },
        {"participants [1, 3] of communicator of 4 participants", "did not arrive within 0.2 s"});
  }
  // Participants 1 and 3 arrive late at the same call: it is over, they fail at once.
  const auto late =
      run_all(*comm, [&](int i) { return call_of(CollectiveKind::all_reduce, on(test::make({1}), i)); }, {1, 3});
  for (int i : {1, 3}) test::check_throws<fl::DeadlineExceeded>([&] { rethrow(late[i]); }, {"did not arrive"});
  // The next call has everyone.
  const auto next = run_all(*comm, [&](int i) { return call_of(CollectiveKind::all_reduce, on(test::make({2}), i)); });
  for (int i = 0; i < 4; ++i) CHECK(expect(next[i].result, {8}, {1}));
}

TEST_CASE("start() returns at once and matches calls by number, many in flight") {
  auto comm = local_communicator(3);
  constexpr int kCalls = 200;
  const std::vector<fl::Tensor> results = test::start_in_flight(*comm, 3, kCalls, [&](int i, int k) {
    return call_of(CollectiveKind::all_reduce, on(test::make({1.0 * k + i}), i));
  });
  bool all_right = true;
  for (int i = 0; i < 3; ++i) {
    for (int k = 0; k < kCalls; ++k) {
      const double got = test::values(results[i * kCalls + k])[0];
      all_right = all_right && got == 3.0 * k + 3;  // (k + 0) + (k + 1) + (k + 2)
    }
  }
  CHECK(all_right);
}

TEST_CASE("a participant's own argument errors are thrown by start()") {
  auto comm = local_communicator(2);
  auto ignore = [](fl::Tensor, std::exception_ptr) {};
  test::check_op_throws<fl::DeviceError>(
      "all_reduce", [&] { comm->start(1, call_of(CollectiveKind::all_reduce, test::make({1})), ignore); },
      {"participant 1", "runs on cpu:1", "got a tensor on cpu:0"});
  test::check_op_throws<fl::InvalidArgument>(
      "all_gather", [&] { comm->start(0, call_of(CollectiveKind::all_gather, fl::Tensor()), ignore); },
      {"empty tensor handle"});
  test::check_op_throws<fl::InvalidArgument>(
      "broadcast",
      [&] { comm->start(0, call_of(CollectiveKind::broadcast, test::make({1}), fl::ReduceOp::sum, 2), ignore); },
      {"root 2 is not a participant", "(0 .. 1)"});
  test::check_op_throws<fl::ShapeError>(
      "reduce_scatter",
      [&] {
        comm->start(0, call_of(CollectiveKind::reduce_scatter, test::make({1, 2, 3})), ignore);
      },
      {"2 equal parts", "[3]"});
  test::check_op_throws<fl::ShapeError>(
      "reduce_scatter", [&] { comm->start(0, call_of(CollectiveKind::reduce_scatter, fl::scalar(1.0f)), ignore); },
      {"[]"});
  test::check_throws<fl::InvalidArgument>(
      [&] { comm->start(2, call_of(CollectiveKind::all_reduce, test::make({1})), ignore); },
      {"local participant 2 does not exist"});
  // None of these counted as a call: a complete call still works.
  const auto next = run_all(*comm, [&](int i) { return call_of(CollectiveKind::all_reduce, on(test::make({1}), i)); });
  for (int i = 0; i < 2; ++i) CHECK(expect(next[i].result, {2}, {1}));
}

TEST_CASE("make_communicator checks its devices") {
  ensure_devices();
  test::check_op_throws<fl::InvalidArgument>("make_communicator", [&] { fl::detail::make_communicator({}); },
                                             {"at least one"});
  test::check_op_throws<fl::InvalidArgument>(
      "make_communicator",
      [&] {
        fl::detail::make_communicator({fl::Device("cpu:1"), fl::Device("cpu:1")});
      },
      {"distinct", "cpu:1 twice"});
  test::check_throws<fl::DeviceError>([&] { fl::detail::make_communicator({fl::Device("cpu:9")}); }, {"cpu:9"});
  if (fl::device_count(fl::DeviceKind::cuda) == 0) {
    test::check_throws<fl::DeviceError>([&] { fl::detail::make_communicator({fl::Device("cuda:0")}); }, {"cuda:0"});
  }
  test::check_throws<fl::InvalidArgument>(
      [&] {
        // The variable as it was (the MPI test list sets it) comes back however the call ends.
        struct Restore {
          const char* old = std::getenv("FLOWLET_COLLECTIVE_TIMEOUT");
          std::string saved = old ? old : "";
          ~Restore() {
            if (old) {
              setenv("FLOWLET_COLLECTIVE_TIMEOUT", saved.c_str(), 1);
            } else {
              unsetenv("FLOWLET_COLLECTIVE_TIMEOUT");
            }
          }
        } restore;
        setenv("FLOWLET_COLLECTIVE_TIMEOUT", "soon", 1);
        fl::detail::make_communicator({fl::Device("cpu:0")});
      },
      {"FLOWLET_COLLECTIVE_TIMEOUT", "soon"});
}

TEST_CASE("destroying a communicator with a call waiting fails that call with Cancelled") {
  auto comm = local_communicator(2);
  std::promise<std::exception_ptr> got;
  comm->start(0, call_of(CollectiveKind::all_reduce, test::make({1})),
              [&](fl::Tensor, std::exception_ptr e) { got.set_value(e); });
  comm.reset();
  const std::exception_ptr error = got.get_future().get();
  test::check_throws<fl::Cancelled>([&] { std::rethrow_exception(error); }, {"destroyed"});
}

TEST_CASE("abort() fails the waiting calls at once with its error, and every later call") {
  auto comm = local_communicator(3, /*timeout=*/60);
  std::promise<std::exception_ptr> waiting;
  comm->start(0, call_of(CollectiveKind::all_reduce, test::make({1})),
              [&](fl::Tensor, std::exception_ptr e) { waiting.set_value(e); });
  const auto start = std::chrono::steady_clock::now();
  comm->abort(std::make_exception_ptr(fl::Cancelled("replica 2 failed on purpose")));
  const std::exception_ptr error = waiting.get_future().get();
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));  // not the 60 s timeout
  test::check_throws<fl::Cancelled>([&] { std::rethrow_exception(error); }, {"replica 2 failed on purpose"});
  // Later calls, of any participant, fail at once too; a second abort changes nothing.
  comm->abort(std::make_exception_ptr(fl::Cancelled("second")));
  for (int local = 0; local < 3; ++local) {
    test::check_throws<fl::Cancelled>([&] { (void)comm->run(local, call_of(CollectiveKind::barrier, fl::Tensor())); },
                                      {"replica 2 failed on purpose"});
  }
}

TEST_CASE("GPU participants (NCCL): every kind on every visible GPU, against the host result") {
  if (test::skip_without_gpu()) return;
  ensure_devices();
  const int gpus = fl::device_count(fl::DeviceKind::cuda);
  std::vector<fl::Device> devices;
  for (int i = 0; i < gpus; ++i) devices.emplace_back(fl::DeviceKind::cuda, i);
  std::shared_ptr<Communicator> comm;
  try {
    comm = fl::detail::make_communicator(devices);
  } catch (const fl::DeviceError& e) {
    MESSAGE("skipped: " << e.what());  // a build without NCCL
    return;
  }
  const int n = comm->size();
  auto gpu = [&](const fl::Tensor& t, int local) { return t.to(devices[local]); };
  for (fl::DType dt : {fl::f32, fl::f16, fl::bf16, fl::i32, fl::i64, fl::u8, fl::b8, fl::f64}) {
    CAPTURE(dt);
    for (fl::ReduceOp op : {fl::ReduceOp::sum, fl::ReduceOp::mean, fl::ReduceOp::max, fl::ReduceOp::min}) {
      CAPTURE(fl::to_string(op));
      const auto out = run_all(*comm, [&](int i) {
        const std::vector<double> v =
            dt == fl::b8 ? std::vector<double>{1, 0, i == 0 ? 1.0 : 0.0} : std::vector<double>{1.0 + i, 2.0 * i, 5};
        return call_of(CollectiveKind::all_reduce, gpu(test::make(v, dt), i), op);
      });
      std::vector<double> want(3);
      for (int k = 0; k < 3; ++k) {
        double s = 0, mx = -1e300, mn = 1e300;
        for (int i = 0; i < n; ++i) {
          const double v = dt == fl::b8 ? std::vector<double>{1, 0, i == 0 ? 1.0 : 0.0}[k]
                                        : std::vector<double>{1.0 + i, 2.0 * i, 5}[k];
          s += v, mx = std::max(mx, v), mn = std::min(mn, v);
        }
        if (dt == fl::b8) {
          want[k] = (op == fl::ReduceOp::sum || op == fl::ReduceOp::max) ? (mx > 0) : (mn > 0);
        } else if (op == fl::ReduceOp::sum) {
          want[k] = s;
        } else if (op == fl::ReduceOp::mean) {
          want[k] = test::is_float(dt) ? test::round_to(s / n, dt) : std::trunc(s / n);
        } else {
          want[k] = op == fl::ReduceOp::max ? mx : mn;
        }
      }
      for (int i = 0; i < n; ++i) {
        REQUIRE(outcome_error(out[i]) == "");
        CHECK(out[i].result.device() == devices[i]);
        CHECK(expect(out[i].result, want, {3}));
      }
    }
  }
  const auto gathered =
      run_all(*comm, [&](int i) { return call_of(CollectiveKind::all_gather, gpu(fl::scalar(int64_t{i + 1}), i)); });
  std::vector<int64_t> want;
  for (int i = 0; i < n; ++i) want.push_back(i + 1);
  for (int i = 0; i < n; ++i) CHECK(gathered[i].result.to_vector<int64_t>() == want);
  const auto cast = run_all(*comm, [&](int i) {
    return call_of(CollectiveKind::broadcast, gpu(test::make({10.0 + i}), i), fl::ReduceOp::sum, n - 1);
  });
  for (int i = 0; i < n; ++i) CHECK(expect(cast[i].result, {10.0 + n - 1}, {1}));
  const auto scattered = run_all(*comm, [&](int i) {
    std::vector<double> v(static_cast<size_t>(n));
    for (int k = 0; k < n; ++k) v[k] = 100.0 * k + i;
    return call_of(CollectiveKind::reduce_scatter, gpu(test::make(v), i));
  });
  for (int i = 0; i < n; ++i) CHECK(expect(scattered[i].result, {100.0 * n * i + n * (n - 1) / 2.0}, {1}));
  const auto barrier = run_all(*comm, [&](int) { return call_of(CollectiveKind::barrier, fl::Tensor()); });
  for (int i = 0; i < n; ++i) CHECK(outcome_error(barrier[i]) == "");
}

TEST_CASE("floating max and min propagate NaN; large tensors split over threads match a sequential reduction") {
  auto comm = local_communicator(3);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (fl::ReduceOp op : {fl::ReduceOp::max, fl::ReduceOp::min}) {
    const auto out = run_all(*comm, [&](int i) {
      return call_of(CollectiveKind::all_reduce, on(test::make({i == 1 ? nan : 1.0 * i, 2.0 + i}, fl::f32), i), op);
    });
    for (int i = 0; i < 3; ++i) {
      const auto v = test::values(out[i].result);
      CHECK(std::isnan(v[0]));
      CHECK(v[1] == (op == fl::ReduceOp::max ? 4.0 : 2.0));
    }
  }
  // 300,001 elements: more than one chunk of the thread pool, and a ragged end.
  constexpr int64_t kCount = 300001;
  for (fl::DType dt : {fl::f32, fl::bf16, fl::i64}) {
    CAPTURE(dt);
    std::vector<fl::Tensor> inputs;
    for (int i = 0; i < 3; ++i) inputs.push_back(on(test::random_tensor(fl::Shape{kCount}, 40 + i, dt), i));
    const auto out =
        run_all(*comm, [&](int i) { return call_of(CollectiveKind::all_reduce, inputs[i], fl::ReduceOp::mean); });
    std::vector<std::vector<double>> in;
    for (const auto& t : inputs) in.push_back(test::values(t));
    std::vector<double> want(kCount);
    for (int64_t k = 0; k < kCount; ++k) {
      if (dt == fl::i64) {
        want[k] = std::trunc((in[0][k] + in[1][k] + in[2][k]) / 3);
      } else {  // in f32, in participant order, divided, then rounded once to the dtype
        const float s = static_cast<float>(in[0][k]) + static_cast<float>(in[1][k]) + static_cast<float>(in[2][k]);
        want[k] = test::round_to(static_cast<double>(s / 3.0f), dt);
      }
    }
    for (int i = 0; i < 3; ++i) CHECK(test::values(out[i].result) == want);
  }
}

TEST_CASE("a done callback may drop the last reference to its communicator (on the watchdog's thread)") {
  auto comm = local_communicator(2, 0.1);
  std::promise<std::string> got;
  // Participant 1 never comes: the watchdog delivers the timeout, and the callback destroys the
  // communicator on the watchdog's own thread.
  comm->start(0, call_of(CollectiveKind::all_reduce, test::make({1})), [&](fl::Tensor, std::exception_ptr e) {
    comm.reset();
    got.set_value(e ? "error" : "no error");
  });
  auto future = got.get_future();
  REQUIRE(future.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(future.get() == "error");
  CHECK(comm == nullptr);
}
