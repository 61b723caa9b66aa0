// A tour of the eager core: printing, views and errors, a softmax-regression model trained with
// hand-written gradients, and a few figures measured on this machine.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include <flowlet/flowlet.hpp>

namespace fl = flowlet;

namespace {

// Median wall time of `repeats` runs of fn, in seconds.
template <class F>
double median_seconds(int repeats, F&& fn) {
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void tour() {
  fmt::print("== Tensors are eager: each line runs now ==\n");
  const fl::Tensor a = fl::tensor(std::vector<float>{1, 2, 3, 4, 5, 6}, fl::Shape{2, 3});
  fmt::print("a = {}\n", a);
  fmt::print("a * 2 + 1 = {}\n", a * 2.0f + 1.0f);
  fmt::print("transpose(a) (a view, no copy) = {}\n", fl::transpose(a));
  fmt::print("sum(a, {{1}}) = {}\n", fl::sum(a, {1}));
  fmt::print("softmax(a) = {}\n", fl::softmax(a));
  fmt::print("a > 3 = {}\n", a > 3.0f);
  try {
    fl::matmul(a, a);
  } catch (const fl::ShapeError& e) {
    fmt::print("errors name the op and the shapes: {}\n", e.what());
  }
}

// Three Gaussian blobs in 2-D, learned by softmax regression with the gradient of the mean
// cross-entropy written out by hand: dL/dlogits = (softmax - one_hot) / N.
void softmax_regression() {
  fmt::print("\n== Softmax regression with hand-written gradients (GradientTape does this for you) ==\n");
  constexpr int64_t per_class = 200, classes = 3;
  const fl::Tensor centers = fl::tensor(std::vector<float>{-2, 0, 2, 2, 2, -2}, fl::Shape{classes, 2});
  std::vector<fl::Tensor> points;
  std::vector<int64_t> label_values;
  for (int64_t c = 0; c < classes; ++c) {
    const fl::Tensor center = fl::reshape(fl::gather(centers, fl::tensor({c})), {1, 2});
    points.push_back(fl::randn({per_class, 2}, 100 + static_cast<uint64_t>(c)) * 0.8f + center);
    label_values.insert(label_values.end(), per_class, c);
  }
  const fl::Tensor x = fl::concat(points, 0);
  const fl::Tensor labels = fl::tensor(label_values, fl::Shape{classes * per_class});
  const fl::Tensor targets = fl::one_hot(labels, classes);
  const float n = static_cast<float>(x.shape()[0]);

  fl::Tensor w = fl::randn({2, classes}, 7) * 0.01f;
  fl::Tensor b = fl::zeros({classes});
  const float learning_rate = 0.5f;
  for (int step = 0; step <= 100; ++step) {
    const fl::Tensor logits = fl::matmul(x, w) + b;
    if (step % 25 == 0) {
      const float loss = fl::mean(fl::softmax_cross_entropy(logits, labels)).item<float>();
      const float accuracy =
          fl::mean((fl::argmax(logits, 1) == labels).astype(fl::f32)).item<float>();
      fmt::print("step {:3d}  loss {:.4f}  accuracy {:.3f}\n", step, loss, accuracy);
    }
    const fl::Tensor grad_logits = (fl::softmax(logits) - targets) / n;
    w = w - learning_rate * fl::matmul(fl::transpose(x), grad_logits);
    b = b - learning_rate * fl::sum(grad_logits, {0});
  }
}

void figures() {
  fmt::print("\n== Measured on this machine (median of repeats; `make bench` compares with peers) ==\n");
  const fl::Tensor one_a = fl::tensor({1.0f}), one_b = fl::tensor({2.0f});
  constexpr int kCalls = 200000;
  const double overhead = median_seconds(7, [&] {
    for (int i = 0; i < kCalls; ++i) fl::Tensor c = one_a + one_b;
  }) / kCalls;
  fmt::print("eager a + b, 1 element, new tensor:   {:8.0f} ns per op\n", overhead * 1e9);

  const int64_t n = 16 << 20;
  const fl::Tensor a = fl::randn({n}, 1), b = fl::randn({n}, 2);
  const double add = median_seconds(9, [&] { fl::Tensor c = a + b; });
  fmt::print("a + b, 16M f32, new tensor:           {:8.1f} GB/s\n", 3.0 * 4 * n / add / 1e9);
  const double reduce = median_seconds(9, [&] { fl::Tensor s = fl::sum(a); });
  fmt::print("sum, 16M f32:                         {:8.1f} GB/s\n", 4.0 * n / reduce / 1e9);
  const fl::Tensor m = fl::randn({1024, 1024}, 3);
  const double gemm = median_seconds(9, [&] { fl::Tensor c = fl::matmul(m, m); });
  fmt::print("matmul 1024x1024 f32:                 {:8.1f} GFLOP/s\n", 2.0 * 1024 * 1024 * 1024 / gemm / 1e9);
  const float total = fl::sum(fl::full({n}, 0.1, fl::f32)).item<float>();
  fmt::print("sum of 16M x 0.1f = {} (relative error {:.1e})\n", total, std::abs(total - 1677721.6) / 1677721.6);
}

}  // namespace

int main() {
  try {
    tour();
    softmax_regression();
    figures();
  } catch (const fl::Error& e) {
    std::fprintf(stderr, "demo failed: %s\n", e.what());
    return 1;
  }
  return 0;
}
