// MirroredStrategy across processes, under `mpirun -np N` (tests/meson.build runs it with N = 2):
// strategies of 1 and of 2 logical CPU devices per process. Every process checks on its own:
//   - a mirrored variable starts as global replica 0's value even where the process passed another;
//   - 10 SGD (momentum) and 10 Adam steps on an MLP, with an even and an uneven global batch, equal
//     single-process full-batch training computed in this same program (float tolerance);
//   - every replica's copies stay bit-identical (MirroredOptions::check_replicas_equal all-gathers
//     checksums across the processes after every step).
// Test cases run in file order on every process, so their collectives line up.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include <flowlet/collective.hpp>
#include <flowlet/flowlet.hpp>
#include <flowlet/mirrored.hpp>

#include "support/replicas.hpp"

namespace fl = flowlet;

namespace {

using test::make_step;

void ensure_devices() { test::ensure_cpu_devices(2); }

std::vector<fl::Device> local_devices(int n) { return test::cpu_devices(n); }

fl::MirroredOptions checked_options() {
  fl::MirroredOptions options;
  options.check_replicas_equal = true;
  options.collective_timeout_seconds = 30;
  return options;
}

void build_mlp(fl::nn::Sequential& model) {
  model.add<fl::nn::Linear>(5, 7, /*seed=*/21, "hidden");
  model.add([](const fl::Tensor& x) { return fl::tanh(x); });
  model.add<fl::nn::Linear>(7, 4, /*seed=*/22, "logits");
}

// Global batch k: the same on every process.
std::pair<fl::Tensor, fl::Tensor> batch(int k, int64_t rows) {
  return {fl::randn({rows, 5}, 300 + static_cast<uint64_t>(k)),
          fl::argmax(fl::randn({rows, 4}, 700 + static_cast<uint64_t>(k)), 1)};
}

void check_close(const fl::nn::Sequential& got, const fl::nn::Sequential& want) {
  const std::vector<fl::Variable> g = got.parameters(), w = want.parameters();
  REQUIRE(g.size() == w.size());
  for (size_t i = 0; i < g.size(); ++i) {
    const std::vector<float> a = g[i].value().to_vector<float>(), b = w[i].value().to_vector<float>();
    REQUIRE(a.size() == b.size());
    size_t bad = 0;
    for (size_t j = 0; j < a.size(); ++j) bad += std::abs(a[j] - b[j]) <= 2e-5 + 2e-5 * std::abs(b[j]) ? 0 : 1;
    CAPTURE(i);
    CHECK(bad == 0);
  }
}

// make_optimizer(): a fresh optimizer (copies of one would share its step counter).
template <class MakeOptimizer>
void check_training(int local, MakeOptimizer make_optimizer, int64_t rows) {
  constexpr int kSteps = 10;
  fl::nn::Sequential reference;  // one device, the full batch, in this process
  build_mlp(reference);
  auto reference_optimizer = make_optimizer();
  auto reference_step = fl::trace(make_step(reference, reference_optimizer));
  for (int k = 0; k < kSteps; ++k) {
    auto [x, y] = batch(k, rows);
    (void)reference_step(x, y);
  }
  fl::MirroredStrategy dp(local_devices(local), checked_options());
  REQUIRE(dp.num_replicas() == local * fl::process_count());
  fl::nn::Sequential model;
  {
    auto scope = dp.scope();
    build_mlp(model);
  }
  auto optimizer = make_optimizer();
  auto step = make_step(model, optimizer);
  for (int k = 0; k < kSteps; ++k) {
    auto [x, y] = batch(k, rows);
    const std::vector<fl::Tensor> losses = dp.run(step, x, y);
    CHECK(losses.size() == static_cast<size_t>(local));
  }
  check_close(model, reference);
}

}  // namespace

TEST_CASE("mirrored variables start as global replica 0's value on every process") {
  ensure_devices();
  for (int local : {1, 2}) {
    CAPTURE(local);
    fl::MirroredStrategy dp(local_devices(local), checked_options());
    fl::Variable w;
    {
      auto scope = dp.scope();
      w = fl::Variable(fl::full({3}, 1.0 + fl::process_index(), fl::f32), "w");  // each process its own
    }
    auto read = [&](fl::Tensor x) { return w.value() + fl::sum(x) * 0.0f; };
    for (const fl::Tensor& copy : dp.run(read, fl::ones({dp.num_replicas(), 1}))) {
      CHECK(copy.to_vector<float>() == std::vector<float>{1, 1, 1});
    }
    dp.check_replicas_equal();
  }
}

TEST_CASE("SGD with momentum across processes equals one process on the full batch (even and uneven batches)") {
  ensure_devices();
  for (int local : {1, 2}) {
    for (int64_t extra : {0, 1}) {
      const int64_t rows = 4 * local * fl::process_count() + extra;
      CAPTURE(local);
      CAPTURE(rows);
      check_training(local, [] { return fl::optim::SGD(0.1, 0.9); }, rows);
    }
  }
}

TEST_CASE("Adam across processes equals one process on the full batch (even and uneven batches)") {
  ensure_devices();
  for (int local : {1, 2}) {
    for (int64_t extra : {0, 1}) {
      const int64_t rows = 4 * local * fl::process_count() + extra;
      CAPTURE(local);
      CAPTURE(rows);
      check_training(local, [] { return fl::optim::Adam(0.01); }, rows);
    }
  }
}

TEST_CASE("a diverged replica in another process is named by the equality check on every process") {
  ensure_devices();
  fl::MirroredStrategy dp(local_devices(1), checked_options());
  fl::Variable b;
  {
    auto scope = dp.scope();
    b = fl::Variable(fl::zeros({2}), "b");
  }
  // Outside run() an update reaches this process's copies only: the last process's differ.
  if (fl::process_index() == fl::process_count() - 1 && fl::process_count() > 1) b.assign(fl::ones({2}));
  if (fl::process_count() > 1) {
    bool threw = false;
    try {
      dp.check_replicas_equal();
    } catch (const fl::InvalidArgument& e) {
      threw = true;
      const std::string what = e.what();
      CHECK(what.find("'b'") != std::string::npos);
      CHECK(what.find(fmt::format("process {}", fl::process_count() - 1)) != std::string::npos);
    }
    CHECK(threw);
  }
}

TEST_CASE("processes that create a mirrored variable with different shapes all fail, naming it; the next works") {
  ensure_devices();
  if (fl::process_count() < 2) return;
  fl::MirroredOptions options = checked_options();
  options.collective_timeout_seconds = 10;
  fl::MirroredStrategy dp(local_devices(2), options);
  auto scope = dp.scope();
  bool threw = false;
  try {
    fl::Variable mismatch(fl::zeros({2 + fl::process_index()}), "mismatch");
  } catch (const fl::Error& e) {
    threw = true;
    const std::string what = e.what();
    CHECK(what.find("'mismatch'") != std::string::npos);
  }
  CHECK(threw);
  // Every process failed the same call, so the next creation is in step.
  fl::Variable next(fl::full({2}, 3.0 + fl::process_index(), fl::f32), "next");
  CHECK(next.value().to_vector<float>() == std::vector<float>{3, 3});
}

// Last: it leaves its strategy unusable (by design), and the other processes wait for the timeout.
TEST_CASE("a replica failing in one process fails run() on every process within the timeout, then run() refuses") {
  ensure_devices();
  if (fl::process_count() < 2) return;
  fl::MirroredOptions options = checked_options();
  options.collective_timeout_seconds = 3;
  fl::MirroredStrategy dp(local_devices(1), options);
  fl::Variable w;
  {
    auto scope = dp.scope();
    w = fl::Variable(fl::ones({2}), "w");
  }
  fl::optim::SGD sgd(0.1);
  auto step = [&](fl::Tensor x) {
    if (fl::process_index() == 1) throw fl::InvalidArgument("process 1 fails on purpose");
    fl::GradientTape tape;
    fl::Tensor loss = fl::mean(x * w.value());
    sgd.apply(tape.gradient(loss, {w}), {w});
    return loss;
  };
  const auto start = std::chrono::steady_clock::now();
  bool threw = false;
  try {
    (void)dp.run(step, fl::ones({4, 2}));
  } catch (const fl::Error& e) {
    threw = true;
    const std::string what = e.what();
    if (fl::process_index() == 1) {
      CHECK(what.find("fails on purpose") != std::string::npos);
    } else {
      CHECK(what.find("all_reduce") != std::string::npos);  // the collective that waited in vain
    }
  }
  CHECK(threw);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
  CHECK(w.value().to_vector<float>() == std::vector<float>{1, 1});  // no process updated
  bool refused = false;
  try {
    (void)dp.run(step, fl::ones({4, 2}));
  } catch (const fl::InvalidArgument& e) {
    refused = std::string(e.what()).find("out of step") != std::string::npos;
  }
  CHECK(refused);
}
