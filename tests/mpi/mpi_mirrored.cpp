// MirroredStrategy across processes: run under `mpirun -np N` (optionally with `--local L` logical
// CPU devices per process), or plainly as a 1-process job. Every process checks, on its own:
//   - a mirrored variable starts as global replica 0's value even where the process passed another;
//   - 10 SGD (momentum) and 10 Adam steps on an MLP, with an even and an uneven global batch,
//     equal single-process full-batch training computed in this same program (float tolerance);
//   - every replica's copies stay bit-identical (MirroredOptions::check_replicas_equal, which
//     all-gathers checksums across the processes after every step).
// Exit status 0 when every check passed; 1 with the failures on stderr.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <flowlet/collective.hpp>
#include <flowlet/flowlet.hpp>
#include <flowlet/mirrored.hpp>

namespace fl = flowlet;

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (ok) return;
  ++failures;
  std::fprintf(stderr, "mpi_mirrored (process %d): FAILED: %s\n", fl::process_index(), what.c_str());
}

void build_mlp(fl::nn::Sequential& model) {
  model.add<fl::nn::Linear>(5, 7, /*seed=*/21, "hidden");
  model.add([](const fl::Tensor& x) { return fl::tanh(x); });
  model.add<fl::nn::Linear>(7, 4, /*seed=*/22, "logits");
}

std::pair<fl::Tensor, fl::Tensor> batch(int k, int64_t rows) {
  return {fl::randn({rows, 5}, 300 + static_cast<uint64_t>(k)),
          fl::argmax(fl::randn({rows, 4}, 700 + static_cast<uint64_t>(k)), 1)};
}

template <class Optimizer>
auto make_step(fl::nn::Sequential& model, Optimizer& optimizer) {
  return [&model, &optimizer](fl::Tensor x, fl::Tensor y) {
    const std::vector<fl::Variable> params = model.parameters();
    fl::GradientTape tape;
    fl::Tensor loss = fl::mean(fl::softmax_cross_entropy(model(x), y));
    optimizer.apply(tape.gradient(loss, params), params);
    return loss;
  };
}

std::vector<std::vector<float>> values_of(const fl::nn::Sequential& model) {
  std::vector<std::vector<float>> values;
  for (const fl::Variable& v : model.parameters()) values.push_back(v.value().to_vector<float>());
  return values;
}

bool close(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& want, std::string& why) {
  for (size_t i = 0; i < want.size(); ++i) {
    for (size_t j = 0; j < want[i].size(); ++j) {
      const double g = got[i][j], w = want[i][j];
      if (!(std::abs(g - w) <= 2e-5 + 2e-5 * std::abs(w))) {
        why = fmt::format("parameter {} element {}: got {} want {}", i, j, g, w);
        return false;
      }
    }
  }
  return true;
}

// make_optimizer(): a fresh optimizer (copies of one would share its step counter).
template <class MakeOptimizer>
void check_training(fl::MirroredStrategy& dp, const std::string& name, MakeOptimizer make_optimizer, int64_t rows) {
  constexpr int kSteps = 10;
  // The reference: one device, the full batch, in this process.
  fl::nn::Sequential reference;
  build_mlp(reference);
  auto reference_optimizer = make_optimizer();
  auto reference_step = fl::trace(make_step(reference, reference_optimizer));
  for (int k = 0; k < kSteps; ++k) {
    auto [x, y] = batch(k, rows);
    (void)reference_step(x, y);
  }
  fl::nn::Sequential model;
  {
    auto scope = dp.scope();
    build_mlp(model);
  }
  auto optimizer = make_optimizer();
  auto step = make_step(model, optimizer);
  try {
    for (int k = 0; k < kSteps; ++k) {
      auto [x, y] = batch(k, rows);
      (void)dp.run(step, x, y);
    }
  } catch (const std::exception& e) {
    expect(false, fmt::format("{} with {} rows threw: {}", name, rows, e.what()));
    return;
  }
  std::string why;
  expect(close(values_of(model), values_of(reference), why),
         fmt::format("{} with {} rows over {} replicas differs from one device: {}", name, rows, dp.num_replicas(), why));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    int local = 1;
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "--local" && i + 1 < argc) local = std::stoi(argv[++i]);
      else throw fl::InvalidArgument("mpi_mirrored: unknown option " + arg + " (usage: mpi_mirrored [--local L])");
    }
    if (local > 1) fl::set_logical_cpu_devices(local);
    std::vector<fl::Device> devices;
    for (int l = 0; l < local; ++l) devices.emplace_back(fl::DeviceKind::cpu, l);
    fl::MirroredOptions options;
    options.check_replicas_equal = true;
    options.collective_timeout_seconds = 30;
    fl::MirroredStrategy dp(devices, options);
    expect(dp.num_replicas() == local * fl::process_count(),
           fmt::format("num_replicas {} for {} processes x {} local", dp.num_replicas(), fl::process_count(), local));

    // Each process offers its own initial value; every copy gets process 0's.
    fl::Variable w;
    {
      auto scope = dp.scope();
      w = fl::Variable(fl::full({3}, 1.0 + fl::process_index(), fl::f32), "w");
    }
    auto read = [&](fl::Tensor x) { return w.value() + fl::sum(x) * 0.0f; };
    for (const fl::Tensor& copy : dp.run(read, fl::ones({dp.num_replicas(), 1}))) {
      expect(copy.to_vector<float>() == std::vector<float>{1, 1, 1},
             fmt::format("a copy of w holds {} instead of replica 0's 1", copy.to_vector<float>()[0]));
    }

    const int replicas = dp.num_replicas();
    for (int64_t rows : {int64_t{4} * replicas, int64_t{4} * replicas + 1}) {
      check_training(dp, "SGD (momentum 0.9)", [] { return fl::optim::SGD(0.1, 0.9); }, rows);
      check_training(dp, "Adam", [] { return fl::optim::Adam(0.01); }, rows);
    }
  } catch (const std::exception& e) {
    expect(false, fmt::format("threw: {}", e.what()));
  }
  if (failures == 0) {
    std::printf("mpi_mirrored: process %d of %d: all checks passed\n", fl::process_index(), fl::process_count());
  }
  return failures == 0 ? 0 : 1;
}
