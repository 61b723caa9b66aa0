// GPU benchmarks (issue 6), each figure beside a peer measured in the same run:
//   - GEMM 4096^2 in f32, TF32 and bf16: flowlet against a direct cuBLAS call (target >= 95 %);
//   - c = a + b on 256M f32 elements against the device-to-device copy bandwidth (target >= 85 %);
//   - eager per-op overhead of a small op, and a chain of small ops eager and traced;
//   - the MLP training step of ../mlp_step.hpp (784-256-10, SGD) at batch 64 and 1024, eager and traced;
//   - host transfers: to(cuda:0) of 64 MiB overlapped with a matmul chain against the two one after the
//     other, and host-to-device / device-to-host bandwidth of to() (pinned staging on the copy streams)
//     beside cudaMemcpy from pageable memory and from a pinned buffer (the copy engine's rate).
// The PyTorch figures come from torch_peer.py in the same check (benchmarks/gpu/check.sh).
// Throughput is timed on the host around a loop that ends in a synchronize, after a warm-up, so
// flowlet's dispatch and allocation are included; the direct calls run on their own stream.
// Every section catches its own errors and prints "error ...", so one failure does not hide the rest.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <flowlet/flowlet.hpp>

#include "../mlp_step.hpp"  // the model benchmarks/trace and benchmarks/training time on the CPU

namespace fl = flowlet;

namespace {

const fl::Device kGpu("cuda:0");
const bool kQuick = std::getenv("FLOWLET_GPU_QUICK") != nullptr;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Best of `repeats` timings of `iterations` calls of body, each ending with `wait`.
double best_seconds_per_call(int iterations, const std::function<void()>& body, const std::function<void()>& wait,
                             int repeats = 5) {
  for (int i = 0; i < 2; ++i) body();  // warm-up: caches, handles, cuBLAS heuristics
  wait();
  double best = 1e30;
  for (int r = 0; r < (kQuick ? 2 : repeats); ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i) body();
    wait();
    best = std::min(best, seconds_since(start) / iterations);
  }
  return best;
}

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(fmt::format("{}: {}", what, cudaGetErrorString(status)));
}
void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(fmt::format("{}: {}", what, cublasGetStatusString(status)));
}

// A direct cuBLAS GEMM on device buffers of its own: the peer flowlet's matmul should match.
struct DirectGemm {
  int n;
  cudaDataType_t type;
  cublasComputeType_t compute;
  cudaStream_t stream = nullptr;
  cublasHandle_t handle = nullptr;
  void *a = nullptr, *b = nullptr, *c = nullptr;

  DirectGemm(int n_, cudaDataType_t type_, size_t element, cublasComputeType_t compute_)
      : n(n_), type(type_), compute(compute_) {
    const size_t bytes = static_cast<size_t>(n) * n * element;
    check(cudaSetDevice(0), "cudaSetDevice");
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cublasCreate(&handle), "cublasCreate");
    check(cublasSetStream(handle, stream), "cublasSetStream");
    check(cudaMalloc(&a, bytes), "cudaMalloc");
    check(cudaMalloc(&b, bytes), "cudaMalloc");
    check(cudaMalloc(&c, bytes), "cudaMalloc");
    check(cudaMemset(a, 0, bytes), "cudaMemset");  // zeros: speed does not depend on the values
    check(cudaMemset(b, 0, bytes), "cudaMemset");
  }
  ~DirectGemm() {
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
    cublasDestroy(handle);
    cudaStreamDestroy(stream);
  }
  void run() {
    const float one = 1.0f, zero = 0.0f;
    check(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, b, type, n, a, type, n, &zero, c, type, n,
                       compute, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx");
  }
  void wait() { check(cudaStreamSynchronize(stream), "cudaStreamSynchronize"); }
};

void gemm_section(const char* label, fl::DType dtype, cudaDataType_t type, size_t element, cublasComputeType_t compute,
                  bool tf32) {
  const int n = 4096;
  const double flops = 2.0 * n * static_cast<double>(n) * n;
  const int iterations = kQuick ? 5 : 20;
  try {
    const fl::Tensor a = fl::randn({n, n}, 1, dtype, kGpu);
    const fl::Tensor b = fl::randn({n, n}, 2, dtype, kGpu);
    fl::set_matmul_tf32(tf32);
    // The public op for every dtype (bf16 included): dispatch and allocation count, as for a user.
    const double ours = best_seconds_per_call(iterations, [&] { (void)fl::matmul(a, b); }, [] { fl::synchronize(kGpu); });
    fl::set_matmul_tf32(false);
    DirectGemm direct(n, type, element, compute);
    const double peer = best_seconds_per_call(iterations, [&] { direct.run(); }, [&] { direct.wait(); });
    fmt::print("gemm {} {}^3: flowlet {:.1f} TFLOPS, cuBLAS {:.1f} TFLOPS, ratio {:.3f} (target >= 0.95)\n", label, n,
               flops / ours / 1e12, flops / peer / 1e12, peer / ours);
  } catch (const std::exception& e) {
    fl::set_matmul_tf32(false);
    fmt::print("error gemm {}: {}\n", label, e.what());
  }
}

void add_section() {
  const int64_t n = kQuick ? (int64_t{1} << 26) : (int64_t{256} << 20);
  const double bytes = static_cast<double>(n) * 4;
  const int iterations = kQuick ? 3 : 10;
  try {
    const fl::Tensor a = fl::full({n}, 1.0, fl::f32, kGpu);
    const fl::Tensor b = fl::full({n}, 2.0, fl::f32, kGpu);
    const double add = best_seconds_per_call(iterations, [&] { (void)(a + b); }, [] { fl::synchronize(kGpu); });
    void* src = nullptr;
    void* dst = nullptr;
    cudaStream_t stream = nullptr;
    check(cudaSetDevice(0), "cudaSetDevice");
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaMalloc(&src, static_cast<size_t>(bytes)), "cudaMalloc");
    check(cudaMalloc(&dst, static_cast<size_t>(bytes)), "cudaMalloc");
    check(cudaMemset(src, 0, static_cast<size_t>(bytes)), "cudaMemset");
    const double copy = best_seconds_per_call(
        iterations,
        [&] { check(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, stream), "copy"); },
        [&] { check(cudaStreamSynchronize(stream), "sync"); });
    cudaFree(src);
    cudaFree(dst);
    cudaStreamDestroy(stream);
    const double add_bandwidth = 3 * bytes / add / 1e9;    // reads a and b, writes c
    const double copy_bandwidth = 2 * bytes / copy / 1e9;  // reads and writes once
    fmt::print("add f32 {}M: flowlet {:.3f} ms, {:.0f} GB/s; copy d2d {:.0f} GB/s; ratio {:.3f} (target >= 0.85)\n",
               n >> 20, add * 1e3, add_bandwidth, copy_bandwidth, add_bandwidth / copy_bandwidth);
  } catch (const std::exception& e) {
    fmt::print("error add: {}\n", e.what());
  }
}

// A chain of small elementwise ops, the kind that dominates a small model's step.
fl::Tensor chain(fl::Tensor x, const fl::Tensor& y) {
  for (int i = 0; i < 5; ++i) x = fl::relu(x * y + y);
  return x;  // 15 ops
}

void overhead_section() {
  const int iterations = kQuick ? 2000 : 20000;
  try {
    const fl::Tensor a = fl::ones({256}, fl::f32, kGpu);
    const fl::Tensor b = fl::ones({256}, fl::f32, kGpu);
    const double one = best_seconds_per_call(iterations, [&] { (void)(a + b); }, [] { fl::synchronize(kGpu); });
    fmt::print("eager add 256 f32: {:.2f} us per op\n", one * 1e6);
    const double eager = best_seconds_per_call(iterations / 15, [&] { (void)chain(a, b); }, [] { fl::synchronize(kGpu); });
    fmt::print("eager chain of 15 small ops: {:.1f} us ({:.2f} us per op)\n", eager * 1e6, eager * 1e6 / 15);
    try {
      // Traced without and with CUDA Graph capture (TraceOptions::cuda_graphs), side by side.
      fl::TraceOptions no_capture;
      no_capture.cuda_graphs = false;
      auto plan_only = fl::trace([](fl::Tensor x, fl::Tensor y) { return chain(x, y); }, no_capture);
      const double plan = best_seconds_per_call(iterations / 15, [&] { (void)plan_only(a, b); }, [] { fl::synchronize(kGpu); });
      fmt::print("traced chain of 15 small ops, no CUDA Graph: {:.1f} us ({:.2f}x eager)\n", plan * 1e6, eager / plan);
      auto traced = fl::trace([](fl::Tensor x, fl::Tensor y) { return chain(x, y); });
      const double graph = best_seconds_per_call(iterations / 15, [&] { (void)traced(a, b); }, [] { fl::synchronize(kGpu); });
      const fl::CudaGraphInfo info = traced.cuda_graph_info();
      fmt::print("traced chain of 15 small ops, CUDA Graph: {:.1f} us ({:.2f}x eager){}\n", graph * 1e6, eager / graph,
                 info.captured ? "" : fmt::format("  WARNING: not captured ({})", info.why_not));
    } catch (const std::exception& e) {
      fmt::print("error traced chain: {}\n", e.what());
    }
  } catch (const std::exception& e) {
    fmt::print("error overhead: {}\n", e.what());
  }
}

// The MLP training step (forward, backward, SGD update) with its variables and batch on cuda:0,
// eager and wrapped in fl::trace. Two models from the same seeds: the first step's losses and the
// weights after it are compared before timing, so a wrong traced graph shows up beside its figure.
void mlp_section(int64_t batch) {
  namespace mlp = flowlet_bench::mlp;
  const int iterations = kQuick ? 20 : 200;
  const std::string label = fmt::format("mlp step batch {}", batch);
  try {
    // Linear draws its initial weights on default_device(), the scope's device: so the variables
    // live on the GPU. The steps run outside the scope, where their GPU inputs place them.
    std::unique_ptr<mlp::FlowletMlp> eager_model, traced_model;
    fl::Tensor x, labels;
    {
      fl::DeviceScope on_gpu(kGpu);
      eager_model = std::make_unique<mlp::FlowletMlp>();
      traced_model = std::make_unique<mlp::FlowletMlp>();
    }
    const mlp::Batch data(batch);
    x = data.x.to(kGpu);
    labels = data.labels.to(kGpu);
    for (const fl::Variable& v : eager_model->params) {
      if (v.device() != kGpu) throw std::runtime_error(fmt::format("variable {} is on {}, not cuda:0", v.name(), v.device()));
    }
    fl::optim::SGD eager_sgd(mlp::learning_rate), traced_sgd(mlp::learning_rate);
    auto eager_step = [&](fl::Tensor xb, fl::Tensor yb) { return eager_model->train_step(eager_sgd, xb, yb); };
    auto traced_step = fl::trace(
        [&](fl::Tensor xb, fl::Tensor yb) { return traced_model->train_step(traced_sgd, xb, yb); });

    const float eager_loss = eager_step(x, labels).item<float>();
    const float traced_loss = traced_step(x, labels).item<float>();
    const fl::Device cpu("cpu");
    const double weight_diff =
        mlp::max_abs_difference(eager_model->hidden->weight.value().to(cpu).to_vector<float>(),
                                traced_model->hidden->weight.value().to(cpu).to_vector<float>());
    const double loss_diff = std::fabs(static_cast<double>(eager_loss) - traced_loss);
    fmt::print("note {}: first step loss eager {:.6f} traced {:.6f}; hidden/weight max |diff| {:.2e}{}\n", label,
               eager_loss, traced_loss, weight_diff,
               loss_diff <= 1e-4 && weight_diff <= 1e-5 ? "" : "  WARNING: eager and traced differ");

    const double eager = best_seconds_per_call(iterations, [&] { (void)eager_step(x, labels); },
                                               [] { fl::synchronize(kGpu); });
    fmt::print("{} {}: eager {:.1f} us\n", label, kGpu, eager * 1e6);
    const double traced = best_seconds_per_call(iterations, [&] { (void)traced_step(x, labels); },
                                                [] { fl::synchronize(kGpu); });
    const fl::CudaGraphInfo info = traced_step.cuda_graph_info();
    fmt::print("{} {}: traced {:.1f} us ({:.2f}x eager){}{}\n", label, kGpu, traced * 1e6, eager / traced,
               info.captured ? ", as a CUDA Graph" : fmt::format(", not a CUDA Graph ({})", info.why_not),
               traced_step.trace_count() == 1
                   ? ""
                   : fmt::format("  WARNING: traced {} times ({})", traced_step.trace_count(),
                                 traced_step.last_retrace_reason()));
  } catch (const std::exception& e) {
    fmt::print("error {}: {}\n", label, e.what());
  }
}

// Host transfers of 64 MiB (f32). The overlap figure: a chain of 4096^3 matmuls queued first, then
// to(cuda:0), timed together and apart; "overlap" is the part of the shorter one hidden behind the
// longer (1: fully, 0: not at all). Bandwidths: to() both ways against cudaMemcpy from a pageable
// std::vector and cudaMemcpyAsync from a cudaHostAlloc buffer on a stream of its own (the peer).
void transfer_section() {
  const int64_t n = kQuick ? (int64_t{4} << 20) : (int64_t{16} << 20);
  const size_t bytes = static_cast<size_t>(n) * 4;
  const double mib = static_cast<double>(bytes) / (1 << 20);
  const int iterations = kQuick ? 3 : 10;
  const fl::Device cpu("cpu");
  const auto sync = [] { fl::synchronize(kGpu); };
  try {
    const fl::Tensor host = fl::full({n}, 1.0, fl::f32, cpu);
    const fl::Tensor on_gpu = host.to(kGpu);
    const fl::Tensor w = fl::randn({4096, 4096}, 3, fl::f32, kGpu) * (1.0f / 64);  // keeps the chain near 1
    const auto chain = [&] {
      fl::Tensor x = w;
      for (int i = 0; i < 4; ++i) x = fl::matmul(x, w);
      return x;
    };
    const double h2d = best_seconds_per_call(iterations, [&] { (void)host.to(kGpu); }, sync);
    const double d2h = best_seconds_per_call(iterations, [&] { (void)on_gpu.to(cpu); }, sync);
    const double compute = best_seconds_per_call(iterations, [&] { (void)chain(); }, sync);
    const double together = best_seconds_per_call(iterations, [&] {
      const fl::Tensor busy = chain();  // queued first: the copy runs beside it
      (void)host.to(kGpu);
    }, sync);
    const double serial = h2d + compute;
    fmt::print("copy overlap h2d {:.0f} MiB with 4 matmuls 4096^3: h2d {:.2f} ms, matmuls {:.2f} ms, serial {:.2f} ms, "
               "together {:.2f} ms, overlap {:.2f} (1 = the shorter fully hidden)\n",
               mib, h2d * 1e3, compute * 1e3, serial * 1e3, together * 1e3,
               (serial - together) / std::min(h2d, compute));

    // The peers, on buffers of their own.
    void* device_buffer = nullptr;
    void* pinned = nullptr;
    cudaStream_t stream = nullptr;
    std::vector<char> pageable(bytes, 1);
    check(cudaSetDevice(0), "cudaSetDevice");
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaMalloc(&device_buffer, bytes), "cudaMalloc");
    check(cudaHostAlloc(&pinned, bytes, cudaHostAllocDefault), "cudaHostAlloc");
    std::memset(pinned, 1, bytes);
    const auto peer = [&](void* dst, const void* src, cudaMemcpyKind kind) {
      return best_seconds_per_call(
          iterations, [&] { check(cudaMemcpyAsync(dst, src, bytes, kind, stream), "cudaMemcpyAsync"); },
          [&] { check(cudaStreamSynchronize(stream), "cudaStreamSynchronize"); });
    };
    const double pageable_h2d = peer(device_buffer, pageable.data(), cudaMemcpyHostToDevice);
    const double pageable_d2h = peer(pageable.data(), device_buffer, cudaMemcpyDeviceToHost);
    const double pinned_h2d = peer(device_buffer, pinned, cudaMemcpyHostToDevice);
    const double pinned_d2h = peer(pinned, device_buffer, cudaMemcpyDeviceToHost);
    cudaFree(device_buffer);
    cudaFreeHost(pinned);
    cudaStreamDestroy(stream);
    const auto gbs = [&](double seconds) { return static_cast<double>(bytes) / seconds / 1e9; };
    fmt::print("copy h2d {:.0f} MiB: to() {:.1f} GB/s, cudaMemcpy pageable {:.1f} GB/s, pinned {:.1f} GB/s; "
               "ratio to pinned {:.3f}\n",
               mib, gbs(h2d), gbs(pageable_h2d), gbs(pinned_h2d), pinned_h2d / h2d);
    fmt::print("copy d2h {:.0f} MiB: to() {:.1f} GB/s, cudaMemcpy pageable {:.1f} GB/s, pinned {:.1f} GB/s; "
               "ratio to pinned {:.3f}\n",
               mib, gbs(d2h), gbs(pageable_d2h), gbs(pinned_d2h), pinned_d2h / d2h);
  } catch (const std::exception& e) {
    fmt::print("error copy: {}\n", e.what());
  }
}

}  // namespace

int main() {
  if (fl::device_count(fl::DeviceKind::cuda) == 0) {
    fmt::print("error: no CUDA device visible\n");
    return 1;
  }
  fmt::print("note: times are the best of several loops, each ending in a synchronize\n");
  gemm_section("f32", fl::f32, CUDA_R_32F, 4, CUBLAS_COMPUTE_32F, false);
  gemm_section("tf32", fl::f32, CUDA_R_32F, 4, CUBLAS_COMPUTE_32F_FAST_TF32, true);
  gemm_section("bf16", fl::bf16, CUDA_R_16BF, 2, CUBLAS_COMPUTE_32F, false);
  add_section();
  overhead_section();
  for (int64_t batch : {64, 1024}) mlp_section(batch);
  transfer_section();
  return 0;
}
