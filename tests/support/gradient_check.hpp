// Gradient checks shared by tests/test_autodiff.cpp (every op with a gradient rule, on the CPU) and
// tests/test_cuda.cpp (a representative set on cuda:0): a table of cases per op name, each building
// f64 inputs; check_case compares the tape's gradient of loss = sum(op(inputs) * w), for fixed
// random weights w, with central finite differences of the loss, element by element, on one device.
// Integer inputs (indices, labels) and where's condition are fixed.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "support/reference.hpp"

namespace test::gradient {

using Domain = test::Domain;

using Inputs = std::vector<fl::Tensor>;

struct GradCase {
  std::string label;
  Inputs inputs;
  std::vector<bool> differentiable;  // per input: compared with finite differences
  std::function<fl::Tensor(const Inputs&)> fn;
};

inline fl::Tensor f64_input(const fl::Shape& shape, uint64_t seed, Domain domain = Domain::normal) {
  return test::random_tensor(shape, seed, fl::f64, domain);
}

// Distinct values (gaps of at least 0.1) in a shuffled order: a clear arg-max everywhere.
inline fl::Tensor distinct_input(const fl::Shape& shape, uint64_t seed) {
  std::vector<double> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = -1.0 + 0.1 * static_cast<double>(i);
  test::Rng rng(seed);
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[static_cast<size_t>(rng.integer(0, static_cast<int64_t>(i) - 1))]);
  return test::make(v, shape, fl::f64);
}

inline fl::Tensor indices(const std::vector<int64_t>& v, const fl::Shape& shape, fl::DType dt = fl::i64) {
  std::vector<double> d(v.begin(), v.end());
  return test::make(d, shape, dt);
}

inline GradCase all_floating(std::string label, Inputs inputs, std::function<fl::Tensor(const Inputs&)> fn) {
  std::vector<bool> diff(inputs.size(), true);
  return {std::move(label), std::move(inputs), std::move(diff), std::move(fn)};
}

using BinaryFn = fl::Tensor (*)(const fl::Tensor&, const fl::Tensor&);
using UnaryFn = fl::Tensor (*)(const fl::Tensor&);

// Same shapes, a row vector, a column, a scalar, and the broadcast on the left operand.
inline std::vector<GradCase> binary_cases(BinaryFn fn, Domain a_domain, Domain b_domain) {
  const std::vector<std::pair<fl::Shape, fl::Shape>> shapes = {
      {{3, 4}, {3, 4}}, {{3, 4}, {4}}, {{3, 4}, {3, 1}}, {{3, 4}, {}}, {{4}, {3, 4}}, {{2, 1, 3}, {4, 1}},
  };
  std::vector<GradCase> cases;
  uint64_t seed = 100;
  for (const auto& [a, b] : shapes) {
    cases.push_back(all_floating(test::shape_text(a) + " with " + test::shape_text(b),
                                 {f64_input(a, seed, a_domain), f64_input(b, seed + 1, b_domain)},
                                 [fn](const Inputs& in) { return fn(in[0], in[1]); }));
    seed += 2;
  }
  // One tensor in both positions: the two input gradients accumulate.
  cases.push_back(all_floating("x with itself", {f64_input({2, 3}, seed, a_domain == Domain::positive ? a_domain : b_domain)},
                               [fn](const Inputs& in) { return fn(in[0], in[0]); }));
  return cases;
}

inline std::vector<GradCase> unary_cases(UnaryFn fn, Domain domain) {
  std::vector<GradCase> cases;
  uint64_t seed = 200;
  for (const fl::Shape& s : {fl::Shape{3, 4}, fl::Shape{}, fl::Shape{2, 3, 2}}) {
    cases.push_back(all_floating(test::shape_text(s), {f64_input(s, seed++, domain)},
                                 [fn](const Inputs& in) { return fn(in[0]); }));
  }
  return cases;
}

// The to_device op's attribute struct, as src/ops/shape.cpp declares it (ToDeviceAttrs{Device}).
// Tensor::to skips the op when the device does not change, and cpu:0 is the only device, so the
// rule is reached by dispatching the op directly.
struct ToDeviceAttrsMirror {
  fl::Device device;
};

using Builder = std::function<std::vector<GradCase>()>;

#include "support/gradient_cases_norm.inc"  // add_norm_gradient_cases (issue 15)

}  // namespace test::gradient

// Issue 15's cases (conv2d and pooling), which need GradCase and the helpers above.
#include "support/conv_grad_cases.hpp"

namespace test::gradient {

inline std::map<std::string, Builder> build_cases() {
  std::map<std::string, Builder> b;
  const Domain N = Domain::normal;

  b["add"] = [=] { return binary_cases(&fl::add, N, N); };
  b["sub"] = [=] { return binary_cases(&fl::sub, N, N); };
  b["mul"] = [=] { return binary_cases(&fl::mul, N, N); };
  b["div"] = [=] { return binary_cases(&fl::div, N, Domain::nonzero); };
  b["pow"] = [=] { return binary_cases(&fl::pow, Domain::positive, N); };
  // Random normal values: ties (and near-ties within the finite-difference step) do not occur.
  b["maximum"] = [=] { return binary_cases(&fl::maximum, N, N); };
  b["minimum"] = [=] { return binary_cases(&fl::minimum, N, N); };

  b["neg"] = [=] { return unary_cases(&fl::neg, N); };
  b["exp"] = [=] { return unary_cases(&fl::exp, N); };
  b["log"] = [=] { return unary_cases(&fl::log, Domain::positive); };
  b["sqrt"] = [=] { return unary_cases(&fl::sqrt, Domain::positive); };
  b["tanh"] = [=] { return unary_cases(&fl::tanh, N); };
  b["sigmoid"] = [=] { return unary_cases(&fl::sigmoid, N); };
  b["relu"] = [=] { return unary_cases(&fl::relu, Domain::nonzero); };  // |x| >= 0.5: away from the kink
  b["abs"] = [=] { return unary_cases(&fl::abs, Domain::nonzero); };
  b["square"] = [=] { return unary_cases(&fl::square, N); };
  b["log1p"] = [=] { return unary_cases(&fl::log1p, Domain::positive); };
  b["expm1"] = [=] { return unary_cases(&fl::expm1, N); };
  b["erf"] = [=] { return unary_cases(&fl::erf, N); };
  b["gelu"] = [=] { return unary_cases(&fl::gelu, N); };
  // Piecewise constant: zero gradients, checked away from the jumps (sign at 0, floor at integers,
  // round at halves), where finite differences are zero too.
  b["sign"] = [=] { return unary_cases(&fl::sign, Domain::nonzero); };
  for (const char* name : {"floor", "round"}) {
    const UnaryFn fn = std::string(name) == "floor" ? &fl::floor : &fl::round;
    b[name] = [fn] {
      const fl::Tensor x = test::make({-2.8, -1.2, -0.3, 0.2, 0.7, 1.8, 2.3, 3.6}, fl::Shape{2, 4}, fl::f64);
      return std::vector<GradCase>{all_floating("away from the jumps", {x}, [fn](const Inputs& in) { return fn(in[0]); })};
    };
  }
  b["clamp"] = [=] {
    std::vector<GradCase> cases;
    const auto clamp3 = [](const Inputs& in) { return fl::clamp(in[0], in[1], in[2]); };
    cases.push_back(all_floating("scalar bounds", {f64_input({3, 4}, 300), test::make({-0.5}, fl::Shape{}, fl::f64),
                                                   test::make({0.6}, fl::Shape{}, fl::f64)}, clamp3));
    // Random bounds per column and row: some below x, some above, some with lo > hi (hi wins).
    cases.push_back(all_floating("broadcast bounds", {f64_input({3, 4}, 301), f64_input({4}, 417), f64_input({3, 1}, 533)},
                                 clamp3));
    cases.push_back(all_floating("double bounds", {f64_input({2, 5}, 304)},
                                 [](const Inputs& in) { return fl::clamp(in[0], -0.5, 0.5); }));
    return cases;
  };

  b["where"] = [] {
    std::vector<GradCase> cases;
    const fl::Tensor cond = test::make({1, 0, 0, 1, 1, 0, 1, 0, 0, 1, 1, 1}, fl::Shape{3, 4}, fl::b8);
    cases.push_back({"same shapes", {cond, f64_input({3, 4}, 1), f64_input({3, 4}, 2)}, {false, true, true},
                     [](const Inputs& in) { return fl::where(in[0], in[1], in[2]); }});
    const fl::Tensor column = test::make({1, 0, 1}, fl::Shape{3, 1}, fl::b8);
    cases.push_back({"broadcast condition and operands", {column, f64_input({4}, 3), f64_input({3, 4}, 4)},
                     {false, true, true}, [](const Inputs& in) { return fl::where(in[0], in[1], in[2]); }});
    cases.push_back({"scalar operand", {cond, f64_input({}, 5), f64_input({3, 1}, 6)}, {false, true, true},
                     [](const Inputs& in) { return fl::where(in[0], in[1], in[2]); }});
    return cases;
  };

  b["cast"] = [] {
    // f64 -> f64 here; the f32 -> f64 path (the gradient returns to f32) is its own test below.
    return std::vector<GradCase>{all_floating("f64 to f64", {f64_input({3, 4}, 7)},
                                              [](const Inputs& in) { return fl::cast(in[0], fl::f64); })};
  };

  b["sum"] = [] {
    std::vector<GradCase> cases;
    cases.push_back(all_floating("all", {f64_input({3, 4}, 8)}, [](const Inputs& in) { return fl::sum(in[0]); }));
    for (const std::vector<int64_t>& axes : std::vector<std::vector<int64_t>>{{0}, {1}, {0, 1}, {-1}})
      for (bool keepdims : {false, true})
        cases.push_back(all_floating(fmt::format("axes {} keepdims {}", axes.size() == 2 ? "{0,1}" : std::to_string(axes[0]), keepdims),
                                     {f64_input({3, 4}, 9)},
                                     [axes, keepdims](const Inputs& in) { return fl::sum(in[0], axes, keepdims); }));
    cases.push_back(all_floating("rank 3 axes {0, 2}", {f64_input({2, 3, 4}, 10)},
                                 [](const Inputs& in) { return fl::sum(in[0], {0, 2}, false); }));
    cases.push_back(all_floating("zero-size input", {f64_input({0, 3}, 11)},
                                 [](const Inputs& in) { return fl::sum(in[0], {0}, false); }));
    cases.push_back(all_floating("empty axes list", {f64_input({2, 3}, 11)},
                                 [](const Inputs& in) { return fl::sum(in[0], std::vector<int64_t>{}, false); }));
    return cases;
  };

  b["max"] = [] {
    std::vector<GradCase> cases;
    cases.push_back(all_floating("all", {distinct_input({3, 4}, 12)}, [](const Inputs& in) { return fl::max(in[0]); }));
    for (const std::vector<int64_t>& axes : std::vector<std::vector<int64_t>>{{0}, {1}, {0, 1}})
      for (bool keepdims : {false, true})
        cases.push_back(all_floating(fmt::format("axes {} keepdims {}", axes.size() == 2 ? "{0,1}" : std::to_string(axes[0]), keepdims),
                                     {distinct_input({3, 4}, 13)},
                                     [axes, keepdims](const Inputs& in) { return fl::max(in[0], axes, keepdims); }));
    cases.push_back(all_floating("rank 3 axis -1", {distinct_input({2, 3, 4}, 14)},
                                 [](const Inputs& in) { return fl::max(in[0], {-1}, false); }));
    return cases;
  };

  b["matmul"] = [] {
    std::vector<GradCase> cases;
    const std::vector<std::pair<fl::Shape, fl::Shape>> shapes = {
        {{3, 4}, {4, 5}}, {{2, 3, 4}, {2, 4, 5}}, {{2, 3, 4}, {4, 5}}, {{3, 4}, {2, 4, 5}}, {{1, 1}, {1, 1}}, {{3, 0}, {0, 2}}};
    uint64_t seed = 15;
    for (const auto& [a, bs] : shapes) {
      cases.push_back(all_floating(test::shape_text(a) + " x " + test::shape_text(bs),
                                   {f64_input(a, seed), f64_input(bs, seed + 1)},
                                   [](const Inputs& in) { return fl::matmul(in[0], in[1]); }));
      seed += 2;
    }
    cases.push_back(all_floating("transposed view operand", {f64_input({4, 3}, 30), f64_input({4, 5}, 31)},
                                 [](const Inputs& in) { return fl::matmul(fl::transpose(in[0]), in[1]); }));
    return cases;
  };

  b["reshape"] = [] {
    return std::vector<GradCase>{
        all_floating("[3, 4] to [2, 6]", {f64_input({3, 4}, 32)}, [](const Inputs& in) { return fl::reshape(in[0], {2, 6}); }),
        all_floating("[2, 3, 2] to [-1, 3]", {f64_input({2, 3, 2}, 33)},
                     [](const Inputs& in) { return fl::reshape(in[0], {-1, 3}); }),
        all_floating("scalar to [1, 1]", {f64_input({}, 34)}, [](const Inputs& in) { return fl::reshape(in[0], {1, 1}); }),
    };
  };

  b["permute"] = [] {
    return std::vector<GradCase>{
        all_floating("{2, 0, 1}", {f64_input({2, 3, 4}, 35)}, [](const Inputs& in) { return fl::permute(in[0], {2, 0, 1}); }),
        all_floating("transpose", {f64_input({3, 4}, 36)}, [](const Inputs& in) { return fl::transpose(in[0]); }),
    };
  };

  b["slice"] = [] {
    return std::vector<GradCase>{
        all_floating("axis 0", {f64_input({4, 3}, 37)}, [](const Inputs& in) { return fl::slice(in[0], 0, 1, 2); }),
        all_floating("axis 1", {f64_input({3, 5}, 38)}, [](const Inputs& in) { return fl::slice(in[0], 1, 2, 3); }),
        all_floating("axis -1 of rank 3", {f64_input({2, 3, 4}, 39)},
                     [](const Inputs& in) { return fl::slice(in[0], -1, 0, 2); }),
        all_floating("whole axis", {f64_input({5}, 40)}, [](const Inputs& in) { return fl::slice(in[0], 0, 0, 5); }),
        all_floating("empty slice", {f64_input({3, 2}, 40)}, [](const Inputs& in) { return fl::slice(in[0], 0, 3, 0); }),
        all_floating("slice of a slice", {f64_input({6, 2}, 41)},
                     [](const Inputs& in) { return fl::slice(fl::slice(in[0], 0, 1, 4), 0, 2, 2); }),
    };
  };

  b["copy"] = [] {
    return std::vector<GradCase>{
        all_floating("contiguous", {f64_input({3, 4}, 42)},
                     [](const Inputs& in) { return fl::dispatch(*fl::find_op("copy"), {in[0]}); }),
        all_floating("of a permuted view", {f64_input({3, 4}, 43)},
                     [](const Inputs& in) { return fl::transpose(in[0]).contiguous(); }),
    };
  };

  b["to_device"] = [] {
    return std::vector<GradCase>{all_floating("cpu:0 to cpu:0", {f64_input({3, 4}, 44)}, [](const Inputs& in) {
      return fl::dispatch(*fl::find_op("to_device"), {in[0]}, ToDeviceAttrsMirror{fl::Device("cpu:0")});
    })};
  };

  b["concat"] = [] {
    return std::vector<GradCase>{
        all_floating("axis 0", {f64_input({2, 3}, 45), f64_input({1, 3}, 46)},
                     [](const Inputs& in) { return fl::concat({in[0], in[1]}, 0); }),
        all_floating("axis -1, three parts", {f64_input({2, 1}, 47), f64_input({2, 3}, 48), f64_input({2, 2}, 49)},
                     [](const Inputs& in) { return fl::concat({in[0], in[1], in[2]}, -1); }),
        all_floating("one input twice", {f64_input({2, 2}, 50), f64_input({2, 2}, 51)},
                     [](const Inputs& in) { return fl::concat({in[0], in[1], in[0]}, 1); }),
    };
  };

  b["gather"] = [] {
    std::vector<GradCase> cases;
    cases.push_back({"repeated indices", {f64_input({5, 3}, 52), indices({0, 2, 2, 4, 0, 2}, {6})}, {true, false},
                     [](const Inputs& in) { return fl::gather(in[0], in[1]); }});
    cases.push_back({"rank-2 i32 indices", {f64_input({4}, 53), indices({3, 3, 1, 0}, {2, 2}, fl::i32)}, {true, false},
                     [](const Inputs& in) { return fl::gather(in[0], in[1]); }});
    cases.push_back({"scalar index", {f64_input({3, 2, 2}, 54), indices({1}, {})}, {true, false},
                     [](const Inputs& in) { return fl::gather(in[0], in[1]); }});
    return cases;
  };

  b["scatter_add"] = [] {
    std::vector<GradCase> cases;
    cases.push_back({"repeated indices", {indices({1, 0, 1, 3}, {4}), f64_input({4, 3}, 55)}, {false, true},
                     [](const Inputs& in) { return fl::scatter_add(in[0], in[1], 4); }});
    cases.push_back({"rank-2 i32 indices, unused rows", {indices({4, 0, 4, 2}, {2, 2}, fl::i32), f64_input({2, 2, 3}, 56)},
                     {false, true}, [](const Inputs& in) { return fl::scatter_add(in[0], in[1], 6); }});
    cases.push_back({"rank-1 updates", {indices({2, 2, 0}, {3}), f64_input({3}, 57)}, {false, true},
                     [](const Inputs& in) { return fl::scatter_add(in[0], in[1], 3); }});
    return cases;
  };

  for (const bool log : {false, true}) {
    b[log ? "log_softmax" : "softmax"] = [log] {
      std::vector<GradCase> cases;
      for (const int64_t axis : {int64_t{0}, int64_t{-1}}) {
        cases.push_back(all_floating(fmt::format("[3, 4] axis {}", axis), {f64_input({3, 4}, 58 + static_cast<uint64_t>(axis + 1))},
                                     [log, axis](const Inputs& in) { return log ? fl::log_softmax(in[0], axis) : fl::softmax(in[0], axis); }));
      }
      cases.push_back(all_floating("[2, 3, 4] axis 1", {f64_input({2, 3, 4}, 60)},
                                   [log](const Inputs& in) { return log ? fl::log_softmax(in[0], 1) : fl::softmax(in[0], 1); }));
      return cases;
    };
  }

  b["softmax_cross_entropy"] = [] {
    std::vector<GradCase> cases;
    cases.push_back({"i64 labels", {f64_input({4, 5}, 61), indices({0, 4, 2, 2}, {4})}, {true, false},
                     [](const Inputs& in) { return fl::softmax_cross_entropy(in[0], in[1]); }});
    cases.push_back({"i32 labels", {f64_input({3, 2}, 62), indices({1, 0, 1}, {3}, fl::i32)}, {true, false},
                     [](const Inputs& in) { return fl::softmax_cross_entropy(in[0], in[1]); }});
    return cases;
  };
  // The collectives in a plain run span one participant (the world's): the SPMD loss is this
  // process's loss, and each rule's collective of the gradient is the identity. Participants on
  // several devices are checked by tests/test_collective_ops.cpp.
  for (const char* name : {"all_reduce", "reduce_scatter"}) {
    const bool scatter = std::string(name) == "reduce_scatter";
    b[name] = [scatter] {
      std::vector<GradCase> cases;
      uint64_t seed = 700;
      for (fl::ReduceOp op : {fl::ReduceOp::sum, fl::ReduceOp::mean, fl::ReduceOp::max, fl::ReduceOp::min}) {
        cases.push_back(all_floating(std::string("[3, 2] ") + fl::to_string(op), {f64_input({3, 2}, ++seed)},
                                     [op, scatter](const Inputs& in) {
                                       return scatter ? fl::reduce_scatter(in[0], op) : fl::all_reduce(in[0], op);
                                     }));
      }
      return cases;
    };
  }
  b["broadcast"] = [] {
    return std::vector<GradCase>{
        all_floating("[4] from root 0", {f64_input({4}, 710)}, [](const Inputs& in) { return fl::broadcast(in[0], 0); })};
  };
  b["all_gather"] = [] {
    return std::vector<GradCase>{
        all_floating("[2, 3]", {f64_input({2, 3}, 711)}, [](const Inputs& in) { return fl::all_gather(in[0]); }),
        all_floating("a scalar", {f64_input({}, 712)}, [](const Inputs& in) { return fl::all_gather(in[0]); })};
  };
  add_conv_cases(b);
  add_norm_gradient_cases(b);
  return b;
}

// The tape's gradients of sum(fn(inputs) * weights) with respect to the differentiable inputs.
inline std::vector<fl::Tensor> tape_gradients(const GradCase& c, const Inputs& inputs, const fl::Tensor& weights) {
  std::vector<fl::Tensor> sources;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (c.differentiable[i]) sources.push_back(inputs[i]);
  fl::GradientTape tape;
  for (const fl::Tensor& s : sources) tape.watch(s);
  return tape.gradient(fl::sum(c.fn(inputs) * weights), sources);
}

// The case's inputs with every floating one stored in `dt`.
inline Inputs inputs_in(const GradCase& c, fl::DType dt) {
  Inputs out;
  for (const fl::Tensor& t : c.inputs)
    out.push_back(t.dtype() == fl::f64 ? test::make(test::values(t), t.shape(), dt) : t);
  return out;
}

// d f / d x_j at `base` for every j, by central differences of step h: f gets base with x_j moved.
inline std::vector<double> central_differences(const std::vector<double>& base, double h,
                                               const std::function<double(const std::vector<double>&)>& f) {
  std::vector<double> slopes(base.size());
  std::vector<double> moved = base;
  for (size_t j = 0; j < base.size(); ++j) {
    moved[j] = base[j] + h;
    const double plus = f(moved);
    moved[j] = base[j] - h;
    const double minus = f(moved);
    moved[j] = base[j];
    slopes[j] = (plus - minus) / (2 * h);
  }
  return slopes;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double total = 0;
  for (size_t i = 0; i < a.size(); ++i) total += a[i] * b[i];
  return total;
}

constexpr double kEps = 1e-6;
inline const test::Tolerance kGradTolerance{1e-6, 1e-6};

// Runs one case on `device` (inputs, the op, the tape and every finite-difference evaluation there):
// the tape's gradient of sum(fn(inputs) * w) against central finite differences.
inline void check_case(const GradCase& c, const fl::Device& device = fl::Device("cpu")) {
  Inputs inputs;
  for (const fl::Tensor& t : c.inputs) inputs.push_back(t.to(device));
  const fl::Tensor probe = c.fn(inputs);
  const fl::Tensor weights = test::random_tensor(probe.shape(), 4242, fl::f64).to(device);
  const std::vector<double> w = test::values(weights);

  std::vector<size_t> positions;
  for (size_t i = 0; i < c.inputs.size(); ++i)
    if (c.differentiable[i]) positions.push_back(i);
  const std::vector<fl::Tensor> grads = tape_gradients(c, inputs, weights);
  REQUIRE(grads.size() == positions.size());

  for (size_t k = 0; k < positions.size(); ++k) {
    const size_t pos = positions[k];
    INFO("input ", pos);
    const fl::Tensor& x = c.inputs[pos];
    const std::vector<double> base = test::values(x);
    const std::vector<double> numeric = central_differences(base, kEps, [&](const std::vector<double>& moved) {
      Inputs in = inputs;
      in[pos] = test::make(moved, x.shape(), fl::f64).to(device);
      return dot(test::values(c.fn(in)), w);
    });
    CHECK(grads[k].device() == device);
    test::check_tensor(grads[k], numeric, x.shape(), fl::f64, kGradTolerance);
  }
}


}  // namespace test::gradient
