// The job scripts/chaos_test.py kills: a small deterministic training run that checkpoints with
// DistributedCheckpointManager and, with --resume, continues from its latest complete checkpoint.
//
//   mpirun -np 2 chaos_job --mode mirrored --steps 200 --every-steps 5 --checkpoint-dir D --resume --out F
//   mpirun -np 4 chaos_job --mode ps --servers 2 --steps 60 --every-steps 5 --checkpoint-dir D --resume --out F
//
// Data: batch i of the job is a pure function of (--seed, i): inputs randn, labels the argmax of a
// fixed random linear "teacher", so a resumed run sees exactly the batches an uninterrupted one does.
//   - mirrored: MirroredStrategy, one replica per process, an MLP + Adam; step i trains on batch i;
//     checkpoint step s = s steps done (metadata next_batch = s), saved by maybe_save every K steps.
//   - ps: ParameterServerStrategy (async) with --servers servers and the other processes as
//     workers; each run() trains K steps per worker (worker w's step i reads batch i * W + w), then
//     the job saves checkpoint s = steps each worker has done (metadata worker_steps = s, workers).
// The last step is always checkpointed, so a run restarted after it finished only writes --out.
//
// Output for the test: every restore prints "restored step S from DIR" on stdout (process 0);
// --dump-restored FILE writes the model's values right after a restore (safetensors, process 0);
// --out FILE writes the final model, its loss on a fixed evaluation batch ("final_loss") and, in
// mirrored mode, the optimizer's step counter ("optimizer_iterations") (safetensors, process 0).
// Bad arguments and refused restores print "chaos_job: error: ..." on stderr and exit 1.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <flowlet/collective.hpp>
#include <flowlet/distributed_checkpoint.hpp>
#include <flowlet/flowlet.hpp>
#include <flowlet/mirrored.hpp>
#include <flowlet/parameter_server.hpp>

namespace fl = flowlet;

namespace {

constexpr int64_t kFeatures = 8, kHidden = 16, kClasses = 4, kBatchRows = 32, kEvalRows = 256;

struct Options {
  std::string mode;
  int64_t steps = 0;
  int64_t every_steps = 5;
  std::string checkpoint_dir;
  bool resume = false;
  int servers = 1;
  uint64_t seed = 1;
  std::string out;
  std::string dump_restored;
  int max_to_keep = 3;
};

[[noreturn]] void usage_error(const std::string& what) {
  throw fl::InvalidArgument("chaos_job: " + what +
                            "\nusage: chaos_job --mode mirrored|ps --steps N --checkpoint-dir DIR [--every-steps K]"
                            " [--resume] [--servers S] [--seed X] [--out FILE] [--dump-restored FILE] [--keep N]");
}

int64_t parse_int(const std::string& flag, const std::string& text, int64_t minimum) {
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty()) usage_error(flag + " needs an integer; got '" + text + "'");
  if (value < minimum) usage_error(flag + " must be >= " + std::to_string(minimum) + "; got " + text);
  return value;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(flag + " needs a value");
      return argv[++i];
    };
    if (flag == "--mode") o.mode = value();
    else if (flag == "--steps") o.steps = parse_int(flag, value(), 1);
    else if (flag == "--every-steps") o.every_steps = parse_int(flag, value(), 1);
    else if (flag == "--checkpoint-dir") o.checkpoint_dir = value();
    else if (flag == "--resume") o.resume = true;
    else if (flag == "--servers") o.servers = static_cast<int>(parse_int(flag, value(), 1));
    else if (flag == "--seed") o.seed = static_cast<uint64_t>(parse_int(flag, value(), 0));
    else if (flag == "--out") o.out = value();
    else if (flag == "--dump-restored") o.dump_restored = value();
    else if (flag == "--keep") o.max_to_keep = static_cast<int>(parse_int(flag, value(), 1));
    else usage_error("unknown argument '" + flag + "'");
  }
  if (o.mode != "mirrored" && o.mode != "ps") usage_error("--mode must be mirrored or ps; got '" + o.mode + "'");
  if (o.steps == 0) usage_error("--steps is required");
  if (o.checkpoint_dir.empty()) usage_error("--checkpoint-dir is required");
  return o;
}

// Batch `index` of the job: a pure function of (seed, index).
std::pair<fl::Tensor, fl::Tensor> batch(uint64_t seed, int64_t index, int64_t rows) {
  const fl::Tensor teacher = fl::randn({kFeatures, kClasses}, seed * 7919 + 17);
  const fl::Tensor x = fl::randn({rows, kFeatures}, seed * 1000003 + 101 + static_cast<uint64_t>(index));
  return {x, fl::argmax(fl::matmul(x, teacher), 1)};
}

void build_mlp(fl::nn::Sequential& model, uint64_t seed) {
  model.add<fl::nn::Linear>(kFeatures, kHidden, seed * 31 + 1, "hidden");
  model.add([](const fl::Tensor& x) { return fl::tanh(x); });
  model.add<fl::nn::Linear>(kHidden, kClasses, seed * 31 + 2, "logits");
}

// Loss of the model's current (local) values on a fixed batch that no step trains on.
double eval_loss(fl::nn::Sequential& model, uint64_t seed) {
  auto [x, y] = batch(seed, -1000, kEvalRows);
  return fl::mean(fl::softmax_cross_entropy(model(x), y)).to_vector<float>().at(0);
}

// Process 0 writes `vars`' current values (copies, so mirrored or server variables are read
// outside any run) and `extra` to a safetensors file.
void write_values(const std::string& path, const std::vector<fl::Variable>& vars, std::vector<fl::Variable> extra,
                  int64_t step) {
  if (path.empty() || fl::process_index() != 0) return;
  std::vector<fl::Variable> copies;
  for (const fl::Variable& v : vars) copies.emplace_back(v.value(), v.name());
  for (fl::Variable& v : extra) copies.push_back(std::move(v));
  fl::save_checkpoint(path, copies, step);
}

void log_line(const std::string& text) {
  if (fl::process_index() != 0) return;
  std::printf("%s\n", text.c_str());
  std::fflush(stdout);
}

// Restores the latest complete checkpoint when --resume; returns it (nullopt: a fresh start).
std::optional<fl::RestoredCheckpoint> maybe_restore(const Options& o, fl::DistributedCheckpointManager& checkpoints,
                                                    const std::vector<fl::Variable>& params) {
  if (!o.resume) return std::nullopt;
  std::optional<fl::RestoredCheckpoint> restored = checkpoints.restore_latest();
  if (restored) {
    log_line("restored step " + std::to_string(restored->step) + " from " + restored->path + " (saved by " +
             std::to_string(restored->saved_processes) + " processes: " + restored->saved_cluster + ")");
    write_values(o.dump_restored, params, {}, restored->step);
  } else {
    log_line("no checkpoint in " + o.checkpoint_dir + ": starting at step 0");
  }
  return restored;
}

int64_t metadata_value(const fl::RestoredCheckpoint& restored, const std::string& key) {
  auto found = restored.metadata.find(key);
  if (found == restored.metadata.end()) {
    throw fl::InvalidArgument("chaos_job: checkpoint " + restored.path + " has no metadata '" + key + "'");
  }
  return found->second;
}

fl::DistributedCheckpointOptions checkpoint_options(const Options& o, bool step_rule) {
  fl::DistributedCheckpointOptions options;
  options.max_to_keep = o.max_to_keep;
  options.prefix = "ckpt";
  options.every_steps = step_rule ? o.every_steps : 0;
  return options;
}

int run_mirrored(const Options& o) {
  fl::MirroredOptions mirrored_options;
  mirrored_options.collective_timeout_seconds = 30;
  fl::MirroredStrategy dp({}, mirrored_options);  // one replica per process
  fl::nn::Sequential model;
  {
    auto scope = dp.scope();
    build_mlp(model, o.seed);
  }
  const std::vector<fl::Variable> params = model.parameters();
  fl::optim::Adam optimizer(1e-2);
  optimizer.build(params);  // the slots and the counter exist (mirrored) before a restore fills them

  fl::DistributedCheckpointManager checkpoints(o.checkpoint_dir, checkpoint_options(o, true));
  checkpoints.add(params);
  checkpoints.add(optimizer.variables());
  int64_t first = 0;
  if (const auto restored = maybe_restore(o, checkpoints, params)) {
    first = metadata_value(*restored, "next_batch");
    if (first != restored->step) {
      throw fl::InvalidArgument("chaos_job: checkpoint " + restored->path + " of step " +
                                std::to_string(restored->step) + " says next_batch " + std::to_string(first));
    }
  }

  auto step = [&model, &optimizer](fl::Tensor x, fl::Tensor y) {
    const std::vector<fl::Variable> vars = model.parameters();
    fl::GradientTape tape;
    fl::Tensor loss = fl::mean(fl::softmax_cross_entropy(model(x), y));
    optimizer.apply(tape.gradient(loss, vars), vars);
    return loss;
  };
  int64_t last_saved = first;
  for (int64_t i = first; i < o.steps; ++i) {
    auto [x, y] = batch(o.seed, i, kBatchRows);
    (void)dp.run(step, x, y);
    if (checkpoints.maybe_save(i + 1, {{"next_batch", i + 1}})) last_saved = i + 1;
  }
  if (last_saved < o.steps) checkpoints.save(o.steps, {{"next_batch", o.steps}});
  checkpoints.wait();
  const double loss = eval_loss(model, o.seed);
  log_line("done: " + std::to_string(o.steps) + " steps, eval loss " + std::to_string(loss));
  write_values(o.out, params,
               {fl::Variable(fl::tensor(std::vector<float>{static_cast<float>(loss)}, fl::Shape{}), "final_loss"),
                fl::Variable(optimizer.iterations().value(), "optimizer_iterations")},
               o.steps);
  return 0;
}

int run_ps(const Options& o) {
  const int processes = fl::process_count();
  if (o.servers >= processes) {
    usage_error("--servers " + std::to_string(o.servers) + " leaves no worker among " + std::to_string(processes) +
                " processes");
  }
  fl::ParameterServerOptions ps_options;
  ps_options.num_servers = o.servers;
  ps_options.num_workers = processes - o.servers;
  ps_options.mode = fl::TrainingMode::async;
  ps_options.timeout_seconds = 30;
  ps_options.sharding.min_bytes_to_split = 256;  // the [8, 16] hidden weight is split by rows
  fl::ParameterServerStrategy ps(ps_options);
  const int workers = ps.num_workers();
  fl::nn::Sequential model;
  {
    auto scope = ps.scope();
    build_mlp(model, o.seed);
  }
  const std::vector<fl::Variable> params = model.parameters();

  fl::DistributedCheckpointManager checkpoints(o.checkpoint_dir, checkpoint_options(o, false));
  checkpoints.add(ps);
  int64_t done = 0;  // steps every worker has done
  if (const auto restored = maybe_restore(o, checkpoints, params)) {
    done = metadata_value(*restored, "worker_steps");
    const int64_t saved_workers = metadata_value(*restored, "workers");
    if (done != restored->step || saved_workers != workers) {
      throw fl::InvalidArgument("chaos_job: checkpoint " + restored->path + " of step " +
                                std::to_string(restored->step) + " holds worker_steps " + std::to_string(done) +
                                " of " + std::to_string(saved_workers) + " workers; this job has " +
                                std::to_string(workers));
    }
  }
  auto make_optimizer = [] { return std::make_unique<fl::optim::Adam>(1e-2); };
  while (done < o.steps) {
    const int64_t begin = done, end = std::min(o.steps, done + o.every_steps);
    ps.run(make_optimizer, [&](fl::ps::Worker& worker) {
      auto step = fl::trace([&](fl::Tensor x, fl::Tensor y) {
        fl::GradientTape tape;
        fl::Tensor loss = fl::mean(fl::softmax_cross_entropy(model(x), y));
        worker.apply_gradients(tape.gradient(loss, params), params);
        return loss;
      });
      for (int64_t i = begin; i < end; ++i) {
        auto [x, y] = batch(o.seed, i * workers + worker.index(), kBatchRows);
        (void)step(x, y);
      }
    });
    done = end;
    checkpoints.save(done, {{"worker_steps", done}, {"workers", workers}});
  }
  checkpoints.wait();
  const double loss = eval_loss(model, o.seed);
  log_line("done: " + std::to_string(o.steps) + " steps per worker, eval loss " + std::to_string(loss));
  write_values(o.out, params,
               {fl::Variable(fl::tensor(std::vector<float>{static_cast<float>(loss)}, fl::Shape{}), "final_loss")},
               o.steps);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    return o.mode == "mirrored" ? run_mirrored(o) : run_ps(o);
  } catch (const std::exception& error) {
    // Errors the processes agreed on already name the failing process ("process N: ..."); name
    // this process only for the others.
    if (std::string_view(error.what()).starts_with("process ")) {
      std::fprintf(stderr, "chaos_job: error: %s\n", error.what());
    } else {
      std::fprintf(stderr, "chaos_job: error (process %d): %s\n", fl::process_index(), error.what());
    }
    return 1;
  }
}
