// f32 all-reduce, 4 KB ... 64 MB.
//
// Under a launcher (`mpirun -np 2 bench_all_reduce`): the world communicator's data-only path
// (check_header = false, what a call site runs after its first use) and its first-use path (the
// header exchange first) against a raw MPI_Allreduce of the same bytes on MPI_COMM_WORLD, printing
// raw time / flowlet time per size (target >= 0.9 at every size).
//
// Without a launcher: an in-process communicator of 2 logical CPU devices (one thread each)
// against memcpy. An all-reduce of 2 participants reads 2 inputs and writes 2 results, twice the
// traffic of one memcpy of the same bytes, so the ideal is 2 x the memcpy time; the ratio printed is
// that ideal over the measured time (1.0 = as fast as memory allows).
//
// Every process runs the same fixed iteration counts (collectives must match); a timing is the
// slowest process's, the median of 7 repetitions.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <flowlet/flowlet.hpp>
#include <functional>
#include <thread>
#include <vector>

#include "collective/communicator.hpp"
#include "collective/transport/mpi_include.hpp"

namespace fl = flowlet;
using fl::detail::CollectiveCall;
using fl::detail::CollectiveKind;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kRepetitions = 7;

int64_t iterations_for(int64_t bytes) { return std::clamp<int64_t>((int64_t{256} << 20) / bytes, 4, 2000); }

std::string size_text(int64_t bytes) {
  return bytes >= (1 << 20) ? fmt::format("{} MB", bytes >> 20) : fmt::format("{} KB", bytes >> 10);
}

// Seconds per iteration of each body, the median over repetitions of the slowest process. The
// bodies take turns within each repetition, so that the load of a shared machine falls on all of
// them alike.
std::vector<double> time_per_iteration(int64_t iterations, bool across_processes,
                                       const std::vector<std::function<void()>>& bodies) {
  std::vector<std::vector<double>> samples(bodies.size());
  for (const auto& body : bodies) body();  // warm-up: allocations, MPI connections
  for (int r = 0; r < kRepetitions; ++r) {
    for (size_t b = 0; b < bodies.size(); ++b) {
      if (across_processes) MPI_Barrier(MPI_COMM_WORLD);
      const auto begin = Clock::now();
      for (int64_t i = 0; i < iterations; ++i) bodies[b]();
      double seconds = std::chrono::duration<double>(Clock::now() - begin).count();
      if (across_processes) MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      samples[b].push_back(seconds / static_cast<double>(iterations));
    }
  }
  std::vector<double> medians;
  for (auto& s : samples) {
    std::sort(s.begin(), s.end());
    medians.push_back(s[s.size() / 2]);
  }
  return medians;
}

void across_processes() {
  auto world = fl::detail::world_communicator();  // starts MPI
  const bool print = fl::process_index() == 0;
  if (print) {
    fmt::print("all_reduce f32 sum over {} processes (world communicator, 1 participant each) vs MPI_Allreduce\n",
               fl::process_count());
    fmt::print("{:>8} {:>12} {:>12} {:>12} {:>12} {:>10} {:>10}\n", "size", "raw MPI us", "raw Iallr us",
               "data-only us", "first-use us", "raw/data", "raw/first");
  }
  for (int64_t bytes = 4 << 10; bytes <= (int64_t{64} << 20); bytes *= 4) {
    const int64_t n = bytes / 4;
    const int64_t iterations = iterations_for(bytes);
    const fl::Tensor input = fl::full({n}, 1.0 + fl::process_index(), fl::f32);
    std::vector<float> send(static_cast<size_t>(n), 1.0f), receive(static_cast<size_t>(n));
    CollectiveCall data_only_call;
    data_only_call.kind = CollectiveKind::all_reduce;
    data_only_call.input = input;
    data_only_call.check_header = false;
    CollectiveCall first_use_call = data_only_call;
    first_use_call.check_header = true;
    const std::vector<double> times = time_per_iteration(
        iterations, true,
        {[&] { MPI_Allreduce(send.data(), receive.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); },
         // The nonblocking call flowlet's progress thread makes, waited for on the calling thread:
         // what MPI's nonblocking path itself costs against the blocking one.
         [&] {
           MPI_Request request;
           MPI_Iallreduce(send.data(), receive.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD,
                          &request);
           int done = 0;
           while (!done) MPI_Test(&request, &done, MPI_STATUS_IGNORE);
         },
         [&] { world->run(0, data_only_call); }, [&] { world->run(0, first_use_call); }});
    const double raw = times[0], raw_nonblocking = times[1], data_only = times[2], first_use = times[3];
    // The result is right (every process holds 1 + its index).
    CollectiveCall check;
    check.input = input;
    const float got = world->run(0, check).data<float>()[n - 1];
    const int p = fl::process_count();
    const float want = static_cast<float>(p + p * (p - 1) / 2);
    if (print) {
      fmt::print("{:>8} {:>12.1f} {:>12.1f} {:>12.1f} {:>12.1f} {:>10.2f} {:>10.2f}{}\n", size_text(bytes), raw * 1e6,
                 raw_nonblocking * 1e6, data_only * 1e6, first_use * 1e6, raw / data_only, raw / first_use,
                 got == want ? "" : fmt::format("  WRONG RESULT {} (want {})", got, want));
    }
  }
  if (print) fmt::print("target: raw/data >= 0.9 at every size\n");
}

void in_process() {
  fl::set_logical_cpu_devices(2);
  auto comm = fl::detail::make_communicator({fl::Device("cpu:0"), fl::Device("cpu:1")});
  fmt::print("all_reduce f32 sum, in-process, 2 logical CPU devices (one thread each) vs memcpy\n");
  fmt::print("{:>8} {:>12} {:>12} {:>14} {:>12}\n", "size", "memcpy us", "all_reduce us", "all_reduce GB/s",
             "2*memcpy/ar");
  for (int64_t bytes = 4 << 10; bytes <= (int64_t{64} << 20); bytes *= 4) {
    const int64_t n = bytes / 4;
    const int64_t iterations = iterations_for(bytes);
    std::vector<char> from(static_cast<size_t>(bytes), 1), to(static_cast<size_t>(bytes));
    const double copy = time_per_iteration(iterations, false, {[&] {
                                             std::memcpy(to.data(), from.data(), from.size());
                                             asm volatile("" : : : "memory");
                                           }})[0];
    std::vector<fl::Tensor> inputs = {fl::full({n}, 1.0, fl::f32, fl::Device("cpu:0")),
                                      fl::full({n}, 2.0, fl::f32, fl::Device("cpu:1"))};
    // Each participant runs the whole loop on its own thread, as replicas do.
    auto loop = [&](int local) {
      CollectiveCall call;
      call.input = inputs[static_cast<size_t>(local)];
      for (int64_t i = 0; i < iterations; ++i) comm->run(local, call);
    };
    std::vector<double> samples;
    for (int r = 0; r < kRepetitions + 1; ++r) {  // the first is the warm-up
      const auto begin = Clock::now();
      std::thread second(loop, 1);
      loop(0);
      second.join();
      if (r > 0) samples.push_back(std::chrono::duration<double>(Clock::now() - begin).count() / iterations);
    }
    std::sort(samples.begin(), samples.end());
    const double reduce = samples[samples.size() / 2];
    // Traffic: 2 inputs read, 2 results written.
    fmt::print("{:>8} {:>12.1f} {:>12.1f} {:>14.2f} {:>12.2f}\n", size_text(bytes), copy * 1e6, reduce * 1e6,
               4.0 * static_cast<double>(bytes) / reduce / 1e9, 2 * copy / reduce);
  }
}

}  // namespace

int main() {
  if (fl::process_count() > 1) {
    across_processes();
  } else {
    in_process();
  }
  return 0;
}
