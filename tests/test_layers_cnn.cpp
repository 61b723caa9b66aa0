// The layers beside nn::Linear (flowlet/layers.hpp): Conv2d, BatchNorm2d, LayerNorm, Dropout,
// Embedding and Flatten: shapes, initial values, parameters()/buffers()/variables() and their
// names, modes through Sequential, argument errors, and a small CNN (Conv2d, BatchNorm2d, relu,
// max_pool2d, Flatten, Linear) trained with Adam on a fixed batch: the loss falls, and the traced
// step gives the eager step's losses, weights and running statistics.
#include <cmath>
#include <string>
#include <vector>

#include "support/reference.hpp"

namespace {

std::vector<std::string> names_of(const std::vector<fl::Variable>& vars) {
  std::vector<std::string> names;
  for (const fl::Variable& v : vars) names.push_back(v.name());
  return names;
}

// conv2d by definition: y[n, o, i, j] = b[o] + sum over c, p, q of w[o, c, p, q] * x[n, c, i*s + p - pad, j*s + q - pad].
std::vector<double> conv_reference(const fl::Tensor& xt, const fl::Tensor& wt, const fl::Tensor& bt, int64_t stride,
                                   int64_t pad, fl::Shape& out_shape) {
  const std::vector<double> x = test::values(xt), w = test::values(wt), b = test::values(bt);
  const int64_t N = xt.shape()[0], C = xt.shape()[1], H = xt.shape()[2], W = xt.shape()[3];
  const int64_t O = wt.shape()[0], KH = wt.shape()[2], KW = wt.shape()[3];
  const int64_t OH = (H + 2 * pad - KH) / stride + 1, OW = (W + 2 * pad - KW) / stride + 1;
  out_shape = fl::Shape{N, O, OH, OW};
  std::vector<double> y;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t i = 0; i < OH; ++i)
        for (int64_t j = 0; j < OW; ++j) {
          double acc = b[static_cast<size_t>(o)];
          for (int64_t c = 0; c < C; ++c)
            for (int64_t p = 0; p < KH; ++p)
              for (int64_t q = 0; q < KW; ++q) {
                const int64_t r = i * stride + p - pad, s = j * stride + q - pad;
                if (r < 0 || r >= H || s < 0 || s >= W) continue;
                acc += w[static_cast<size_t>(((o * C + c) * KH + p) * KW + q)] * x[static_cast<size_t>(((n * C + c) * H + r) * W + s)];
              }
          y.push_back(acc);
        }
  return y;
}

}  // namespace

TEST_CASE("Conv2d: shapes, PyTorch's initial bounds, names, and the convolution it applies") {
  fl::nn::Conv2d conv(3, 4, 3, /*seed=*/5, fl::Conv2dOptions{.stride = 2, .padding = 1}, "c1");
  CHECK(conv.weight.shape() == fl::Shape{4, 3, 3, 3});
  CHECK(conv.bias.shape() == fl::Shape{4});
  CHECK(names_of(conv.parameters()) == std::vector<std::string>{"c1/weight", "c1/bias"});
  CHECK(conv.buffers().empty());
  const double bound = 1 / std::sqrt(27.0);
  for (const fl::Variable& v : conv.parameters())
    for (double e : test::values(v.value())) CHECK(std::abs(e) <= bound);
  const fl::Tensor x = test::random_tensor({2, 3, 7, 6}, 1);
  fl::Shape shape;
  const std::vector<double> want = conv_reference(x, conv.weight.value(), conv.bias.value(), 2, 1, shape);
  CHECK(shape == fl::Shape{2, 4, 4, 3});
  test::check_tensor(conv(x), want, shape, fl::f32, test::Tolerance{1e-5, 1e-5});

  // Without a bias, and grouped: weight [6, 4 / 2, 1, 2].
  fl::nn::Conv2d grouped(4, 6, fl::Size2{1, 2}, 6, fl::Conv2dOptions{.groups = 2}, "g", /*has_bias=*/false, fl::f64);
  CHECK(grouped.weight.shape() == fl::Shape{6, 2, 1, 2});
  CHECK(grouped.weight.dtype() == fl::f64);
  CHECK_FALSE(grouped.bias.defined());
  CHECK(names_of(grouped.variables()) == std::vector<std::string>{"g/weight"});
  CHECK(grouped(fl::zeros({1, 4, 3, 3}, fl::f64)).shape() == fl::Shape{1, 6, 3, 2});
}

TEST_CASE("Conv2d: bad sizes and inputs are named") {
  test::check_throws<fl::InvalidArgument>([] { fl::nn::Conv2d(0, 4, 3, 1); }, {"Conv2d", "in_channels", "0"});
  test::check_throws<fl::InvalidArgument>([] { fl::nn::Conv2d(3, 4, fl::Size2{3, 0}, 1); }, {"Conv2d", "kernel width"});
  test::check_throws<fl::InvalidArgument>([] { fl::nn::Conv2d(3, 4, 3, 1, fl::Conv2dOptions{.groups = 2}); },
                                          {"Conv2d", "groups 2"});
  fl::nn::Conv2d conv(3, 4, 3, 1);
  test::check_throws<fl::ShapeError>([&] { (void)conv(fl::zeros({3, 5, 5})); }, {"Conv2d", "[3, 5, 5]"});
  test::check_throws<fl::ShapeError>([&] { (void)conv(fl::zeros({1, 2, 5, 5})); }, {"conv2d"});  // the op's own check
}

TEST_CASE("BatchNorm2d: parameters and buffers, training updates the running statistics, inference does not") {
  fl::nn::BatchNorm2d bn(3, /*momentum=*/0.5, 1e-5, "bn");
  CHECK(names_of(bn.parameters()) == std::vector<std::string>{"bn/gamma", "bn/beta"});
  CHECK(names_of(bn.buffers()) == std::vector<std::string>{"bn/running_mean", "bn/running_var"});
  CHECK(names_of(bn.variables()) ==
        std::vector<std::string>{"bn/gamma", "bn/beta", "bn/running_mean", "bn/running_var"});
  CHECK(test::values(bn.gamma.value()) == std::vector<double>{1, 1, 1});
  CHECK(test::values(bn.running_var.value()) == std::vector<double>{1, 1, 1});
  CHECK(bn.mode() == fl::Mode::training);

  // Channel c of x holds c + {0, 1, 2, 3}: mean c + 1.5, unbiased var 5/3.
  std::vector<double> v;
  for (int n = 0; n < 2; ++n)
    for (int c = 0; c < 3; ++c)
      for (int k = 0; k < 2; ++k) v.push_back(c + 2 * n + k);
  const fl::Tensor x = test::make(v, fl::Shape{2, 3, 1, 2});
  const fl::Tensor y = bn(x);
  const double r = 1 / std::sqrt(1.25 + 1e-5);
  test::check_tensor(y, {-1.5 * r, -0.5 * r, -1.5 * r, -0.5 * r, -1.5 * r, -0.5 * r, 0.5 * r, 1.5 * r, 0.5 * r, 1.5 * r,
                         0.5 * r, 1.5 * r},
                     x.shape(), fl::f32, test::Tolerance{1e-5, 1e-5});
  test::check_tensor(bn.running_mean.value(), {0.75, 1.25, 1.75}, fl::Shape{3}, fl::f32);
  test::check_tensor(bn.running_var.value(), {0.5 + 0.5 * 5.0 / 3.0, 0.5 + 0.5 * 5.0 / 3.0, 0.5 + 0.5 * 5.0 / 3.0},
                     fl::Shape{3}, fl::f32);

  bn.eval();
  const fl::Tensor z = bn(x);  // (x - running_mean) / sqrt(running_var + eps)
  const double rv = 1 / std::sqrt(0.5 + 0.5 * 5.0 / 3.0 + 1e-5);
  test::check_tensor(fl::slice(fl::reshape(z, {12}), 0, 0, 2), {(0 - 0.75) * rv, (1 - 0.75) * rv}, fl::Shape{2}, fl::f32);
  test::check_tensor(bn.running_mean.value(), {0.75, 1.25, 1.75}, fl::Shape{3}, fl::f32);
  CHECK(bn(fl::zeros({5, 3})).shape() == fl::Shape{5, 3});  // [N, C] inputs too

  test::check_throws<fl::InvalidArgument>([] { fl::nn::BatchNorm2d(0); }, {"BatchNorm2d", "channels", "0"});
  test::check_throws<fl::InvalidArgument>([] { fl::nn::BatchNorm2d(2, 1.5); }, {"BatchNorm2d", "momentum"});
  test::check_throws<fl::ShapeError>([&] { (void)bn(fl::zeros({2, 3, 4})); }, {"BatchNorm2d", "[2, 3, 4]"});
}

TEST_CASE("LayerNorm: normalizes the trailing axes; names and errors") {
  fl::nn::LayerNorm ln(fl::Shape{2, 3}, 1e-5, "ln");
  CHECK(names_of(ln.parameters()) == std::vector<std::string>{"ln/gamma", "ln/beta"});
  CHECK(ln.gamma.shape() == fl::Shape{2, 3});
  const fl::Tensor x = test::random_tensor({4, 2, 3}, 3);
  const std::vector<double> xv = test::values(x), y = test::values(ln(x));
  // Each row of 6 (gamma 1, beta 0): mean 0 and biased variance var(x) / (var(x) + eps).
  auto moments = [](const std::vector<double>& v, int r) {
    double m = 0, var = 0;
    for (int j = 0; j < 6; ++j) m += v[static_cast<size_t>(r * 6 + j)] / 6;
    for (int j = 0; j < 6; ++j) var += std::pow(v[static_cast<size_t>(r * 6 + j)] - m, 2) / 6;
    return std::pair<double, double>{m, var};
  };
  for (int r = 0; r < 4; ++r) {
    const auto [xm, xvar] = moments(xv, r);
    const auto [ym, yvar] = moments(y, r);
    CHECK(std::abs(ym) < 1e-6);
    CHECK(std::abs(yvar - xvar / (xvar + 1e-5)) < 1e-5);
  }
  test::check_throws<fl::ShapeError>([&] { (void)ln(fl::zeros({4, 3, 2})); }, {"LayerNorm", "[2, 3]", "[4, 3, 2]"});
  test::check_throws<fl::ShapeError>([&] { (void)ln(fl::zeros({3})); }, {"LayerNorm"});
  test::check_throws<fl::InvalidArgument>([] { fl::nn::LayerNorm(fl::Shape{}); }, {"LayerNorm", "at least one axis"});
  test::check_throws<fl::InvalidArgument>([] { fl::nn::LayerNorm(fl::Shape{3, 0}); }, {"LayerNorm", "[3, 0]"});
}

TEST_CASE("Dropout: drops in training mode, passes x through in inference mode") {
  fl::nn::Dropout drop(0.5);
  CHECK(drop.parameters().empty());
  const fl::Tensor x = fl::ones({1000});
  const std::vector<double> y = test::values(drop(x));
  const auto zeros = std::count(y.begin(), y.end(), 0.0);
  CHECK(zeros > 400);
  CHECK(zeros < 600);
  drop.eval();
  CHECK(drop(x).impl_ptr() == x.impl_ptr());
  test::check_throws<fl::InvalidArgument>([] { fl::nn::Dropout(1.0); }, {"Dropout", "rate", "[0, 1)"});
}

TEST_CASE("Embedding: rows for indices of any rank, its gradient, errors") {
  fl::nn::Embedding emb(5, 3, /*seed=*/2, "emb");
  CHECK(names_of(emb.parameters()) == std::vector<std::string>{"emb/weight"});
  CHECK(emb.weight.shape() == fl::Shape{5, 3});
  const std::vector<double> table = test::values(emb.weight.value());
  for (fl::DType dt : {fl::i64, fl::i32}) {
    const fl::Tensor idx = test::make({4, 0, 4, 2, 1, 3}, fl::Shape{2, 1, 3}, dt);
    const fl::Tensor rows = emb(idx);
    std::vector<double> want;
    for (int i : {4, 0, 4, 2, 1, 3})
      for (int j = 0; j < 3; ++j) want.push_back(table[static_cast<size_t>(i * 3 + j)]);
    test::check_tensor(rows, want, fl::Shape{2, 1, 3, 3}, fl::f32);
  }
  CHECK(emb(fl::scalar(int64_t{2})).shape() == fl::Shape{3});
  // The gradient adds each looked-up row's upstream gradient into its table row.
  fl::GradientTape tape;
  const fl::Tensor loss = fl::sum(emb(test::make({4, 0, 4}, fl::Shape{3}, fl::i64)));
  const fl::Tensor g = tape.gradient(loss, {emb.weight})[0];
  test::check_tensor(g, {1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2}, fl::Shape{5, 3}, fl::f32);
  test::check_throws<fl::OutOfRange>([&] { (void)emb(test::make({5}, fl::Shape{1}, fl::i64)); }, {"5"});
  test::check_throws<fl::DTypeError>([&] { (void)emb(fl::zeros({2})); }, {"Embedding", "f32"});
  test::check_throws<fl::InvalidArgument>([] { fl::nn::Embedding(0, 3, 1); }, {"Embedding", "num_embeddings"});
}

TEST_CASE("Flatten: keeps the batch axis") {
  fl::nn::Flatten flat;
  const fl::Tensor x = test::random_tensor({2, 3, 4, 5}, 4);
  const fl::Tensor y = flat(x);
  CHECK(y.shape() == fl::Shape{2, 60});
  CHECK(test::values(y) == test::values(x));
  CHECK(flat(fl::zeros({7})).shape() == fl::Shape{7, 1});
  test::check_throws<fl::ShapeError>([&] { (void)flat(fl::scalar(1.0f)); }, {"Flatten", "scalar"});
}

TEST_CASE("Sequential: set_mode reaches every part; parameters and buffers in order") {
  fl::nn::Sequential model;
  model.add<fl::nn::Conv2d>(1, 2, 3, 1, fl::Conv2dOptions{.padding = 1}, "conv");
  auto& bn = model.add<fl::nn::BatchNorm2d>(2, 0.1, 1e-5, "bn");
  model.add([](const fl::Tensor& t) { return fl::relu(t); });
  auto& drop = model.add<fl::nn::Dropout>(0.5);
  model.add<fl::nn::Flatten>();
  CHECK(names_of(model.parameters()) == std::vector<std::string>{"conv/weight", "conv/bias", "bn/gamma", "bn/beta"});
  CHECK(names_of(model.buffers()) == std::vector<std::string>{"bn/running_mean", "bn/running_var"});
  CHECK(model.variables().size() == 6);
  model.eval();
  CHECK(bn.mode() == fl::Mode::inference);
  CHECK(drop.mode() == fl::Mode::inference);
  const fl::Tensor x = test::random_tensor({2, 1, 4, 4}, 7);
  const std::vector<double> a = test::values(model(x));
  CHECK(test::values(model(x)) == a);  // deterministic: no dropout, running statistics unchanged
  CHECK(test::values(bn.running_mean.value()) == std::vector<double>{0, 0});
  model.train();
  CHECK(bn.mode() == fl::Mode::training);
  CHECK(drop.mode() == fl::Mode::training);
  (void)model(x);
  CHECK(test::values(bn.running_mean.value()) != std::vector<double>{0, 0});
}

namespace {

// Conv2d(1 -> 4, 3x3, pad 1) - BatchNorm2d - relu - max_pool2d(2) - Flatten - Linear(64 -> 3).
struct SmallCnn {
  fl::nn::Sequential model;
  fl::nn::BatchNorm2d* bn = nullptr;
  SmallCnn() {
    model.add<fl::nn::Conv2d>(1, 4, 3, /*seed=*/21, fl::Conv2dOptions{.padding = 1}, "conv");
    bn = &model.add<fl::nn::BatchNorm2d>(4, 0.1, 1e-5, "bn");
    model.add([](const fl::Tensor& t) { return fl::relu(t); });
    model.add([](const fl::Tensor& t) { return fl::max_pool2d(t, 2); });
    model.add<fl::nn::Flatten>();
    model.add<fl::nn::Linear>(64, 3, /*seed=*/22, "dense");
  }
};

struct CnnRun {
  std::vector<double> losses;
  std::vector<std::vector<double>> variables;
};

CnnRun train_cnn(bool traced, int steps) {
  SmallCnn net;
  fl::optim::Adam adam(0.02);
  // A fixed batch: 12 images 8x8 whose label is the quadrant holding a bright spot (3 classes).
  std::vector<double> images(12 * 64, 0.0), labels;
  for (int i = 0; i < 12; ++i) {
    const int label = i % 3, row = label == 1 ? 5 : 1, col = label == 2 ? 5 : 1;
    for (int d = 0; d < 4; ++d) images[static_cast<size_t>(i * 64 + (row + d / 2) * 8 + col + d % 2)] = 1.0 + 0.1 * (i % 4);
    labels.push_back(label);
  }
  const fl::Tensor noise = test::random_tensor({12, 1, 8, 8}, 23) * 0.1f;
  const fl::Tensor x = test::make(images, fl::Shape{12, 1, 8, 8}) + noise;
  const fl::Tensor y = test::make(labels, fl::Shape{12}, fl::i64);
  const std::vector<fl::Variable> params = net.model.parameters();
  auto step = [&](fl::Tensor xb, fl::Tensor yb) {
    fl::GradientTape tape;
    const fl::Tensor loss = fl::mean(fl::softmax_cross_entropy(net.model(xb), yb));
    adam.apply(tape.gradient(loss, params), params);
    return loss;
  };
  auto traced_step = fl::trace(step);
  CnnRun run;
  for (int s = 0; s < steps; ++s) run.losses.push_back(test::values(traced ? traced_step(x, y) : step(x, y)).at(0));
  for (const fl::Variable& v : net.model.variables()) run.variables.push_back(test::values(v.value()));
  return run;
}

}  // namespace

TEST_CASE("a small CNN trains with Adam on a fixed batch, and the traced step equals the eager one") {
  const CnnRun eager = train_cnn(false, 12);
  CAPTURE(eager.losses);
  CHECK(eager.losses.back() < 0.5 * eager.losses.front());
  const CnnRun traced = train_cnn(true, 12);
  REQUIRE(traced.losses.size() == eager.losses.size());
  test::check_values(traced.losses, eager.losses, test::Tolerance{1e-4, 1e-6});
  REQUIRE(traced.variables.size() == eager.variables.size());  // parameters, then the running statistics
  for (size_t i = 0; i < eager.variables.size(); ++i) {
    CAPTURE(i);
    test::check_values(traced.variables[i], eager.variables[i], test::Tolerance{1e-3, 1e-5});
  }
}
