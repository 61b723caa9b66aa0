// DistributedCheckpointManager in one process: round trips (plain variables, optimizer state,
// mirrored variables on logical CPU devices), metadata, background consistency, every corruption
// of a manifest or shard (detected before any variable changes, naming the file), refusals,
// retention / superseded / incomplete directories, option errors, the save rules, background
// failures, and the Source seam (ManagerAccess::add_source).
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <set>
#include <thread>

#include "checkpoint/distributed/manifest.hpp"
#include "checkpoint/distributed/source.hpp"
#include "checkpoint/distributed/variables_source.hpp"
#include "checkpoint/safetensors_file.hpp"
#include "flowlet/distributed_checkpoint.hpp"
#include "flowlet/mirrored.hpp"
#include "flowlet/optim.hpp"
#include "state/mirrored_variable.hpp"
#include "state/variable_state.hpp"
#include "support/checkpoint_files.hpp"
#include "support/reference.hpp"
#include "support/replicas.hpp"

namespace {

namespace fs = std::filesystem;
namespace ckpt = fl::detail::ckpt;

// A fresh directory under $TMPDIR (or /tmp), removed with its contents at scope exit.
struct TempDir : test::TempDir {
  TempDir() : test::TempDir("flowlet_dckpt") {}
};

using test::contents;
using test::read_file;
using test::with_bit_flipped;
using test::write_file;

// Three variables of different dtypes and ranks, seeded.
std::vector<fl::Variable> make_vars(uint64_t seed) {
  return {fl::Variable(fl::randn({6, 4}, seed), "w"), fl::Variable(fl::randn({4}, seed + 1), "b"),
          fl::Variable(fl::scalar<int64_t>(static_cast<int64_t>(seed)), "count")};
}

void scramble(std::vector<fl::Variable>& vars, uint64_t seed) {
  for (fl::Variable& v : vars) {
    if (v.dtype() == fl::f32) {
      v.assign(fl::randn(v.shape(), seed++));
    } else {
      v.assign(fl::full(v.shape(), -7.0, v.dtype()));
    }
  }
}

std::string shard_file(const std::string& checkpoint, const std::string& shard) {
  for (const auto& entry : fs::directory_iterator(checkpoint)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(shard + ".", 0) == 0 && name.size() > 12 && name.substr(name.size() - 12) == ".safetensors")
      return entry.path().string();
  }
  FAIL("no shard " << shard << " in " << checkpoint);
  return "";
}

// A second source for tests: one tensor written as two row pieces in its own shard ("extra"), so
// that a checkpoint has several shards in one process and pieces that split rows.
class SplitSource final : public ckpt::Source {
 public:
  explicit SplitSource(fl::Tensor value) : value_(std::move(value)) {}
  std::vector<std::string> tensor_names() const override { return {"split"}; }
  void snapshot(const ckpt::ProcessView&, std::vector<ckpt::ShardContent>& shards,
                std::map<std::string, std::string>& attributes) override {
    ckpt::ShardContent shard;
    shard.name = "extra";
    const int64_t rows = value_.shape()[0], half = rows / 2;
    for (const auto& [begin, end] : {std::pair<int64_t, int64_t>{0, half}, {half, rows}}) {
      ckpt::Piece piece;
      piece.tensor = "split";
      piece.dtype = value_.dtype();
      piece.shape = value_.shape();
      piece.row_begin = begin;
      piece.row_end = end;
      piece.value = fl::Tensor::empty(fl::Shape({end - begin, value_.shape()[1]}), value_.dtype());
      std::memcpy(piece.value.raw_data(), static_cast<const float*>(value_.raw_data()) + begin * value_.shape()[1],
                  static_cast<size_t>((end - begin) * value_.shape()[1]) * sizeof(float));
      shard.pieces.push_back(std::move(piece));
    }
    shards.push_back(std::move(shard));
    attributes["split.rows"] = std::to_string(value_.shape()[0]);
  }
  void load(const ckpt::ProcessView&, ckpt::Reader& reader) override {
    loaded_attribute = reader.attributes().at("split.rows");
    // Rows that cross the two pieces.
    middle = reader.read("split", 1, value_.shape()[0] - 1);
    whole = reader.read("split");
  }
  void commit() override { committed = true; }

  fl::Tensor value_;
  std::string loaded_attribute;
  fl::Tensor middle, whole;
  bool committed = false;
};

// Substring check with the message shown on failure.
#define CHECK_CONTAINS(text, part) CHECK_MESSAGE(std::string(text).find(part) != std::string::npos, (text))

}  // namespace

TEST_CASE("plain variables: save, change, restore_latest gives the saved values and metadata") {
  TempDir dir;
  std::vector<fl::Variable> vars = make_vars(1);
  const std::vector<std::string> saved = contents(vars);
  fl::DistributedCheckpointManager manager(dir.path, {.max_to_keep = 3});
  manager.add(vars);
  CHECK_FALSE(manager.restore_latest().has_value());  // none yet: nullopt, nothing changes
  CHECK(contents(vars) == saved);
  manager.save(7, {{"epoch", 2}, {"batch", -5}});
  manager.wait();
  REQUIRE(manager.checkpoints().size() == 1);
  CHECK(manager.latest() == dir.path + "/ckpt-000007");
  CHECK(fs::exists(dir.path + "/ckpt-000007/manifest.json"));
  const fl::CheckpointSaveStats stats = manager.last_save_stats();
  CHECK(stats.step == 7);
  CHECK(stats.bytes > 6 * 4 * 4);
  CHECK(stats.total_bytes == stats.bytes);
  CHECK(stats.copy_seconds >= 0);
  CHECK(stats.write_seconds > 0);

  scramble(vars, 100);
  CHECK(contents(vars) != saved);
  const std::optional<fl::RestoredCheckpoint> restored = manager.restore_latest();
  REQUIRE(restored.has_value());
  CHECK(restored->step == 7);
  CHECK(restored->path == dir.path + "/ckpt-000007");
  CHECK(restored->metadata == std::map<std::string, int64_t>{{"batch", -5}, {"epoch", 2}});
  CHECK(restored->saved_processes == 1);
  CHECK(restored->saved_cluster == "1 process");
  CHECK(contents(vars) == saved);

  // A new manager over the same directory (a restarted job) sees it too.
  std::vector<fl::Variable> fresh = make_vars(50);
  fl::DistributedCheckpointManager again(dir.path);
  again.add(fresh);
  REQUIRE(again.restore_latest().has_value());
  CHECK(contents(fresh) == saved);
}

TEST_CASE("the shard file is a flowlet safetensors file at the checkpoint's step; the manifest lists it") {
  TempDir dir;
  std::vector<fl::Variable> vars = make_vars(2);
  fl::DistributedCheckpointManager manager(dir.path, {.background = false});
  manager.add(vars);
  manager.save(3);
  const std::string checkpoint = dir.path + "/ckpt-000003";
  const std::string shard = shard_file(checkpoint, "variables-p0");
  // save_checkpoint's reader restores it: the same format.
  std::vector<fl::Variable> other = make_vars(9);
  CHECK(fl::restore_checkpoint(shard, other) == 3);
  CHECK(contents(other) == contents(vars));
  const ckpt::Manifest manifest =
      ckpt::parse_manifest(read_file(checkpoint + "/manifest.json"), checkpoint + "/manifest.json", "test");
  CHECK(manifest.step == 3);
  CHECK(manifest.processes == 1);
  REQUIRE(manifest.shards.size() == 1);
  CHECK(manifest.shards[0].bytes == static_cast<int64_t>(fs::file_size(shard)));
  CHECK(checkpoint + "/" + manifest.shards[0].file == shard);
  REQUIRE(manifest.tensors.size() == 3);
  CHECK(manifest.attributes.at("variables.count") == "3");
}

TEST_CASE("optimizer state (Adam slots and step counter) round-trips and training continues identically") {
  TempDir dir;
  const auto run = [](std::vector<fl::Variable>& params, fl::optim::Adam& adam, int steps, uint64_t seed) {
    for (int s = 0; s < steps; ++s) {
      std::vector<fl::Tensor> grads;
      for (size_t i = 0; i < params.size(); ++i) grads.push_back(fl::randn(params[i].shape(), seed + 10 * s + i));
      adam.apply(grads, params);
    }
  };
  std::vector<fl::Variable> params = {fl::Variable(fl::randn({5, 3}, 1), "w"), fl::Variable(fl::randn({3}, 2), "b")};
  fl::optim::Adam adam(0.01);
  adam.build(params);
  fl::DistributedCheckpointManager manager(dir.path);
  manager.add(params);
  manager.add(adam.variables());
  run(params, adam, 3, 100);
  manager.save(3);
  manager.wait();
  run(params, adam, 4, 200);  // the uninterrupted run: 7 steps
  const std::vector<std::string> uninterrupted = contents(params);

  // A restarted job: fresh model and optimizer, restored, then the same 4 steps.
  std::vector<fl::Variable> params2 = {fl::Variable(fl::randn({5, 3}, 7), "w"), fl::Variable(fl::randn({3}, 8), "b")};
  fl::optim::Adam adam2(0.01);
  adam2.build(params2);
  fl::DistributedCheckpointManager resumed(dir.path);
  resumed.add(params2);
  resumed.add(adam2.variables());
  REQUIRE(resumed.restore_latest()->step == 3);
  CHECK(adam2.iterations().value().item<int64_t>() == 3);
  run(params2, adam2, 4, 200);
  CHECK(contents(params2) == uninterrupted);
}

TEST_CASE("mirrored variables: written once from replica 0, restored into every replica's copy") {
  test::ensure_cpu_devices(2);
  TempDir dir;
  fl::MirroredOptions options;
  options.collective_timeout_seconds = 20;
  fl::MirroredStrategy dp(test::cpu_devices(2), options);
  fl::Variable w;
  {
    auto scope = dp.scope();
    w = fl::Variable(test::make({1, 2, 3, 4}, {2, 2}), "w");
  }
  fl::DistributedCheckpointManager manager(dir.path);
  manager.add({w});
  manager.save(1);
  manager.wait();
  const ckpt::Manifest manifest = ckpt::parse_manifest(read_file(dir.path + "/ckpt-000001/manifest.json"), "m", "test");
  REQUIRE(manifest.tensors.size() == 1);  // once, not once per replica
  CHECK(manifest.tensors[0].pieces.size() == 1);

  w.assign(test::make({9, 9, 9, 9}, {2, 2}));
  REQUIRE(manager.restore_latest().has_value());
  const auto copies = fl::detail::all_copies(fl::detail::VariableAccess::state(w));
  REQUIRE(copies.size() == 2);
  for (size_t r = 0; r < copies.size(); ++r) {
    const std::lock_guard<std::mutex> lock(copies[r]->mutex);
    CHECK(copies[r]->value.device() == fl::Device(fl::DeviceKind::cpu, static_cast<int>(r)));
    CHECK(test::values(copies[r]->value) == std::vector<double>{1, 2, 3, 4});
  }
}

TEST_CASE("background consistency: values changed after save() returned do not reach the checkpoint") {
  TempDir dir;
  // The copy is private: updating the variable (in place where it can) leaves the snapshot alone.
  fl::Variable v(fl::full({1000, 64}, 1.0), "v");
  ckpt::VariablesSource source({v}, "test");
  std::vector<ckpt::ShardContent> shards;
  std::map<std::string, std::string> attributes;
  source.snapshot({0, 1}, shards, attributes);
  REQUIRE(shards.size() == 1);
  REQUIRE(shards[0].pieces.size() == 1);
  v.assign_add(fl::full({1000, 64}, 1.0), 1.0);
  CHECK(v.value().data<float>()[0] == 2.0f);
  CHECK(shards[0].pieces[0].value.data<float>()[0] == 1.0f);
  CHECK(shards[0].pieces[0].value.data<float>()[1000 * 64 - 1] == 1.0f);

  // End to end: many saves, each followed at once by updates while the background thread writes.
  fl::DistributedCheckpointManager manager(dir.path, {.max_to_keep = 10});
  manager.add({v});
  for (int step = 0; step < 8; ++step) {
    v.assign(fl::full({1000, 64}, static_cast<double>(step)));
    manager.save(step);
    for (int k = 0; k < 20; ++k) v.assign_add(fl::full({1000, 64}, 1000.0), 1.0);
  }
  manager.wait();
  for (int step = 0; step < 8; ++step) {
    manager.restore(fmt::format("{}/ckpt-{:06d}", dir.path, step));
    const std::vector<double> values = test::values(v.value());
    CHECK(std::all_of(values.begin(), values.end(), [&](double x) { return x == step; }));
  }
}

TEST_CASE("ManagerAccess::add_source: a source's shards, split pieces, attributes and reads across pieces") {
  TempDir dir;
  std::vector<fl::Variable> vars = make_vars(3);
  fl::DistributedCheckpointManager manager(dir.path);
  manager.add(vars);
  const fl::Tensor split_value = fl::randn({7, 3}, 5).contiguous();
  auto source = std::make_shared<SplitSource>(split_value);
  ckpt::ManagerAccess::add_source(manager, source);
  manager.save(4);
  manager.wait();
  const ckpt::Manifest manifest = ckpt::parse_manifest(read_file(dir.path + "/ckpt-000004/manifest.json"), "m", "t");
  CHECK(manifest.shards.size() == 2);
  CHECK(manifest.attributes.at("split.rows") == "7");
  scramble(vars, 40);
  REQUIRE(manager.restore_latest().has_value());
  CHECK(source->committed);
  CHECK(source->loaded_attribute == "7");
  CHECK(test::values(source->whole) == test::values(split_value));
  const std::vector<double> all = test::values(split_value);
  CHECK(test::values(source->middle) == std::vector<double>(all.begin() + 3, all.end() - 3));

  // Names are unique across sources.
  CHECK_THROWS_AS(manager.add({fl::Variable(fl::zeros({1}), "other")}), fl::InvalidArgument);  // after a save
  fl::DistributedCheckpointManager second(dir.path);
  ckpt::ManagerAccess::add_source(second, std::make_shared<SplitSource>(split_value));
  try {
    second.add({fl::Variable(fl::zeros({1}), "split")});
    FAIL("a duplicate name was accepted");
  } catch (const fl::InvalidArgument& e) {
    CHECK_CONTAINS(e.what(), "'split' is already among");
  }
}

// ------------------------------------------------------------------------------------------------
// Corruption: every case throws InvalidArgument naming the file, and no variable changes.

namespace {

struct Corruptible {
  TempDir dir;
  std::vector<fl::Variable> vars = make_vars(11);
  std::shared_ptr<SplitSource> source = std::make_shared<SplitSource>(fl::randn({6, 2}, 3).contiguous());
  std::unique_ptr<fl::DistributedCheckpointManager> manager;
  std::string checkpoint, other;  // step 1 (the one corrupted) and step 2
  std::vector<std::string> saved;

  Corruptible() {
    manager = std::make_unique<fl::DistributedCheckpointManager>(dir.path,
                                                                 fl::DistributedCheckpointOptions{.max_to_keep = 5});
    manager->add(vars);
    ckpt::ManagerAccess::add_source(*manager, source);
    manager->save(1);
    saved = contents(vars);
    scramble(vars, 77);
    source->value_ = fl::randn({6, 2}, 4).contiguous();
    manager->save(2);
    manager->wait();
    checkpoint = dir.path + "/ckpt-000001";
    other = dir.path + "/ckpt-000002";
    scramble(vars, 99);
    saved = contents(vars);  // what must survive every failed restore
  }

  // Restores step 1 and expects InvalidArgument naming `file`; nothing may change.
  void expect_refused(const std::string& file, const std::string& what) {
    source->committed = false;
    try {
      manager->restore(checkpoint);
      FAIL_CHECK("restore accepted " << what);
    } catch (const fl::InvalidArgument& e) {
      CHECK_MESSAGE(std::string(e.what()).find(file) != std::string::npos, what << ": " << e.what());
    }
    CHECK(contents(vars) == saved);
    CHECK_FALSE(source->committed);
  }
};

}  // namespace

TEST_CASE("a restore of the intact checkpoint works (the corruption cases start from it)") {
  Corruptible c;
  CHECK(c.manager->restore(c.checkpoint).step == 1);
  CHECK(c.source->committed);
}

TEST_CASE("manifest truncated at many lengths, or bit-flipped anywhere: refused, naming the manifest") {
  Corruptible c;
  const std::string manifest = c.checkpoint + "/manifest.json";
  const std::string intact = read_file(manifest);
  REQUIRE(intact.size() > 200);
  for (size_t length = 0; length < intact.size(); length += (length < 64 ? 1 : 13)) {
    write_file(manifest, intact.substr(0, length));
    c.expect_refused(manifest, fmt::format("the manifest truncated to {} bytes", length));
  }
  for (size_t at = 0; at < intact.size(); at += 3) {
    for (const int bit : {0, 5}) {
      write_file(manifest, with_bit_flipped(intact, at, bit));
      c.expect_refused(manifest, fmt::format("bit {} of manifest byte {} flipped", bit, at));
    }
  }
  fs::remove(manifest);
  CHECK(c.manager->checkpoints().size() == 1);  // without its manifest, step 1 is not a checkpoint
  c.expect_refused(manifest, "the manifest deleted");
}

TEST_CASE("each shard truncated or bit-flipped in its header and data: refused, naming the shard") {
  Corruptible c;
  for (const std::string shard_name : {"variables-p0", "extra"}) {
    const std::string shard = shard_file(c.checkpoint, shard_name);
    const std::string intact = read_file(shard);
    for (size_t length = 0; length < intact.size(); length += (length < 16 ? 1 : 37)) {
      write_file(shard, intact.substr(0, length));
      c.expect_refused(shard, fmt::format("{} truncated to {} bytes", shard_name, length));
    }
    write_file(shard, intact + "x");
    c.expect_refused(shard, shard_name + " with a byte appended");
    for (size_t at = 0; at < intact.size(); at += 5) {
      write_file(shard, with_bit_flipped(intact, at, 4));
      c.expect_refused(shard, fmt::format("{} byte {} (of {}) flipped", shard_name, at, intact.size()));
    }
    write_file(shard, intact);
  }
  CHECK(c.manager->restore(c.checkpoint).step == 1);  // intact again
}

TEST_CASE("a missing shard, a shard from another checkpoint, a manifest of another step: refused, naming the file") {
  Corruptible c;
  for (const std::string shard_name : {"variables-p0", "extra"}) {
    const std::string shard = shard_file(c.checkpoint, shard_name);
    const std::string intact = read_file(shard);
    fs::remove(shard);
    c.expect_refused(shard, shard_name + " missing");
    // The same shard of step 2 under step 1's file name: another step and other content.
    write_file(shard, read_file(shard_file(c.other, shard_name)));
    c.expect_refused(shard, shard_name + " from step 2");
    write_file(shard, intact);
  }
  // Same name, same step, other content: step 1 saved again elsewhere with other values.
  {
    TempDir elsewhere;
    std::vector<fl::Variable> different = make_vars(12);
    fl::DistributedCheckpointManager m(elsewhere.path, {.background = false});
    m.add(different);
    m.save(1);
    const std::string shard = shard_file(c.checkpoint, "variables-p0");
    const std::string intact = read_file(shard);
    write_file(shard, read_file(shard_file(elsewhere.path + "/ckpt-000001", "variables-p0")));
    c.expect_refused(shard, "variables-p0 of the same step with other content");
    write_file(shard, intact);
  }
  // Step 2's manifest copied into step 1's directory.
  const std::string manifest = c.checkpoint + "/manifest.json";
  const std::string intact = read_file(manifest);
  write_file(manifest, read_file(c.other + "/manifest.json"));
  c.expect_refused(manifest, "the manifest of step 2");
  write_file(manifest, intact);
  CHECK(c.manager->restore(c.checkpoint).step == 1);
}

TEST_CASE(
    "refusals: a missing variable, another dtype (DTypeError), another shape (ShapeError), naming variable and file") {
  TempDir dir;
  {
    fl::DistributedCheckpointManager m(dir.path, {.background = false});
    m.add({fl::Variable(fl::randn({3, 2}, 1), "w"), fl::Variable(fl::randn({2}, 2), "b")});
    m.save(5);
  }
  const std::string manifest = dir.path + "/ckpt-000005/manifest.json";
  const auto attempt = [&](std::vector<fl::Variable> vars) {
    const std::vector<std::string> before = contents(vars);
    fl::DistributedCheckpointManager m(dir.path);
    m.add(vars);
    try {
      m.restore_latest();
    } catch (...) {
      CHECK(contents(vars) == before);
      throw;
    }
  };
  // The checkpoint may hold more than the job restores.
  CHECK_NOTHROW(attempt({fl::Variable(fl::zeros({3, 2}), "w")}));
  try {
    attempt({fl::Variable(fl::zeros({3, 2}), "w"), fl::Variable(fl::zeros({2}), "missing")});
    FAIL("accepted a missing variable");
  } catch (const fl::InvalidArgument& e) {
    CHECK_CONTAINS(e.what(), "'missing'");
    CHECK_CONTAINS(e.what(), manifest);
  }
  try {
    attempt({fl::Variable(fl::zeros({3, 2}, fl::f64), "w")});
    FAIL("accepted another dtype");
  } catch (const fl::DTypeError& e) {
    CHECK_CONTAINS(e.what(), "'w'");
    CHECK_CONTAINS(e.what(), manifest);
  }
  try {
    attempt({fl::Variable(fl::zeros({2}), "b"), fl::Variable(fl::zeros({2, 3}), "w")});
    FAIL("accepted another shape");
  } catch (const fl::ShapeError& e) {
    CHECK_CONTAINS(e.what(), "'w'");
    CHECK_CONTAINS(e.what(), manifest);
  }
}

TEST_CASE(
    "retention keeps the newest max_to_keep; a lower step supersedes higher ones; incomplete saves ignored and "
    "cleaned") {
  TempDir dir;
  fl::Variable v(fl::zeros({2}), "v");
  fl::DistributedCheckpointManager manager(dir.path, {.max_to_keep = 2, .background = false});
  manager.add({v});
  for (int step = 1; step <= 4; ++step) {
    v.assign(fl::full({2}, step));
    manager.save(step * 10);
  }
  CHECK(manager.checkpoints() == std::vector<std::string>{dir.path + "/ckpt-000030", dir.path + "/ckpt-000040"});
  CHECK_FALSE(fs::exists(dir.path + "/ckpt-000010"));
  CHECK_FALSE(fs::exists(dir.path + "/ckpt-000020"));

  // Leftovers of saves that never completed (no manifest): ignored by the listing; those below the
  // next committed step are deleted, those above it are left alone (another save may be writing).
  fs::create_directories(dir.path + "/ckpt-000035");
  write_file(dir.path + "/ckpt-000035/variables-p0.abc.safetensors.tmp.1.0", "partial");
  fs::create_directories(dir.path + "/ckpt-000090");
  write_file(dir.path + "/ckpt-000090/variables-p0.abc.safetensors", "partial");
  CHECK(manager.latest() == dir.path + "/ckpt-000040");
  v.assign(fl::full({2}, 5.0));
  manager.save(50);
  CHECK_FALSE(fs::exists(dir.path + "/ckpt-000035"));
  CHECK(fs::exists(dir.path + "/ckpt-000090/variables-p0.abc.safetensors"));
  CHECK(manager.checkpoints() == std::vector<std::string>{dir.path + "/ckpt-000040", dir.path + "/ckpt-000050"});

  // A run rolled back to 40 saves 45: 50 moves aside (still restorable), 45 is the latest.
  REQUIRE(manager.restore(dir.path + "/ckpt-000040").step == 40);
  CHECK(test::values(v.value()) == std::vector<double>{4, 4});
  manager.save(45);
  CHECK(manager.latest() == dir.path + "/ckpt-000045");
  CHECK(fs::exists(dir.path + "/ckpt-000050.superseded/manifest.json"));
  CHECK(fs::exists(dir.path + "/ckpt-000090"));  // incomplete and above: untouched
  CHECK(manager.restore(dir.path + "/ckpt-000050.superseded").step == 50);
  CHECK(test::values(v.value()) == std::vector<double>{5, 5});

  // Saving a step again replaces it; its old shard files go.
  v.assign(fl::full({2}, 8.0));
  manager.save(45);
  int shards = 0;
  for (const auto& entry : fs::directory_iterator(dir.path + "/ckpt-000045"))
    shards += entry.path().extension() == ".safetensors";
  CHECK(shards == 1);
  v.assign(fl::zeros({2}));
  REQUIRE(manager.restore_latest()->step == 45);
  CHECK(test::values(v.value()) == std::vector<double>{8, 8});
}

TEST_CASE("option and argument errors name the function and the value") {
  TempDir dir;
  const auto message = [](auto&& make) -> std::string {
    try {
      make();
    } catch (const fl::InvalidArgument& e) {
      return e.what();
    }
    return "no error";
  };
  CHECK_CONTAINS(message([] { fl::DistributedCheckpointManager m(""); }), "directory is empty");
  CHECK_CONTAINS(message([&] { fl::DistributedCheckpointManager m(dir.path + std::string("\0x", 2)); }), "NUL");
  CHECK_CONTAINS(message([&] { fl::DistributedCheckpointManager m(dir.path, {.max_to_keep = 0}); }),
                 "max_to_keep must be at least 1; got 0");
  CHECK_CONTAINS(message([&] { fl::DistributedCheckpointManager m(dir.path, {.prefix = ""}); }), "prefix");
  CHECK_CONTAINS(message([&] { fl::DistributedCheckpointManager m(dir.path, {.prefix = "a/b"}); }), "a/b");
  CHECK_CONTAINS(message([&] { fl::DistributedCheckpointManager m(dir.path, {.every_steps = -1}); }),
                 "every_steps must be >= 0");
  CHECK_CONTAINS(message([&] { fl::DistributedCheckpointManager m(dir.path, {.every_seconds = -1}); }),
                 "every_seconds");
  CHECK_CONTAINS(message([&] { fl::DistributedCheckpointManager m(dir.path, {.every_seconds = std::nan("")}); }),
                 "every_seconds");

  fl::DistributedCheckpointManager manager(dir.path);
  CHECK_CONTAINS(message([&] { manager.add({fl::Variable()}); }), "empty Variable handle");
  CHECK_CONTAINS(message([&] { manager.add({fl::Variable(fl::zeros({1}))}); }), "empty name");
  CHECK_CONTAINS(message([&] {
                   manager.add({fl::Variable(fl::zeros({1}), "a"), fl::Variable(fl::zeros({1}), "a")});
                 }),
                 "'a' is already among");
  CHECK_CONTAINS(message([&] { manager.add({fl::Variable(fl::zeros({1}), "__metadata__")}); }), "__metadata__");
  manager.add({fl::Variable(fl::zeros({1}), "a")});
  CHECK_CONTAINS(message([&] { manager.add({fl::Variable(fl::zeros({1}), "a")}); }), "'a' is already among");
  CHECK_CONTAINS(message([&] { manager.save(-1); }), "step must be >= 0; got -1");
  CHECK_CONTAINS(message([&] { manager.save(1, {{"", 1}}); }), "metadata keys");
  CHECK_CONTAINS(message([&] { manager.maybe_save(-2); }), "got -2");
  CHECK_CONTAINS(message([&] { manager.restore(dir.path + "/nothing"); }), dir.path + "/nothing/manifest.json");
  CHECK_CONTAINS(message([&] { manager.restore(""); }), "path is empty");
  CHECK(manager.checkpoints().empty());
  manager.save(0);
  manager.wait();
  CHECK_CONTAINS(message([&] { manager.add({fl::Variable(fl::zeros({1}), "late")}); }), "after a save or restore");

  // A directory that cannot be listed is an error, never "no checkpoint".
  write_file(dir.path + "/file", "x");
  fl::DistributedCheckpointManager on_file(dir.path + "/file");
  CHECK_CONTAINS(message([&] { on_file.checkpoints(); }), "cannot list directory");
  CHECK_CONTAINS(message([&] { on_file.restore_latest(); }), "cannot list directory");
}

TEST_CASE("maybe_save: every_steps and every_seconds") {
  TempDir dir;
  fl::Variable v(fl::zeros({1}), "v");
  {
    fl::DistributedCheckpointManager manager(dir.path + "/steps", {.every_steps = 3, .background = false});
    manager.add({v});
    std::vector<int64_t> saved;
    for (int64_t step = 0; step < 10; ++step) {
      if (manager.maybe_save(step)) saved.push_back(step);
    }
    CHECK(saved == std::vector<int64_t>{0, 3, 6, 9});
    CHECK(manager.checkpoints().size() == 4);
  }
  {
    fl::DistributedCheckpointManager manager(dir.path + "/seconds", {.every_seconds = 0.3});
    manager.add({v});
    CHECK_FALSE(manager.maybe_save(1));  // counted from construction
    std::this_thread::sleep_for(std::chrono::milliseconds(350));
    CHECK(manager.maybe_save(2));
    CHECK_FALSE(manager.maybe_save(3));  // counted from the save that began at 2
    std::this_thread::sleep_for(std::chrono::milliseconds(350));
    CHECK(manager.maybe_save(4, {{"batch", 4}}));
    manager.wait();
    CHECK(manager.checkpoints().size() == 2);
  }
  {
    fl::DistributedCheckpointManager manager(dir.path + "/none");
    manager.add({v});
    for (int64_t step = 0; step < 5; ++step) CHECK_FALSE(manager.maybe_save(step));
  }
}

TEST_CASE("a background failure is kept and rethrown by the next wait() or save(); the destructor only prints it") {
  TempDir dir;
  write_file(dir.path + "/file", "x");
  fl::Variable v(fl::zeros({1}), "v");
  {
    fl::DistributedCheckpointManager manager(dir.path + "/file/sub");  // cannot create directories under a file
    manager.add({v});
    manager.save(1);  // returns after the copy
    try {
      manager.wait();
      FAIL("wait() did not rethrow");
    } catch (const fl::InvalidArgument& e) {
      CHECK_CONTAINS(e.what(), "cannot create directory");
      CHECK_CONTAINS(e.what(), dir.path + "/file/sub");
    }
    CHECK_NOTHROW(manager.wait());  // rethrown once
    manager.save(2);
    CHECK_THROWS_AS(manager.save(3), fl::InvalidArgument);  // save() rethrows the failed save 2 first
    manager.save(4);  // fails in the background again; the destructor prints it and returns
  }
  // A source whose piece is not what it claims: refused before the checkpoint exists.
  class BadSource final : public ckpt::Source {
   public:
    std::vector<std::string> tensor_names() const override { return {"bad"}; }
    void snapshot(const ckpt::ProcessView&, std::vector<ckpt::ShardContent>& shards,
                  std::map<std::string, std::string>&) override {
      ckpt::Piece piece;
      piece.tensor = "bad";
      piece.shape = fl::Shape({4});
      piece.row_end = 4;
      piece.value = fl::Tensor::empty(fl::Shape({3}), fl::f32);
      shards.push_back({"bad", {piece}});
    }
    void load(const ckpt::ProcessView&, ckpt::Reader&) override {}
    void commit() override {}
  };
  fl::DistributedCheckpointManager manager(dir.path + "/bad");
  ckpt::ManagerAccess::add_source(manager, std::make_shared<BadSource>());
  manager.save(1);
  CHECK_THROWS_WITH_AS(manager.wait(), doctest::Contains("bad piece of 'bad'"), fl::InvalidArgument);
  CHECK(manager.checkpoints().empty());
}

TEST_CASE("writers are balanced by bytes, deterministically") {
  CHECK(ckpt::VariablesSource::assign_writers({100, 10, 60, 50}, 2) == std::vector<int>{0, 0, 1, 1});
  CHECK(ckpt::VariablesSource::assign_writers({5, 5, 5}, 3) == std::vector<int>{0, 1, 2});
  CHECK(ckpt::VariablesSource::assign_writers({5, 5, 5}, 1) == std::vector<int>{0, 0, 0});
  CHECK(ckpt::VariablesSource::assign_writers({1, 2}, 4) == std::vector<int>{1, 0});
}

TEST_CASE("a checkpoint written by 2 processes restores in a job of 1 (every variable, whichever process wrote it)") {
  // The files two processes would write, made here: each process's VariablesSource snapshot, its
  // shard file, and process 0's manifest over both.
  TempDir dir;
  std::vector<fl::Variable> vars = make_vars(21);
  vars.emplace_back(fl::randn({30, 2}, 5), "big");
  const std::vector<std::string> saved = contents(vars);
  const std::string checkpoint = dir.path + "/ckpt-000009";
  fs::create_directories(checkpoint);
  ckpt::VariablesSource source(vars, "test");
  ckpt::Manifest manifest;
  manifest.step = 9;
  manifest.processes = 2;
  manifest.cluster = "2 processes";
  manifest.metadata = {{"batch", 3}};
  for (int process = 0; process < 2; ++process) {
    std::vector<ckpt::ShardContent> shards;
    source.snapshot({process, 2}, shards, manifest.attributes);
    REQUIRE(shards.size() == 1);
    std::vector<fl::checkpoint::NamedTensor> tensors;
    for (ckpt::Piece& piece : shards[0].pieces) {
      manifest.tensors.push_back(
          {piece.tensor, piece.dtype, piece.shape, {{shards[0].name, piece.row_begin, piece.row_end, piece.tensor}}});
      tensors.push_back({piece.tensor, piece.value});
    }
    CHECK_FALSE(tensors.empty());  // both processes write some
    ckpt::ShardRecord record{shards[0].name, shards[0].name + ".0123456789abcdef.safetensors", 0, 0, process};
    const auto written = fl::checkpoint::write_safetensors_file(checkpoint + "/" + record.file, tensors, 9, {}, "test");
    record.bytes = written.bytes;
    record.crc32 = written.crc32;
    manifest.shards.push_back(record);
  }
  write_file(checkpoint + "/manifest.json", ckpt::manifest_to_json(manifest));

  scramble(vars, 5);
  fl::DistributedCheckpointManager manager(dir.path);
  manager.add(vars);
  const std::optional<fl::RestoredCheckpoint> restored = manager.restore_latest();
  REQUIRE(restored.has_value());
  CHECK(restored->saved_processes == 2);
  CHECK(restored->saved_cluster == "2 processes");
  CHECK(restored->metadata.at("batch") == 3);
  CHECK(contents(vars) == saved);
}

TEST_CASE("a save killed with SIGKILL at a random moment leaves the previous or the new checkpoint, complete") {
  TempDir dir;
  constexpr int kStates = 3;
  constexpr int64_t kRoundStride = 1'000'000;
  std::vector<std::vector<fl::Variable>> states;
  std::vector<std::vector<std::string>> expected;
  for (int s = 0; s < kStates; ++s) {
    states.push_back(
        {fl::Variable(fl::full({1 << 18}, s + 1.0), "big"), fl::Variable(fl::full({16}, s * 100.0, fl::i64), "small")});
    expected.push_back(contents(states.back()));
  }
  const auto started = std::chrono::steady_clock::now();
  {
    fl::DistributedCheckpointManager first(dir.path, {.max_to_keep = 2, .background = false});
    first.add(states[0]);
    first.save(0);
  }
  const auto save_us =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - started).count();
  std::vector<fl::Variable> targets = {fl::Variable(fl::zeros({1 << 18}), "big"),
                                       fl::Variable(fl::zeros({16}, fl::i64), "small")};
  std::mt19937_64 rng(20261201);
  std::uniform_int_distribution<int> completed_saves(0, 2);
  std::uniform_int_distribution<int64_t> delay_us(0, std::max<int64_t>(2 * save_us, 2000));
  constexpr int kRounds = 24;
  std::set<int64_t> steps_seen;
  int killed_mid_write = 0;  // step directories without a manifest seen after the kills
  for (int round = 1; round <= kRounds; ++round) {
    const int wait_for = completed_saves(rng);
    const std::chrono::microseconds delay(delay_us(rng));
    test::kill_saving_child(
        [&](const std::function<void()>& report) {
          // Copies and file writes only; one manager per state, all over the same directory.
          std::vector<std::unique_ptr<fl::DistributedCheckpointManager>> managers;
          for (int s = 0; s < kStates; ++s) {
            managers.push_back(std::make_unique<fl::DistributedCheckpointManager>(
                dir.path, fl::DistributedCheckpointOptions{.max_to_keep = 2, .background = false}));
            managers.back()->add(states[static_cast<size_t>(s)]);
          }
          for (int64_t i = 1;; ++i) {
            managers[static_cast<size_t>(i % kStates)]->save(round * kRoundStride + i);
            report();
          }
        },
        wait_for, delay);

    for (const auto& entry : fs::directory_iterator(dir.path)) {
      killed_mid_write += !fs::exists(entry.path() / "manifest.json");
    }
    fl::DistributedCheckpointManager manager(dir.path);
    manager.add(targets);
    const std::optional<fl::RestoredCheckpoint> restored = manager.restore_latest();
    REQUIRE(restored.has_value());
    const int64_t step = restored->step;
    CHECK(step / kRoundStride <= round);  // never a step no save reached
    if (wait_for > 0) CHECK((step / kRoundStride == round && step % kRoundStride >= wait_for));  // reported saves stick
    CHECK(contents(targets) == expected[static_cast<size_t>(step % kRoundStride % kStates)]);
    // Retention: a save that completed this round left 2; a kill after the next manifest, before
    // its clean-up, may add one. (Rounds with no completed save may add one each until the next.)
    if (wait_for > 0) CHECK(manager.checkpoints().size() <= 3);
    // Every listed checkpoint is whole (a deletion cut short never leaves a manifest without shards).
    for (const std::string& path : manager.checkpoints()) CHECK_NOTHROW(manager.restore(path));
    steps_seen.insert(step);
  }
  MESSAGE("one save took " << save_us << " us; " << steps_seen.size() << " distinct steps over " << kRounds
                           << " kills; " << killed_mid_write
                           << " step directories without a manifest seen after kills (summed over rounds)");
  CHECK(killed_mid_write > 0);
  CHECK(steps_seen.size() > kRounds / 2);
}
