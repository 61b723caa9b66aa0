// Host transfers on the CUDA copy streams (issue 6): round trips while kernels run, blocks reused
// right after a transfer, a long stress loop against a CPU reference, Send/Recv edges of traced
// graphs between the CPU and a GPU, memory accounting, and (white-box) that synchronize waits for
// every stream of a device and that the caching allocator holds back a block used on a copy stream
// until its fences completed.
//
// Every case needs a GPU and skips with a message without one (CI and the development machines
// have the CUDA toolkit but no GPU). References are computed on the host from the values the inputs
// hold, never by the GPU path under test.
#include <flowlet_config.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "support/gpu.hpp"
#include "support/reference.hpp"

#if FLOWLET_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda/allocator.hpp"
#include "cuda/runtime.hpp"
#endif

using test::skip_without_gpu;

namespace {

const fl::Device kCpu("cpu");
const fl::Device kGpu("cuda:0");

// A chain of `length` matmuls by `w` on w's device, each scaled by 1/sqrt(n) so that values stay
// near 1: queued work that keeps the compute stream busy for a while.
fl::Tensor matmul_chain(fl::Tensor x, const fl::Tensor& w, int length) {
  const auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(w.shape()[0])));
  for (int i = 0; i < length; ++i) x = fl::matmul(x, w) * scale;
  return x;
}

double sum_of(const std::vector<double>& values) {
  double total = 0;
  for (double v : values) total += v;
  return total;
}

}  // namespace

TEST_CASE("synchronize on cuda:0 without a GPU throws DeviceError saying there are no CUDA devices") {
  if (test::have_gpu()) {
    MESSAGE("skipped: a GPU is visible");
    return;
  }
  CHECK(test::check_throws<fl::DeviceError>([] { fl::synchronize(kGpu); }, {"cuda:0"}));
}

TEST_CASE("round trips of many sizes and every dtype keep their values while matmuls run on the GPU") {
  if (skip_without_gpu()) return;
  // Sizes in bytes around the staging chunks (1 MiB at least, at most 8 per transfer).
  const std::vector<int64_t> byte_sizes = {1, 3, 4096, 4097, (1 << 20) - 1, (1 << 20) + 1, (5 << 20) + 3};
  const fl::Tensor w = fl::randn({2048, 2048}, 1, fl::f32, kGpu);
  // A small product queued between the copies, checked against the host.
  const fl::Tensor a_host = test::random_tensor({64, 48}, 21, fl::f32);
  const fl::Tensor b_host = test::random_tensor({48, 32}, 22, fl::f32);
  const std::vector<double> product_want = test::matmul_ref(test::host(a_host), test::host(b_host)).values;
  for (fl::DType dt : test::kAllDTypes) {
    CAPTURE(dt);
    fl::Tensor busy = matmul_chain(w, w, 8);  // queued, not waited for: the copies below overlap it
    std::vector<fl::Tensor> hosts, gpus, doubled;
    for (size_t k = 0; k < byte_sizes.size(); ++k) {
      const int64_t n = std::max<int64_t>(1, byte_sizes[k] / static_cast<int64_t>(fl::dtype_size(dt)));
      hosts.push_back(test::random_tensor({n}, 1000 + k, dt));
      gpus.push_back(hosts.back().to(kGpu));
    }
    // Kernels that read the copies, queued behind the matmuls (and behind the copies' events).
    for (const fl::Tensor& g : gpus) doubled.push_back(fl::concat({g, g}, 0));
    const fl::Tensor product = fl::matmul(a_host.to(kGpu), b_host.to(kGpu));
    busy = matmul_chain(busy, w, 2);
    for (size_t k = 0; k < hosts.size(); ++k) {
      CAPTURE(byte_sizes[k]);
      CHECK(gpus[k].device() == kGpu);
      const std::vector<double> want = test::values(hosts[k]);
      test::check_values(test::values(gpus[k].to(kCpu)), want, {0, 0});
      std::vector<double> twice = want;
      twice.insert(twice.end(), want.begin(), want.end());
      test::check_values(test::values(doubled[k].to(kCpu)), twice, {0, 0});
    }
    test::check_values(test::values(product), product_want, {1e-4, 1e-4});
    CHECK(std::isfinite(fl::sum(busy).item<float>()));
  }
}

TEST_CASE("a block freed while kernels still read it is not overwritten by a host-to-device copy into a new tensor") {
  if (skip_without_gpu()) return;
  const fl::Tensor w = fl::randn({1024, 1024}, 3, fl::f32, kGpu);
  for (int round = 0; round < 10; ++round) {
    CAPTURE(round);
    const fl::Tensor x = matmul_chain(fl::randn({1024, 1024}, 10 + round, fl::f32, kGpu), w, 16);
    fl::Tensor total;
    {
      const fl::Tensor scratch = x * 2.0f;  // 4 MiB, the size of the copy below
      total = fl::sum(scratch);            // queued behind the chain: reads scratch later
    }  // scratch's block is free on the host while sum still has to read it
    const fl::Tensor host = test::random_tensor({1024, 1024}, 100 + round, fl::f32);
    const fl::Tensor copied = host.to(kGpu);  // must not land in scratch's block before sum read it
    const double want = 2 * sum_of(test::values(x));
    CHECK(std::fabs(total.item<float>() - want) <= 1e-4 * (std::fabs(want) + 1024));
    test::check_values(test::values(copied.to(kCpu)), test::values(host), {0, 0});
  }
}

TEST_CASE("a tensor freed while its host-to-device copy may still run does not overwrite a later tensor") {
  if (skip_without_gpu()) return;
  const int64_t n = int64_t{16} << 20;  // 64 MiB of f32
  const fl::Tensor threes = fl::full({n}, 3.0, fl::f32, kCpu);
  const fl::Tensor w = fl::randn({1024, 1024}, 4, fl::f32, kGpu);
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    const fl::Tensor busy = matmul_chain(w, w, 8);
    { const fl::Tensor dropped = threes.to(kGpu); }  // freed at once; its copy may still be writing
    const fl::Tensor sevens = fl::full({n}, 7.0, fl::f32, kGpu);  // same size class
    const fl::Tensor total = fl::sum(sevens);
    CHECK(total.item<float>() == doctest::Approx(7.0 * static_cast<double>(n)).epsilon(1e-6));
    const std::vector<float> back = fl::slice(sevens, 0, n - 4096, 4096).to(kCpu).to_vector<float>();
    CHECK(std::all_of(back.begin(), back.end(), [](float v) { return v == 7.0f; }));
    (void)busy;
  }
}

TEST_CASE("1000 rounds of to(gpu), compute and to(cpu), with freed blocks reused in between, match the CPU") {
  if (skip_without_gpu()) return;
  const fl::Tensor w_host = test::random_tensor({64, 64}, 7, fl::f32);
  const fl::Tensor w = w_host.to(kGpu);
  const test::Host hw = test::host(w_host);
  int failures = 0;
  for (int i = 0; i < 1000 && failures < 5; ++i) {
    // Sizes vary, so blocks of several classes are freed and reused across rounds.
    const int64_t rows = 1 + (i * 37) % 97;
    const fl::Tensor x_host = test::random_tensor({rows, 64}, 5000 + i, fl::f32);
    const fl::Tensor x = x_host.to(kGpu);
    const fl::Tensor y = fl::matmul(x, w) * 0.5f + x;
    const fl::Tensor got = y.to(kCpu);
    const test::Host hx = test::host(x_host);
    test::Host want = test::matmul_ref(hx, hw);
    for (size_t k = 0; k < want.values.size(); ++k) want.values[k] = want.values[k] * 0.5 + hx.values[k];
    CAPTURE(i);
    if (!test::check_values(test::values(got), want.values, {1e-4, 1e-4})) ++failures;
  }
}

TEST_CASE("a traced function with CPU arguments and a cuda:0 scope inside equals the eager result") {
  if (skip_without_gpu()) return;
  // CPU -> GPU (x and w are Recv'd on cuda:0), GPU -> CPU (h is Recv'd back for the CPU tail).
  const auto fn = [](fl::Tensor x, fl::Tensor w) {
    fl::Tensor h, out;
    {
      fl::DeviceScope gpu(kGpu);
      h = fl::relu(fl::matmul(x, w)) + 1.0f;
    }
    {
      fl::DeviceScope cpu(kCpu);
      out = fl::sum(h * 2.0f, {1});
    }
    return out;
  };
  auto traced = fl::trace(fn);
  for (int round = 0; round < 20; ++round) {
    CAPTURE(round);
    const fl::Tensor x = test::random_tensor({48, 32}, 200 + round, fl::f32);
    const fl::Tensor w = test::random_tensor({32, 40}, 300 + round, fl::f32);
    const fl::Tensor eager = fn(x, w);
    const fl::Tensor graph = traced(x, w);
    CHECK(eager.device() == kCpu);
    CHECK(graph.device() == kCpu);
    test::check_values(test::values(graph), test::values(eager), {1e-5, 1e-5});
    // Both against the host reference in double.
    test::Host h = test::matmul_ref(test::host(x), test::host(w));
    std::vector<double> want(48, 0.0);
    for (int64_t i = 0; i < 48; ++i) {
      for (int64_t j = 0; j < 40; ++j) want[static_cast<size_t>(i)] += 2 * (std::max(0.0, h.values[static_cast<size_t>(i * 40 + j)]) + 1);
    }
    test::check_values(test::values(eager), want, {1e-4, 1e-4});
  }
  CHECK(traced.trace_count() == 1);
}

TEST_CASE("memory_stats(cuda:0) counts a copied tensor once and returns to its baseline after transfers") {
  if (skip_without_gpu()) return;
  fl::synchronize(kGpu);
  const fl::DeviceMemoryStats before = fl::memory_stats(kGpu);
  {
    const fl::Tensor host = test::random_tensor({256, 1024}, 9, fl::f32);
    const fl::Tensor g = host.to(kGpu);
    CHECK(fl::memory_stats(kGpu).bytes_in_use == before.bytes_in_use + 256 * 1024 * 4);
    for (int i = 0; i < 50; ++i) {
      const fl::Tensor y = (g * 2.0f).to(kCpu).to(kGpu);
      (void)fl::sum(y).item<float>();
    }
    CHECK(fl::memory_stats(kGpu).bytes_in_use == before.bytes_in_use + 256 * 1024 * 4);
  }
  fl::synchronize(kGpu);
  CHECK(fl::memory_stats(kGpu).bytes_in_use == before.bytes_in_use);
}

TEST_CASE("a transfer larger than the staging limit goes both ways unchanged") {
  if (skip_without_gpu()) return;
  const int64_t n = (int64_t{257} << 20) / 4 + 3;  // i32 elements: just past 256 MiB, copied unstaged
  const fl::Tensor host = fl::arange(n, fl::i32, kCpu);
  const std::vector<int32_t> back = host.to(kGpu).to(kCpu).to_vector<int32_t>();
  REQUIRE(back.size() == static_cast<size_t>(n));
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) wrong += back[static_cast<size_t>(i)] != static_cast<int32_t>(i);
  CHECK(wrong == 0);
}

#if FLOWLET_HAVE_CUDA
namespace cuda = fl::detail::cuda;

TEST_CASE("synchronize(cuda:0) waits for the compute stream and both copy streams") {
  if (skip_without_gpu()) return;
  const fl::Tensor w = fl::randn({2048, 2048}, 5, fl::f32, kGpu);
  const fl::Tensor busy = matmul_chain(w, w, 4);
  const fl::Tensor host = fl::full({int64_t{16} << 20}, 1.0, fl::f32, kCpu);
  const fl::Tensor copied = host.to(kGpu);  // the copy stream may still be writing
  (void)fl::sum(busy).to(kCpu);             // uses the device-to-host stream
  const fl::Tensor more = matmul_chain(busy, w, 4);
  fl::synchronize(kGpu);
  for (auto kind : {cuda::StreamKind::compute, cuda::StreamKind::host_to_device, cuda::StreamKind::device_to_host}) {
    CAPTURE(static_cast<int>(kind));
    CHECK(cudaStreamQuery(cuda::device_stream(0, kind)) == cudaSuccess);
  }
  CHECK(cuda::stream(0) == cuda::device_stream(0, cuda::StreamKind::compute));
  (void)copied;
  (void)more;
}

TEST_CASE("the allocator reuses a compute-only block at once and holds a block used on a copy stream until its fences completed") {
  if (skip_without_gpu()) return;
  // A size no other case uses, so that its class's lists hold only this case's blocks.
  const size_t bytes = 7'777'777;
  const cudaStream_t d2h = cuda::device_stream(0, cuda::StreamKind::device_to_host);

  void* plain = cuda::allocate(0, bytes);
  cuda::deallocate(0, plain, bytes);
  void* again = cuda::allocate(0, bytes);
  CHECK(again == plain);  // compute-ordered: handed out again at once
  cuda::deallocate(0, again, bytes);
  void* from_free_list = cuda::allocate(0, bytes);  // take it back out, so that only `marked` is free below
  REQUIRE(from_free_list == plain);

  const fl::Tensor w = fl::randn({2048, 2048}, 6, fl::f32, kGpu);
  fl::synchronize(kGpu);
  void* marked = cuda::allocate_idle(0, bytes);
  cuda::record_use(0, marked, d2h, 0);
  const fl::Tensor busy = matmul_chain(w, w, 8);  // milliseconds of queued compute
  cuda::deallocate(0, marked, bytes);             // fences recorded now, behind the matmuls
  void* other = cuda::allocate_idle(0, bytes);    // must not be `marked`: its compute fence is pending
  CHECK(other != marked);
  void* compute = cuda::allocate(0, bytes);  // nor from the compute path
  CHECK(compute != marked);
  fl::synchronize(kGpu);
  void* reused = cuda::allocate_idle(0, bytes);  // fences completed: idle again, handed out first (LIFO)
  CHECK(reused == marked);
  const int64_t cached = cuda::cached_bytes(0);
  CHECK(cached >= 0);
  for (void* block : {other, reused}) cuda::deallocate(0, block, bytes);
  for (void* block : {compute, from_free_list}) cuda::deallocate(0, block, bytes);
  (void)busy;
  fl::synchronize(kGpu);
}
#endif
