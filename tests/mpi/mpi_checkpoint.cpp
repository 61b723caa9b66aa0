// DistributedCheckpointManager across processes, under `mpirun -np N` (tests/meson.build: N = 2, 3):
//   - every process writes its own shard and the manifest lists all N; restore on every process;
//   - mirrored variables (2 logical CPU devices per process) are written once and restored into
//     every replica's copy on every process;
//   - a corruption that only one process sees (a shard only it validates) makes every process
//     throw the same error, naming that process and the file, with no variable changed anywhere;
//   - a write that fails on one process fails the save on every process;
//   - processes that see different latest checkpoints are refused;
//   - the time rule saves at the same steps on every process although their clocks run apart;
//   - a checkpoint of N processes is read back through the Reader alone on process 0 (what a
//     restore in a job of one process does).
// Test cases run in file order on every process, so their collectives line up.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <flowlet/collective.hpp>
#include <flowlet/distributed_checkpoint.hpp>
#include <flowlet/flowlet.hpp>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/distributed/agreement.hpp"
#include "checkpoint/distributed/manifest.hpp"
#include "checkpoint/distributed/reader.hpp"
#include "checkpoint/distributed/source.hpp"
#include "collective/communicator.hpp"
#include "flowlet/mirrored.hpp"
#include "state/mirrored_variable.hpp"
#include "state/variable_state.hpp"
#include "support/checkpoint_files.hpp"
#include "support/reference.hpp"
#include "support/replicas.hpp"

namespace fl = flowlet;
namespace fs = std::filesystem;
namespace ckpt = fl::detail::ckpt;

namespace {

fl::detail::Communicator* world() { return fl::detail::world_communicator().get(); }

// A directory every process shares: process 0 makes it, the others learn its name.
struct SharedDir {
  std::string path;
  SharedDir() {
    std::string mine;
    if (fl::process_index() == 0) {
      std::string pattern = "/tmp/flowlet_mpi_ckpt_XXXXXX";
      REQUIRE(::mkdtemp(pattern.data()) != nullptr);
      mine = pattern;
    }
    path = ckpt::all_gather_strings(world(), mine)[0];
  }
  ~SharedDir() {
    fl::barrier();  // nobody still reads it
    std::error_code error;
    if (fl::process_index() == 0) fs::remove_all(path, error);
  }
};

using test::read_file;
using test::with_bit_flipped;
using test::write_file;

// N + 2 variables of different sizes (every process gets at least one to write), seeded alike on every process.
std::vector<fl::Variable> make_vars(uint64_t seed) {
  std::vector<fl::Variable> vars;
  for (int i = 0; i < fl::process_count() + 2; ++i) {
    vars.emplace_back(fl::randn({10 + 7 * i, 3}, seed + static_cast<uint64_t>(i)), fmt::format("v{}", i));
  }
  vars.emplace_back(fl::scalar<int64_t>(static_cast<int64_t>(seed)), "count");
  return vars;
}

std::vector<std::vector<double>> values(const std::vector<fl::Variable>& vars) {
  std::vector<std::vector<double>> out;
  for (const fl::Variable& v : vars) out.push_back(test::values(v.value()));
  return out;
}

void scramble(std::vector<fl::Variable>& vars) {
  for (fl::Variable& v : vars) v.assign(fl::full(v.shape(), -3.0, v.dtype()));
}

std::string shard_path(const std::string& checkpoint, const std::string& shard) {
  const ckpt::Manifest m = ckpt::parse_manifest(read_file(checkpoint + "/manifest.json"), "manifest", "test");
  for (const ckpt::ShardRecord& s : m.shards) {
    if (s.name == shard) return checkpoint + "/" + s.file;
  }
  FAIL("no shard " << shard);
  return "";
}

// Writes one shard per process ("unread-p<k>") that no source reads back: only the process the
// manager assigns to validate it sees a corruption in it. On `bad_process` its piece is malformed.
class UnreadSource final : public ckpt::Source {
 public:
  explicit UnreadSource(int bad_process = -1) : bad_process_(bad_process) {}
  std::vector<std::string> tensor_names() const override {
    std::vector<std::string> names;
    for (int p = 0; p < fl::process_count(); ++p) names.push_back(fmt::format("unread{}", p));
    return names;
  }
  void snapshot(const ckpt::ProcessView& view, std::vector<ckpt::ShardContent>& shards,
                std::map<std::string, std::string>&) override {
    ckpt::Piece piece;
    piece.tensor = fmt::format("unread{}", view.process);
    piece.shape = fl::Shape({8});
    piece.row_end = 8;
    piece.value = fl::full({view.process == bad_process_ ? 7 : 8}, 1.0 + view.process).contiguous();
    shards.push_back({fmt::format("unread-p{}", view.process), {piece}});
  }
  void load(const ckpt::ProcessView&, ckpt::Reader&) override {}
  void commit() override {}

 private:
  int bad_process_;
};

}  // namespace

TEST_CASE("every process writes its own shard, the manifest lists them all, and every process restores") {
  SharedDir dir;
  std::vector<fl::Variable> vars = make_vars(1);
  const auto saved = values(vars);
  fl::DistributedCheckpointManager manager(dir.path);
  manager.add(vars);
  manager.save(12, {{"batch", 34}});
  manager.wait();
  const fl::CheckpointSaveStats stats = manager.last_save_stats();
  CHECK(stats.step == 12);
  CHECK(stats.bytes > 0);  // every process wrote something
  const std::string checkpoint = dir.path + "/ckpt-000012";
  const ckpt::Manifest m = ckpt::parse_manifest(read_file(checkpoint + "/manifest.json"), "manifest", "test");
  CHECK(m.processes == fl::process_count());
  REQUIRE(static_cast<int>(m.shards.size()) == fl::process_count());
  int64_t total = 0;
  for (int p = 0; p < fl::process_count(); ++p) {
    CHECK(m.shards[static_cast<size_t>(p)].name == fmt::format("variables-p{}", p));
    CHECK(m.shards[static_cast<size_t>(p)].process == p);
    CHECK(static_cast<int64_t>(fs::file_size(checkpoint + "/" + m.shards[static_cast<size_t>(p)].file)) ==
          m.shards[static_cast<size_t>(p)].bytes);
    total += m.shards[static_cast<size_t>(p)].bytes;
  }
  if (fl::process_index() == 0) CHECK(stats.total_bytes == total);
  CHECK(m.tensors.size() == vars.size());

  scramble(vars);
  const std::optional<fl::RestoredCheckpoint> restored = manager.restore_latest();
  REQUIRE(restored.has_value());
  CHECK(restored->step == 12);
  CHECK(restored->saved_processes == fl::process_count());
  CHECK(restored->metadata.at("batch") == 34);
  CHECK(values(vars) == saved);
}

TEST_CASE("mirrored variables: written once, restored into every replica's copy on every process") {
  test::ensure_cpu_devices(2);
  SharedDir dir;
  fl::MirroredOptions options;
  options.collective_timeout_seconds = 30;
  fl::MirroredStrategy dp(test::cpu_devices(2), options);
  fl::Variable w, b;
  {
    auto scope = dp.scope();
    w = fl::Variable(fl::randn({5, 3}, 17), "w");
    b = fl::Variable(fl::randn({3}, 18), "b");
  }
  const auto saved = values({w, b});
  fl::DistributedCheckpointManager manager(dir.path);
  manager.add({w, b});
  manager.save(2);
  manager.wait();
  const ckpt::Manifest m = ckpt::parse_manifest(read_file(dir.path + "/ckpt-000002/manifest.json"), "manifest", "test");
  CHECK(m.tensors.size() == 2);  // once each, not once per replica or process
  w.assign(fl::zeros({5, 3}));
  b.assign(fl::zeros({3}));
  REQUIRE(manager.restore_latest().has_value());
  for (const fl::Variable& v : {w, b}) {
    const auto copies = fl::detail::all_copies(fl::detail::VariableAccess::state(v));
    REQUIRE(copies.size() == 2);
    for (const auto& copy : copies) {
      const std::lock_guard<std::mutex> lock(copy->mutex);
      CHECK(test::values(copy->value) == saved[v.name() == "w" ? 0 : 1]);
    }
  }
}

TEST_CASE(
    "a corruption only one process sees: every process throws its error, naming it and the file; nothing changes") {
  SharedDir dir;
  std::vector<fl::Variable> vars = make_vars(2);
  fl::DistributedCheckpointManager manager(dir.path);
  manager.add(vars);
  ckpt::ManagerAccess::add_source(manager, std::make_shared<UnreadSource>());
  manager.save(3);
  manager.wait();
  scramble(vars);
  const auto before = values(vars);
  const std::string checkpoint = dir.path + "/ckpt-000003";
  // Shards in the manifest: variables-p0, unread-p0, variables-p1, ...: unread-p0 is shard 1, which
  // process 1 validates (1 % N) and no source reads.
  const std::string shard = shard_path(checkpoint, "unread-p0");
  const std::string intact = read_file(shard);
  fl::barrier();
  if (fl::process_index() == 0) {
    write_file(shard, with_bit_flipped(intact, intact.size() - 3, 0));
  }
  fl::barrier();
  try {
    manager.restore(checkpoint);
    FAIL("restore accepted a corrupt shard");
  } catch (const fl::InvalidArgument& e) {
    const std::string message = e.what();
    CHECK_MESSAGE(message.rfind("process 1: ", 0) == 0, message);
    CHECK_MESSAGE(message.find(shard) != std::string::npos, message);
  }
  CHECK(values(vars) == before);
  fl::barrier();
  if (fl::process_index() == 0) write_file(shard, intact);
  fl::barrier();
  CHECK(manager.restore(checkpoint).step == 3);
  CHECK(values(vars) != before);
}

TEST_CASE("a write that fails on one process fails the save on every process, and no checkpoint appears") {
  SharedDir dir;
  const int bad = fl::process_count() - 1;
  fl::DistributedCheckpointManager manager(dir.path);
  manager.add(make_vars(3));
  ckpt::ManagerAccess::add_source(manager, std::make_shared<UnreadSource>(bad));
  manager.save(1);
  try {
    manager.wait();
    FAIL("the save succeeded");
  } catch (const fl::InvalidArgument& e) {
    const std::string message = e.what();
    CHECK_MESSAGE(message.rfind(fmt::format("process {}: ", bad), 0) == 0, message);
    CHECK_MESSAGE(message.find("bad piece of 'unread") != std::string::npos, message);
  }
  CHECK(manager.checkpoints().empty());
}

// A source whose snapshot throws on one process (as a parameter-server save inside run() does).
class RefusingSource final : public ckpt::Source {
 public:
  explicit RefusingSource(int refusing_process) : refusing_process_(refusing_process) {}
  std::vector<std::string> tensor_names() const override { return {}; }
  void snapshot(const ckpt::ProcessView& view, std::vector<ckpt::ShardContent>&,
                std::map<std::string, std::string>&) override {
    if (view.process == refusing_process_) throw fl::InvalidArgument("refused the snapshot here");
  }
  void load(const ckpt::ProcessView&, ckpt::Reader&) override {}
  void commit() override {}

 private:
  int refusing_process_;
};

TEST_CASE("a snapshot refused on one process fails save() on every process at once, and saving goes on after") {
  SharedDir dir;
  const int refusing = fl::process_count() - 1;
  fl::DistributedCheckpointManager manager(dir.path);
  manager.add(make_vars(4));
  ckpt::ManagerAccess::add_source(manager, std::make_shared<RefusingSource>(refusing));
  const auto start = std::chrono::steady_clock::now();
  try {
    manager.save(1);
    FAIL("the save succeeded");
  } catch (const fl::InvalidArgument& e) {
    const std::string message = e.what();
    CHECK_MESSAGE(message == fmt::format("process {}: refused the snapshot here", refusing), message);
  }
  // At once: not after the collective timeout of a writer thread waiting for the refusing process.
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
  manager.wait();  // nothing in flight
  CHECK(manager.checkpoints().empty());
}

TEST_CASE("processes that see different latest checkpoints are refused, every one of them") {
  SharedDir dir;
  const std::string mine = fmt::format("{}/p{}", dir.path, fl::process_index());  // not shared: a misconfiguration
  {
    // Each process writes its shard into its own directory; process 0's alone gets the manifest.
    fl::Variable v(fl::zeros({2}), "v");
    fl::DistributedCheckpointManager manager(mine, {.background = false});
    manager.add({v});
    manager.save(1);
  }
  fl::Variable v(fl::zeros({2}), "v");
  fl::DistributedCheckpointManager manager(mine);
  manager.add({v});
  CHECK_THROWS_WITH_AS(manager.restore_latest(), doctest::Contains("the processes see different latest checkpoints"),
                       fl::InvalidArgument);
}

TEST_CASE("the time rule saves at the same steps on every process although their clocks disagree") {
  SharedDir dir;
  fl::Variable v(fl::zeros({4}), "v");
  fl::DistributedCheckpointManager manager(dir.path, {.max_to_keep = 100, .every_seconds = 0.15});
  manager.add({v});
  std::string saved_at;
  for (int64_t step = 0; step < 12; ++step) {
    // Process k's steps take (k + 1) * 20 ms: alone, each would save at other steps.
    std::this_thread::sleep_for(std::chrono::milliseconds(20 * (fl::process_index() + 1)));
    v.assign(fl::full({4}, static_cast<double>(step)));
    if (manager.maybe_save(step)) saved_at += fmt::format("{} ", step);
  }
  manager.wait();
  const std::vector<std::string> all = ckpt::all_gather_strings(world(), saved_at);
  for (const std::string& other : all) CHECK(other == saved_at);
  CHECK(!saved_at.empty());
  CHECK(manager.checkpoints().size() == static_cast<size_t>(std::count(saved_at.begin(), saved_at.end(), ' ')));
}

TEST_CASE("a checkpoint of N processes, read back through the Reader alone on process 0 (a 1-process restore)") {
  SharedDir dir;
  std::vector<fl::Variable> vars = make_vars(4);
  const auto saved = values(vars);
  fl::DistributedCheckpointManager manager(dir.path);
  manager.add(vars);
  manager.save(8);
  manager.wait();
  fl::barrier();
  if (fl::process_index() == 0) {
    ckpt::CheckpointReader reader(dir.path + "/ckpt-000008", 8, "test");
    CHECK(reader.saved_processes() == fl::process_count());
    for (size_t i = 0; i < vars.size(); ++i) {
      const fl::Tensor t = reader.read(vars[i].name());
      CHECK(t.shape() == vars[i].shape());
      CHECK(test::values(t) == saved[i]);
    }
    // Every shard validates in full on this one process.
    for (size_t k = 0; k < reader.manifest().shards.size(); ++k) CHECK_NOTHROW(reader.validate_shard(k));
  }
}
