// conv2d on the CPU, forward and forward + backward (input and weight gradients), f32 NCHW, on
// ResNet-like shapes and the CNN demo's: flowlet's engine (im2col or Winograd on flowlet's pool,
// src/kernels/conv_gemm.hpp) against libtorch (at::convolution / at::convolution_backward, its
// threads set to flowlet's budget) and, when built with oneDNN, oneDNN 2.6 primitives on plain NCHW
// memory (Debian's build runs on its own OpenMP threads, set to the same count). Target: time <=
// 1.1 x libtorch's. BENCH_CONV_BASELINE=1 adds flowlet with FLOWLET_CONV_WINOGRAD_4X4=0 and
// FLOWLET_CONV_ONEDNN=0 (the engine of docs/notes18/conv.md) as a contender in the same process,
// for information.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <flowlet/flowlet.hpp>

#include "../../src/ops/conv_attrs.hpp"  // to call the backward ops directly, as the gradient rule does
#include "../harness.hpp"
#include "../torch_peer.hpp"

#ifdef FLOWLET_BENCH_HAVE_DNNL
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace fl = flowlet;
namespace bench = flowlet_bench;

namespace {

struct Shape2d {
  std::string label;
  int64_t n, c, h, w, o, k, stride, pad;
};

int thread_budget() {
  const char* env = std::getenv("FLOWLET_NUM_THREADS");
  const int asked = env ? std::atoi(env) : 0;
  return asked >= 1 ? asked : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

double conv_flops(const Shape2d& s, int64_t oh, int64_t ow) {
  return 2.0 * static_cast<double>(s.n * s.o * oh * ow) * static_cast<double>(s.c * s.k * s.k);
}

#ifdef FLOWLET_BENCH_HAVE_DNNL
// oneDNN forward, backward-data and backward-weights primitives on plain NCHW / OIHW memory.
struct DnnlConv {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  dnnl::memory src, wei, dst, diff_src, diff_wei, diff_dst;
  dnnl::convolution_forward fwd;
  dnnl::convolution_backward_data bwd_data;
  dnnl::convolution_backward_weights bwd_weights;

  DnnlConv(const Shape2d& s, int64_t oh, int64_t ow, float* x, float* w, float* y, float* dx, float* dw, float* dy) {
    using tag = dnnl::memory::format_tag;
    using dt = dnnl::memory::data_type;
    const dnnl::memory::desc x_md({s.n, s.c, s.h, s.w}, dt::f32, tag::nchw);
    const dnnl::memory::desc w_md({s.o, s.c, s.k, s.k}, dt::f32, tag::oihw);
    const dnnl::memory::desc y_md({s.n, s.o, oh, ow}, dt::f32, tag::nchw);
    const dnnl::memory::dims strides{s.stride, s.stride}, pads{s.pad, s.pad}, dil{0, 0};
    src = dnnl::memory(x_md, engine, x), wei = dnnl::memory(w_md, engine, w), dst = dnnl::memory(y_md, engine, y);
    diff_src = dnnl::memory(x_md, engine, dx), diff_wei = dnnl::memory(w_md, engine, dw), diff_dst = dnnl::memory(y_md, engine, dy);
    const dnnl::convolution_forward::desc fd(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, x_md,
                                             w_md, y_md, strides, dil, pads, pads);
    const dnnl::convolution_forward::primitive_desc fpd(fd, engine);
    fwd = dnnl::convolution_forward(fpd);
    const dnnl::convolution_backward_data::desc bd(dnnl::algorithm::convolution_direct, x_md, w_md, y_md, strides, dil,
                                                   pads, pads);
    bwd_data = dnnl::convolution_backward_data(dnnl::convolution_backward_data::primitive_desc(bd, engine, fpd));
    const dnnl::convolution_backward_weights::desc wd(dnnl::algorithm::convolution_direct, x_md, w_md, y_md, strides, dil,
                                                      pads, pads);
    bwd_weights = dnnl::convolution_backward_weights(dnnl::convolution_backward_weights::primitive_desc(wd, engine, fpd));
  }
  void forward() {
    fwd.execute(stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
    stream.wait();
  }
  void backward() {
    bwd_data.execute(stream, {{DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DIFF_SRC, diff_src}});
    bwd_weights.execute(stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_DIFF_WEIGHTS, diff_wei}});
    stream.wait();
  }
};
#endif

void run_shape(const Shape2d& s) {
  const fl::Tensor x = fl::randn(fl::Shape{s.n, s.c, s.h, s.w}, 1);
  const fl::Tensor w = fl::randn(fl::Shape{s.o, s.c, s.k, s.k}, 2) * 0.05f;
  const fl::Conv2dOptions options{.stride = s.stride, .padding = s.pad};
  const fl::Tensor y0 = fl::conv2d(x, w, options);
  const int64_t oh = y0.shape()[2], ow = y0.shape()[3];
  const fl::Tensor dy = fl::randn(y0.shape(), 3);
  const double flops = conv_flops(s, oh, ow);
  const bench::Options big{.samples = 9};

  fl::detail::Conv2dAttrs attrs;
  attrs.stride_h = attrs.stride_w = s.stride;
  attrs.pad_top = attrs.pad_bottom = attrs.pad_left = attrs.pad_right = s.pad;
  const fl::detail::Conv2dBackwardAttrs input_attrs{attrs, s.h, s.w}, weight_attrs{attrs, s.k, s.k};
  const fl::Op& backward_input = *fl::find_op("conv2d_backward_input");
  const fl::Op& backward_weight = *fl::find_op("conv2d_backward_weight");
  const std::vector<fl::Tensor> bi{dy, w}, bw{x, dy};

#ifdef FLOWLET_BENCH_HAVE_TORCH
  c10::InferenceMode guard;
  const at::Tensor tx = at::from_blob(const_cast<float*>(x.data<float>()), {s.n, s.c, s.h, s.w}).clone();
  const at::Tensor tw = at::from_blob(const_cast<float*>(w.data<float>()), {s.o, s.c, s.k, s.k}).clone();
  const at::Tensor tdy = at::from_blob(const_cast<float*>(dy.data<float>()), {s.n, s.o, oh, ow}).clone();
  const std::vector<int64_t> stride{s.stride, s.stride}, pad{s.pad, s.pad}, dil{1, 1}, out_pad{0, 0};
  auto torch_forward = [&] { return at::convolution(tx, tw, {}, stride, pad, dil, false, out_pad, 1); };
#endif
#ifdef FLOWLET_BENCH_HAVE_DNNL
  std::vector<float> dx(static_cast<size_t>(x.numel())), dw(static_cast<size_t>(w.numel())), y(static_cast<size_t>(y0.numel()));
  DnnlConv dnnl_conv(s, oh, ow, const_cast<float*>(x.data<float>()), const_cast<float*>(w.data<float>()), y.data(), dx.data(),
                     dw.data(), const_cast<float*>(dy.data<float>()));
#endif

  // The previous round's engine in the same process (the switches are read per call).
  const bool baseline = std::getenv("BENCH_CONV_BASELINE") != nullptr && std::string(std::getenv("BENCH_CONV_BASELINE")) == "1";
  auto as_baseline = [](auto&& body) {
    return [body] {
      setenv("FLOWLET_CONV_WINOGRAD_4X4", "0", 1);
      setenv("FLOWLET_CONV_ONEDNN", "0", 1);
      body();
      unsetenv("FLOWLET_CONV_WINOGRAD_4X4");
      unsetenv("FLOWLET_CONV_ONEDNN");
    };
  };
  const std::string detail = fmt::format("x [{}, {}, {}, {}], w [{}, {}, {}, {}], stride {}, pad {}", s.n, s.c, s.h, s.w, s.o,
                                         s.c, s.k, s.k, s.stride, s.pad);
  {
    bench::Section section(s.label + " forward", bench::Metric::rate("GFLOP/s", flops / 1e9), detail);
    auto forward = [&] { bench::do_not_optimize(fl::conv2d(x, w, options)); };
    const bench::Result ours = section.run("flowlet conv2d", forward, big);
    if (baseline) {
      const bench::Result before = section.run("flowlet, last round's engine", as_baseline(forward), big);
      section.compare(ours, before, std::nullopt);
    }
#ifdef FLOWLET_BENCH_HAVE_TORCH
    const bench::Result torch = section.run("libtorch at::convolution", [&] { bench::do_not_optimize(torch_forward()); }, big);
#else
    const bench::Result torch = section.skip("libtorch");
#endif
#ifdef FLOWLET_BENCH_HAVE_DNNL
    const bench::Result onednn = section.run("oneDNN (OpenMP threads)", [&] { dnnl_conv.forward(); }, big);
    section.compare(onednn, torch, std::nullopt);
#endif
    section.compare(ours, torch, bench::Target::at_least(1.0 / 1.1, "time <= 1.1 x libtorch"));
  }
  {
    bench::Section section(s.label + " forward + backward", bench::Metric::rate("GFLOP/s", 3 * flops / 1e9),
                           detail + "; backward = input and weight gradients");
    auto both = [&] {
      bench::do_not_optimize(fl::conv2d(x, w, options));
      bench::do_not_optimize(fl::dispatch(backward_input, bi, &input_attrs));
      bench::do_not_optimize(fl::dispatch(backward_weight, bw, &weight_attrs));
    };
    const bench::Result ours = section.run("flowlet", both, big);
    if (baseline) {
      const bench::Result before = section.run("flowlet, last round's engine", as_baseline(both), big);
      section.compare(ours, before, std::nullopt);
    }
#ifdef FLOWLET_BENCH_HAVE_TORCH
    const bench::Result torch = section.run("libtorch", [&] {
      bench::do_not_optimize(torch_forward());
      bench::do_not_optimize(at::convolution_backward(tdy, tx, tw, c10::nullopt, stride, pad, dil, false, out_pad, 1,
                                                      {true, true, false}));
    }, big);
#else
    const bench::Result torch = section.skip("libtorch");
#endif
#ifdef FLOWLET_BENCH_HAVE_DNNL
    const bench::Result onednn = section.run("oneDNN (OpenMP threads)", [&] {
      dnnl_conv.forward();
      dnnl_conv.backward();
    }, big);
    section.compare(onednn, torch, std::nullopt);
#endif
    section.compare(ours, torch, bench::Target::at_least(1.0 / 1.1, "time <= 1.1 x libtorch"));
  }
}

void run_all() {
  const int threads = thread_budget();
#ifdef FLOWLET_BENCH_HAVE_TORCH
  at::set_num_threads(threads);
  fmt::print("   libtorch threads set to flowlet's budget: {}\n", at::get_num_threads());
#endif
#ifdef FLOWLET_BENCH_HAVE_DNNL
  omp_set_num_threads(threads);
  fmt::print("   oneDNN {}.{}.{} (CPU runtime OpenMP), {} OpenMP threads\n", dnnl_version()->major, dnnl_version()->minor,
             dnnl_version()->patch, threads);
#endif
  // BENCH_CONV_ONLY=<substring> runs the shapes whose label contains it.
  const char* only = std::getenv("BENCH_CONV_ONLY");
  const std::vector<Shape2d> shapes = {
      {"resnet 64x56x56 3x3", 32, 64, 56, 56, 64, 3, 1, 1},
      {"resnet 128x28x28 3x3", 32, 128, 28, 28, 128, 3, 1, 1},
      {"resnet 256x14x14 1x1 -> 64", 32, 256, 14, 14, 64, 1, 1, 0},
      {"resnet 64x56x56 1x1 -> 256", 32, 64, 56, 56, 256, 1, 1, 0},
      {"cnn demo conv1 1x28x28 5x5 -> 32", 128, 1, 28, 28, 32, 5, 1, 2},
      {"cnn demo conv1 1x28x28 3x3 -> 32", 128, 1, 28, 28, 32, 3, 1, 1},
      {"cnn demo conv2 32x14x14 5x5 -> 64", 128, 32, 14, 14, 64, 5, 1, 2},
      {"cnn demo conv2 32x14x14 3x3 -> 64", 128, 32, 14, 14, 64, 3, 1, 1},
  };
  for (const Shape2d& s : shapes)
    if (only == nullptr || s.label.find(only) != std::string::npos) run_shape(s);
}

}  // namespace

int main() {
  return bench::run_benchmark("bench_conv", "conv2d forward and backward, f32 NCHW, CPU", false, run_all);
}
