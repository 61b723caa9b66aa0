// GPU benchmarks of issue 15: conv2d forward and forward + backward (both gradients) on ResNet-like
// shapes through cuDNN, in f32 (no TF32), TF32 and bf16; max pooling and batch normalization
// (training, forward + backward) at a ResNet stem's size. torch_peer_conv.py times the same calls
// with PyTorch (cudnn.benchmark on, TF32 as here) in the same check and prints the ratios against
// these lines (target: flowlet at least 0.9x PyTorch's speed on conv2d). Timed on the host around
// loops that end in a synchronize, after a warm-up that also lets cuDNN time its algorithms.
// Every line is "gpu-conv <name>: <ms> ms ..." or "error <name>: ...", so one failure hides nothing.
#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <flowlet/flowlet.hpp>

namespace fl = flowlet;

namespace {

const fl::Device kGpu("cuda:0");
const bool kQuick = std::getenv("FLOWLET_GPU_QUICK") != nullptr;

double best_ms_per_call(int iterations, const std::function<void()>& body) {
  for (int i = 0; i < 3; ++i) body();  // warm-up: cuDNN's algorithm search, the allocator's cache
  fl::synchronize(kGpu);
  double best = 1e30;
  for (int r = 0; r < (kQuick ? 2 : 5); ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i) body();
    fl::synchronize(kGpu);
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() /
                              iterations);
  }
  return best;
}

struct ConvShape {
  const char* name;
  int64_t n, c, h, w, o, k, stride, pad;
};

// ResNet-50-like layers at batch 32 (the shapes, plus a strided 3x3 and the 7x7 stem).
const std::vector<ConvShape> kShapes = {
    {"32x64x56x56 3x3 64", 32, 64, 56, 56, 64, 3, 1, 1},
    {"32x128x28x28 3x3 128", 32, 128, 28, 28, 128, 3, 1, 1},
    {"32x256x56x56 1x1 64", 32, 256, 56, 56, 64, 1, 1, 0},
    {"32x64x56x56 1x1 256", 32, 64, 56, 56, 256, 1, 1, 0},
    {"32x128x56x56 3x3 128 stride 2", 32, 128, 56, 56, 128, 3, 2, 1},
    {"32x3x224x224 7x7 64 stride 2", 32, 3, 224, 224, 64, 7, 2, 3},
};

void conv_section(const ConvShape& s, const char* label, fl::DType dtype, bool tf32) {
  const std::string name = fmt::format("{} {}", s.name, label);
  try {
    fl::set_matmul_tf32(tf32);
    const fl::Tensor x = fl::randn({s.n, s.c, s.h, s.w}, 1, dtype, kGpu);
    const fl::Tensor w = fl::randn({s.o, s.c, s.k, s.k}, 2, dtype, kGpu);
    fl::Conv2dOptions o;
    o.stride = s.stride, o.padding = s.pad;
    const int iterations = kQuick ? 3 : 10;
    const double forward = best_ms_per_call(iterations, [&] { (void)fl::conv2d(x, w, o); });
    const double both = best_ms_per_call(iterations, [&] {
      fl::GradientTape tape;
      tape.watch(x);
      tape.watch(w);
      (void)tape.gradient(fl::conv2d(x, w, o), {x, w});  // seeds of ones, like PyTorch's y.sum().backward()
    });
    const int64_t oh = (s.h + 2 * s.pad - s.k) / s.stride + 1, ow = (s.w + 2 * s.pad - s.k) / s.stride + 1;
    const double flops = 2.0 * static_cast<double>(s.n * s.o * oh * ow) * static_cast<double>(s.c * s.k * s.k);
    fmt::print("gpu-conv {}: forward {:.3f} ms ({:.1f} TFLOPS), forward+backward {:.3f} ms ({:.1f} TFLOPS)\n", name,
               forward, flops / forward / 1e9, both, 3 * flops / both / 1e9);
  } catch (const std::exception& e) {
    fmt::print("error gpu-conv {}: {}\n", name, e.what());
  }
  fl::set_matmul_tf32(false);
}

void pool_norm_section() {
  try {
    const fl::Tensor x = fl::randn({32, 64, 112, 112}, 3, fl::f32, kGpu);
    fl::Pool2dOptions o;
    o.kernel = 3, o.stride = 2, o.padding = 1;
    const double forward = best_ms_per_call(10, [&] { (void)fl::max_pool2d(x, o); });
    const double both = best_ms_per_call(10, [&] {
      fl::GradientTape tape;
      tape.watch(x);
      (void)tape.gradient(fl::max_pool2d(x, o), {x});
    });
    fmt::print("gpu-conv max_pool2d 32x64x112x112 3x3 stride 2 f32: forward {:.3f} ms, forward+backward {:.3f} ms\n",
               forward, both);
  } catch (const std::exception& e) {
    fmt::print("error gpu-conv max_pool2d: {}\n", e.what());
  }
  try {
    const fl::Tensor x = fl::randn({32, 64, 56, 56}, 4, fl::f32, kGpu);
    const fl::Tensor gamma = fl::ones({64}, fl::f32, kGpu), beta = fl::zeros({64}, fl::f32, kGpu);
    const double forward = best_ms_per_call(10, [&] { (void)fl::batch_norm_training(x, gamma, beta); });
    const double both = best_ms_per_call(10, [&] {
      fl::GradientTape tape;
      for (const fl::Tensor& t : {x, gamma, beta}) tape.watch(t);
      (void)tape.gradient(fl::batch_norm_training(x, gamma, beta).y, {x, gamma, beta});
    });
    fmt::print("gpu-conv batch_norm 32x64x56x56 f32: forward {:.3f} ms, forward+backward {:.3f} ms\n", forward, both);
  } catch (const std::exception& e) {
    fmt::print("error gpu-conv batch_norm: {}\n", e.what());
  }
}

}  // namespace

int main() {
  if (fl::device_count(fl::DeviceKind::cuda) == 0) {
    fmt::print("error gpu-conv: no CUDA device visible\n");
    return 0;
  }
  fmt::print("note gpu-conv: times are the best of several loops, each ending in a synchronize\n");
  for (const ConvShape& s : kShapes) {
    conv_section(s, "f32", fl::f32, false);
    conv_section(s, "tf32", fl::f32, true);
    conv_section(s, "bf16", fl::bf16, false);
  }
  pool_norm_section();
  return 0;
}
