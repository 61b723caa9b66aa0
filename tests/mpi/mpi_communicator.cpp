// The MPI backend (src/collective/transport/mpi_*), run by mpirun with 2 and 3 processes (see
// tests/meson.build). Every process runs every test case in the same order; expected values are
// computed here in double from what each process holds, which every process can work out.
#include <chrono>
#include <cstring>
#include <future>
#include <thread>

#include "collective/communicator.hpp"
#include "collective/transport/process.hpp"
#include "support/communicator.hpp"
#include "support/reference.hpp"
#include "support/replicas.hpp"

namespace {

using fl::detail::CollectiveKind;
using fl::detail::Communicator;
using test::call_of;
using test::expect;
using test::Outcome;
using test::rethrow;
using test::run_all;
using test::run_one;

void ensure_devices() { test::ensure_cpu_devices(2); }

int rank() { return fl::process_index(); }
int procs() { return fl::process_count(); }

// The participant's result against `want`; its error, if it got one, is the failure message.
bool expect(const Outcome& o, const std::vector<double>& want, const fl::Shape& shape,
            std::source_location loc = std::source_location::current()) {
  if (o.error) {
    try {
      std::rethrow_exception(o.error);
    } catch (const std::exception& e) {
      ADD_FAIL_CHECK_AT(loc.file_name(), static_cast<int>(loc.line()), fmt::format("the call failed: {}", e.what()));
    }
    return false;
  }
  return expect(o.result, want, shape, loc);
}

std::shared_ptr<Communicator> world() {
  ensure_devices();
  return fl::detail::world_communicator();
}

// Participant p's input for the dtype tests: small values every dtype holds exactly.
std::vector<double> input_of(int p, fl::DType dt) {
  if (dt == fl::b8) return {1, 0, p == 0 ? 1.0 : 0.0, p % 2 == 0 ? 1.0 : 0.0};
  return {1.0 + p, 2.0 * p, p == 1 ? 9.0 : 3.0, 7.0 - p};
}

}  // namespace

TEST_CASE("processes come from the launcher") {
  REQUIRE(procs() >= 2);
  CHECK(rank() >= 0);
  CHECK(rank() < procs());
  CHECK(fl::detail::process_placement().source == "Open MPI");
  CHECK(fl::local_process_index() == rank());  // mpirun on one machine
}

TEST_CASE("world communicator: one participant per process") {
  auto comm = world();
  CHECK(comm->size() == procs());
  CHECK(comm->local_size() == 1);
  CHECK(comm->processes() == procs());
  CHECK(comm->process_rank() == rank());
  CHECK(comm->describe() == fmt::format("communicator of {} participants ({} processes x [cpu:0])", procs(), procs()));
}

TEST_CASE("world all_reduce in every dtype and reduction, with and without the header exchange") {
  auto comm = world();
  for (bool check_header : {true, false}) {
    for (fl::DType dt : test::kAllDTypes) {
      for (fl::ReduceOp op : {fl::ReduceOp::sum, fl::ReduceOp::mean, fl::ReduceOp::max, fl::ReduceOp::min}) {
        CAPTURE(check_header);
        CAPTURE(dt);
        CAPTURE(fl::to_string(op));
        std::vector<double> want(4);
        for (size_t k = 0; k < 4; ++k) {
          double s = 0, mx = -1e300, mn = 1e300;
          for (int p = 0; p < procs(); ++p) {
            const double v = input_of(p, dt)[k];
            s += v;
            mx = std::max(mx, v);
            mn = std::min(mn, v);
          }
          if (dt == fl::b8) {
            want[k] = (op == fl::ReduceOp::sum || op == fl::ReduceOp::max) ? (mx > 0) : (mn > 0);
          } else if (op == fl::ReduceOp::sum) {
            want[k] = s;
          } else if (op == fl::ReduceOp::mean) {
            want[k] = test::is_float(dt) ? test::round_to(s / procs(), dt) : std::trunc(s / procs());
          } else {
            want[k] = op == fl::ReduceOp::max ? mx : mn;
          }
        }
        const Outcome o = run_one(
            *comm, 0, call_of(CollectiveKind::all_reduce, test::make(input_of(rank(), dt), dt), op, 0, check_header));
        REQUIRE_FALSE(o.error);
        CHECK(o.result.dtype() == dt);
        CHECK(expect(o, want, {4}));
      }
    }
  }
}

TEST_CASE("f16 accumulates in f32 across processes and rounds once") {
  auto comm = world();
  // 2048 + 1 (+ 1): f16 step by step stays at 2048; in f32 the sum is 2049 (2050 for 3 processes),
  // which rounds (ties to even) to 2048 for 2049 and to 2050 for 2050.
  const Outcome o =
      run_one(*comm, 0, call_of(CollectiveKind::all_reduce, test::make({rank() == 0 ? 2048.0 : 1.0}, fl::f16)));
  CHECK(expect(o, {procs() == 2 ? 2048.0 : 2050.0}, {1}));
  // i32 sums wrap.
  const int32_t v = rank() == 0 ? std::numeric_limits<int32_t>::max() : 1;
  const Outcome w =
      run_one(*comm, 0, call_of(CollectiveKind::all_reduce, fl::tensor(std::vector<int32_t>{v}, fl::Shape{1})));
  CHECK(w.result.to_vector<int32_t>()[0] == std::numeric_limits<int32_t>::min() + (procs() - 2));
}

TEST_CASE("floating max and min propagate a NaN from any process") {
  auto comm = world();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (int holder = 0; holder < procs(); ++holder) {
    for (fl::DType dt : {fl::f32, fl::f64, fl::bf16}) {
      for (fl::ReduceOp op : {fl::ReduceOp::max, fl::ReduceOp::min}) {
        CAPTURE(holder);
        CAPTURE(dt);
        const Outcome o = run_one(*comm, 0,
                                  call_of(CollectiveKind::all_reduce,
                                          test::make({rank() == holder ? nan : 1.0 * rank(), 1.0 * rank()}, dt), op));
        REQUIRE_FALSE(o.error);
        const auto v = test::values(o.result);
        CHECK(std::isnan(v[0]));
        CHECK(v[1] == (op == fl::ReduceOp::max ? procs() - 1.0 : 0.0));
      }
    }
  }
}

TEST_CASE("world broadcast from every root, all_gather, reduce_scatter, barrier") {
  auto comm = world();
  for (int root = 0; root < procs(); ++root) {
    const Outcome o =
        run_one(*comm, 0,
                call_of(CollectiveKind::broadcast, test::make({10.0 * rank(), 1.0}, fl::f64), fl::ReduceOp::sum, root));
    CHECK(expect(o, {10.0 * root, 1.0}, {2}));
  }
  {
    const Outcome o = run_one(
        *comm, 0,
        call_of(CollectiveKind::all_gather, test::make({1.0 * rank(), -1.0 * rank()}, fl::Shape{1, 2}, fl::bf16)));
    std::vector<double> want;
    for (int p = 0; p < procs(); ++p) want.insert(want.end(), {1.0 * p, -1.0 * p});
    CHECK(expect(o, want, {procs(), 2}));
  }
  {
    const Outcome o = run_one(*comm, 0, call_of(CollectiveKind::all_gather, fl::scalar(int64_t{rank() * 3})));
    std::vector<int64_t> want;
    for (int p = 0; p < procs(); ++p) want.push_back(p * 3);
    CHECK(o.result.to_vector<int64_t>() == want);
  }
  for (fl::DType dt : {fl::f32, fl::f16, fl::i64}) {
    CAPTURE(dt);
    // Rows of 2; process p holds k + 10 p at flat index k. The sum at k is P k + 10 (0 + 1 + ...).
    std::vector<double> in(static_cast<size_t>(4 * procs()));
    for (size_t k = 0; k < in.size(); ++k) in[k] = static_cast<double>(k) + 10.0 * rank();
    const Outcome o =
        run_one(*comm, 0, call_of(CollectiveKind::reduce_scatter, test::make(in, fl::Shape{2 * procs(), 2}, dt)));
    const double offset = 10.0 * procs() * (procs() - 1) / 2;
    std::vector<double> want;
    for (int k = 4 * rank(); k < 4 * rank() + 4; ++k) want.push_back(procs() * k + offset);
    CHECK(expect(o, want, {2, 2}));
  }
  const Outcome b = run_one(*comm, 0, call_of(CollectiveKind::barrier, fl::Tensor()));
  CHECK_FALSE(b.error);
  CHECK_FALSE(b.result.defined());
}

TEST_CASE("broadcast, all_gather and reduce_scatter in every dtype") {
  auto comm = world();
  for (fl::DType dt : test::kAllDTypes) {
    CAPTURE(dt);
    const int root = procs() - 1;
    const Outcome b = run_one(
        *comm, 0, call_of(CollectiveKind::broadcast, test::make(input_of(rank(), dt), dt), fl::ReduceOp::sum, root));
    CHECK(expect(b, input_of(root, dt), {4}));
    const Outcome g =
        run_one(*comm, 0, call_of(CollectiveKind::all_gather, test::make(input_of(rank(), dt), fl::Shape{2, 2}, dt)));
    std::vector<double> gathered;
    for (int p = 0; p < procs(); ++p) {
      const auto v = input_of(p, dt);
      gathered.insert(gathered.end(), v.begin(), v.end());
    }
    CHECK(expect(g, gathered, {2 * procs(), 2}));
    // reduce_scatter of [procs, 4]: process p's row k is input_of(p) + k; the max over processes.
    std::vector<double> rows;
    for (int k = 0; k < procs(); ++k) {
      for (double v : input_of(rank(), dt)) rows.push_back(dt == fl::b8 ? v : v + k);
    }
    const Outcome r = run_one(
        *comm, 0,
        call_of(CollectiveKind::reduce_scatter, test::make(rows, fl::Shape{procs(), 4}, dt), fl::ReduceOp::max));
    std::vector<double> want(4, -1e300);
    for (int p = 0; p < procs(); ++p) {
      const auto v = input_of(p, dt);
      for (int k = 0; k < 4; ++k) want[k] = std::max(want[k], dt == fl::b8 ? v[k] : v[k] + rank());
    }
    CHECK(expect(r, want, {1, 4}));
  }
}

TEST_CASE("results are bit-identical on every process") {
  auto comm = world();
  const fl::Tensor x = test::random_tensor(fl::Shape{4099}, 7 + rank());
  const Outcome sum = run_one(*comm, 0, call_of(CollectiveKind::all_reduce, x, fl::ReduceOp::sum, 0, false));
  REQUIRE_FALSE(sum.error);
  // Everyone's result, gathered: every block must equal this process's bytes.
  const Outcome all = run_one(*comm, 0, call_of(CollectiveKind::all_gather, sum.result));
  const auto mine = sum.result.to_vector<float>();
  const auto everyone = all.result.to_vector<float>();
  for (int p = 0; p < procs(); ++p) {
    CHECK(std::memcmp(everyone.data() + p * mine.size(), mine.data(), mine.size() * sizeof(float)) == 0);
  }
  // And it is the sum: each process's input is known to all (same seeds).
  std::vector<double> want(mine.size(), 0.0);
  for (int p = 0; p < procs(); ++p) {
    const auto v = test::random_tensor(fl::Shape{4099}, 7 + p).to_vector<float>();
    for (size_t k = 0; k < v.size(); ++k) want[k] += v[k];
  }
  CHECK(expect(sum, want, {4099}));
}

TEST_CASE("0-size tensors through every kind") {
  auto comm = world();
  for (CollectiveKind kind : {CollectiveKind::all_reduce, CollectiveKind::broadcast, CollectiveKind::all_gather,
                              CollectiveKind::reduce_scatter}) {
    CAPTURE(fl::detail::collective_name(kind));
    const Outcome o = run_one(*comm, 0, call_of(kind, fl::zeros(fl::Shape{0, 5}, fl::f16)));
    REQUIRE_FALSE(o.error);
    CHECK(o.result.shape() == fl::Shape{0, 5});
  }
}

TEST_CASE("processes that disagree all fail with the same error, and the next call works") {
  auto comm = world();
  const int last = procs() - 1;
  const std::string last_who = fmt::format("participant {}", last);
  {
    const Outcome o =
        run_one(*comm, 0, call_of(CollectiveKind::all_reduce, fl::zeros(fl::Shape{rank() == last ? 3 : 2})));
    test::check_op_throws<fl::ShapeError>("all_reduce", [&] { rethrow(o); },
                                          {"disagree on the shape", "participant 0 with [2]", last_who + " with [3]"});
  }
  {
    const Outcome o = run_one(
        *comm, 0, call_of(CollectiveKind::all_gather, fl::zeros(fl::Shape{2}, rank() == last ? fl::i32 : fl::f32)));
    test::check_op_throws<fl::DTypeError>("all_gather", [&] { rethrow(o); },
                                          {"participant 0 with f32", last_who + " with i32"});
  }
  {
    const Outcome o = run_one(*comm, 0,
                              call_of(CollectiveKind::all_reduce, fl::zeros(fl::Shape{2}),
                                      rank() == last ? fl::ReduceOp::min : fl::ReduceOp::mean));
    test::check_op_throws<fl::InvalidArgument>("all_reduce", [&] { rethrow(o); }, {"reduction", "mean", "min"});
  }
  {
    const Outcome o = run_one(
        *comm, 0,
        call_of(rank() == last ? CollectiveKind::broadcast : CollectiveKind::all_reduce, fl::zeros(fl::Shape{2})));
    test::check_op_throws<fl::InvalidArgument>("all_reduce", [&] { rethrow(o); },
                                               {"disagree on the collective", last_who + " with broadcast"});
  }
  const Outcome next = run_one(*comm, 0, call_of(CollectiveKind::all_reduce, test::make({1})));
  CHECK(expect(next, {1.0 * procs()}, {1}));
}

TEST_CASE("a process that does not arrive: DeadlineExceeded names it; the communicator is unusable after") {
  ensure_devices();
  auto comm = fl::detail::make_communicator({fl::Device("cpu:0")}, {.timeout_seconds = 1});
  const int last = procs() - 1;
  if (rank() != last) {
    const auto begin = std::chrono::steady_clock::now();
    const Outcome o = run_one(*comm, 0, call_of(CollectiveKind::all_reduce, test::make({1})));
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    test::check_op_throws<fl::DeadlineExceeded>(
        "all_reduce", [&] { rethrow(o); },
        {fmt::format("participants [{}] of communicator", last), "did not arrive within 1 s"});
    CHECK(waited >= 0.9);
    CHECK(waited < 10);
    const Outcome again = run_one(*comm, 0, call_of(CollectiveKind::barrier, fl::Tensor()));
    test::check_op_throws<fl::DeadlineExceeded>("barrier", [&] { rethrow(again); }, {"cannot be used again"});
  } else {
    // Stay (without calling) until the others timed out: leaving at once would tell them, and they
    // would fail with "left" instead of the timeout this case is about.
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  }
  comm.reset();
  // Everyone is back in step on the world communicator.
  const Outcome next = run_one(*world(), 0, call_of(CollectiveKind::all_reduce, test::make({2})));
  CHECK(expect(next, {2.0 * procs()}, {1}));
}

TEST_CASE("a data-only call a process does not make: the others time out, and the job still ends cleanly") {
  ensure_devices();
  auto comm = fl::detail::make_communicator({fl::Device("cpu:0")}, {.timeout_seconds = 1});
  const Outcome first = run_one(*comm, 0, call_of(CollectiveKind::all_reduce, test::make({1})));
  CHECK(expect(first, {1.0 * procs()}, {1}));
  const int last = procs() - 1;
  if (rank() != last) {
    const Outcome o =
        run_one(*comm, 0, call_of(CollectiveKind::all_reduce, test::make({1}), fl::ReduceOp::sum, 0, false));
    // No header exchange: which process is missing is not known here, and the message says so.
    test::check_op_throws<fl::DeadlineExceeded>("all_reduce", [&] { rethrow(o); },
                                                {"did not complete within 1 s", "data-only"});
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // until the others timed out
  }
  // The others' MPI call stays pending (MPI cannot withdraw it): their communicator is kept, not
  // freed, and MPI_Finalize at exit does not wait for it (this program's exit status shows it).
  comm.reset();
  const Outcome next = run_one(*world(), 0, call_of(CollectiveKind::barrier, fl::Tensor()));
  CHECK_FALSE(next.error);
}

TEST_CASE("a process that destroyed its communicator: its peers fail at once, not at the timeout") {
  ensure_devices();
  auto comm = fl::detail::make_communicator({fl::Device("cpu:0")}, {.timeout_seconds = 30});
  const Outcome first = run_one(*comm, 0, call_of(CollectiveKind::all_reduce, test::make({1})));
  CHECK(expect(first, {1.0 * procs()}, {1}));
  if (rank() == 1) {
    comm.reset();
  } else {
    const auto begin = std::chrono::steady_clock::now();
    const Outcome o = run_one(*comm, 0, call_of(CollectiveKind::all_reduce, test::make({1})));
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    test::check_op_throws<fl::DeadlineExceeded>("all_reduce", [&] { rethrow(o); },
                                                {"participant 1 of communicator", "after 1 calls", "call 1"});
    CHECK(waited < 10);
    comm.reset();
  }
  const Outcome next = run_one(*world(), 0, call_of(CollectiveKind::barrier, fl::Tensor()));
  CHECK_FALSE(next.error);
}

TEST_CASE("a data-only call that fails inside one process: it fails there, the others fail too, nobody hangs") {
  ensure_devices();
  auto comm = fl::detail::make_communicator({fl::Device("cpu:0"), fl::Device("cpu:1")}, {.timeout_seconds = 2});
  auto on = [&](const fl::Tensor& t, int local) { return t.to(comm->device(local)); };
  const auto first =
      run_all(*comm, [&](int l) { return call_of(CollectiveKind::all_reduce, on(test::make({1}), l)); });
  for (int l = 0; l < 2; ++l) CHECK(expect(first[l], {2.0 * procs()}, {1}));
  if (rank() == 0) {
    // Participant 1 of process 0 never makes call 1 (a data-only call).
    const Outcome o =
        run_one(*comm, 0, call_of(CollectiveKind::all_reduce, on(test::make({1}), 0), fl::ReduceOp::sum, 0, false));
    test::check_op_throws<fl::DeadlineExceeded>("all_reduce", [&] { rethrow(o); },
                                                {"participants [1] of communicator", "did not arrive within 2 s"});
    // Participant 1 comes late to that call: it is over.
    const Outcome late =
        run_one(*comm, 1, call_of(CollectiveKind::all_reduce, on(test::make({1}), 1), fl::ReduceOp::sum, 0, false));
    test::check_throws<fl::DeadlineExceeded>([&] { rethrow(late); }, {"did not arrive"});
    // The call never reached the others, so this process's calls no longer line up with theirs:
    // the next call fails at once.
    const auto later = run_all(*comm, [&](int) { return call_of(CollectiveKind::barrier, fl::Tensor()); });
    for (int l = 0; l < 2; ++l) {
      test::check_op_throws<fl::DeadlineExceeded>("barrier", [&] { rethrow(later[l]); }, {"cannot be used again"});
    }
  } else {
    const auto out = run_all(*comm, [&](int l) {
      return call_of(CollectiveKind::all_reduce, on(test::make({1}), l), fl::ReduceOp::sum, 0, false);
    });
    for (int l = 0; l < 2; ++l) test::check_op_throws<fl::DeadlineExceeded>("all_reduce", [&] { rethrow(out[l]); });
  }
  comm.reset();
  const Outcome next = run_one(*world(), 0, call_of(CollectiveKind::all_reduce, test::make({3})));
  CHECK(expect(next, {3.0 * procs()}, {1}));
}

TEST_CASE("a done callback may drop the last reference to its communicator (on the progress thread)") {
  ensure_devices();
  auto comm = fl::detail::make_communicator({fl::Device("cpu:0")});
  std::promise<double> got;
  // start() hands the call to the progress thread, which runs the callback: the communicator is
  // destroyed there, and the other processes' goodbyes still come in.
  comm->start(0, call_of(CollectiveKind::all_reduce, test::make({2})), [&](fl::Tensor r, std::exception_ptr e) {
    const double value = e ? -1.0 : test::values(r)[0];
    comm.reset();
    got.set_value(value);
  });
  auto future = got.get_future();
  REQUIRE(future.wait_for(std::chrono::seconds(20)) == std::future_status::ready);
  CHECK(future.get() == 2.0 * procs());
  const Outcome next = run_one(*world(), 0, call_of(CollectiveKind::barrier, fl::Tensor()));
  CHECK_FALSE(next.error);
}

TEST_CASE("make_communicator: every process must bring the same number of devices") {
  ensure_devices();
  std::vector<fl::Device> devices = {fl::Device("cpu:0")};
  if (rank() == 1) devices.push_back(fl::Device("cpu:1"));
  test::check_op_throws<fl::InvalidArgument>("make_communicator", [&] { fl::detail::make_communicator(devices); },
                                             {"same number of local devices", "1 on process 0", "2 on process 1"});
}

TEST_CASE("hierarchical: 2 logical CPU devices per process") {
  ensure_devices();
  auto comm = fl::detail::make_communicator({fl::Device("cpu:0"), fl::Device("cpu:1")});
  const int n = comm->size();
  REQUIRE(n == 2 * procs());
  CHECK(comm->local_size() == 2);
  CHECK(comm->rank_of(1) == 2 * rank() + 1);
  CHECK(comm->describe() == fmt::format("communicator of {} participants ({} processes x [cpu:0, cpu:1])", n, procs()));
  auto on = [&](const fl::Tensor& t, int local) { return t.to(comm->device(local)); };
  SUBCASE("all_reduce sum and mean, with and without headers") {
    for (bool check : {true, false}) {
      const auto out = run_all(*comm, [&](int l) {
        const double p = comm->rank_of(l);
        return call_of(CollectiveKind::all_reduce, on(test::make({p, 1, p * p}), l), fl::ReduceOp::sum, 0, check);
      });
      double s = 0, s2 = 0;
      for (int p = 0; p < n; ++p) s += p, s2 += p * p;
      for (int l = 0; l < 2; ++l) {
        CHECK(expect(out[l], {s, 1.0 * n, s2}, {3}));
        CHECK(out[l].result.device() == comm->device(l));
      }
    }
    const auto mean = run_all(*comm, [&](int l) {
      return call_of(CollectiveKind::all_reduce, on(test::make({1.0 * comm->rank_of(l)}, fl::bf16), l),
                     fl::ReduceOp::mean);
    });
    for (int l = 0; l < 2; ++l) CHECK(expect(mean[l], {test::round_to((n - 1) / 2.0, fl::bf16)}, {1}));
  }
  SUBCASE("broadcast from a participant of the last process") {
    const int root = n - 1;
    const auto out = run_all(*comm, [&](int l) {
      return call_of(CollectiveKind::broadcast, on(test::make({100.0 + comm->rank_of(l)}), l), fl::ReduceOp::sum, root);
    });
    for (int l = 0; l < 2; ++l) CHECK(expect(out[l], {100.0 + root}, {1}));
  }
  SUBCASE("all_gather in participant order") {
    const auto out = run_all(*comm, [&](int l) {
      return call_of(CollectiveKind::all_gather, on(fl::scalar(int32_t(comm->rank_of(l) * 7)), l));
    });
    std::vector<int32_t> want;
    for (int p = 0; p < n; ++p) want.push_back(p * 7);
    for (int l = 0; l < 2; ++l) CHECK(out[l].result.to_vector<int32_t>() == want);
  }
  SUBCASE("reduce_scatter: participant i gets part i") {
    const auto out = run_all(*comm, [&](int l) {
      std::vector<double> v(static_cast<size_t>(n));
      for (int k = 0; k < n; ++k) v[k] = k * 100.0 + comm->rank_of(l);
      return call_of(CollectiveKind::reduce_scatter, on(test::make(v), l), fl::ReduceOp::max);
    });
    for (int l = 0; l < 2; ++l) CHECK(expect(out[l], {comm->rank_of(l) * 100.0 + (n - 1)}, {1}));
  }
  SUBCASE("a disagreement inside one process fails every participant of every process") {
    // Process 0's second participant passes another shape: process 0 fails it itself, and the
    // header exchange tells the others.
    const auto out = run_all(*comm, [&](int l) {
      return call_of(CollectiveKind::all_reduce, on(fl::zeros(fl::Shape{rank() == 0 && l == 1 ? 4 : 2}), l));
    });
    for (int l = 0; l < 2; ++l) {
      if (rank() == 0) {
        test::check_op_throws<fl::ShapeError>("all_reduce", [&] { rethrow(out[l]); },
                                              {"participant 0 (cpu:0) with [2]", "participant 1 (cpu:1) with [4]"});
      } else {
        test::check_op_throws<fl::InvalidArgument>("all_reduce", [&] { rethrow(out[l]); },
                                                   {"failed in process 0 (participants 0 .. 1)"});
      }
    }
    const auto next =
        run_all(*comm, [&](int l) { return call_of(CollectiveKind::all_reduce, on(test::make({1}), l)); });
    for (int l = 0; l < 2; ++l) CHECK(expect(next[l], {1.0 * n}, {1}));
  }
  SUBCASE("a disagreement between processes names both") {
    const auto out = run_all(*comm, [&](int l) {
      return call_of(CollectiveKind::all_gather, on(fl::zeros(fl::Shape{2}, rank() == 1 ? fl::f64 : fl::f32), l));
    });
    for (int l = 0; l < 2; ++l) {
      test::check_op_throws<fl::DTypeError>(
          "all_gather", [&] { rethrow(out[l]); },
          {"process 0 (participants 0 .. 1) with f32", "process 1 (participants 2 .. 3) with f64"});
    }
  }
  SUBCASE("many calls in flight keep their order") {
    constexpr int kCalls = 50;
    const std::vector<fl::Tensor> results = test::start_in_flight(*comm, 2, kCalls, [&](int l, int k) {
      return call_of(CollectiveKind::all_reduce, on(test::make({1.0 * k}), l), fl::ReduceOp::sum, 0, k == 0);
    });
    bool right = true;
    for (int l = 0; l < 2; ++l) {
      for (int k = 0; k < kCalls; ++k) right = right && test::values(results[l * kCalls + k])[0] == 1.0 * k * n;
    }
    CHECK(right);
  }
}
