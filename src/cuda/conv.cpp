// conv2d, conv2d_backward_input and conv2d_backward_weight on CUDA, through cuDNN's convolution
// API (cudnnConvolutionForward / BackwardData / BackwardFilter; the legacy API is still in v9).
//
// - Algorithms: chosen once per problem (dtype, shapes, geometry, TF32, device) and cached with
//   their workspace size. The first call times the candidates with cudnnFind*AlgorithmEx, as
//   PyTorch does with torch.backends.cudnn.benchmark; FLOWLET_CUDNN_FIND=0 takes cuDNN's heuristic
//   (cudnnGet*_v7) instead. While a CUDA Graph records, nothing is timed: a cached choice serves,
//   else the heuristic's (not cached, so a later eager call still times them). The descriptors
//   are kept with the choice, so a call after the first costs one map lookup.
// - Workspace: from flowlet's caching allocator (a u8 tensor on the device), so it is stream
//   ordered like every other buffer and comes from the graph's pool while recording.
// - Precision: f32 runs with CUDNN_FMA_MATH (no TF32) unless set_matmul_tf32(true), as matmul;
//   f16/bf16 accumulate in f32 on tensor cores; f64 in f64.
// - Padding: cuDNN pads symmetrically. Asymmetric padding ("same" with an even kernel or a
//   stride) pads the input explicitly (kernels/conv.cu) and convolves without padding; the input
//   gradient is then computed for the padded input and cropped.
// - bias and the fused ReLU run as one epilogue kernel after the convolution.
#include <array>
#include <climits>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <fmt/format.h>

#include "core/check.hpp"
#include "core/device_scope_state.hpp"
#include "cuda/cudnn.hpp"
#include "cuda/kernels/conv_launch.hpp"
#include "cuda/register.hpp"
#include "cuda/runtime.hpp"
#include "flowlet/ops/linalg.hpp"
#include "ops/conv_attrs.hpp"
#include "runtime/step_context.hpp"

namespace flowlet::detail::cuda {
namespace {

enum class Pass { forward, backward_data, backward_filter };
constexpr const char* pass_name(Pass p) {
  return p == Pass::forward ? "conv2d" : p == Pass::backward_data ? "conv2d_backward_input" : "conv2d_backward_weight";
}

// An algorithm with the math type it runs under and the workspace it needs.
struct Choice {
  int algo = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  size_t workspace = 0;
};


// FLOWLET_CUDNN_LOG=1: each new plan prints its algorithm to stderr (check.sh shows them beside
// the benchmark, to tell a slow algorithm from a slow call).
bool log_plans() {
  static const bool on = [] {
    const char* env = std::getenv("FLOWLET_CUDNN_LOG");
    return env != nullptr && std::string(env) != "0";
  }();
  return on;
}

bool timing_allowed() {
  static const bool allowed = [] {
    const char* env = std::getenv("FLOWLET_CUDNN_FIND");
    return env == nullptr || std::string(env) != "0";
  }();
  return allowed;
}

constexpr size_t kMaxFindWorkspace = size_t{1} << 30;  // what timing may allocate for one candidate

// The math type f32 must keep: FMA only (exact f32) unless TF32 is allowed.
cudnnMathType_t requested_math(DType dtype, bool tf32) {
  if (dtype == DType::f16 || dtype == DType::bf16) return CUDNN_TENSOR_OP_MATH;
  if (dtype == DType::f32 && !tf32) return CUDNN_FMA_MATH;
  return CUDNN_DEFAULT_MATH;
}

// A problem as cuDNN sees it: x, w and y (the padded x when the padding is asymmetric).
struct Problem {
  Shape x, w, y;
  DType dtype;
  ConvGeometry geometry;
  bool tf32;
  int device;

  // What identifies a plan: the pass and every number above.
  using Key = std::array<int64_t, 24>;
  Key key(Pass pass) const {
    const ConvGeometry& g = geometry;
    return {static_cast<int64_t>(pass), static_cast<int64_t>(dtype), x[0], x[1], x[2], x[3], w[0], w[1], w[2], w[3],
            y[0], y[1], y[2], y[3], g.pad_h, g.pad_w, g.stride_h, g.stride_w, g.dilation_h, g.dilation_w, g.groups,
            tf32 ? 1 : 0, device, 0};
  }
};

struct Descriptors {
  TensorDescriptor x, y;
  FilterDescriptor w;
  ConvolutionDescriptor conv;
  Descriptors(const Problem& p, Pass pass)
      : x(p.x, p.dtype, pass_name(pass), p.device),
        y(p.y, p.dtype, pass_name(pass), p.device),
        w(p.w, p.dtype, pass_name(pass), p.device),
        conv(p.geometry, p.dtype, requested_math(p.dtype, p.tf32), p.device) {}
};

// The first usable candidate of a perf list (cuDNN orders them fastest first). f32 without TF32
// skips tensor-op candidates.
template <class Perf>
bool pick(const Perf* perf, int count, bool strict_f32, Choice& choice) {
  for (int i = 0; i < count; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
    if (strict_f32 && (perf[i].mathType == CUDNN_TENSOR_OP_MATH ||
                       perf[i].mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION)) {
      continue;
    }
    choice.algo = static_cast<int>(perf[i].algo);
    choice.math = strict_f32 ? CUDNN_FMA_MATH : perf[i].mathType;
    return true;
  }
  return false;
}

// The workspace timing offers the candidates: the largest any algorithm asks for (up to
// kMaxFindWorkspace), as PyTorch's benchmark mode does, so that no fast algorithm is skipped for
// want of memory. `size_of(algo, &bytes)` is the pass's cudnnGet*WorkspaceSize.
template <class SizeOf>
size_t largest_workspace(int algorithms, SizeOf size_of) {
  size_t most = 0;
  for (int algo = 0; algo < algorithms; ++algo) {
    size_t bytes = 0;
    if (size_of(algo, &bytes) == CUDNN_STATUS_SUCCESS && bytes <= kMaxFindWorkspace) most = std::max(most, bytes);
  }
  return most;
}

Tensor workspace_tensor(size_t bytes, Device device) {
  return bytes == 0 ? Tensor() : Tensor::empty(Shape{static_cast<int64_t>(bytes)}, u8, device);
}

// The buffers of one pass: forward reads a and b (x, w) into out (y); backward data reads (w, dy)
// into dx; backward filter reads (x, dy) into dw.
struct Buffers {
  const void* a;
  const void* b;
  void* out;
};

// Finds the algorithm of `pass` for problem p: timed unless `recording`.
Choice choose(Pass pass, const Problem& p, Descriptors& d, cudnnHandle_t handle, const Buffers& buf, bool recording,
              Device device) {
  const bool strict = p.dtype == DType::f32 && !p.tf32;
  const bool timed = timing_allowed() && !recording;
  Choice choice;
  bool ok = false;
  const int dev = p.device;
  switch (pass) {
    case Pass::forward: {
      cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
      int count = 0;
      FLOWLET_CUDA_CHECK(dev, cudnnGetConvolutionForwardAlgorithm_v7(handle, d.x.get(), d.w.get(), d.conv.get(),
                                                                     d.y.get(), CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                                     &count, perf));
      if (timed) {
        const size_t bytes = largest_workspace(CUDNN_CONVOLUTION_FWD_ALGO_COUNT, [&](int algo, size_t* size) {
          return cudnnGetConvolutionForwardWorkspaceSize(handle, d.x.get(), d.w.get(), d.conv.get(), d.y.get(),
                                                         static_cast<cudnnConvolutionFwdAlgo_t>(algo), size);
        });
        const Tensor ws = workspace_tensor(bytes, device);
        FLOWLET_CUDA_CHECK(dev, cudnnFindConvolutionForwardAlgorithmEx(
                                    handle, d.x.get(), buf.a, d.w.get(), buf.b, d.conv.get(), d.y.get(), buf.out,
                                    CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, perf,
                                    bytes == 0 ? nullptr : ws.raw_data(), bytes));
      }
      ok = pick(perf, count, strict, choice);
      if (ok) {
        d.conv.set_math(choice.math, dev);
        FLOWLET_CUDA_CHECK(dev, cudnnGetConvolutionForwardWorkspaceSize(
                                    handle, d.x.get(), d.w.get(), d.conv.get(), d.y.get(),
                                    static_cast<cudnnConvolutionFwdAlgo_t>(choice.algo), &choice.workspace));
      }
      break;
    }
    case Pass::backward_data: {
      cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
      int count = 0;
      FLOWLET_CUDA_CHECK(dev, cudnnGetConvolutionBackwardDataAlgorithm_v7(
                                  handle, d.w.get(), d.y.get(), d.conv.get(), d.x.get(),
                                  CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count, perf));
      if (timed) {
        const size_t bytes = largest_workspace(CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, [&](int algo, size_t* size) {
          return cudnnGetConvolutionBackwardDataWorkspaceSize(handle, d.w.get(), d.y.get(), d.conv.get(), d.x.get(),
                                                              static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), size);
        });
        const Tensor ws = workspace_tensor(bytes, device);
        FLOWLET_CUDA_CHECK(dev, cudnnFindConvolutionBackwardDataAlgorithmEx(
                                    handle, d.w.get(), buf.a, d.y.get(), buf.b, d.conv.get(), d.x.get(), buf.out,
                                    CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count, perf,
                                    bytes == 0 ? nullptr : ws.raw_data(), bytes));
      }
      ok = pick(perf, count, strict, choice);
      if (ok) {
        d.conv.set_math(choice.math, dev);
        FLOWLET_CUDA_CHECK(dev, cudnnGetConvolutionBackwardDataWorkspaceSize(
                                    handle, d.w.get(), d.y.get(), d.conv.get(), d.x.get(),
                                    static_cast<cudnnConvolutionBwdDataAlgo_t>(choice.algo), &choice.workspace));
      }
      break;
    }
    case Pass::backward_filter: {
      cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
      int count = 0;
      FLOWLET_CUDA_CHECK(dev, cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                                  handle, d.x.get(), d.y.get(), d.conv.get(), d.w.get(),
                                  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count, perf));
      if (timed) {
        const size_t bytes = largest_workspace(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, [&](int algo, size_t* size) {
          return cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, d.x.get(), d.y.get(), d.conv.get(), d.w.get(),
                                                                static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo),
                                                                size);
        });
        const Tensor ws = workspace_tensor(bytes, device);
        FLOWLET_CUDA_CHECK(dev, cudnnFindConvolutionBackwardFilterAlgorithmEx(
                                    handle, d.x.get(), buf.a, d.y.get(), buf.b, d.conv.get(), d.w.get(), buf.out,
                                    CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count, perf,
                                    bytes == 0 ? nullptr : ws.raw_data(), bytes));
      }
      ok = pick(perf, count, strict, choice);
      if (ok) {
        d.conv.set_math(choice.math, dev);
        FLOWLET_CUDA_CHECK(dev, cudnnGetConvolutionBackwardFilterWorkspaceSize(
                                    handle, d.x.get(), d.y.get(), d.conv.get(), d.w.get(),
                                    static_cast<cudnnConvolutionBwdFilterAlgo_t>(choice.algo), &choice.workspace));
      }
      break;
    }
  }
  if (!ok) {
    fail<DeviceError>("{}: cuDNN offers no algorithm for x {}, w {}, y {} ({}{}) on cuda:{}", pass_name(pass), p.x,
                      p.w, p.y, p.dtype, strict ? ", TF32 off" : "", dev);
  }
  return choice;
}

// A problem's descriptors (the convolution's set to the chosen math type) and algorithm, built
// once per problem and kept for the process: later calls reuse both, so a call costs a lookup.
struct Plan {
  Descriptors d;
  Choice choice;
  Plan(const Problem& p, Pass pass) : d(p, pass) {}
};

std::mutex plans_mutex;
std::map<Problem::Key, std::unique_ptr<Plan>>& plans() {
  static std::map<Problem::Key, std::unique_ptr<Plan>> cached;  // never erased: plans stay valid
  return cached;
}

const Plan* cached_plan(const Problem::Key& key) {
  std::lock_guard lock(plans_mutex);
  const auto found = plans().find(key);
  return found == plans().end() ? nullptr : found->second.get();
}

// One cuDNN call of `pass`: out = conv(a, b) with beta = 0.
void run_pass(Pass pass, const Problem& p, const Buffers& buf, const OpCall& call, Device device) {
  const Launch on = launch_on(device);
  const CudnnHandle handle(on.device, on.stream);
  const Problem::Key key = p.key(pass);
  const Plan* plan = cached_plan(key);
  std::unique_ptr<Plan> uncached;  // a plan chosen while a CUDA Graph records: heuristic, not kept
  if (plan == nullptr) {
    const bool recording = recording_of(call.step) != nullptr;
    auto fresh = std::make_unique<Plan>(p, pass);
    fresh->choice = choose(pass, p, fresh->d, handle.get(), buf, recording, device);
    fresh->d.conv.set_math(fresh->choice.math, on.device);
    if (log_plans()) {
      fmt::print(stderr, "cudnn: {} {} x {} w {} y {} pad [{}, {}] stride [{}, {}] dilation [{}, {}] groups {}: algo {}, math {}, workspace {} bytes ({})\n",
                 pass_name(pass), p.dtype, p.x, p.w, p.y, p.geometry.pad_h, p.geometry.pad_w, p.geometry.stride_h,
                 p.geometry.stride_w, p.geometry.dilation_h, p.geometry.dilation_w, p.geometry.groups,
                 fresh->choice.algo, static_cast<int>(fresh->choice.math), fresh->choice.workspace,
                 recording ? "heuristic, recording" : timing_allowed() ? "timed" : "heuristic");
    }
    if (recording) {
      uncached = std::move(fresh);
      plan = uncached.get();
    } else {
      std::lock_guard lock(plans_mutex);
      plan = plans().try_emplace(key, std::move(fresh)).first->second.get();  // a racing thread's plan is as good
    }
  }
  const Descriptors& d = plan->d;
  const Choice& choice = plan->choice;
  const Tensor ws = workspace_tensor(choice.workspace, device);
  void* ws_data = choice.workspace == 0 ? nullptr : ws.raw_data();
  const float one32 = 1.0f, zero32 = 0.0f;
  const double one64 = 1.0, zero64 = 0.0;
  const bool f64 = p.dtype == DType::f64;
  const void* one = f64 ? static_cast<const void*>(&one64) : static_cast<const void*>(&one32);
  const void* zero = f64 ? static_cast<const void*>(&zero64) : static_cast<const void*>(&zero32);
  switch (pass) {
    case Pass::forward:
      FLOWLET_CUDA_CHECK(on.device, cudnnConvolutionForward(handle.get(), one, d.x.get(), buf.a, d.w.get(), buf.b,
                                                            d.conv.get(),
                                                            static_cast<cudnnConvolutionFwdAlgo_t>(choice.algo),
                                                            ws_data, choice.workspace, zero, d.y.get(), buf.out));
      break;
    case Pass::backward_data:
      FLOWLET_CUDA_CHECK(on.device, cudnnConvolutionBackwardData(
                                        handle.get(), one, d.w.get(), buf.a, d.y.get(), buf.b, d.conv.get(),
                                        static_cast<cudnnConvolutionBwdDataAlgo_t>(choice.algo), ws_data,
                                        choice.workspace, zero, d.x.get(), buf.out));
      break;
    case Pass::backward_filter:
      FLOWLET_CUDA_CHECK(on.device, cudnnConvolutionBackwardFilter(
                                        handle.get(), one, d.x.get(), buf.a, d.y.get(), buf.b, d.conv.get(),
                                        static_cast<cudnnConvolutionBwdFilterAlgo_t>(choice.algo), ws_data,
                                        choice.workspace, zero, d.w.get(), buf.out));
      break;
  }
}

bool symmetric(const Conv2dAttrs& a) { return a.pad_top == a.pad_bottom && a.pad_left == a.pad_right; }

// The geometry cuDNN gets: the attributes' padding when symmetric, none when the input is padded here.
ConvGeometry geometry_of(const Conv2dAttrs& a, const char* op) {
  auto to_int = [&](int64_t v) {
    if (v < 0 || v > INT_MAX) fail<ShapeError>("{}: cuDNN takes geometry values in [0, 2^31); got {}", op, a.describe());
    return static_cast<int>(v);
  };
  ConvGeometry g;
  if (symmetric(a)) g.pad_h = to_int(a.pad_top), g.pad_w = to_int(a.pad_left);
  g.stride_h = to_int(a.stride_h), g.stride_w = to_int(a.stride_w);
  g.dilation_h = to_int(a.dilation_h), g.dilation_w = to_int(a.dilation_w);
  g.groups = to_int(a.groups);
  return g;
}

// x padded by the attributes' (asymmetric) padding.
Tensor padded(const Tensor& x, const Conv2dAttrs& a, const Launch& on) {
  const Shape& s = x.shape();
  const int64_t h = s[2] + a.pad_top + a.pad_bottom, w = s[3] + a.pad_left + a.pad_right;
  Tensor out = Tensor::empty(Shape{s[0], s[1], h, w}, x.dtype(), x.device());
  launch_pad_planes(x.raw_data(), out.raw_data(), static_cast<int>(dtype_size(x.dtype())), s[0] * s[1], s[2], s[3],
                    a.pad_top, a.pad_left, h, w, on);
  return out;
}

void fill_zero(const Tensor& t, const Launch& on) {
  FLOWLET_CUDA_CHECK(on.device, cudaMemsetAsync(t.raw_data(), 0, static_cast<size_t>(t.numel()) * dtype_size(t.dtype()),
                                                on.stream));
}

void conv2d_kernel(const OpCall& call, std::span<Tensor> out) {
  NoDeviceScope here;
  const auto& a = call.attrs<Conv2dAttrs>();
  Tensor& y = out[0];
  if (y.numel() == 0) return;
  const Launch on = launch_on(y.device());
  Tensor x = call.inputs[0].contiguous();
  const Tensor w = call.inputs[1].contiguous();
  if (x.numel() == 0 || w.numel() == 0) {
    fill_zero(y, on);  // an empty sum (no input channels, or an empty kernel)
  } else {
    if (!symmetric(a)) x = padded(x, a, on);
    const Problem p{x.shape(), w.shape(), y.shape(), x.dtype(), geometry_of(a, "conv2d"), matmul_tf32(), on.device};
    run_pass(Pass::forward, p, {x.raw_data(), w.raw_data(), y.raw_data()}, call, y.device());
  }
  Tensor bias;
  if (call.inputs.size() > 2) bias = call.inputs[2].contiguous();
  const Shape& ys = y.shape();
  launch_bias_activation(y.raw_data(), bias.defined() ? bias.raw_data() : nullptr, element_type(y.dtype()), ys[0], ys[1],
                         ys[2] * ys[3], a.activation == ConvActivation::relu, on);
}

void conv2d_backward_input_kernel(const OpCall& call, std::span<Tensor> out) {
  NoDeviceScope here;
  const auto& attrs = call.attrs<Conv2dBackwardAttrs>();
  const Conv2dAttrs& a = attrs.conv;
  Tensor& dx = out[0];
  if (dx.numel() == 0) return;
  const Launch on = launch_on(dx.device());
  const Tensor dy = call.inputs[0].contiguous();
  const Tensor w = call.inputs[1].contiguous();
  if (dy.numel() == 0 || w.numel() == 0) return fill_zero(dx, on);
  const Shape& s = dx.shape();
  const bool pad_here = !symmetric(a);
  const Tensor target = pad_here ? Tensor::empty(Shape{s[0], s[1], s[2] + a.pad_top + a.pad_bottom,
                                                       s[3] + a.pad_left + a.pad_right},
                                                 dx.dtype(), dx.device())
                                 : dx;
  const Problem p{target.shape(), w.shape(), dy.shape(), dx.dtype(), geometry_of(a, "conv2d_backward_input"),
                  matmul_tf32(), on.device};
  run_pass(Pass::backward_data, p, {w.raw_data(), dy.raw_data(), target.raw_data()}, call, dx.device());
  if (pad_here) {
    const Shape& t = target.shape();
    launch_crop_planes(target.raw_data(), dx.raw_data(), static_cast<int>(dtype_size(dx.dtype())), s[0] * s[1], t[2],
                       t[3], a.pad_top, a.pad_left, s[2], s[3], on);
  }
}

void conv2d_backward_weight_kernel(const OpCall& call, std::span<Tensor> out) {
  NoDeviceScope here;
  const Conv2dAttrs& a = call.attrs<Conv2dBackwardAttrs>().conv;
  Tensor& dw = out[0];
  if (dw.numel() == 0) return;
  const Launch on = launch_on(dw.device());
  Tensor x = call.inputs[0].contiguous();
  const Tensor dy = call.inputs[1].contiguous();
  if (x.numel() == 0 || dy.numel() == 0) return fill_zero(dw, on);
  if (!symmetric(a)) x = padded(x, a, on);
  const Problem p{x.shape(), dw.shape(), dy.shape(), dw.dtype(), geometry_of(a, "conv2d_backward_weight"),
                  matmul_tf32(), on.device};
  run_pass(Pass::backward_filter, p, {x.raw_data(), dy.raw_data(), dw.raw_data()}, call, dw.device());
}

}  // namespace

void add_pool_kernels(const OpList& ops);  // pool.cpp

void add_conv_kernels(const OpList& ops) {
  set_kernel(ops, "conv2d", &conv2d_kernel);
  set_kernel(ops, "conv2d_backward_input", &conv2d_backward_input_kernel);
  set_kernel(ops, "conv2d_backward_weight", &conv2d_backward_weight_kernel);
  add_pool_kernels(ops);
}

}  // namespace flowlet::detail::cuda
