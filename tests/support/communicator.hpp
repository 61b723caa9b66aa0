// Test support for the communicator tests (tests/test_communicator.cpp in one process,
// tests/mpi/mpi_communicator.cpp under mpirun): calls, and running them on the participants' threads.
#pragma once

#include <exception>
#include <functional>
#include <future>
#include <optional>
#include <source_location>
#include <thread>
#include <utility>
#include <vector>

#include "collective/communicator.hpp"
#include "support/reference.hpp"

namespace test {

inline fl::detail::CollectiveCall call_of(fl::detail::CollectiveKind kind, fl::Tensor input,
                                          fl::ReduceOp op = fl::ReduceOp::sum, int root = 0, bool check_header = true) {
  fl::detail::CollectiveCall call;
  call.kind = kind;
  call.op = op;
  call.root = root;
  call.input = std::move(input);
  call.check_header = check_header;
  return call;
}

// A participant's result: its values, shape and dtype-appropriate tolerance (exact for integers);
// a failed check when there is no result.
inline bool expect(const fl::Tensor& got, const std::vector<double>& want, const fl::Shape& shape,
                   std::source_location loc = std::source_location::current()) {
  if (!got.defined()) {
    ADD_FAIL_CHECK_AT(loc.file_name(), static_cast<int>(loc.line()), "no result");
    return false;
  }
  return check_tensor(got, want, shape, got.dtype(), std::nullopt, loc);
}

// One participant's outcome: its result, or the error it got.
struct Outcome {
  fl::Tensor result;
  std::exception_ptr error;
};

// Rethrows the participant's error (for check_throws); nothing when there is none.
inline void rethrow(const Outcome& o) {
  if (o.error) std::rethrow_exception(o.error);
}

// Local participant `local` runs `call` on this thread.
inline Outcome run_one(fl::detail::Communicator& comm, int local, fl::detail::CollectiveCall call) {
  Outcome o;
  try {
    o.result = comm.run(local, std::move(call));
  } catch (...) {
    o.error = std::current_exception();
  }
  return o;
}

// Local participant i runs make_call(i) on its own thread, every one of `who` (default: all of
// comm's local participants) at once; the others' outcomes stay empty.
inline std::vector<Outcome> run_all(fl::detail::Communicator& comm,
                                    const std::function<fl::detail::CollectiveCall(int)>& make_call,
                                    const std::vector<int>& who = {}) {
  std::vector<int> participants = who;
  if (participants.empty()) {
    for (int i = 0; i < comm.local_size(); ++i) participants.push_back(i);
  }
  std::vector<Outcome> outcomes(static_cast<size_t>(comm.local_size()));
  std::vector<std::thread> threads;
  for (int i : participants) {
    threads.emplace_back([&, i] { outcomes[static_cast<size_t>(i)] = run_one(comm, i, make_call(i)); });
  }
  for (auto& t : threads) t.join();
  return outcomes;
}

// Local participants 0 .. participants-1, each on its own thread, start() make_call(i, k) for
// k = 0 .. calls-1 without waiting; returns the results once all have come, participant i's call k
// at [i * calls + k] (a call's error is thrown).
inline std::vector<fl::Tensor> start_in_flight(fl::detail::Communicator& comm, int participants, int calls,
                                               const std::function<fl::detail::CollectiveCall(int, int)>& make_call) {
  std::vector<std::promise<fl::Tensor>> results(static_cast<size_t>(participants * calls));
  std::vector<std::future<fl::Tensor>> futures;
  for (std::promise<fl::Tensor>& result : results) futures.push_back(result.get_future());
  std::vector<std::thread> threads;
  for (int i = 0; i < participants; ++i) {
    threads.emplace_back([&, i] {
      for (int k = 0; k < calls; ++k) {
        std::promise<fl::Tensor>& result = results[static_cast<size_t>(i * calls + k)];
        comm.start(i, make_call(i, k), [&result](fl::Tensor r, std::exception_ptr e) {
          if (e) {
            result.set_exception(e);
          } else {
            result.set_value(std::move(r));
          }
        });
      }
    });
  }
  for (auto& t : threads) t.join();
  for (std::future<fl::Tensor>& f : futures) f.wait();  // every callback has run before `results` goes
  std::vector<fl::Tensor> got;
  for (std::future<fl::Tensor>& f : futures) got.push_back(f.get());
  return got;
}

}  // namespace test
