// The built-in optimizers' fused update (one optimizer_update op per variable, state/optimizer_update.*)
// against naive f64 reference loops of each rule and against the per-op update() (a subclass, which
// apply() never fuses): Adam, AdamW, SGD with momentum, Nesterov and weight decay; f32, f64, f16
// and bf16 variables (f32 slots); odd sizes, a variable split over threads, non-contiguous
// gradients, empty variables, absent gradients, readers holding old values; eager against traced
// (and the traced graph's shape); checkpoints of the slots and the step counter.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <flowlet/flowlet.hpp>

namespace fl = flowlet;

namespace {

// The same rules through update(): apply() fuses only the built-in classes themselves.
struct PerOpAdam : fl::optim::Adam {
  using Adam::Adam;
};
struct PerOpSgd : fl::optim::SGD {
  using SGD::SGD;
};

std::vector<double> host(const fl::Tensor& t) { return fl::cast(t, fl::f64).to_vector<double>(); }

struct Hyper {
  double lr = 0.01, beta1 = 0.9, beta2 = 0.999, eps = 1e-7, weight_decay = 0.0;
  bool nesterov = false;
};

// Keras' Adam, with AdamW's decoupled decay first, in f64.
void adam_reference(std::vector<double>& w, std::vector<double>& m, std::vector<double>& v,
                    const std::vector<double>& g, int t, const Hyper& h) {
  const double corrected = h.lr * std::sqrt(1.0 - std::pow(h.beta2, t)) / (1.0 - std::pow(h.beta1, t));
  for (size_t i = 0; i < w.size(); ++i) {
    m[i] = h.beta1 * m[i] + (1.0 - h.beta1) * g[i];
    v[i] = h.beta2 * v[i] + (1.0 - h.beta2) * g[i] * g[i];
    w[i] -= h.lr * h.weight_decay * w[i];
    w[i] -= corrected * m[i] / (std::sqrt(v[i]) + h.eps);
  }
}

// SGD with L2 weight decay and (Nesterov) momentum (beta1 is the momentum; 0: none), in f64.
void sgd_reference(std::vector<double>& w, std::vector<double>& u, const std::vector<double>& g, const Hyper& h) {
  for (size_t i = 0; i < w.size(); ++i) {
    const double grad = g[i] + h.weight_decay * w[i];
    double direction = grad;
    if (h.beta1 > 0.0) {
      u[i] = h.beta1 * u[i] + grad;
      direction = h.nesterov ? grad + h.beta1 * u[i] : u[i];
    }
    w[i] -= h.lr * direction;
  }
}

// |got - want| <= abs + rel |want| for every element.
void check_near(const std::vector<double>& got, const std::vector<double>& want, double rel, double abs,
                const std::string& what) {
  REQUIRE(got.size() == want.size());
  size_t bad = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - want[i]);
    if (!(err <= abs + rel * std::fabs(want[i]))) {
      ++bad;
      worst = std::max(worst, err);
    }
  }
  CAPTURE(what);
  CAPTURE(worst);
  CHECK(bad == 0);
}

fl::Variable slot_of(const fl::optim::Optimizer& opt, const fl::Variable& var, const std::string& slot) {
  const std::string name = opt.name() + "/" + var.name() + "/" + slot;
  for (const fl::Variable& s : opt.variables()) {
    if (s.name() == name) return s;
  }
  FAIL("no slot " << name);
  return {};
}

// "w<i>" (appended, not operator+(const char*, string&&), which GCC 12 warns about falsely).
std::string weight_name(size_t i) {
  std::string name = "w";
  name += std::to_string(i);
  return name;
}

int count_nodes(const fl::Graph& graph, const std::string& op) {
  int n = 0;
  for (const fl::Node& node : graph.nodes()) n += !node.removed && node.op != nullptr && node.op->name == op;
  return n;
}

// Relative tolerance of the update in `dt` against f64 (a few roundings per step, three steps).
double tolerance(fl::DType dt) {
  if (dt == fl::f64) return 1e-12;
  if (dt == fl::f16) return 3 * 9.8e-4;   // 2^-10 per rounding of the weight
  if (dt == fl::bf16) return 3 * 7.9e-3;  // 2^-7
  return 2e-6;
}

const std::vector<fl::Shape> kShapes = {{13}, {5, 7}, {0, 3}, {301, 211}};  // tails, empty, split over threads

}  // namespace

TEST_CASE("fused Adam and AdamW match an f64 reference and the per-op update (every floating dtype)") {
  for (fl::DType dt : {fl::f32, fl::f64, fl::f16, fl::bf16}) {
    for (double decay : {0.0, 0.05}) {
      CAPTURE(dt);
      CAPTURE(decay);
      Hyper h;
      h.lr = 0.02;
      h.weight_decay = decay;
      std::vector<fl::Variable> fused_vars, per_op_vars;
      for (size_t i = 0; i < kShapes.size(); ++i) {
        const fl::Tensor init = fl::cast(fl::randn(kShapes[i], 10 + i), dt);
        fused_vars.emplace_back(init, weight_name(i));
        per_op_vars.emplace_back(init, weight_name(i));
      }
      fl::optim::Adam fused(h.lr, h.beta1, h.beta2, h.eps, decay);
      PerOpAdam per_op(h.lr, h.beta1, h.beta2, h.eps, decay);
      std::vector<std::vector<double>> w, m, v;
      for (const fl::Variable& var : fused_vars) {
        w.push_back(host(var.value()));
        m.emplace_back(w.back().size(), 0.0);
        v.emplace_back(w.back().size(), 0.0);
      }
      for (int t = 1; t <= 3; ++t) {
        std::vector<fl::Tensor> grads;
        for (size_t i = 0; i < kShapes.size(); ++i) {
          grads.push_back(fl::cast(fl::randn(kShapes[i], 100 * t + i), dt));
          adam_reference(w[i], m[i], v[i], host(grads.back()), t, h);
        }
        fused.apply(grads, fused_vars);
        per_op.apply(grads, per_op_vars);
      }
      CHECK(fused.iterations().value().item<int64_t>() == 3);
      const double rel = tolerance(dt);
      for (size_t i = 0; i < kShapes.size(); ++i) {
        CHECK(fused_vars[i].dtype() == dt);
        // Near zero, absolute: where m cancels, m / sqrt(v) amplifies f32's rounding of the moments
        // (about 30x at v's smallest, sqrt(1 - beta2) |g|), so 1e-4 of the step's size lr.
        const double abs = dt == fl::f64 ? 1e-14 : dt == fl::f32 ? h.lr * 1e-4 : rel * 0.05;
        check_near(host(fused_vars[i].value()), w[i], rel, abs, "weight vs reference");
        check_near(host(fused_vars[i].value()), host(per_op_vars[i].value()), 2 * rel, 2 * abs, "weight vs per-op");
        const fl::Variable fm = slot_of(fused, fused_vars[i], "m");
        const fl::Variable fv = slot_of(fused, fused_vars[i], "v");
        CHECK(fm.dtype() == (dt == fl::f64 ? fl::f64 : fl::f32));
        // The moments see the (rounded) gradients only: f32 rounding, whatever the variable's dtype.
        // Absolute near zero (m cancels): a few f32 roundings of terms of size |g| ~ 1.
        const double slot_rel = dt == fl::f64 ? 1e-13 : 1e-6;
        const double slot_abs = dt == fl::f64 ? 1e-14 : 1e-6;
        check_near(host(fm.value()), m[i], slot_rel, slot_abs, "m vs reference");
        check_near(host(fv.value()), v[i], slot_rel, slot_abs, "v vs reference");
      }
    }
  }
}

TEST_CASE("fused SGD with momentum, Nesterov and weight decay matches an f64 reference and the per-op update") {
  struct Variant {
    double momentum, decay;
    bool nesterov;
  };
  for (const Variant& variant : {Variant{0.9, 0.0, false}, Variant{0.9, 0.0, true}, Variant{0.8, 0.01, true},
                                 Variant{0.0, 0.01, false}, Variant{0.0, 0.0, false}}) {
    for (fl::DType dt : {fl::f32, fl::f64, fl::f16, fl::bf16}) {
      CAPTURE(dt);
      CAPTURE(variant.momentum);
      CAPTURE(variant.decay);
      CAPTURE(variant.nesterov);
      Hyper h;
      h.lr = 0.05;
      h.beta1 = variant.momentum;
      h.weight_decay = variant.decay;
      h.nesterov = variant.nesterov;
      std::vector<fl::Variable> fused_vars, per_op_vars;
      for (size_t i = 0; i < kShapes.size(); ++i) {
        const fl::Tensor init = fl::cast(fl::randn(kShapes[i], 20 + i), dt);
        fused_vars.emplace_back(init, weight_name(i));
        per_op_vars.emplace_back(init, weight_name(i));
      }
      fl::optim::SGD fused(h.lr, variant.momentum, variant.nesterov, variant.decay);
      PerOpSgd per_op(h.lr, variant.momentum, variant.nesterov, variant.decay);
      std::vector<std::vector<double>> w, u;
      for (const fl::Variable& var : fused_vars) {
        w.push_back(host(var.value()));
        u.emplace_back(w.back().size(), 0.0);
      }
      for (int t = 1; t <= 3; ++t) {
        std::vector<fl::Tensor> grads;
        for (size_t i = 0; i < kShapes.size(); ++i) {
          grads.push_back(fl::cast(fl::randn(kShapes[i], 200 * t + i), dt));
          sgd_reference(w[i], u[i], host(grads.back()), h);
        }
        fused.apply(grads, fused_vars);
        per_op.apply(grads, per_op_vars);
      }
      const double rel = tolerance(dt);
      for (size_t i = 0; i < kShapes.size(); ++i) {
        check_near(host(fused_vars[i].value()), w[i], rel, rel, "weight vs reference");
        check_near(host(fused_vars[i].value()), host(per_op_vars[i].value()), 2 * rel, 2 * rel, "weight vs per-op");
        if (variant.momentum > 0.0) {
          const fl::Variable velocity = slot_of(fused, fused_vars[i], "momentum");
          CHECK(velocity.dtype() == (dt == fl::f64 ? fl::f64 : fl::f32));
          // The velocity sees the weight through the decay: the weight's rounding, scaled by it.
          check_near(host(velocity.value()), u[i], dt == fl::f64 ? 1e-12 : 1e-5, variant.decay > 0 ? rel : 1e-6,
                     "velocity vs reference");
        }
      }
    }
  }
}

TEST_CASE("the fused update: absent gradients, non-contiguous gradients, and readers keep the old values") {
  fl::Variable a(fl::randn({6, 4}, 1), "a"), b(fl::randn({9}, 2), "b");
  fl::optim::Adam adam(0.1);
  const fl::Tensor a_before = a.value();  // held by the caller: the update must not change it
  const std::vector<double> a_values = host(a_before), b_values = host(b.value());
  // Gradient for a: a transposed view (not contiguous); none for b.
  const fl::Tensor ga = fl::transpose(fl::randn({4, 6}, 3));
  REQUIRE_FALSE(ga.is_contiguous());
  adam.apply({ga, fl::Tensor()}, {a, b});
  CHECK(host(a_before) == a_values);
  CHECK(host(b.value()) == b_values);  // no gradient: unchanged, and so are its slots
  CHECK(host(slot_of(adam, b, "m").value()) == std::vector<double>(9, 0.0));
  CHECK(adam.iterations().value().item<int64_t>() == 1);
  Hyper h;
  h.lr = 0.1;
  std::vector<double> w = a_values, m(24, 0.0), v(24, 0.0);
  adam_reference(w, m, v, host(ga), 1, h);
  check_near(host(a.value()), w, 2e-6, 1e-5, "a after one step");
  // A slot held by a reader keeps its old value too.
  const fl::Tensor m_before = slot_of(adam, a, "m").value();
  const std::vector<double> m_values = host(m_before);
  adam.apply({ga, fl::Tensor()}, {a, b});
  CHECK(host(m_before) == m_values);
  CHECK(host(slot_of(adam, a, "m").value()) != m_values);
}

TEST_CASE("eagerly the fused update writes the variable and its slots in place; update() allocates new values") {
  // The buffers' addresses, read without keeping a handle (a held value is copied on write).
  auto address = [](const fl::Variable& v) { return v.value().raw_data(); };
  for (bool fused : {true, false}) {
    CAPTURE(fused);
    fl::Variable w(fl::randn({37, 5}, 1), "w");
    std::unique_ptr<fl::optim::Optimizer> opt;
    if (fused) {
      opt = std::make_unique<fl::optim::Adam>(0.1);
    } else {
      opt = std::make_unique<PerOpAdam>(0.1);
    }
    opt->build({w});
    const void* w_at = address(w);
    const void* m_at = address(slot_of(*opt, w, "m"));
    const void* v_at = address(slot_of(*opt, w, "v"));
    opt->apply({fl::randn({37, 5}, 2)}, {w});
    // update() assigns each moment a new tensor made while the old one is alive: another address.
    CHECK((address(slot_of(*opt, w, "m")) == m_at) == fused);
    if (fused) {
      CHECK(address(w) == w_at);
      CHECK(address(slot_of(*opt, w, "v")) == v_at);
    }
  }
}

TEST_CASE("bad calls to a fused optimizer throw and change nothing") {
  fl::Variable a(fl::randn({3, 2}, 1), "a");
  fl::optim::Adam adam(0.1);
  const std::vector<double> before = host(a.value());
  CHECK_THROWS_AS(adam.apply({fl::randn({2, 3}, 2)}, {a}), fl::ShapeError);
  CHECK_THROWS_AS(adam.apply({fl::cast(fl::randn({3, 2}, 2), fl::f64)}, {a}), fl::DTypeError);
  CHECK_THROWS_AS(adam.apply({fl::randn({3, 2}, 2), fl::randn({3, 2}, 2)}, {a}), fl::InvalidArgument);
  CHECK(host(a.value()) == before);
  CHECK(adam.iterations().value().item<int64_t>() == 0);
}

namespace {

struct Model {
  std::vector<fl::Variable> vars;
  explicit Model(fl::DType dt = fl::f32) {
    vars = {fl::Variable(fl::cast(fl::randn({6, 8}, 1) * 0.3f, dt), "w1"), fl::Variable(fl::cast(fl::zeros({8}), dt), "b1"),
            fl::Variable(fl::cast(fl::randn({8, 3}, 2) * 0.3f, dt), "w2"), fl::Variable(fl::cast(fl::zeros({3}), dt), "b2")};
  }
  fl::Tensor loss(const fl::Tensor& x, const fl::Tensor& y) const {
    const fl::Tensor h = fl::relu(fl::matmul(x, vars[0]) + vars[1]);
    return fl::mean(fl::softmax_cross_entropy(fl::cast(fl::matmul(h, vars[2]) + vars[3], fl::f32), y));
  }
  fl::Tensor step(fl::optim::Optimizer& opt, const fl::Tensor& x, const fl::Tensor& y) {
    fl::GradientTape tape;
    const fl::Tensor l = loss(x, y);
    std::vector<fl::Tensor> grads = tape.gradient(l, vars);
    opt.apply(grads, vars);
    return l;
  }
};

std::unique_ptr<fl::optim::Optimizer> make_optimizer(int which) {
  switch (which) {
    case 0: return std::make_unique<fl::optim::Adam>(0.01);
    case 1: return std::make_unique<fl::optim::AdamW>(0.01, 0.1);
    case 2: return std::make_unique<fl::optim::SGD>(0.1, 0.9, /*nesterov=*/true, 0.01);
    default: return std::make_unique<fl::optim::SGD>(0.1);
  }
}

}  // namespace

TEST_CASE("a traced step with a fused optimizer matches the eager one and updates each variable with one node") {
  const fl::Tensor x = fl::cast(fl::randn({16, 6}, 11), fl::f32);
  const fl::Tensor labels = fl::tensor(std::vector<int64_t>{0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0}, {16});
  for (fl::DType dt : {fl::f32, fl::bf16}) {
    for (int which = 0; which < 4; ++which) {
      CAPTURE(dt);
      CAPTURE(which);
      Model eager_model(dt), traced_model(dt);
      auto eager_opt = make_optimizer(which);
      auto traced_opt = make_optimizer(which);
      auto traced = fl::trace(
          [&](fl::Tensor xb, fl::Tensor yb) { return traced_model.step(*traced_opt, fl::cast(xb, dt), yb); });
      for (int s = 0; s < 4; ++s) {
        const float eager_loss = eager_model.step(*eager_opt, fl::cast(x, dt), labels).item<float>();
        const float traced_loss = traced(x, labels).item<float>();
        CHECK(traced_loss == doctest::Approx(eager_loss).epsilon(dt == fl::f32 ? 1e-6 : 1e-2));
      }
      for (size_t i = 0; i < eager_model.vars.size(); ++i) {
        check_near(host(traced_model.vars[i].value()), host(eager_model.vars[i].value()), tolerance(dt),
                   dt == fl::f32 ? 1e-6 : tolerance(dt), "traced vs eager weight");
      }
      for (const fl::Variable& s : eager_opt->variables()) {
        for (const fl::Variable& t : traced_opt->variables()) {
          if (t.name() != s.name()) continue;
          check_near(host(t.value()), host(s.value()), dt == fl::f32 ? 1e-5 : 5e-2, 1e-6, "slot " + s.name());
        }
      }
      CHECK(traced_opt->iterations().value().item<int64_t>() == 4);
      const fl::Graph& graph = traced.graph(x, labels);
      // One fused node per variable (plain SGD keeps assign_sub, which becomes accumulating GEMMs).
      CHECK(count_nodes(graph, "optimizer_update") == (which == 3 ? 0 : 4));
      if (which != 3) {
        // Only the step counter's increment is left as an assign; no slot is read on its own.
        CHECK(count_nodes(graph, "assign_variable") == 1);
      }
      CHECK(traced.trace_count() == 1);
    }
  }
}

TEST_CASE("a traced step that reads a slot after the fused update sees the updated slot") {
  const fl::Tensor x = fl::randn({4, 6}, 11);
  const fl::Tensor labels = fl::tensor(std::vector<int64_t>{0, 1, 2, 0}, {4});
  Model eager_model, traced_model;
  fl::optim::Adam eager_opt(0.01), traced_opt(0.01);
  eager_opt.build(eager_model.vars);
  traced_opt.build(traced_model.vars);
  const fl::Variable traced_m = slot_of(traced_opt, traced_model.vars[0], "m");
  auto traced = fl::trace([&](fl::Tensor xb, fl::Tensor yb) {
    const fl::Tensor before = traced_m.value();
    traced_model.step(traced_opt, xb, yb);
    return fl::sum(traced_m.value()) - fl::sum(before);
  });
  for (int s = 0; s < 3; ++s) {
    const std::vector<double> m_before = host(slot_of(eager_opt, eager_model.vars[0], "m").value());
    eager_model.step(eager_opt, x, labels);
    const std::vector<double> m_after = host(slot_of(eager_opt, eager_model.vars[0], "m").value());
    double want = 0;
    for (size_t i = 0; i < m_after.size(); ++i) want += m_after[i] - m_before[i];
    const double got = traced(x, labels).item<float>();
    CHECK(got == doctest::Approx(want).epsilon(1e-4).scale(1e-6));
    CHECK(want != 0.0);
  }
}

TEST_CASE("checkpoints of a fused optimizer's slots and step counter resume the same run, eager and traced") {
  const fl::Tensor x = fl::randn({8, 6}, 11);
  const fl::Tensor labels = fl::tensor(std::vector<int64_t>{0, 1, 2, 0, 1, 2, 0, 1}, {8});
  const auto dir = std::filesystem::temp_directory_path() /
                   fmt::format("flowlet_test_optim_{}", std::chrono::steady_clock::now().time_since_epoch().count());
  std::filesystem::create_directories(dir);
  for (bool traced_run : {false, true}) {
    for (int which = 0; which < 3; ++which) {
      CAPTURE(traced_run);
      CAPTURE(which);
      auto run = [&](Model& model, fl::optim::Optimizer& opt, int steps) {
        if (traced_run) {
          auto step = fl::trace([&](fl::Tensor xb, fl::Tensor yb) { return model.step(opt, xb, yb); });
          for (int s = 0; s < steps; ++s) step(x, labels);
        } else {
          for (int s = 0; s < steps; ++s) model.step(opt, x, labels);
        }
      };
      Model straight;
      auto straight_opt = make_optimizer(which);
      run(straight, *straight_opt, 4);

      Model first;
      auto first_opt = make_optimizer(which);
      run(first, *first_opt, 2);
      std::vector<fl::Variable> saved = first.vars;
      for (const fl::Variable& s : first_opt->variables()) saved.push_back(s);
      const std::string path = (dir / fmt::format("ckpt{}.safetensors", which)).string();
      fl::save_checkpoint(path, saved, 2);

      Model resumed;
      auto resumed_opt = make_optimizer(which);
      resumed_opt->build(resumed.vars);
      std::vector<fl::Variable> restored = resumed.vars;
      for (const fl::Variable& s : resumed_opt->variables()) restored.push_back(s);
      CHECK(fl::restore_checkpoint(path, restored) == 2);
      CHECK(resumed_opt->iterations().value().item<int64_t>() == 2);
      run(resumed, *resumed_opt, 2);
      CHECK(resumed_opt->iterations().value().item<int64_t>() == 4);
      for (size_t i = 0; i < straight.vars.size(); ++i) {
        CHECK(host(resumed.vars[i].value()) == host(straight.vars[i].value()));
      }
    }
  }
  std::filesystem::remove_all(dir);
}
