// f32 all-reduce on GPU participants through the NCCL backend against a raw ncclAllReduce on a
// communicator of the same GPUs, 4 KB ... 64 MB, each timed to completion (the flowlet call
// returns once its result is ready; the raw loop synchronizes the stream per call likewise).
// One process (run it plainly, or as `mpirun -np 1`): the participants are cuda:0 .. cuda:<n-1>
// (FLOWLET_BENCH_GPUS, default 1). Prints raw time / flowlet time per size.
#include <cuda_runtime_api.h>
#include <fmt/core.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <flowlet/flowlet.hpp>
#include <thread>
#include <vector>

#include "collective/communicator.hpp"

namespace fl = flowlet;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kRepetitions = 7;

int64_t iterations_for(int64_t bytes) { return std::clamp<int64_t>((int64_t{1} << 30) / bytes, 10, 2000); }

std::string size_text(int64_t bytes) {
  return bytes >= (1 << 20) ? fmt::format("{} MB", bytes >> 20) : fmt::format("{} KB", bytes >> 10);
}

template <class F>
double median_seconds(int64_t iterations, F&& loop) {
  loop(1);  // warm-up
  std::vector<double> samples;
  for (int r = 0; r < kRepetitions; ++r) {
    const auto begin = Clock::now();
    loop(iterations);
    samples.push_back(std::chrono::duration<double>(Clock::now() - begin).count() / static_cast<double>(iterations));
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

bool ok(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return true;
  fmt::print("error {}: {}\n", what, ncclGetErrorString(r));
  return false;
}

}  // namespace

int main() {
  const int available = fl::device_count(fl::DeviceKind::cuda);
  const char* wanted = std::getenv("FLOWLET_BENCH_GPUS");
  const int gpus = std::min(available, wanted ? std::atoi(wanted) : 1);
  if (gpus < 1) {
    fmt::print("error nccl: no GPU visible\n");
    return 0;
  }
  std::vector<fl::Device> devices;
  std::vector<int> list;
  for (int i = 0; i < gpus; ++i) {
    devices.emplace_back(fl::DeviceKind::cuda, i);
    list.push_back(i);
  }
  std::shared_ptr<fl::detail::Communicator> comm;
  try {
    comm = fl::detail::make_communicator(devices);
  } catch (const std::exception& e) {
    fmt::print("error nccl: {}\n", e.what());
    return 0;
  }
  std::vector<ncclComm_t> raw(static_cast<size_t>(gpus));
  if (!ok(ncclCommInitAll(raw.data(), gpus, list.data()), "ncclCommInitAll")) return 0;
  std::vector<cudaStream_t> streams(static_cast<size_t>(gpus));
  for (int i = 0; i < gpus; ++i) {
    cudaSetDevice(i);
    cudaStreamCreateWithFlags(&streams[static_cast<size_t>(i)], cudaStreamNonBlocking);
  }
  fmt::print("nccl all_reduce f32 sum over {} GPU participant{} in process {} of {}\n", gpus, gpus == 1 ? "" : "s",
             fl::process_index(), fl::process_count());
  fmt::print("nccl {:>8} {:>12} {:>12} {:>10}\n", "size", "raw us", "flowlet us", "raw/flowlet");
  for (int64_t bytes = 4 << 10; bytes <= (int64_t{64} << 20); bytes *= 4) {
    const int64_t n = bytes / 4;
    const int64_t iterations = iterations_for(bytes);
    std::vector<fl::Tensor> inputs;
    std::vector<fl::Tensor> outputs;
    for (int i = 0; i < gpus; ++i) {
      inputs.push_back(fl::full({n}, 1.0 + i, fl::f32, devices[static_cast<size_t>(i)]));
      outputs.push_back(fl::zeros({n}, fl::f32, devices[static_cast<size_t>(i)]));
    }
    for (int i = 0; i < gpus; ++i) fl::synchronize(devices[static_cast<size_t>(i)]);
    const double raw_time = median_seconds(iterations, [&](int64_t count) {
      for (int64_t k = 0; k < count; ++k) {
        ncclGroupStart();
        for (int i = 0; i < gpus; ++i) {
          ncclAllReduce(inputs[static_cast<size_t>(i)].raw_data(), outputs[static_cast<size_t>(i)].raw_data(),
                        static_cast<size_t>(n), ncclFloat32, ncclSum, raw[static_cast<size_t>(i)],
                        streams[static_cast<size_t>(i)]);
        }
        ncclGroupEnd();
        for (int i = 0; i < gpus; ++i) cudaStreamSynchronize(streams[static_cast<size_t>(i)]);
      }
    });
    fl::Tensor last;
    const double ours = median_seconds(iterations, [&](int64_t count) {
      for (int64_t k = 0; k < count; ++k) {
        std::vector<std::thread> others;
        for (int i = 1; i < gpus; ++i) {
          others.emplace_back([&, i] {
            fl::detail::CollectiveCall call;
            call.input = inputs[static_cast<size_t>(i)];
            call.check_header = false;
            comm->run(i, call);
          });
        }
        fl::detail::CollectiveCall call;
        call.input = inputs[0];
        call.check_header = false;
        last = comm->run(0, call);
        for (auto& t : others) t.join();
      }
    });
    const float got = last.to(fl::Device("cpu")).data<float>()[n - 1];
    const float want = static_cast<float>(gpus * (gpus + 1) / 2);
    fmt::print("nccl {:>8} {:>12.1f} {:>12.1f} {:>10.2f}{}\n", size_text(bytes), raw_time * 1e6, ours * 1e6,
               raw_time / ours, got == want ? "" : fmt::format("  WRONG RESULT {} (want {})", got, want));
  }
  for (ncclComm_t c : raw) ncclCommDestroy(c);
  return 0;
}
