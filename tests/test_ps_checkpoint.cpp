// Checkpoints of ParameterServerStrategy jobs in one process (servers and workers as threads): the
// values and the servers' optimizer state (Adam's slots and step counters, a dense matrix and a
// sparse embedding table) saved after a run and restored into a fresh strategy of the same shape
// (the continuation equals the uninterrupted run exactly) and of other shapes (2 -> 3 and 3 -> 1
// servers: values and slots equal the saved tensors, the counters follow the documented rule, and
// training continues as the saved job would have), the refused checkpoints (another kind, workers,
// optimizer, missing variables, shapes, dtypes) that change nothing, and saves inside run().
//
// Every scenario runs twice: through the DistributedCheckpointManager (files, manifests) and
// through the source alone with an in-memory Reader (the contract of src/checkpoint/distributed/
// source.hpp), which also lets the refusal cases edit what a checkpoint records.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/distributed/source.hpp"
#include "flowlet/distributed_checkpoint.hpp"
#include "flowlet/parameter_server.hpp"
#include "ps/checkpoint/ps_source.hpp"
#include "support/parameter_server.hpp"
#include "support/reference.hpp"
#include "support/replicas.hpp"

#ifndef PS_CHECKPOINT_WITH_MANAGER
#define PS_CHECKPOINT_WITH_MANAGER 1
#endif

namespace {

namespace ckpt = fl::detail::ckpt;
using fl::TrainingMode;

void ensure_devices() { test::ensure_cpu_devices(8); }

// ---------------------------------------------------------------------------------------------
// The model: y = x w scale + b (w and b split by rows over every server, the scalar scale whole on
// one) plus an embedding table looked up sparsely (split by rows: with 2 servers rows [0, 5) and
// [5, 10)), trained by Adam on the servers in sync mode with one worker, so that a run is
// deterministic.

// Variations of the model, for the checkpoints that must not fit.
struct Variant {
  int workers = 1;
  int64_t table_rows = 10;
  fl::DType table_dtype = fl::f32;
  bool extra = false;  // one more server variable
};

struct Model {
  explicit Model(int servers, Variant variant = {}) : ps(options(servers, variant.workers)) {
    auto scope = ps.scope();
    w = fl::Variable(fl::randn({6, 3}, /*seed=*/7), "w");
    b = fl::Variable(fl::zeros({3}), "b");
    table = fl::Variable(fl::randn({variant.table_rows, 4}, /*seed=*/5, variant.table_dtype), "table");
    scale = fl::Variable(fl::scalar(0.5f), "scale");  // rank 0: placed whole on one server
    if (variant.extra) extra = fl::Variable(fl::ones({2}), "extra");
  }
  static fl::ParameterServerOptions options(int servers, int workers) {
    fl::ParameterServerOptions o;
    o.num_servers = servers;
    o.num_workers = workers;
    o.mode = TrainingMode::sync;
    o.cluster = fl::ParameterServerOptions::Cluster::in_process;
    o.sharding.min_bytes_to_split = 0;  // every variable split over every server
    o.timeout_seconds = 20;
    return o;
  }
  std::vector<fl::Variable> params() const { return {w, b, table, scale}; }

  fl::ParameterServerStrategy ps;
  fl::Variable w, b, table, scale, extra;
};

fl::ParameterServerStrategy::OptimizerFactory adam() {
  return [] { return std::make_unique<fl::optim::Adam>(0.05); };
}

// Steps [first, first + steps) of the data; step i looks up the table rows ids(i).
using Ids = std::function<std::vector<int64_t>(int)>;

void train(Model& m, int first, int steps, const Ids& ids,
           const fl::ParameterServerStrategy::OptimizerFactory& factory = adam()) {
  m.ps.run(factory, [&](fl::ps::Worker& worker) {
    for (int i = first; i < first + steps; ++i) {
      const fl::Tensor x = fl::randn({4, 6}, /*seed=*/100 + static_cast<uint64_t>(i));
      const fl::Tensor y = fl::randn({4, 3}, /*seed=*/200 + static_cast<uint64_t>(i));
      const std::vector<int64_t> rows = ids(i);
      const fl::Tensor id_tensor = fl::tensor(rows, fl::Shape{static_cast<int64_t>(rows.size())});
      fl::GradientTape tape;
      const fl::Tensor looked_up = fl::gather(m.table, id_tensor);
      const fl::Tensor loss = fl::mean(fl::square(fl::matmul(x, m.w) * m.scale + m.b - y)) +
                              fl::cast(fl::sum(fl::square(looked_up)), fl::f32);
      const std::vector<fl::Variable> params = m.params();
      worker.apply_gradients(tape.gradient(loss, params), params);
    }
  });
}

// Before the save: rows 1, 3 (server 0 of 2) three times, then 1 and 7 (both servers) once, so
// that with 2 servers the table's pieces took 4 and 1 updates. After it: rows 1 and 8 only, which
// keep their pieces' counters equal in every placement used below (2 -> 3 servers).
std::vector<int64_t> ids_before(int step) { return step < 3 ? std::vector<int64_t>{1, 3} : std::vector<int64_t>{1, 7}; }
std::vector<int64_t> ids_after(int) { return {1, 8}; }
std::vector<int64_t> ids_row1(int) { return {1}; }

// Every slot of `var` by slot name ("m", "momentum"), each whole (its pieces' rows joined in
// placement order), and each piece's step counter.
std::map<std::string, std::vector<double>> slots_of(const Model& m, const fl::Variable& var) {
  std::map<std::string, std::vector<double>> slots;
  const std::string prefix = "/" + var.name() + "/";
  for (const fl::optim::Optimizer* optimizer : m.ps.optimizers(var)) {
    for (const fl::Variable& v : optimizer->variables()) {
      const size_t at = v.name().find(prefix);
      if (v.dtype() == fl::i64 || at == std::string::npos) continue;  // the counter
      const std::vector<double> rows = test::values(v.value());
      std::vector<double>& slot = slots[v.name().substr(at + prefix.size())];
      slot.insert(slot.end(), rows.begin(), rows.end());
    }
  }
  return slots;
}

std::vector<int64_t> counters(const Model& m, const fl::Variable& var) {
  std::vector<int64_t> all;
  for (const fl::optim::Optimizer* optimizer : m.ps.optimizers(var)) {
    all.push_back(optimizer->iterations().value().item<int64_t>());
  }
  return all;
}

// Everything a job's state is: values, slots, counters (counters only where `with_counters`).
struct State {
  std::map<std::string, std::vector<double>> tensors;
  std::map<std::string, std::vector<int64_t>> counts;
};
State state_of(const Model& m, bool with_slots = true) {
  State s;
  for (const fl::Variable& v : m.params()) {
    s.tensors[v.name()] = test::values(v.value());
    if (!with_slots) continue;
    const auto slots = slots_of(m, v);
    REQUIRE_MESSAGE(!slots.empty(), "no optimizer slots for " << v.name());
    for (const auto& [slot, values] : slots) s.tensors[v.name() + "/" + slot] = values;
    s.counts[v.name()] = counters(m, v);
  }
  return s;
}

void check_tensors_equal(const State& got, const State& want, double tolerance) {
  REQUIRE(got.tensors.size() == want.tensors.size());
  for (const auto& [name, values] : want.tensors) {
    INFO("tensor " << name);
    REQUIRE(got.tensors.count(name) == 1);
    CHECK(test::check_values(got.tensors.at(name), values, {tolerance, tolerance}));
  }
}

// Tensors within `tolerance` and the same counters.
void check_same_state(const State& got, const State& want, double tolerance) {
  check_tensors_equal(got, want, tolerance);
  CHECK(got.counts == want.counts);
}

// ---------------------------------------------------------------------------------------------
// Where checkpoints go: through the manager (files), or through the source alone (memory).

class Store {
 public:
  virtual ~Store() = default;
  virtual void attach(Model& m) = 0;  // before m's first save or restore
  virtual void save(Model& m, int64_t step) = 0;
  virtual void restore(Model& m) = 0;  // the latest checkpoint
  virtual const char* name() const = 0;
};

#if PS_CHECKPOINT_WITH_MANAGER
class ManagerStore final : public Store {
 public:
  ManagerStore() : directory_(std::filesystem::temp_directory_path() / fmt::format("ps_ckpt_{}", counter_++)) {
    std::filesystem::remove_all(directory_);
  }
  ~ManagerStore() override {
    managers_.clear();
    std::error_code ignored;
    std::filesystem::remove_all(directory_, ignored);
  }
  void attach(Model& m) override {
    // Background writes (the default): save() returns after the snapshot's copies, wait() when
    // the checkpoint is complete.
    auto manager = std::make_unique<fl::DistributedCheckpointManager>(directory_.string());
    manager->add(m.ps);
    managers_[&m] = std::move(manager);
  }
  void save(Model& m, int64_t step) override {
    managers_.at(&m)->save(step, {{"batch", step}});
    managers_.at(&m)->wait();
  }
  void restore(Model& m) override {
    const std::optional<fl::RestoredCheckpoint> restored = managers_.at(&m)->restore_latest();
    REQUIRE(restored.has_value());
    CHECK(restored->metadata.at("batch") == restored->step);
  }
  const char* name() const override { return "manager"; }
  fl::DistributedCheckpointManager& manager(Model& m) { return *managers_.at(&m); }
  const std::filesystem::path& directory() const { return directory_; }

 private:
  static inline int counter_ = 0;
  std::filesystem::path directory_;
  std::map<const Model*, std::unique_ptr<fl::DistributedCheckpointManager>> managers_;
};

#endif

// An in-memory checkpoint: the shards and attributes a snapshot produced, read back by rows.
class MemoryCheckpoint final : public ckpt::Reader {
 public:
  MemoryCheckpoint(int64_t step, std::vector<ckpt::ShardContent> shards, std::map<std::string, std::string> attributes)
      : step_(step), attributes_(std::move(attributes)) {
    for (ckpt::ShardContent& shard : shards) {
      for (ckpt::Piece& piece : shard.pieces) {
        auto found = std::find_if(records_.begin(), records_.end(),
                                  [&](const ckpt::TensorRecord& r) { return r.name == piece.tensor; });
        if (found == records_.end()) {
          records_.push_back({piece.tensor, piece.dtype, piece.shape, {}});
          found = records_.end() - 1;
        }
        found->pieces.push_back({shard.name, piece.row_begin, piece.row_end});
        values_[{piece.tensor, piece.row_begin}] = piece.value;
      }
    }
    for (ckpt::TensorRecord& r : records_) {
      std::sort(r.pieces.begin(), r.pieces.end(),
                [](const ckpt::PieceRecord& a, const ckpt::PieceRecord& b) { return a.row_begin < b.row_begin; });
    }
  }
  int64_t step() const override { return step_; }
  const std::string& path() const override { return path_; }
  int saved_processes() const override { return 1; }
  const std::map<std::string, std::string>& attributes() const override { return attributes_; }
  std::map<std::string, std::string>& attributes() { return attributes_; }  // to edit in refusal cases
  const std::vector<ckpt::TensorRecord>& tensors() const override { return records_; }
  std::vector<ckpt::TensorRecord>& tensors() { return records_; }
  const ckpt::TensorRecord* find(const std::string& tensor) const override {
    for (const ckpt::TensorRecord& r : records_) {
      if (r.name == tensor) return &r;
    }
    return nullptr;
  }
  using ckpt::Reader::read;
  fl::Tensor read(const std::string& tensor, int64_t row_begin, int64_t row_end) override {
    const ckpt::TensorRecord* record = find(tensor);
    if (record == nullptr) throw fl::InvalidArgument("MemoryCheckpoint: no tensor " + tensor);
    std::vector<fl::Tensor> parts;
    for (const ckpt::PieceRecord& p : record->pieces) {
      const int64_t begin = std::max(p.row_begin, row_begin), end = std::min(p.row_end, row_end);
      if (begin >= end) continue;
      const fl::Tensor& value = values_.at({tensor, p.row_begin});
      parts.push_back(value.rank() == 0 && record->shape.rank() == 0
                          ? value
                          : fl::slice(value, 0, begin - p.row_begin, end - begin));
    }
    if (record->shape.rank() == 0) return parts.at(0);
    return parts.size() == 1 ? parts[0] : fl::concat(parts, 0);
  }

 private:
  int64_t step_;
  std::string path_ = "memory://checkpoint";
  std::map<std::string, std::string> attributes_;
  std::vector<ckpt::TensorRecord> records_;
  std::map<std::pair<std::string, int64_t>, fl::Tensor> values_;
};

class MemoryStore final : public Store {
 public:
  void attach(Model& m) override {
    sources_[&m] =
        std::make_shared<fl::detail::ps::checkpoint::ParameterServerSource>(fl::detail::ps::StrategyAccess::core(m.ps));
  }
  void save(Model& m, int64_t step) override {
    std::vector<ckpt::ShardContent> shards;
    std::map<std::string, std::string> attributes;
    sources_.at(&m)->snapshot({0, 1}, shards, attributes);
    latest_ = std::make_unique<MemoryCheckpoint>(step, std::move(shards), std::move(attributes));
  }
  void restore(Model& m) override {
    REQUIRE(latest_ != nullptr);
    restore_from(m, *latest_);
  }
  void restore_from(Model& m, ckpt::Reader& reader) {
    auto& source = *sources_.at(&m);
    source.load({0, 1}, reader);
    source.commit();
  }
  const char* name() const override { return "memory"; }
  MemoryCheckpoint& latest() { return *latest_; }
  fl::detail::ps::checkpoint::ParameterServerSource& source(Model& m) { return *sources_.at(&m); }

 private:
  std::map<const Model*, std::shared_ptr<fl::detail::ps::checkpoint::ParameterServerSource>> sources_;
  std::unique_ptr<MemoryCheckpoint> latest_;
};

// Attaches `m` to `store` and trains its steps [0, steps).
void attach_and_train(Store& store, Model& m, int steps, const Ids& ids) {
  store.attach(m);
  train(m, 0, steps, ids);
}

// Runs `scenario` with each store in turn (after ensure_devices()).
void for_each_store(const std::function<void(Store*)>& scenario) {
  ensure_devices();
  std::vector<std::unique_ptr<Store>> stores;
#if PS_CHECKPOINT_WITH_MANAGER
  stores.push_back(std::make_unique<ManagerStore>());
#endif
  stores.push_back(std::make_unique<MemoryStore>());
  for (const auto& store : stores) {
    INFO("store: " << std::string(store->name()));
    scenario(store.get());
  }
}

}  // namespace

TEST_CASE("ps checkpoint: a restored job continues exactly as the uninterrupted one") {
  for_each_store([](Store* store) {
    constexpr int kBefore = 4, kAfter = 3;
    // The uninterrupted job: trains, is saved, trains on.
    Model original(2);
    store->attach(original);
    train(original, 0, kBefore, ids_before);
    const State at_save = state_of(original);
    CHECK(at_save.counts.at("table") == std::vector<int64_t>{4, 1});  // the sparse pushes as planned
    CHECK(at_save.counts.at("w") == std::vector<int64_t>{4, 4});
    store->save(original, kBefore);
    train(original, kBefore, kAfter, ids_after);
    const State reference = state_of(original);

    // A fresh job of the same shape restores before its first run (the optimizer state waits for
    // run()'s optimizers) and trains the same steps.
    Model resumed(2);
    store->attach(resumed);
    store->restore(resumed);
    for (const fl::Variable& v : resumed.params()) CHECK(test::values(v.value()) == at_save.tensors.at(v.name()));
    train(resumed, kBefore, kAfter, ids_after);
    const State got = state_of(resumed);
    check_same_state(got, reference, 0.0);

    // Restoring into a job that has run (its optimizers exist): installed at once.
    store->restore(resumed);
    const State back = state_of(resumed);
    check_same_state(back, at_save, 0.0);
  });
}

TEST_CASE("ps checkpoint: 2 servers -> 3 -> 1: rows re-sharded, slots with them, counters by the rule") {
  for_each_store([](Store* store) {
    Model two(2);
    attach_and_train(*store, two, 4, ids_before);
    const State at_save = state_of(two);
    REQUIRE(at_save.counts.at("table") == std::vector<int64_t>{4, 1});
    store->save(two, 4);
    train(two, 4, 3, ids_after);
    const State two_continued = state_of(two);

    // 3 servers: table rows [0, 4) [4, 7) [7, 10). A run of no steps makes the optimizers, which
    // take the restored state: values and slots are the saved tensors, whatever the placement.
    Model three(3);
    REQUIRE(three.ps.placement(three.table).size() == 3);
    store->attach(three);
    store->restore(three);
    train(three, 4, 0, ids_after);
    const State restored3 = state_of(three);
    check_tensors_equal(restored3, at_save, 0.0);
    // A piece whose rows came from saved pieces with different counts takes the largest: [4, 7)
    // holds rows of the pieces that took 4 and 1 updates.
    CHECK(restored3.counts.at("table") == std::vector<int64_t>{4, 4, 1});
    CHECK(restored3.counts.at("w") == std::vector<int64_t>{4, 4, 4});
    CHECK(restored3.counts.at("b") == std::vector<int64_t>{4, 4, 4});
    CHECK(restored3.counts.at("scale") == std::vector<int64_t>{4});
    // Rows 1 and 8 keep their pieces' counts in both placements: training continues as on 2 servers.
    train(three, 4, 3, ids_after);
    const State three_continued = state_of(three);
    check_tensors_equal(three_continued, two_continued, 1e-6);
    CHECK(three_continued.counts.at("table") == std::vector<int64_t>{7, 4, 4});
    CHECK(two_continued.counts.at("table") == std::vector<int64_t>{7, 4});

    // 3 -> 1 server: every piece's rows in one; its count is the largest (7).
    store->save(three, 7);
    Model one(1);
    store->attach(one);
    store->restore(one);
    train(one, 7, 0, ids_row1);
    const State restored1 = state_of(one);
    check_tensors_equal(restored1, three_continued, 0.0);
    CHECK(restored1.counts.at("table") == std::vector<int64_t>{7});
    CHECK(restored1.counts.at("w") == std::vector<int64_t>{7});
    // Row 1's piece took 7 updates in both: one server continues as three do.
    train(three, 7, 2, ids_row1);
    train(one, 7, 2, ids_row1);
    check_tensors_equal(state_of(one), state_of(three), 1e-6);
  });
}

namespace {

// `attempt` must throw E with `words` in its message and leave `m`'s state (values, slots,
// counters) as it was.
template <class E>
void check_refused(Model& m, const std::function<void()>& attempt, const std::vector<std::string>& words) {
  const State before = state_of(m);
  std::string message;
  try {
    attempt();
    FAIL("no error");
  } catch (const E& e) {
    message = e.what();
  }
  INFO("message: " << message);
  for (const std::string& word : words) CHECK(message.find(word) != std::string::npos);
  const State after = state_of(m);
  check_same_state(after, before, 0.0);
}

}  // namespace

TEST_CASE("ps checkpoint: checkpoints that do not fit are refused and change nothing") {
  for_each_store([](Store* store) {
    Model saved(2);
    attach_and_train(*store, saved, 4, ids_before);
    store->save(saved, 4);

    // Targets that have run (their servers' optimizers hold state that must survive the refusal).
    const auto target = [&](Variant variant, const fl::ParameterServerStrategy::OptimizerFactory& factory = adam()) {
      auto m = std::make_unique<Model>(2, variant);
      store->attach(*m);
      train(*m, 0, 2, ids_after, factory);
      return m;
    };
    {  // another number of workers
      auto m = target({.workers = 2});
      check_refused<fl::InvalidArgument>(*m, [&] { store->restore(*m); }, {"1 workers", "has 2", "restart with 1"});
    }
    {  // another optimizer
      auto m = target({}, [] { return std::make_unique<fl::optim::SGD>(0.1, 0.9); });
      check_refused<fl::InvalidArgument>(*m, [&] { store->restore(*m); }, {"'adam'", "'sgd'"});
    }
    {  // a variable the checkpoint lacks
      auto m = target({.extra = true});
      check_refused<fl::InvalidArgument>(*m, [&] { store->restore(*m); }, {"'extra'"});
    }
    {  // another shape
      auto m = target({.table_rows = 12});
      check_refused<fl::ShapeError>(*m, [&] { store->restore(*m); }, {"'table'", "[10, 4]", "[12, 4]"});
    }
    {  // another dtype
      auto m = target({.table_dtype = fl::f64});
      check_refused<fl::DTypeError>(*m, [&] { store->restore(*m); }, {"'table'", "f64"});
    }
  });
}

TEST_CASE("ps checkpoint: optimizer state restored before the first run waits for run()'s optimizers") {
  for_each_store([](Store* store) {
    Model saved(2);
    attach_and_train(*store, saved, 4, ids_before);
    const State at_save = state_of(saved);
    store->save(saved, 4);

    Model fresh(2);
    store->attach(fresh);
    store->restore(fresh);
    // Another optimizer: run() refuses before anything starts (no worker runs, values unchanged)...
    bool worker_ran = false;
    CHECK_THROWS_WITH_AS(
        fresh.ps.run([] { return std::make_unique<fl::optim::SGD>(0.1); }, [&](fl::ps::Worker&) { worker_ran = true; }),
        doctest::Contains("of optimizer 'adam'"), fl::InvalidArgument);
    CHECK_FALSE(worker_ran);
    for (const fl::Variable& v : fresh.params()) CHECK(test::values(v.value()) == at_save.tensors.at(v.name()));
    // ... and a save now holds the restored state, not the absent optimizers'.
    store->save(fresh, 4);
    Model again(2);
    store->attach(again);
    store->restore(again);
    // The right optimizer gets the state.
    train(fresh, 4, 0, ids_after);
    train(again, 4, 0, ids_after);
    check_same_state(state_of(fresh), at_save, 0.0);
    check_same_state(state_of(again), at_save, 0.0);
  });
}

TEST_CASE("ps checkpoint: a checkpoint saved before the first run holds values only") {
  for_each_store([](Store* store) {
    Model saved(2);
    store->attach(saved);
    const State initial = state_of(saved, /*with_slots=*/false);
    store->save(saved, 0);
    // Restored into a job that trained: values back to the initial ones, optimizer state fresh
    // (zeros, counters 0), so that it continues as a new job would.
    Model trained(2);
    attach_and_train(*store, trained, 4, ids_before);
    store->restore(trained);
    train(trained, 0, 0, ids_before);
    const State reset = state_of(trained);
    for (const auto& [name, values] : initial.tensors) CHECK(reset.tensors.at(name) == values);
    for (const char* name : {"w/m", "w/v", "table/m", "table/v"}) {
      const std::vector<double>& slot = reset.tensors.at(name);
      CHECK(std::all_of(slot.begin(), slot.end(), [](double x) { return x == 0.0; }));
    }
    CHECK(reset.counts.at("table") == std::vector<int64_t>{0, 0});
    train(trained, 0, 4, ids_before);
    Model fresh(2);
    train(fresh, 0, 4, ids_before);
    check_tensors_equal(state_of(trained), state_of(fresh), 0.0);
  });
}

TEST_CASE("ps checkpoint: saves and restores inside run() are refused, naming the strategy") {
  for_each_store([](Store* store) {
    Model m(1);
    attach_and_train(*store, m, 1, ids_after);
    store->save(m, 1);
    const State before = state_of(m);
    CHECK_THROWS_WITH_AS(m.ps.run(adam(), [&](fl::ps::Worker&) { store->save(m, 2); }),
                         doctest::Contains("inside ParameterServerStrategy::run()"), fl::InvalidArgument);
    CHECK_THROWS_WITH_AS(m.ps.run(adam(), [&](fl::ps::Worker&) { store->restore(m); }),
                         doctest::Contains("inside ParameterServerStrategy::run()"), fl::InvalidArgument);
    const State after = state_of(m);
    check_same_state(after, before, 0.0);
  });
}

TEST_CASE("ps checkpoint: the source refuses another kind of checkpoint and damaged attributes") {
  ensure_devices();
  MemoryStore store;
  Model saved(2);
  attach_and_train(store, saved, 4, ids_before);
  store.save(saved, 4);
  MemoryCheckpoint& checkpoint = store.latest();
  // What a snapshot records.
  const std::map<std::string, std::string>& a = checkpoint.attributes();
  CHECK(a.at("ps.kind") == "parameter_server");
  CHECK(a.at("ps.servers") == "2");
  CHECK(a.at("ps.workers") == "1");
  CHECK(a.at("ps.mode") == "sync");
  CHECK(a.at("ps.optimizer") == "adam");
  CHECK(a.at("ps.slots") == "m,v");
  CHECK(a.at("ps.placement.table") == "0:0-5,1:5-10");
  CHECK(a.at("ps.placement.b") == "0:0-2,1:2-3");
  REQUIRE(checkpoint.find("adam/table/iterations") != nullptr);
  CHECK(checkpoint.read("adam/table/iterations").to_vector<int64_t>() == std::vector<int64_t>{4, 1});
  CHECK(checkpoint.find("adam/w/m") != nullptr);
  REQUIRE(checkpoint.find("table") != nullptr);
  CHECK(checkpoint.find("table")->pieces.size() == 2);
  CHECK(checkpoint.find("table")->pieces[1].shard == "server-1");

  Model m(2);
  attach_and_train(store, m, 2, ids_after);
  const std::map<std::string, std::string> good = checkpoint.attributes();
  const auto refused_with = [&](const std::function<void(std::map<std::string, std::string>&)>& edit,
                                const std::vector<std::string>& words) {
    checkpoint.attributes() = good;
    edit(checkpoint.attributes());
    check_refused<fl::InvalidArgument>(
        m, [&] { store.restore_from(m, checkpoint); }, words);
  };
  refused_with([](auto& a) { a.erase("ps.kind"); }, {"not written by a parameter-server job", "memory://checkpoint"});
  refused_with([](auto& a) { a["ps.kind"] = "mirrored"; }, {"'mirrored'"});
  refused_with([](auto& a) { a["ps.placement.table"] = "0:0-5,1:6-10"; }, {"placement of 'table'"});
  refused_with([](auto& a) { a["ps.placement.table"] = "0:0-5,7:5-10"; }, {"placement of 'table'"});
  refused_with([](auto& a) { a["ps.placement.table"] = "0:0-5,1:5-9"; }, {"covers 9 rows"});
  refused_with([](auto& a) { a.erase("ps.placement.w"); }, {"ps.variables"});
  refused_with([](auto& a) { a["ps.servers"] = "zero"; }, {"ps.servers"});
  refused_with([](auto& a) { a["ps.slots"] = "m,v,u"; }, {"slots m, v, u", "slots m, v"});
  checkpoint.attributes() = good;
  // A checkpoint whose slot is missing: refused, naming the tensor.
  auto& records = checkpoint.tensors();
  records.erase(std::remove_if(records.begin(), records.end(), [](auto& r) { return r.name == "adam/b/v"; }),
                records.end());
  check_refused<fl::InvalidArgument>(m, [&] { store.restore_from(m, checkpoint); }, {"'adam/b/v'"});
}

TEST_CASE("ps checkpoint: server variables need unique names") {
  ensure_devices();
  fl::ParameterServerStrategy ps(Model::options(1, 1));
  {
    auto scope = ps.scope();
    fl::Variable a(fl::zeros({2}), "same");
    fl::Variable b(fl::zeros({2}), "same");
  }
  MemoryStore store;
  CHECK_THROWS_WITH_AS(fl::detail::ps::checkpoint::ParameterServerSource(fl::detail::ps::StrategyAccess::core(ps)),
                       doctest::Contains("two server variables are named 'same'"), fl::InvalidArgument);
}

TEST_CASE("ps checkpoint: a damaged or foreign checkpoint on disk is refused before anything changes") {
  ensure_devices();
  ManagerStore store;
  Model saved(2);
  attach_and_train(store, saved, 4, ids_before);
  store.save(saved, 4);
  const std::string checkpoint = store.manager(saved).latest().value();
  std::map<std::string, std::filesystem::path> shard_files;  // "server-0" -> its file
  for (const auto& entry : std::filesystem::directory_iterator(checkpoint)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("server-")) shard_files[name.substr(0, name.find('.'))] = entry.path();
  }
  REQUIRE(shard_files.size() == 2);  // one file per server

  Model m(2);
  attach_and_train(store, m, 2, ids_after);
  const std::filesystem::path damaged = shard_files.at("server-1");
  const std::string file_name = damaged.filename().string();
  {  // a flipped bit in server 1's rows
    std::fstream file(damaged, std::ios::in | std::ios::out | std::ios::binary);
    const auto size = static_cast<std::streamoff>(std::filesystem::file_size(damaged));
    file.seekg(size - 3);
    char byte = 0;
    file.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x10);
    file.seekp(size - 3);
    file.write(&byte, 1);
  }
  check_refused<fl::InvalidArgument>(m, [&] { store.manager(m).restore(checkpoint); }, {file_name});
  std::filesystem::resize_file(damaged, std::filesystem::file_size(damaged) / 2);  // truncated
  check_refused<fl::InvalidArgument>(m, [&] { store.manager(m).restore(checkpoint); }, {file_name});
  std::filesystem::remove(damaged);  // missing
  check_refused<fl::InvalidArgument>(m, [&] { store.manager(m).restore(checkpoint); }, {file_name});

  // A checkpoint of plain variables (another kind of job) in another directory.
  const std::filesystem::path other = store.directory().string() + "_plain";
  {
    fl::DistributedCheckpointOptions options;
    options.background = false;
    fl::DistributedCheckpointManager plain(other.string(), options);
    fl::Variable w(fl::zeros({6, 3}), "w");
    plain.add({w});
    plain.save(1);
  }
  const std::string foreign = (other / "ckpt-000001").string();
  REQUIRE(std::filesystem::exists(foreign));
  check_refused<fl::InvalidArgument>(m, [&] { store.manager(m).restore(foreign); },
                                     {"not written by a parameter-server job"});
  std::filesystem::remove_all(other);
}
