// The parameter server (src/ps/server): one or two ShardServers driven through a Transport, the
// workers being plain handlers that collect the servers' replies. Every mode with exact accounting
// (SGD on counter-like variables: the values are the initial ones minus lr times the sum of the
// gradients the server reports applied), the sync step's backups, late and duplicate pushes,
// bounded staleness, timeouts, bad and malformed messages, sparse SGD / Adam against host
// arithmetic, a variable split over two servers, optimizer state across runs, and finish().
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "flowlet/ops/shape.hpp"
#include "ps/server/optimizer_access.hpp"
#include "ps/server/shard_server.hpp"
#include "ps/sharding.hpp"
#include "ps/transport/transport.hpp"
#include "ps/wire/messages.hpp"
#include "support/reference.hpp"

namespace {

namespace ps = fl::detail::ps;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// The transport under test: the wire part's in-process one (the handler runs inside send(), one
// call at a time per endpoint).
std::unique_ptr<ps::Transport> make_transport(int endpoints, std::chrono::duration<double> delay = {}) {
  return ps::make_in_memory_transport(endpoints, delay);
}

// ---------------------------------------------------------------------------------------------
// A cluster of test workers: endpoint num_servers + w collects what servers send to worker w.

class Workers {
 public:
  Workers(int servers, int workers, std::chrono::duration<double> message_delay = {})
      : servers_(servers),
        workers_(workers),
        transport_(make_transport(servers + workers, message_delay)), inboxes_(new Inbox[static_cast<size_t>(workers)]) {
    for (int w = 0; w < workers; ++w) {
      transport_->attach(servers + w, [this, w](int, ps::Bytes bytes) {
        Inbox& inbox = inboxes_[static_cast<size_t>(w)];
        {
          std::lock_guard lock(inbox.mutex);
          inbox.messages.push_back(ps::decode(bytes));
        }
        inbox.ready.notify_all();
      });
    }
  }

  // Detached first: no handler call may still be touching an inbox when the inboxes go.
  ~Workers() {
    for (int w = 0; w < workers_; ++w) transport_->detach(servers_ + w);
  }
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;

  ps::Transport& transport() { return *transport_; }
  int endpoint(int worker) const { return servers_ + worker; }

  // Sends `message` from worker `worker` to server `server`; returns its size on the wire.
  int64_t send(int worker, const ps::Message& message, int server = 0) {
    ps::Bytes bytes = ps::encode(message);
    const auto size = static_cast<int64_t>(bytes.size());
    transport_->send(endpoint(worker), server, std::move(bytes));
    return size;
  }
  void send_bytes(int from_endpoint, ps::Bytes bytes, int server = 0) {
    transport_->send(from_endpoint, server, std::move(bytes));
  }

  // The next message to `worker` within `within`, or nothing (no assertion: for worker threads).
  std::optional<ps::Message> take(int worker, std::chrono::duration<double> within = 60s) {
    Inbox& inbox = inboxes_[static_cast<size_t>(worker)];
    std::unique_lock lock(inbox.mutex);
    if (!inbox.ready.wait_for(lock, within, [&] { return !inbox.messages.empty(); })) return std::nullopt;
    ps::Message message = std::move(inbox.messages.front());
    inbox.messages.pop_front();
    return message;
  }

  // The next message to `worker`, waiting up to `within`; fails the test when none comes.
  ps::Message next(int worker, std::chrono::duration<double> within = 60s) {
    Inbox& inbox = inboxes_[static_cast<size_t>(worker)];
    std::unique_lock lock(inbox.mutex);
    const bool arrived = inbox.ready.wait_for(lock, within, [&] { return !inbox.messages.empty(); });
    REQUIRE_MESSAGE(arrived, "worker " << worker << " got no message within " << within.count() << " s");
    ps::Message message = std::move(inbox.messages.front());
    inbox.messages.pop_front();
    return message;
  }
  template <class T>
  T next_as(int worker, std::chrono::duration<double> within = 60s) {
    ps::Message message = next(worker, within);
    std::string detail = ps::message_name(message);
    if (auto* error = std::get_if<ps::ErrorReply>(&message)) detail += ": " + error->message;
    REQUIRE_MESSAGE(std::holds_alternative<T>(message), "worker " << worker << " got an unexpected " << detail);
    return std::get<T>(std::move(message));
  }
  // True when nothing reaches `worker` for `period`.
  bool quiet(int worker, std::chrono::duration<double> period = 150ms) {
    Inbox& inbox = inboxes_[static_cast<size_t>(worker)];
    std::unique_lock lock(inbox.mutex);
    return !inbox.ready.wait_for(lock, period, [&] { return !inbox.messages.empty(); });
  }

 private:
  struct Inbox {
    std::mutex mutex;
    std::condition_variable ready;
    std::deque<ps::Message> messages;
  };
  int servers_;
  int workers_;
  std::unique_ptr<ps::Transport> transport_;
  std::unique_ptr<Inbox[]> inboxes_;
};

// ---------------------------------------------------------------------------------------------
// Messages, configurations and values.

ps::PullRequest pull(uint64_t id, int worker, int64_t clock, int32_t var, int64_t min_version = 0) {
  return ps::PullRequest{id, worker, clock, var, min_version};
}
ps::SparsePullRequest sparse_pull(uint64_t id, int worker, int32_t var, std::vector<int64_t> rows) {
  const auto n = static_cast<int64_t>(rows.size());
  return ps::SparsePullRequest{id, worker, 0, var, 0, fl::tensor(rows, fl::Shape{n})};
}
ps::PushEntry dense(int32_t var, const fl::Tensor& grad) { return ps::PushEntry{var, fl::Tensor(), grad}; }
ps::PushEntry sparse(int32_t var, std::vector<int64_t> rows, const fl::Tensor& grad) {
  const auto n = static_cast<int64_t>(rows.size());
  return ps::PushEntry{var, fl::tensor(rows, fl::Shape{n}), grad};
}
ps::Push push(int worker, int64_t clock, int64_t read_version, std::vector<ps::PushEntry> entries) {
  return ps::Push{worker, clock, read_version, std::move(entries)};
}
ps::Goodbye goodbye(int worker, int64_t clock = 0) { return ps::Goodbye{worker, clock}; }

fl::Tensor f32(const std::vector<double>& values) { return test::make(values); }
fl::Tensor f32(const std::vector<double>& values, const fl::Shape& shape) { return test::make(values, shape); }

std::function<std::unique_ptr<fl::optim::Optimizer>()> sgd(double lr, double momentum = 0) {
  return [=] { return std::make_unique<fl::optim::SGD>(lr, momentum); };
}

ps::ServerConfig config(int workers, fl::TrainingMode mode, std::function<std::unique_ptr<fl::optim::Optimizer>()> opt,
                        int server = 0, int servers = 1) {
  ps::ServerConfig c;
  c.server = server;
  c.num_servers = servers;
  c.num_workers = workers;
  c.mode = mode;
  c.timeout = std::chrono::duration<double>(30.0);
  c.make_optimizer = std::move(opt);
  return c;
}

// Placements as the strategy makes them: whole variables round-robin, large ones split.
std::vector<ps::VariablePlacement> place(int servers, const std::vector<std::pair<fl::Shape, fl::DType>>& vars,
                                         int64_t min_bytes_to_split = int64_t{1} << 20) {
  ps::Placer placer(servers, fl::ShardingPolicy{min_bytes_to_split, 0});
  std::vector<ps::VariablePlacement> placements;
  for (size_t i = 0; i < vars.size(); ++i) {
    placements.push_back(placer.place(static_cast<int32_t>(i), fmt::format("v{}", i), vars[i].first, vars[i].second));
  }
  return placements;
}

Clock::time_point soon(std::chrono::duration<double> d = 10s) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(d);
}

std::vector<double> values(const fl::Tensor& t) { return test::values(t); }

// Expects ErrorReply(request_id, code) whose message contains every part.
void expect_error(const ps::Message& message, uint64_t request_id, ps::ErrorCode code,
                  const std::vector<std::string>& parts) {
  REQUIRE_MESSAGE(std::holds_alternative<ps::ErrorReply>(message), "got a " << ps::message_name(message));
  const auto& error = std::get<ps::ErrorReply>(message);
  CHECK(error.request_id == request_id);
  CHECK(static_cast<int>(error.code) == static_cast<int>(code));
  for (const std::string& part : parts) {
    CHECK_MESSAGE(error.message.find(part) != std::string::npos, "\"" << error.message << "\" lacks \"" << part << "\"");
  }
}

std::vector<int64_t> histogram_head(const fl::ServerStats& stats, size_t n) {
  REQUIRE(stats.staleness_histogram.size() == 64);
  return std::vector<int64_t>(stats.staleness_histogram.begin(), stats.staleness_histogram.begin() + n);
}

}  // namespace

// =============================================================================================

TEST_CASE("async: every push applied at once; staleness = version - read version; exact counters") {
  Workers cluster(1, 2);
  ps::ShardServer server(config(2, fl::TrainingMode::async, sgd(0.5)), place(1, {{{3}, fl::f32}}),
                         cluster.transport());
  server.seed({f32({10, 20, 30})});
  server.start();
  int64_t sent = 0;
  sent += cluster.send(0, pull(1, 0, 0, 0));
  auto first = cluster.next_as<ps::PullReply>(0);
  CHECK(first.request_id == 1);
  CHECK(first.version == 0);
  CHECK(values(first.value) == std::vector<double>{10, 20, 30});

  sent += cluster.send(0, push(0, 1, 0, {dense(0, f32({1, 2, 3}))}));  // staleness 0 -> version 1
  sent += cluster.send(1, push(1, 1, 0, {dense(0, f32({2, 2, 2}))}));  // staleness 1 -> version 2
  sent += cluster.send(0, push(0, 2, 1, {dense(0, f32({4, 0, 0}))}));  // staleness 1 -> version 3
  sent += cluster.send(1, pull(2, 1, 1, 0));
  auto after = cluster.next_as<ps::PullReply>(1);
  CHECK(after.request_id == 2);
  CHECK(after.version == 3);
  // 10 - 0.5 * (1 + 2 + 4), 20 - 0.5 * (2 + 2 + 0), 30 - 0.5 * (3 + 2 + 0)
  CHECK(values(after.value) == std::vector<double>{6.5, 18, 27.5});

  sent += cluster.send(0, goodbye(0));
  sent += cluster.send(1, goodbye(1));
  server.finish(soon());

  const fl::ServerStats stats = server.stats();
  CHECK(stats.server == 0);
  CHECK(stats.version == 3);
  CHECK(stats.updates_applied == 3);
  CHECK(stats.updates_dropped == 0);
  CHECK(stats.steps == 3);
  CHECK(histogram_head(stats, 3) == std::vector<int64_t>{1, 2, 0});
  CHECK(stats.max_staleness == 1);
  CHECK(stats.messages_received == 7);
  CHECK(stats.bytes_received == sent);
  CHECK(stats.messages_sent == 2);
  CHECK(stats.bytes_sent ==
        static_cast<int64_t>(ps::encode(first).size() + ps::encode(after).size()));
  CHECK(values(server.piece_values()[0]) == std::vector<double>{6.5, 18, 27.5});
  REQUIRE(server.optimizer(0) != nullptr);
  CHECK(server.optimizer(0)->iterations().value().item<int64_t>() == 3);
}

TEST_CASE("async: staleness of 63 and more lands in the last bucket; max_staleness keeps the real value") {
  Workers cluster(1, 2);
  ps::ShardServer server(config(2, fl::TrainingMode::async, sgd(1.0)), place(1, {{{1}, fl::f32}}),
                         cluster.transport());
  server.seed({fl::zeros({1})});
  server.start();
  for (int i = 0; i < 70; ++i) cluster.send(1, push(1, i + 1, i, {dense(0, f32({1}))}));  // staleness 0 each
  cluster.send(0, push(0, 1, 0, {dense(0, f32({1}))}));   // read 0 at version 70
  cluster.send(0, push(0, 2, 8, {dense(0, f32({1}))}));   // read 8 at version 71: 63
  cluster.send(0, push(0, 3, 71, {dense(0, f32({1}))}));  // read 71 at version 72: 1
  cluster.send(0, goodbye(0));
  cluster.send(1, goodbye(1));
  server.finish(soon());
  const fl::ServerStats stats = server.stats();
  CHECK(stats.staleness_histogram[0] == 70);
  CHECK(stats.staleness_histogram[1] == 1);
  CHECK(stats.staleness_histogram[63] == 2);
  CHECK(stats.max_staleness == 70);
  CHECK(stats.updates_applied == 73);
  CHECK(values(server.piece_values()[0]) == std::vector<double>{-73});
}

TEST_CASE("sync, 3 workers + 1 backup: first 3 pushes make the step; late and duplicate pushes dropped; "
          "parked pulls answered; fewer live workers still complete steps") {
  Workers cluster(1, 4);
  ps::ServerConfig c = config(4, fl::TrainingMode::sync, sgd(1.0));
  c.backup_workers = 1;
  ps::ShardServer server(c, place(1, {{{2}, fl::f32}}), cluster.transport());
  server.seed({f32({0, 0})});
  server.start();

  // Step 0: worker 3 waits for version 1; workers 0, 1, 2 complete the step, worker 3 is late.
  cluster.send(3, pull(10, 3, 0, 0, /*min_version=*/1));
  cluster.send(0, push(0, 1, 0, {dense(0, f32({3, 6}))}));
  cluster.send(1, push(1, 1, 0, {dense(0, f32({6, 3}))}));
  CHECK(cluster.quiet(3));  // two of three pushes: the pull stays parked
  cluster.send(2, push(2, 1, 0, {dense(0, f32({0, 3}))}));
  auto reply = cluster.next_as<ps::PullReply>(3);
  CHECK(reply.request_id == 10);
  CHECK(reply.version == 1);
  CHECK(values(reply.value) == std::vector<double>{-3, -4});  // -(mean of the three)
  cluster.send(3, push(3, 1, 0, {dense(0, f32({100, 100}))}));  // late: read version 0 < 1
  CHECK(cluster.quiet(3));  // dropped silently: the worker learns the new version from its next pull

  // Step 1: worker 0 pushes twice (the second dropped), 1 and 2 complete it.
  cluster.send(0, push(0, 2, 1, {dense(0, f32({1, 1}))}));
  cluster.send(0, push(0, 3, 1, {dense(0, f32({100, 100}))}));
  cluster.send(1, push(1, 2, 1, {dense(0, f32({2, 2}))}));
  cluster.send(2, push(2, 2, 1, {dense(0, f32({3, 3}))}));
  cluster.send(0, pull(11, 0, 3, 0, 2));
  auto step1 = cluster.next_as<ps::PullReply>(0);
  CHECK(step1.version == 2);
  CHECK(values(step1.value) == std::vector<double>{-5, -6});

  // Workers 2 and 3 leave: two live workers are fewer than the 3 a step takes, so both make it.
  cluster.send(2, goodbye(2));
  cluster.send(3, goodbye(3));
  cluster.send(0, push(0, 4, 2, {dense(0, f32({1, 0}))}));
  CHECK(cluster.quiet(0));
  cluster.send(1, push(1, 3, 2, {dense(0, f32({3, 2}))}));
  cluster.send(0, pull(12, 0, 4, 0, 3));
  auto step2 = cluster.next_as<ps::PullReply>(0);
  CHECK(step2.version == 3);
  CHECK(values(step2.value) == std::vector<double>{-7, -7});

  cluster.send(0, goodbye(0));
  cluster.send(1, goodbye(1));
  server.finish(soon());
  const fl::ServerStats stats = server.stats();
  CHECK(stats.version == 3);
  CHECK(stats.steps == 3);
  CHECK(stats.updates_applied == 8);  // 3 + 3 + 2 pushes went into steps
  CHECK(stats.updates_dropped == 2);  // the late one and the duplicate
  CHECK(histogram_head(stats, 2) == std::vector<int64_t>{8, 0});
  CHECK(stats.max_staleness == 0);
  CHECK(values(server.piece_values()[0]) == std::vector<double>{-7, -7});
  CHECK(server.optimizer(0)->iterations().value().item<int64_t>() == 3);  // one apply per step
}

TEST_CASE("sync: sparse gradients of a step are concatenated, repeated rows summed, divided by the pushes; "
          "dense ones averaged over the pushes that carried them") {
  Workers cluster(1, 3);
  ps::ShardServer server(config(3, fl::TrainingMode::sync, sgd(1.0)), place(1, {{{4, 2}, fl::f32}, {{2}, fl::f32}}),
                         cluster.transport());
  server.seed({fl::zeros({4, 2}), fl::zeros({2})});
  server.start();
  // Step 0: worker 2 pushes no gradient at all (its step still counts).
  cluster.send(0, push(0, 1, 0, {sparse(0, {0, 2}, f32({3, 3, 6, 6}, {2, 2})), dense(1, f32({2, 4}))}));
  cluster.send(1, push(1, 1, 0, {sparse(0, {2, 3}, f32({3, 0, 9, 9}, {2, 2})), dense(1, f32({4, 8}))}));
  cluster.send(2, push(2, 1, 0, {}));
  cluster.send(0, pull(1, 0, 1, 0, 1));
  // Rows over the 3 pushes: row 0: 3/3; row 2: (6 + 3)/3, (6 + 0)/3; row 3: 9/3; row 1 untouched.
  CHECK(values(cluster.next_as<ps::PullReply>(0).value) == std::vector<double>{-1, -1, 0, 0, -3, -2, -3, -3});
  cluster.send(0, pull(2, 0, 1, 1, 1));
  CHECK(values(cluster.next_as<ps::PullReply>(0).value) == std::vector<double>{-3, -6});  // mean of 2 carriers

  // Step 1: a dense and a sparse entry for one variable: the sparse one made dense, mean of the two.
  cluster.send(0, push(0, 2, 1, {dense(0, fl::full({4, 2}, 3.0))}));
  cluster.send(1, push(1, 2, 1, {sparse(0, {1}, f32({6, 6}, {1, 2}))}));
  cluster.send(2, push(2, 2, 1, {}));
  for (int w = 0; w < 3; ++w) cluster.send(w, goodbye(w));
  server.finish(soon());
  // Minus 3/2 everywhere, and (3 + 6)/2 on row 1.
  CHECK(values(server.piece_values()[0]) == std::vector<double>{-2.5, -2.5, -4.5, -4.5, -4.5, -3.5, -4.5, -4.5});
  CHECK(values(server.piece_values()[1]) == std::vector<double>{-3, -6});
  CHECK(server.stats().updates_applied == 6);
  CHECK(server.stats().steps == 2);
  CHECK(server.optimizer(1)->iterations().value().item<int64_t>() == 1);  // v1 had gradients in step 0 only
}

TEST_CASE("bounded staleness k = 1: a worker 2 steps ahead waits for the slowest; staleness <= k") {
  Workers cluster(1, 2);
  ps::ServerConfig c = config(2, fl::TrainingMode::bounded_staleness, sgd(1.0));
  c.staleness = 1;
  ps::ShardServer server(c, place(1, {{{2}, fl::f32}}), cluster.transport());
  server.seed({f32({0, 0})});
  server.start();

  cluster.send(0, pull(1, 0, 0, 0));
  CHECK(cluster.next_as<ps::PullReply>(0).version == 0);
  cluster.send(1, pull(2, 1, 0, 0));
  CHECK(cluster.next_as<ps::PullReply>(1).version == 0);

  cluster.send(0, push(0, 1, 0, {dense(0, f32({1, 0}))}));  // staleness 0; slowest still at 0
  cluster.send(0, pull(3, 0, 1, 0));                         // 1 step ahead: allowed
  CHECK(cluster.next_as<ps::PullReply>(0).version == 0);
  cluster.send(0, push(0, 2, 0, {dense(0, f32({1, 0}))}));  // staleness 0
  cluster.send(0, pull(4, 0, 2, 0));                         // 2 steps ahead: parks
  CHECK(cluster.quiet(0));
  cluster.send(1, push(1, 1, 0, {dense(0, f32({0, 1}))}));  // staleness 0; slowest now 1
  auto released = cluster.next_as<ps::PullReply>(0);
  CHECK(released.request_id == 4);
  CHECK(released.version == 1);
  CHECK(values(released.value) == std::vector<double>{-2, -1});
  cluster.send(1, push(1, 2, 0, {dense(0, f32({0, 1}))}));  // read 0 at version 1: staleness 1
  cluster.send(0, push(0, 3, 1, {dense(0, f32({1, 0}))}));  // read 1 at version 2: staleness 1
  cluster.send(0, pull(5, 0, 3, 0));                         // 3 - 2 <= 1
  auto last = cluster.next_as<ps::PullReply>(0);
  CHECK(last.version == 2);
  CHECK(values(last.value) == std::vector<double>{-3, -2});

  cluster.send(1, goodbye(1));
  cluster.send(0, goodbye(0));
  server.finish(soon());
  const fl::ServerStats stats = server.stats();
  CHECK(stats.updates_applied == 5);
  CHECK(stats.steps == 5);
  CHECK(stats.updates_dropped == 0);
  CHECK(histogram_head(stats, 3) == std::vector<int64_t>{3, 2, 0});
  CHECK(stats.max_staleness == 1);
  CHECK(stats.version == 3);  // once worker 1 left, the slowest live worker had pushed 3
  CHECK(values(server.piece_values()[0]) == std::vector<double>{-3, -2});
}

TEST_CASE("a parked pull past the timeout gets ErrorReply(deadline_exceeded) naming the workers waited for") {
  SUBCASE("sync") {
    Workers cluster(1, 3);
    ps::ServerConfig c = config(3, fl::TrainingMode::sync, sgd(1.0));
    c.timeout = std::chrono::duration<double>(0.2);
    ps::ShardServer server(c, place(1, {{{2}, fl::f32}}), cluster.transport());
    server.seed({f32({0, 0})});
    server.start();
    cluster.send(0, push(0, 1, 0, {dense(0, f32({1, 1}))}));
    const auto asked = Clock::now();
    cluster.send(0, pull(7, 0, 1, 0, 1));
    const ps::Message answer = cluster.next(0, 5s);
    const double waited = std::chrono::duration<double>(Clock::now() - asked).count();
    CHECK(waited >= 0.2);
    CHECK(waited < 2.0);
    expect_error(answer, 7, ps::ErrorCode::deadline_exceeded,
                 {"parameter server 0 (sync)", "worker 0", "version 0", "needs version 1", "waiting for workers 1, 2"});
    CHECK(server.stats().steps == 0);
    // Once nobody is left to push, the pushes already taken make the last step (none is lost).
    for (int w = 0; w < 3; ++w) cluster.send(w, goodbye(w));
    server.finish(soon());
    CHECK(server.stats().steps == 1);
    CHECK(server.stats().updates_applied == 1);
    CHECK(values(server.piece_values()[0]) == std::vector<double>{-1, -1});
  }
  SUBCASE("bounded staleness") {
    Workers cluster(1, 2);
    ps::ServerConfig c = config(2, fl::TrainingMode::bounded_staleness, sgd(1.0));
    c.timeout = std::chrono::duration<double>(0.2);
    ps::ShardServer server(c, place(1, {{{2}, fl::f32}}), cluster.transport());
    server.seed({f32({0, 0})});
    server.start();
    cluster.send(0, push(0, 1, 0, {dense(0, f32({1, 1}))}));
    cluster.send(0, pull(8, 0, 1, 0));  // k = 0: waits for worker 1's first push
    expect_error(cluster.next(0, 5s), 8, ps::ErrorCode::deadline_exceeded,
                 {"parameter server 0 (bounded_staleness k = 0)", "version 0", "waiting for worker 1"});
    cluster.send(0, goodbye(0));
    cluster.send(1, goodbye(1));
    server.finish(soon());
  }
}

TEST_CASE("bad pushes change nothing, count as dropped and are answered with ErrorReply") {
  Workers cluster(1, 2);
  // v0: a [4, 2] table, v1: a [3] vector, v2: an i64 counter nobody can train.
  ps::ShardServer server(config(2, fl::TrainingMode::async, sgd(1.0)),
                         place(1, {{{4, 2}, fl::f32}, {{3}, fl::f32}, {{2}, fl::i64}}), cluster.transport());
  const fl::Tensor table = f32({1, 2, 3, 4, 5, 6, 7, 8}, {4, 2});
  const fl::Tensor vector = f32({1, 2, 3});
  const fl::Tensor counter = fl::tensor(std::vector<int64_t>{5, 6}, fl::Shape{2});
  server.seed({table, vector, counter});
  server.start();

  struct Bad {
    ps::Push push;
    std::string part;
  };
  const fl::Tensor good = f32({1, 1, 1});
  const std::vector<Bad> bad = {
      {push(0, 1, 0, {dense(99, good)}), "variable 99 is not held by this server"},
      {push(0, 1, 0, {dense(1, f32({1, 1}))}), "dense gradient shape [2] differs from the piece's [3]"},
      {push(0, 1, 0, {dense(1, test::make({1, 1, 1}, fl::f64))}), "gradient dtype f64 differs"},
      {push(0, 1, 0, {sparse(0, {4}, f32({1, 1}, {1, 2}))}), "row 4 is outside the piece's rows [0, 4)"},
      {push(0, 1, 0, {sparse(0, {-1}, f32({1, 1}, {1, 2}))}), "row -1 is outside"},
      {push(0, 1, 0, {sparse(0, {1, 1}, f32({1, 1, 1, 1}, {2, 2}))}), "row 1 appears more than once"},
      {push(0, 1, 0, {sparse(0, {0}, f32({1, 1, 1}, {1, 3}))}), "sparse gradient shape [1, 3]"},
      {push(0, 1, 0, {ps::PushEntry{0, test::make({0}, fl::i32), f32({1, 1}, {1, 2})}}), "rows must be an i64 vector"},
      {push(0, 1, 0, {dense(2, fl::tensor(std::vector<int64_t>{1, 1}, fl::Shape{2}))}), "takes no gradient"},
      {push(0, 1, 0, {dense(1, good), dense(99, good)}), "variable 99"},  // the good entry is not applied either
      {push(0, 1, 0, {dense(1, good), dense(1, good)}), "variable 'v1' appears twice"},
      {push(1, 1, 0, {dense(1, good)}), "push from endpoint 1 claims to come from worker 1"},
      {push(0, 1, 5, {dense(1, good)}), "read version 5"},
  };
  for (const Bad& b : bad) {
    CAPTURE(b.part);
    cluster.send(0, b.push);
    expect_error(cluster.next(0), 0, ps::ErrorCode::invalid_argument,
                 {"parameter server 0 (async): dropped a push from worker", b.part});
  }
  // Bad pulls: answered with their request id (they are not updates: nothing is counted).
  cluster.send(0, pull(41, 0, 0, 99));
  expect_error(cluster.next(0), 41, ps::ErrorCode::invalid_argument, {"pull by worker 0: variable 99 is not held"});
  cluster.send(0, sparse_pull(42, 0, 0, {9}));
  expect_error(cluster.next(0), 42, ps::ErrorCode::invalid_argument, {"sparse pull of 'v0'", "row 9 is outside"});
  cluster.send(0, pull(44, 0, -1, 0));
  expect_error(cluster.next(0), 44, ps::ErrorCode::invalid_argument, {"clock must be >= 0; got -1"});
  cluster.send(0, sparse_pull(43, 0, 2, {0}));
  CHECK(std::holds_alternative<ps::PullReply>(cluster.next(0)));  // rows of the i64 counter: readable
  // A push after the worker's goodbye.
  cluster.send(1, goodbye(1));
  cluster.send(1, push(1, 1, 0, {dense(1, good)}));
  expect_error(cluster.next(1), 0, ps::ErrorCode::invalid_argument, {"worker 1 said goodbye"});

  // Nothing changed; the server still works.
  CHECK(server.stats().updates_dropped == static_cast<int64_t>(bad.size()) + 1);
  CHECK(server.stats().updates_applied == 0);
  cluster.send(0, push(0, 1, 0, {dense(1, good)}));
  cluster.send(0, goodbye(0));
  server.finish(soon());
  const std::vector<fl::Tensor> pieces = server.piece_values();
  CHECK(values(pieces[0]) == values(table));
  CHECK(values(pieces[1]) == std::vector<double>{0, 1, 2});  // only the last, good push
  CHECK(values(pieces[2]) == std::vector<double>{5, 6});
  CHECK(server.stats().updates_applied == 1);
  CHECK(server.stats().version == 1);
}

TEST_CASE("malformed bytes are dropped, counted and answered; from a server endpoint they are only counted") {
  Workers cluster(2, 1);  // endpoints: servers 0 and 1, worker 0 at 2
  ps::ShardServer server(config(1, fl::TrainingMode::async, sgd(1.0), 0, 2), place(2, {{{2}, fl::f32}}),
                         cluster.transport());
  server.seed({f32({0, 0})});
  server.start();

  cluster.send_bytes(cluster.endpoint(0), ps::Bytes{std::byte{1}, std::byte{2}, std::byte{3}});
  expect_error(cluster.next(0), 0, ps::ErrorCode::invalid_argument,
               {"parameter server 0 (async): dropped a malformed message from endpoint 2 (worker 0)"});
  // Every truncation of a valid push.
  const ps::Bytes whole = ps::encode(push(0, 1, 0, {dense(0, f32({1, 1}))}));
  for (size_t n = 0; n < whole.size(); ++n) {
    cluster.send_bytes(cluster.endpoint(0), ps::Bytes(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(n)));
    expect_error(cluster.next(0), 0, ps::ErrorCode::invalid_argument, {"malformed message"});
  }
  cluster.send_bytes(1, ps::Bytes{std::byte{0}});  // from server 1: no one to answer
  // Messages a server never takes.
  cluster.send(0, ps::PullReply{5, 0, f32({1})});
  expect_error(cluster.next(0), 0, ps::ErrorCode::invalid_argument, {"dropped a pull_reply"});
  cluster.send(0, goodbye(0));
  server.finish(soon());
  CHECK(cluster.quiet(0, 50ms));
  const fl::ServerStats stats = server.stats();
  CHECK(stats.updates_dropped == static_cast<int64_t>(whole.size()) + 3);
  CHECK(stats.updates_applied == 0);
  CHECK(values(server.piece_values()[0]) == std::vector<double>{0, 0});
}

// ---------------------------------------------------------------------------------------------
// Workers on their own threads, as in a run: exact accounting whatever the interleaving.

namespace {

// Worker w's loop: `steps` times pull (at `clock` steps pushed, waiting for the version after the
// one it read last in sync), then push a gradient of ones computed "from" the version read.
// Returns "" or what went wrong (no assertions off the test's thread).
std::string worker_loop(Workers& cluster, int w, int steps, fl::TrainingMode mode) {
  int64_t read = 0;
  for (int step = 0; step < steps; ++step) {
    const int64_t min_version = mode == fl::TrainingMode::sync && step > 0 ? read + 1 : 0;
    cluster.send(w, pull(static_cast<uint64_t>(step + 1), w, step, 0, min_version));
    std::optional<ps::Message> reply = cluster.take(w);
    if (!reply || !std::holds_alternative<ps::PullReply>(*reply)) {
      return fmt::format("worker {} step {}: {}", w, step,
                         !reply ? std::string("no reply")
                                : std::holds_alternative<ps::ErrorReply>(*reply) ? std::get<ps::ErrorReply>(*reply).message
                                                                                 : ps::message_name(*reply));
    }
    read = std::get<ps::PullReply>(*reply).version;
    cluster.send(w, push(w, step + 1, read, {dense(0, fl::ones({2}))}));
  }
  cluster.send(w, goodbye(w, steps));
  return {};
}

// Runs `workers` worker threads of `steps` steps against one server; returns its stats and value.
std::pair<fl::ServerStats, std::vector<double>> run_threads(ps::ServerConfig c, int steps,
                                                            std::chrono::duration<double> message_delay = {}) {
  const int workers = c.num_workers;
  Workers cluster(1, workers, message_delay);
  ps::ShardServer server(c, place(1, {{{2}, fl::f32}}), cluster.transport());
  server.seed({fl::zeros({2})});
  server.start();
  std::vector<std::string> errors(static_cast<size_t>(workers));
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] { errors[static_cast<size_t>(w)] = worker_loop(cluster, w, steps, c.mode); });
  }
  for (std::thread& t : threads) t.join();
  for (const std::string& error : errors) CHECK_MESSAGE(error.empty(), error);
  server.finish(soon());
  return {server.stats(), values(server.piece_values()[0])};
}

int64_t sum(const std::vector<int64_t>& v) {
  int64_t total = 0;
  for (int64_t x : v) total += x;
  return total;
}

}  // namespace

TEST_CASE("threads, async: every push applied exactly once") {
  const auto [stats, value] = run_threads(config(4, fl::TrainingMode::async, sgd(1.0)), 50);
  CHECK(stats.updates_applied == 200);
  CHECK(stats.updates_dropped == 0);
  CHECK(stats.version == 200);
  CHECK(sum(stats.staleness_histogram) == 200);
  CHECK(value == std::vector<double>{-200, -200});  // lr 1 x 200 gradients of ones
}

TEST_CASE("threads, sync with a backup: each step moves by one mean; applied + dropped = pushed") {
  ps::ServerConfig c = config(4, fl::TrainingMode::sync, sgd(1.0));
  c.backup_workers = 1;
  const auto [stats, value] = run_threads(c, 30);
  CHECK(stats.updates_applied + stats.updates_dropped == 120);
  CHECK(stats.steps >= 30);
  CHECK(stats.version == stats.steps);
  CHECK(value == std::vector<double>{-static_cast<double>(stats.steps), -static_cast<double>(stats.steps)});
  CHECK(stats.staleness_histogram[0] == stats.updates_applied);
}

TEST_CASE("threads, bounded staleness k = 2: every push applied, none staler than 2") {
  ps::ServerConfig c = config(3, fl::TrainingMode::bounded_staleness, sgd(1.0));
  c.staleness = 2;
  const auto [stats, value] = run_threads(c, 40);
  CHECK(stats.updates_applied == 120);
  CHECK(stats.updates_dropped == 0);
  CHECK(stats.max_staleness <= 2);
  CHECK(sum(stats.staleness_histogram) == 120);
  CHECK(value == std::vector<double>{-120, -120});
}

TEST_CASE("threads over a transport that delays every message 1 ms (a delivery thread per endpoint)") {
  SUBCASE("async") {
    const auto [stats, value] = run_threads(config(3, fl::TrainingMode::async, sgd(1.0)), 20, 1ms);
    CHECK(stats.updates_applied == 60);
    CHECK(value == std::vector<double>{-60, -60});
  }
  SUBCASE("sync with a backup") {
    ps::ServerConfig c = config(3, fl::TrainingMode::sync, sgd(1.0));
    c.backup_workers = 1;
    const auto [stats, value] = run_threads(c, 20, 1ms);
    CHECK(stats.updates_applied + stats.updates_dropped == 60);
    CHECK(value == std::vector<double>{-static_cast<double>(stats.steps), -static_cast<double>(stats.steps)});
  }
  SUBCASE("bounded staleness k = 1") {
    ps::ServerConfig c = config(3, fl::TrainingMode::bounded_staleness, sgd(1.0));
    c.staleness = 1;
    const auto [stats, value] = run_threads(c, 20, 1ms);
    CHECK(stats.updates_applied == 60);
    CHECK(stats.max_staleness <= 1);
    CHECK(value == std::vector<double>{-60, -60});
  }
}

TEST_CASE("fuzz: 500 pushes with random bytes changed never crash the server, which keeps serving") {
  Workers cluster(1, 2);
  ps::ShardServer server(config(2, fl::TrainingMode::async, sgd(1.0)), place(1, {{{4, 2}, fl::f32}}),
                         cluster.transport());
  server.seed({fl::zeros({4, 2})});
  server.start();
  const ps::Bytes valid = ps::encode(push(0, 1, 0, {sparse(0, {1, 3}, f32({1, 2, 3, 4}, {2, 2}))}));
  std::mt19937 rng(13);
  for (int i = 0; i < 500; ++i) {
    ps::Bytes bytes = valid;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f) bytes[rng() % bytes.size()] = static_cast<std::byte>(rng() & 0xff);
    cluster.send_bytes(cluster.endpoint(0), std::move(bytes));
  }
  // Worker 1 is served as before.
  cluster.send(1, pull(1, 1, 0, 0));
  CHECK(std::holds_alternative<ps::PullReply>(cluster.next(1)));
  cluster.send(0, goodbye(0));
  cluster.send(1, goodbye(1));
  server.finish(soon());
  const fl::ServerStats stats = server.stats();
  CHECK(stats.updates_applied + stats.updates_dropped <= 500);
  CHECK(stats.updates_dropped > 0);
  CHECK(stats.messages_received == 503);
}

// ---------------------------------------------------------------------------------------------
// Sparse updates: only the touched rows of the variable and of its slots change.

namespace {

// Runs `pushes` (sparse, in order, async) on a [5, 3] table and returns the server's piece and the
// optimizer's state (iterations first, then the slots), read after finish().
struct SparseRun {
  std::vector<double> table;
  std::vector<std::vector<double>> state;
  std::vector<std::string> state_names;
};
SparseRun run_sparse(std::function<std::unique_ptr<fl::optim::Optimizer>()> optimizer,
                     const std::vector<double>& initial, const std::vector<ps::PushEntry>& pushes) {
  Workers cluster(1, 1);
  ps::ShardServer server(config(1, fl::TrainingMode::async, std::move(optimizer)), place(1, {{{5, 3}, fl::f32}}),
                         cluster.transport());
  server.seed({f32(initial, {5, 3})});
  server.start();
  int64_t version = 0;
  for (const ps::PushEntry& entry : pushes) {
    cluster.send(0, push(0, version + 1, version, {entry}));
    ++version;
  }
  cluster.send(0, goodbye(0));
  server.finish(soon());
  SparseRun run;
  run.table = values(server.piece_values()[0]);
  for (const fl::Variable& v : server.optimizer(0)->variables()) {
    run.state.push_back(values(v.value()));
    run.state_names.push_back(v.name());
  }
  CHECK(server.stats().updates_applied == static_cast<int64_t>(pushes.size()));
  return run;
}

const std::vector<double> kTable = {0.5, -1, 2, 1.5, 0.25, -3, 4, 1, -0.5, 2.5, -2, 0.75, 3, 3.5, -1.25};

void check_close(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i] == doctest::Approx(want[i]).epsilon(tol));
  }
}

}  // namespace

TEST_CASE("sparse SGD with momentum: only touched rows and their velocity change (host arithmetic)") {
  const std::vector<ps::PushEntry> pushes = {sparse(0, {3, 0}, f32({1, 2, 3, 4, 5, 6}, {2, 3})),
                                             sparse(0, {0, 1}, f32({1, 1, 1, 2, 2, 2}, {2, 3}))};
  const SparseRun run = run_sparse(sgd(0.1, 0.9), kTable, pushes);
  // Host: velocity per row, only for the rows a push names.
  std::vector<double> w = kTable, velocity(15, 0);
  auto step = [&](int64_t row, const std::vector<double>& g) {
    for (int c = 0; c < 3; ++c) {
      double& v = velocity[static_cast<size_t>(row * 3 + c)];
      v = 0.9 * v + g[static_cast<size_t>(c)];
      w[static_cast<size_t>(row * 3 + c)] -= 0.1 * v;
    }
  };
  step(3, {1, 2, 3});
  step(0, {4, 5, 6});
  step(0, {1, 1, 1});
  step(1, {2, 2, 2});
  check_close(run.table, w, 1e-6);
  for (int c = 0; c < 3; ++c) {  // rows 2 and 4 bit for bit
    CHECK(run.table[6 + c] == kTable[6 + c]);
    CHECK(run.table[12 + c] == kTable[12 + c]);
  }
  REQUIRE(run.state.size() == 2);  // the counter and the one velocity slot: no stand-in left behind
  CHECK(run.state[0] == std::vector<double>{2});
  CHECK(run.state_names[1] == "sgd/v0/momentum");
  check_close(run.state[1], velocity, 1e-6);
}

TEST_CASE("sparse Adam: touched rows and their moments follow Adam's formulas; the rest stays") {
  const std::vector<ps::PushEntry> pushes = {sparse(0, {3, 0}, f32({1, 2, 3, 4, 5, 6}, {2, 3})),
                                             sparse(0, {0, 1}, f32({1, -1, 1, 2, 2, -2}, {2, 3}))};
  const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-7;
  const SparseRun run = run_sparse([=] { return std::make_unique<fl::optim::Adam>(lr, b1, b2, eps); }, kTable, pushes);
  std::vector<double> w = kTable, m(15, 0), v(15, 0);
  auto step = [&](int t, int64_t row, const std::vector<double>& g) {
    const double corrected = lr * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t));
    for (int c = 0; c < 3; ++c) {
      const auto i = static_cast<size_t>(row * 3 + c);
      m[i] = b1 * m[i] + (1 - b1) * g[static_cast<size_t>(c)];
      v[i] = b2 * v[i] + (1 - b2) * g[static_cast<size_t>(c)] * g[static_cast<size_t>(c)];
      w[i] -= corrected * m[i] / (std::sqrt(v[i]) + eps);
    }
  };
  step(1, 3, {1, 2, 3});
  step(1, 0, {4, 5, 6});
  step(2, 0, {1, -1, 1});
  step(2, 1, {2, 2, -2});
  check_close(run.table, w, 1e-5);
  for (int c = 0; c < 3; ++c) {
    CHECK(run.table[6 + c] == kTable[6 + c]);
    CHECK(run.table[12 + c] == kTable[12 + c]);
  }
  REQUIRE(run.state.size() == 3);
  CHECK(run.state[0] == std::vector<double>{2});
  check_close(run.state[1], m, 1e-5);
  check_close(run.state[2], v, 1e-5);
  CHECK(run.state[1][6] == 0);  // row 2's moments were never touched
  CHECK(run.state[2][14] == 0);
}

TEST_CASE("sparse Adam over every row equals dense Adam on the same gradient") {
  const fl::Tensor grad_rows = f32({1, 2, 3, 4, 5, 6, -1, -2, -3, 0.5, 0.5, 0.5, 2, 0, -2}, {5, 3});
  // Rows in another order: [4, 2, 0, 1, 3] takes grad rows in that order.
  const std::vector<int64_t> order = {4, 2, 0, 1, 3};
  const fl::Tensor permuted = fl::gather(grad_rows, fl::tensor(order, fl::Shape{5}));
  const SparseRun run = run_sparse([] { return std::make_unique<fl::optim::Adam>(0.01); }, kTable,
                                   {sparse(0, order, permuted), sparse(0, order, permuted)});
  fl::Variable dense_var(f32(kTable, {5, 3}), "v0");
  fl::optim::Adam dense_adam(0.01);
  dense_adam.apply({grad_rows}, {dense_var});
  dense_adam.apply({grad_rows}, {dense_var});
  check_close(run.table, values(dense_var.value()), 1e-6);
}

TEST_CASE("sparse updates with a user optimizer whose slot is made on first use") {
  // Accumulates gradients in a slot that slot_names() does not list: update() makes it lazily.
  class Accumulate : public fl::optim::Optimizer {
   public:
    Accumulate() : Optimizer("accumulate") {}

   protected:
    void update(fl::Variable& var, const fl::Tensor& grad) override {
      fl::Variable& sum = slot(var, "sum");
      sum.assign(sum.value() + grad);
      var.assign_sub(sum.value());
    }
  };
  const SparseRun run =
      run_sparse([] { return std::make_unique<Accumulate>(); }, std::vector<double>(15, 0),
                 {sparse(0, {1}, f32({1, 2, 3}, {1, 3})), sparse(0, {1, 4}, f32({1, 1, 1, 5, 5, 5}, {2, 3}))});
  // Row 1: sum 1,2,3 then 2,3,4: w = -(1+2), -(2+3), -(3+4); row 4: sum 5: w = -5.
  CHECK(run.table == std::vector<double>{0, 0, 0, -3, -5, -7, 0, 0, 0, 0, 0, 0, -5, -5, -5});
  REQUIRE(run.state.size() == 2);
  CHECK(run.state_names[1] == "accumulate/v0/sum");
  CHECK(run.state[1] == std::vector<double>{0, 0, 0, 2, 3, 4, 0, 0, 0, 0, 0, 0, 5, 5, 5});
}

TEST_CASE("apply_sparse: a bad call or an update that throws changes nothing and leaves no stand-in behind") {
  class Throws : public fl::optim::Optimizer {
   public:
    Throws() : Optimizer("throws") {}

   protected:
    void update(fl::Variable& var, const fl::Tensor& grad) override {
      slot(var, "lazy");      // a slot made for the stand-in ...
      var.assign_sub(grad);   // ... and the stand-in changed, before the failure
      throw fl::OutOfRange("throws: refused");
    }
  };
  Throws optimizer;
  fl::Variable table(fl::zeros({4, 2}), "t");
  const fl::Tensor one_row = fl::tensor(std::vector<int64_t>{1}, fl::Shape{1});
  using fl::detail::OptimizerAccess;
  test::check_throws<fl::OutOfRange>(
      [&] { OptimizerAccess::apply_sparse(optimizer, table, one_row, fl::ones({1, 2})); }, {"throws: refused"});
  CHECK(optimizer.variables().size() == 1);  // the counter only
  CHECK(optimizer.iterations().value().item<int64_t>() == 0);
  CHECK(values(table.value()) == std::vector<double>(8, 0.0));

  const std::string op = "OptimizerAccess::apply_sparse";
  fl::optim::SGD sgd_optimizer(1.0);
  test::check_op_throws<fl::InvalidArgument>(op, [&] {
    OptimizerAccess::apply_sparse(sgd_optimizer, table, fl::tensor(std::vector<int64_t>{2, 2}, fl::Shape{2}),
                                  fl::ones({2, 2}));
  }, {"rows of 't' repeat"});
  test::check_op_throws<fl::OutOfRange>(op, [&] {
    OptimizerAccess::apply_sparse(sgd_optimizer, table, fl::tensor(std::vector<int64_t>{4}, fl::Shape{1}),
                                  fl::ones({1, 2}));
  }, {"row 4 of 't' is outside [0, 4)"});
  test::check_op_throws<fl::ShapeError>(op, [&] {
    OptimizerAccess::apply_sparse(sgd_optimizer, table, one_row, fl::ones({2, 2}));
  }, {"must have shape [1, 2]; got [2, 2]"});
  test::check_op_throws<fl::DTypeError>(op, [&] {
    OptimizerAccess::apply_sparse(sgd_optimizer, table, one_row, fl::ones({1, 2}, fl::f64));
  }, {"must be f32; got f64"});
  fl::Variable scalar(fl::zeros({}), "s");
  test::check_op_throws<fl::InvalidArgument>(op, [&] {
    OptimizerAccess::apply_sparse(sgd_optimizer, scalar, one_row, fl::ones({1}));
  }, {"'s' is a scalar"});
  CHECK(sgd_optimizer.iterations().value().item<int64_t>() == 0);
  CHECK(values(table.value()) == std::vector<double>(8, 0.0));
}

TEST_CASE("write_rows writes in place when the buffer is private and copies when a reader holds it") {
  fl::Variable table(f32({0, 0, 0, 0, 0, 0}, {3, 2}), "t");
  const void* before = table.value().raw_data();
  fl::detail::write_rows(table, fl::tensor(std::vector<int64_t>{2, 0}, fl::Shape{2}), f32({5, 6, 1, 2}, {2, 2}));
  CHECK(table.value().raw_data() == before);  // in place
  CHECK(values(table.value()) == std::vector<double>{1, 2, 0, 0, 5, 6});
  const fl::Tensor held = table.value();
  fl::detail::write_rows(table, fl::tensor(std::vector<int64_t>{1}, fl::Shape{1}), f32({7, 7}, {1, 2}));
  CHECK(values(held) == std::vector<double>{1, 2, 0, 0, 5, 6});  // the reader keeps its values
  CHECK(values(table.value()) == std::vector<double>{1, 2, 7, 7, 5, 6});
  test::check_throws<fl::OutOfRange>(
      [&] { fl::detail::write_rows(table, fl::tensor(std::vector<int64_t>{3}, fl::Shape{1}), f32({1, 1}, {1, 2})); },
      {"write_rows", "row 3", "[0, 3)"});
  test::check_throws<fl::ShapeError>(
      [&] { fl::detail::write_rows(table, fl::tensor(std::vector<int64_t>{0}, fl::Shape{1}), f32({1, 1, 1}, {1, 3})); },
      {"write_rows", "[1, 2]"});
  CHECK(values(table.value()) == std::vector<double>{1, 2, 7, 7, 5, 6});
}

TEST_CASE("a sparse push on a large table costs its rows, not the table: written in place, small peak memory; "
          "a sparse pull moves only its rows") {
  const int64_t rows = 100000, width = 64, n = 512;
  const int64_t table_bytes = rows * width * 4;
  Workers cluster(1, 1);
  ps::ShardServer server(config(1, fl::TrainingMode::async, [] { return std::make_unique<fl::optim::Adam>(0.01); }),
                         place(1, {{{rows, width}, fl::f32}}), cluster.transport());
  server.seed({fl::zeros({rows, width})});
  const void* buffer = server.piece_values()[0].raw_data();
  server.start();
  std::vector<int64_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = (i * 7919) % rows;  // distinct, spread out
  const fl::Tensor grad = fl::ones({n, width});
  // The first push makes Adam's two slots (whole tables, once); the second is the steady state.
  cluster.send(0, push(0, 1, 0, {sparse(0, ids, grad)}));
  cluster.send(0, sparse_pull(1, 0, 0, ids));
  const auto first = cluster.next_as<ps::PullReply>(0);
  const fl::Device cpu("cpu:0");
  const int64_t in_use = fl::memory_stats(cpu).bytes_in_use;
  fl::reset_peak_memory_stats(cpu);
  cluster.send(0, push(0, 2, 1, {sparse(0, ids, grad)}));
  cluster.send(0, sparse_pull(2, 0, 0, ids));
  const auto second = cluster.next_as<ps::PullReply>(0);
  const int64_t peak = fl::memory_stats(cpu).peak_bytes_in_use - in_use;
  CHECK_MESSAGE(peak < table_bytes / 4, "a sparse step raised the peak by " << peak << " bytes");
  CHECK(second.value.shape() == fl::Shape{n, width});
  cluster.send(0, goodbye(0));
  server.finish(soon());

  const fl::Tensor table = server.piece_values()[0];
  CHECK(table.raw_data() == buffer);  // never replaced by a copy
  // Two Adam steps with g = 1 on the touched rows: each moves by lr * m_hat / (sqrt(v_hat) + eps),
  // which is lr to within eps / sqrt(v) ~ 3e-6 of it.
  const float* w = table.data<float>();
  const double expected = -2 * 0.01;
  CHECK(w[ids[5] * width + 3] == doctest::Approx(expected).epsilon(1e-4));
  CHECK(test::values(second.value)[7] == doctest::Approx(expected).epsilon(1e-4));
  int64_t untouched = 0;
  for (int64_t i = 0; i < rows * width; ++i) untouched += w[i] == 0.0f ? 1 : 0;
  CHECK(untouched == (rows - n) * width);
  // Bytes: two replies of n rows each (plus a small header), nothing of the table.
  const fl::ServerStats stats = server.stats();
  CHECK(stats.bytes_sent == static_cast<int64_t>(ps::encode(first).size() + ps::encode(second).size()));
  CHECK(stats.bytes_sent < 2 * (n * width * 4 + 128));
}

// ---------------------------------------------------------------------------------------------

TEST_CASE("a variable split by rows over two servers: each holds, serves and updates its rows") {
  Workers cluster(2, 1);
  // v0 [5, 2] split: server 0 rows [0, 3), server 1 rows [3, 5); v1 [2] whole on server 0.
  const auto placements = place(2, {{{5, 2}, fl::f32}, {{2}, fl::f32}}, /*min_bytes_to_split=*/16);
  REQUIRE(placements[0].pieces.size() == 2);
  REQUIRE(placements[1].pieces.size() == 1);
  ps::ShardServer s0(config(1, fl::TrainingMode::async, sgd(1.0), 0, 2), placements, cluster.transport());
  ps::ShardServer s1(config(1, fl::TrainingMode::async, sgd(1.0), 1, 2), placements, cluster.transport());
  const fl::Tensor table = f32({0, 1, 10, 11, 20, 21, 30, 31, 40, 41}, {5, 2});
  s0.seed({table, f32({7, 8})});
  s1.seed({table, f32({7, 8})});
  s0.start();
  s1.start();

  cluster.send(0, pull(1, 0, 0, 0), 0);
  CHECK(values(cluster.next_as<ps::PullReply>(0).value) == std::vector<double>{0, 1, 10, 11, 20, 21});
  cluster.send(0, pull(2, 0, 0, 0), 1);
  CHECK(values(cluster.next_as<ps::PullReply>(0).value) == std::vector<double>{30, 31, 40, 41});
  cluster.send(0, sparse_pull(3, 0, 0, {1, 0, 1}), 1);  // local rows: global 4, 3, 4
  auto rows = cluster.next_as<ps::PullReply>(0);
  CHECK(rows.value.shape() == fl::Shape{3, 2});
  CHECK(values(rows.value) == std::vector<double>{40, 41, 30, 31, 40, 41});
  cluster.send(0, pull(4, 0, 0, 1), 1);  // v1 lives on server 0 only
  expect_error(cluster.next(0), 4, ps::ErrorCode::invalid_argument, {"parameter server 1", "variable 1 is not held"});

  cluster.send(0, push(0, 1, 0, {dense(0, f32({1, 1, 1, 1, 1, 1}, {3, 2})), dense(1, f32({1, 2}))}), 0);
  cluster.send(0, push(0, 1, 0, {sparse(0, {1}, f32({5, 5}, {1, 2}))}), 1);
  cluster.send(0, goodbye(0), 0);
  cluster.send(0, goodbye(0), 1);
  s0.finish(soon());
  s1.finish(soon());
  const auto p0 = s0.piece_values();
  const auto p1 = s1.piece_values();
  CHECK(values(p0[0]) == std::vector<double>{-1, 0, 9, 10, 19, 20});
  CHECK(values(p0[1]) == std::vector<double>{6, 6});
  CHECK(values(p1[0]) == std::vector<double>{30, 31, 35, 36});
  CHECK_FALSE(p1[1].defined());
  CHECK(s1.optimizer(1) == nullptr);
  CHECK(s0.stats().updates_applied == 1);
  CHECK(s1.stats().updates_applied == 1);
}

TEST_CASE("seeding again keeps each piece's optimizer and slots; counters restart, the version goes on") {
  Workers cluster(1, 1);
  ps::ShardServer server(config(1, fl::TrainingMode::async, sgd(1.0, 0.5)), place(1, {{{2}, fl::f32}}),
                         cluster.transport());
  server.seed({f32({0, 0})});
  const fl::optim::Optimizer* optimizer = server.optimizer(0);
  REQUIRE(optimizer != nullptr);
  server.start();
  cluster.send(0, push(0, 1, 0, {dense(0, f32({2, 4}))}));  // velocity 2, 4
  cluster.send(0, goodbye(0));
  server.finish(soon());
  CHECK(values(server.piece_values()[0]) == std::vector<double>{-2, -4});
  test::check_throws<fl::InvalidArgument>([&] { server.start(); }, {"ShardServer::start", "seed"});

  server.seed({f32({10, 10})});
  CHECK(server.optimizer(0) == optimizer);
  CHECK(server.stats().updates_applied == 0);
  CHECK(server.stats().version == 1);
  server.start();
  cluster.send(0, push(0, 1, 1, {dense(0, f32({2, 2}))}));  // velocity 0.5 * (2, 4) + (2, 2) = (3, 4)
  cluster.send(0, goodbye(0));
  server.finish(soon());
  CHECK(values(server.piece_values()[0]) == std::vector<double>{7, 6});
  CHECK(server.stats().updates_applied == 1);
  CHECK(server.stats().version == 2);
  CHECK(histogram_head(server.stats(), 1) == std::vector<int64_t>{1});
  CHECK(optimizer->iterations().value().item<int64_t>() == 2);
}

TEST_CASE("finish(): a deadline error names the workers that did not say goodbye") {
  Workers cluster(1, 3);
  ps::ShardServer server(config(3, fl::TrainingMode::async, sgd(1.0)), place(1, {{{2}, fl::f32}}),
                         cluster.transport());
  server.seed({f32({0, 0})});
  server.start();
  cluster.send(1, goodbye(1));
  const auto began = Clock::now();
  test::check_throws<fl::DeadlineExceeded>([&] { server.finish(soon(0.1s)); },
                                           {"ShardServer::finish", "parameter server 0 (async)",
                                            "workers 0, 2 did not say goodbye"});
  CHECK(std::chrono::duration<double>(Clock::now() - began).count() < 2.0);
  CHECK(values(server.piece_values()[0]) == std::vector<double>{0, 0});
  // Finished: messages now are dropped by the transport, and finishing again does nothing.
  cluster.send(0, pull(1, 0, 0, 0));
  CHECK(cluster.quiet(0, 100ms));
  server.finish(soon());
}

TEST_CASE("an optimizer that throws: the push is dropped and answered, finish() rethrows the error") {
  class Broken : public fl::optim::Optimizer {
   public:
    Broken() : Optimizer("broken") {}

   protected:
    void update(fl::Variable&, const fl::Tensor&) override { throw fl::OutOfRange("broken: update refused"); }
  };
  Workers cluster(1, 1);
  ps::ShardServer server(config(1, fl::TrainingMode::async, [] { return std::make_unique<Broken>(); }),
                         place(1, {{{2}, fl::f32}}), cluster.transport());
  server.seed({f32({1, 1})});
  server.start();
  cluster.send(0, push(0, 1, 0, {dense(0, f32({1, 1}))}));
  expect_error(cluster.next(0), 0, ps::ErrorCode::internal, {"applying a push failed", "broken: update refused"});
  cluster.send(0, goodbye(0));
  test::check_throws<fl::OutOfRange>([&] { server.finish(soon()); }, {"broken: update refused"});
  CHECK(server.stats().updates_dropped == 1);
  CHECK(server.stats().updates_applied == 0);
  CHECK(server.stats().version == 0);
  CHECK(values(server.piece_values()[0]) == std::vector<double>{1, 1});
}

TEST_CASE("configuration and seeding errors") {
  Workers cluster(1, 2);
  const auto placements = place(1, {{{2, 2}, fl::f32}});
  auto make = [&](ps::ServerConfig c) { ps::ShardServer server(std::move(c), placements, cluster.transport()); };
  test::check_throws<fl::InvalidArgument>([&] { make(config(0, fl::TrainingMode::async, sgd(1))); },
                                          {"ShardServer", "num_workers"});
  test::check_throws<fl::InvalidArgument>([&] { make(config(2, fl::TrainingMode::async, sgd(1), 1, 1)); },
                                          {"ShardServer", "server 1 of 1"});
  test::check_throws<fl::InvalidArgument>([&] { make(config(2, fl::TrainingMode::async, nullptr)); },
                                          {"ShardServer", "make_optimizer"});
  test::check_throws<fl::InvalidArgument>([&] { make(config(5, fl::TrainingMode::async, sgd(1))); },
                                          {"ShardServer", "3 endpoints", "need 6"});
  auto backups = config(2, fl::TrainingMode::sync, sgd(1));
  backups.backup_workers = 2;
  test::check_throws<fl::InvalidArgument>([&] { make(backups); }, {"backup_workers", "got 2 with 2 workers"});
  auto stale = config(2, fl::TrainingMode::bounded_staleness, sgd(1));
  stale.staleness = -1;
  test::check_throws<fl::InvalidArgument>([&] { make(stale); }, {"staleness", "-1"});

  ps::ShardServer server(config(2, fl::TrainingMode::async, sgd(1)), placements, cluster.transport());
  test::check_throws<fl::InvalidArgument>([&] { server.start(); }, {"not seeded"});
  test::check_throws<fl::InvalidArgument>([&] { server.seed({}); }, {"ShardServer::seed", "got 0 values for 1"});
  test::check_throws<fl::ShapeError>([&] { server.seed({fl::zeros({3, 2})}); }, {"'v0'", "[2, 2]", "[3, 2]"});
  test::check_throws<fl::DTypeError>([&] { server.seed({fl::zeros({2, 2}, fl::f64)}); }, {"'v0'", "f32", "f64"});
  CHECK(server.optimizer(0) == nullptr);  // a failed seed made nothing
  server.seed({fl::zeros({2, 2})});
  server.start();
  test::check_throws<fl::InvalidArgument>([&] { server.seed({fl::zeros({2, 2})}); }, {"is running"});
  test::check_throws<fl::InvalidArgument>([&] { server.start(); }, {"already running"});
  test::check_throws<fl::InvalidArgument>([&] { (void)server.piece_values(); }, {"after finish()"});
  cluster.send(0, goodbye(0));
  cluster.send(1, goodbye(1));
  server.finish(soon());
}
