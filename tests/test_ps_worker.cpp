// The parameter-server worker: WorkerClient against fake servers, the ps ops, and ServerVariables.
//
// A FakeCluster attaches a handler on each server endpoint of an in-memory transport that decodes
// every request (recording it) and answers pulls from tables held here, at a version the test sets,
// or with a scripted reply (an error, silence). So every figure the client produces (assembled
// values, request fields, cut gradients, versions, clocks, counters) is compared with values
// computed here from the tables and the placements, not by the code under test.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "flowlet/trace.hpp"
#include "ps/ops/server_variables.hpp"
#include "ps/sharding.hpp"
#include "ps/transport/transport.hpp"
#include "ps/wire/messages.hpp"
#include "ps/worker/worker_client.hpp"
#include "runtime/thread_pool.hpp"
#include "state/mirrored_variable.hpp"
#include "support/reference.hpp"

namespace fd = flowlet::detail;
namespace ps = flowlet::detail::ps;
using Clock = std::chrono::steady_clock;

namespace {

// Two threads (one pool worker besides the caller), whatever the environment says, before the pool
// starts: the budget where one worker's step delay holding a pool thread would stall another
// in-process worker ("a straggler's delay in a traced step holds no pool thread").
const bool threads_configured = [] { return setenv("FLOWLET_NUM_THREADS", "2", /*overwrite=*/1) == 0; }();

const bool devices_ready = (fl::set_logical_cpu_devices(4), true);

// `t` holds `want` (row-major) with shape `shape`, in its own dtype.
bool same(const fl::Tensor& t, const std::vector<double>& want, const fl::Shape& shape,
          std::source_location loc = std::source_location::current()) {
  return test::check_tensor(t, want, shape, t.dtype(), std::nullopt, loc);
}

// Distinct values: element i of a table made by table_values(base, n) is base + i.
fl::Tensor table(const fl::Shape& shape, double base) {
  std::vector<double> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = base + static_cast<double>(i);
  return test::make(v, shape);
}

// Servers that answer from `tables` (one per variable id, the whole variable) and record every
// request they get.
class FakeCluster {
 public:
  // How a server answers one request: nullopt for the default answer; a message to send instead.
  using Script = std::function<std::optional<ps::Message>(int server, const ps::Message& request)>;

  FakeCluster(int servers, int workers, std::vector<ps::VariablePlacement> placements, std::vector<fl::Tensor> tables,
              double message_delay = 0)
      : servers_(servers),
        placements_(std::move(placements)),
        tables_(std::move(tables)),
        transport_(ps::make_in_memory_transport(servers + workers, std::chrono::duration<double>(message_delay))),
        got_(static_cast<size_t>(servers)),
        versions_(static_cast<size_t>(servers), 0) {
    (void)devices_ready;
    for (int s = 0; s < servers; ++s) {
      transport_->attach(s, [this, s](int from, ps::Bytes bytes) { handle(s, from, std::move(bytes)); });
    }
  }
  ~FakeCluster() {
    for (int s = 0; s < servers_; ++s) transport_->detach(s);
  }

  ps::Transport& transport() { return *transport_; }
  void set_version(int server, int64_t version) {
    std::lock_guard lock(mutex_);
    versions_[static_cast<size_t>(server)] = version;
  }
  void set_script(Script script) {
    std::lock_guard lock(mutex_);
    script_ = std::move(script);
  }
  std::vector<ps::Message> received(int server) {
    std::lock_guard lock(mutex_);
    return got_[static_cast<size_t>(server)];
  }
  template <class T>
  std::vector<T> received_of(int server) {
    std::vector<T> out;
    for (const ps::Message& m : received(server)) {
      if (const T* t = std::get_if<T>(&m)) out.push_back(*t);
    }
    return out;
  }

 private:
  void handle(int server, int from, ps::Bytes bytes) {
    const ps::Message request = ps::decode(bytes);
    Script script;
    int64_t version = 0;
    {
      std::lock_guard lock(mutex_);
      got_[static_cast<size_t>(server)].push_back(request);
      script = script_;
      version = versions_[static_cast<size_t>(server)];
    }
    std::optional<ps::Message> reply;
    if (script) reply = script(server, request);
    if (!reply) reply = answer(server, request, version);
    if (reply) transport_->send(server, from, ps::encode(*reply));
  }

  std::optional<ps::Message> answer(int server, const ps::Message& request, int64_t version) {
    if (const auto* pull = std::get_if<ps::PullRequest>(&request)) {
      const ps::VariablePlacement& p = placements_[static_cast<size_t>(pull->var_id)];
      const ps::ShardPiece* piece = p.piece_on(server);
      const fl::Tensor& t = tables_[static_cast<size_t>(pull->var_id)];
      fl::Tensor value = p.shape.rank() == 0 ? t : fl::slice(t, 0, piece->row_begin, piece->rows()).contiguous();
      return ps::PullReply{pull->request_id, version, value};
    }
    if (const auto* pull = std::get_if<ps::SparsePullRequest>(&request)) {
      const ps::VariablePlacement& p = placements_[static_cast<size_t>(pull->var_id)];
      const ps::ShardPiece* piece = p.piece_on(server);
      const fl::Tensor& t = tables_[static_cast<size_t>(pull->var_id)];
      fl::Tensor mine = fl::slice(t, 0, piece->row_begin, piece->rows());
      return ps::PullReply{pull->request_id, version, fl::gather(mine, pull->rows).contiguous()};
    }
    return std::nullopt;  // pushes and goodbyes get no answer
  }

  int servers_;
  std::vector<ps::VariablePlacement> placements_;
  std::vector<fl::Tensor> tables_;
  std::unique_ptr<ps::Transport> transport_;
  std::mutex mutex_;
  std::vector<std::vector<ps::Message>> got_;
  std::vector<int64_t> versions_;
  Script script_;
};

// Placements made as the strategy makes them.
std::vector<ps::VariablePlacement> place(int servers, const std::vector<std::pair<std::string, fl::Shape>>& vars,
                                         int64_t min_bytes_to_split = 1 << 20) {
  ps::Placer placer(servers, fl::ShardingPolicy{min_bytes_to_split, 0});
  std::vector<ps::VariablePlacement> out;
  for (size_t i = 0; i < vars.size(); ++i) {
    out.push_back(placer.place(static_cast<int32_t>(i), vars[i].first, vars[i].second, fl::f32));
  }
  return out;
}

ps::WorkerConfig config(int servers, int workers = 1, int worker = 0, double timeout = 20) {
  ps::WorkerConfig c;
  c.worker = worker;
  c.num_servers = servers;
  c.num_workers = workers;
  c.timeout = std::chrono::duration<double>(timeout);
  c.device = fl::Device("cpu:0");
  return c;
}

// A pull's outcome, waited for.
struct Result {
  fl::Tensor value;
  std::exception_ptr error;
};
template <class Start>
Result wait(Start start) {
  auto promise = std::make_shared<std::promise<Result>>();
  auto future = promise->get_future();
  start([promise](fl::Tensor v, std::exception_ptr e) { promise->set_value(Result{std::move(v), std::move(e)}); });
  REQUIRE(future.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
  return future.get();
}
Result pull(ps::WorkerClient& c, int32_t id) {
  return wait([&](ps::WorkerClient::Done d) { c.pull(id, std::move(d)); });
}
Result pull_rows(ps::WorkerClient& c, int32_t id, const std::vector<int64_t>& ids) {
  const fl::Tensor t = fl::tensor(ids, fl::Shape{static_cast<int64_t>(ids.size())});
  return wait([&](ps::WorkerClient::Done d) { c.pull_rows(id, t, std::move(d)); });
}
void rethrow(const Result& r) {
  if (r.error) std::rethrow_exception(r.error);
}

}  // namespace

TEST_CASE("pull: a variable placed whole comes from its one server") {
  // Two small variables: round-robin, "a" on server 0 and "b" on server 1.
  const auto placements = place(2, {{"a", {3}}, {"b", {2, 3}}});
  REQUIRE(placements[1].pieces.size() == 1);
  CHECK(placements[1].pieces[0].server == 1);
  FakeCluster cluster(2, 1, placements, {table({3}, 10), table({2, 3}, 100)});
  cluster.set_version(1, 7);
  ps::WorkerClient client(config(2), placements, cluster.transport());
  client.start();
  const Result r = pull(client, 1);
  REQUIRE_FALSE(r.error);
  CHECK(same(r.value, {100, 101, 102, 103, 104, 105}, {2, 3}));
  CHECK(r.value.device() == fl::Device("cpu:0"));
  const auto requests = cluster.received_of<ps::PullRequest>(1);
  REQUIRE(requests.size() == 1);
  CHECK(requests[0].worker == 0);
  CHECK(requests[0].var_id == 1);
  CHECK(requests[0].clock == 0);
  CHECK(requests[0].min_version == 0);
  CHECK(cluster.received(0).empty());
  client.finish();
}

TEST_CASE("pull: a row-split variable's pieces are concatenated in row order, on the client's device") {
  // 5 rows x 4 f32 = 80 bytes >= 64: split 3 + 2 over two servers.
  const auto placements = place(2, {{"w", {5, 4}}}, 64);
  REQUIRE(placements[0].pieces.size() == 2);
  CHECK(placements[0].pieces[0].rows() == 3);
  FakeCluster cluster(2, 1, placements, {table({5, 4}, 0)});
  auto c = config(2);
  c.device = fl::Device("cpu:2");
  ps::WorkerClient client(c, placements, cluster.transport());
  client.start();
  const Result r = pull(client, 0);
  REQUIRE_FALSE(r.error);
  std::vector<double> want(20);
  for (size_t i = 0; i < want.size(); ++i) want[i] = static_cast<double>(i);
  CHECK(same(r.value, want, {5, 4}));
  CHECK(r.value.device() == fl::Device("cpu:2"));
  CHECK(cluster.received_of<ps::PullRequest>(0).size() == 1);
  CHECK(cluster.received_of<ps::PullRequest>(1).size() == 1);
  client.finish();
}

TEST_CASE("pull_rows: one message per owning server, rows in the order of the ids, bytes ~ the rows") {
  const int64_t rows = 1000, cols = 16;
  const auto placements = place(2, {{"table", {rows, cols}}}, 1024);
  REQUIRE(placements[0].pieces.size() == 2);
  const int64_t split = placements[0].pieces[1].row_begin;  // 500
  FakeCluster cluster(2, 1, placements, {table({rows, cols}, 0)});
  ps::WorkerClient client(config(2), placements, cluster.transport());
  client.start();
  cluster.transport().reset_counters();
  const std::vector<int64_t> ids = {907, 3, 512, 499, 0, 999, 250, 500};  // shuffled, both servers
  const Result r = pull_rows(client, 0, ids);
  REQUIRE_FALSE(r.error);
  std::vector<double> want;
  for (int64_t id : ids) {
    for (int64_t c = 0; c < cols; ++c) want.push_back(static_cast<double>(id * cols + c));
  }
  CHECK(same(r.value, want, {static_cast<int64_t>(ids.size()), cols}));
  // One request per server, each with that server's local rows in the order asked.
  const auto to0 = cluster.received_of<ps::SparsePullRequest>(0);
  const auto to1 = cluster.received_of<ps::SparsePullRequest>(1);
  REQUIRE(to0.size() == 1);
  REQUIRE(to1.size() == 1);
  CHECK(to0[0].rows.to_vector<int64_t>() == std::vector<int64_t>{3, 499, 0, 250});
  CHECK(to1[0].rows.to_vector<int64_t>() == std::vector<int64_t>{907 - split, 512 - split, 999 - split, 0});
  const fl::WorkerStats stats = client.stats();
  CHECK(stats.messages_sent == 2);
  CHECK(stats.messages_received == 2);
  const int64_t payload = static_cast<int64_t>(ids.size()) * cols * 4;
  CHECK(stats.bytes_received >= payload);
  CHECK(stats.bytes_received <= payload + 2 * 128);  // two small headers
  CHECK(stats.bytes_sent <= static_cast<int64_t>(ids.size()) * 8 + 2 * 128);
  client.finish();
}

TEST_CASE("pull_rows: an id out of range is OutOfRange, no message sent; no ids is an empty result") {
  const auto placements = place(1, {{"t", {4, 2}}});
  FakeCluster cluster(1, 1, placements, {table({4, 2}, 0)});
  ps::WorkerClient client(config(1), placements, cluster.transport());
  client.start();
  const Result bad = pull_rows(client, 0, {1, 4});
  test::check_throws<fl::OutOfRange>([&] { rethrow(bad); }, {"'t'", "id 4", "position 1", "[0, 4)"});
  const Result none = pull_rows(client, 0, {});
  REQUIRE_FALSE(none.error);
  CHECK(test::shape_text(none.value.shape()) == "[0, 2]");
  CHECK(cluster.received(0).empty());
  client.finish();
}

TEST_CASE("push: dense gradients cut to each server's rows, sparse ids made local, an empty push still sent") {
  // "w" 6x2 split 3+3; "b" whole on... round robin starts at server 0 for whole variables.
  const auto placements = place(2, {{"w", {6, 2}}, {"b", {2}}, {"emb", {10, 2}}}, 40);
  REQUIRE(placements[0].pieces.size() == 2);
  REQUIRE(placements[1].pieces.size() == 1);
  REQUIRE(placements[2].pieces.size() == 2);
  const int b_server = placements[1].pieces[0].server;
  FakeCluster cluster(2, 1, placements, {table({6, 2}, 0), table({2}, 0), table({10, 2}, 0)});
  ps::WorkerClient client(config(2), placements, cluster.transport());
  client.start();
  const fl::Tensor gw = table({6, 2}, 0);
  const fl::Tensor gb = table({2}, 50);
  // Sparse: ids 7, 2, 9 (then padding -1), rows 100.., 102.., 104..
  const fl::Tensor ids = fl::tensor(std::vector<int64_t>{7, 2, 9, -1}, fl::Shape{4});
  const fl::Tensor grows = table({4, 2}, 100);
  const std::vector<ps::VariableGradient> grads = {{0, gw, {}}, {1, gb, {}}, {2, grows, ids}};
  client.push(0, grads);
  client.push(1, grads);
  CHECK(client.steps() == 1);
  const auto p0 = cluster.received_of<ps::Push>(0);
  const auto p1 = cluster.received_of<ps::Push>(1);
  REQUIRE(p0.size() == 1);
  REQUIRE(p1.size() == 1);
  CHECK(p0[0].clock == 1);
  CHECK(p1[0].clock == 1);
  CHECK(p0[0].worker == 0);
  auto entry = [](const ps::Push& p, int32_t id) -> const ps::PushEntry* {
    for (const auto& e : p.entries) {
      if (e.var_id == id) return &e;
    }
    return nullptr;
  };
  // Dense rows 0..2 to server 0, 3..5 to server 1.
  REQUIRE(entry(p0[0], 0));
  CHECK_FALSE(entry(p0[0], 0)->rows.defined());  // dense
  CHECK(same(entry(p0[0], 0)->grad, {0, 1, 2, 3, 4, 5}, {3, 2}));
  REQUIRE(entry(p1[0], 0));
  CHECK(same(entry(p1[0], 0)->grad, {6, 7, 8, 9, 10, 11}, {3, 2}));
  // The whole variable to its server only.
  const ps::Push& b_push = b_server == 0 ? p0[0] : p1[0];
  const ps::Push& other = b_server == 0 ? p1[0] : p0[0];
  REQUIRE(entry(b_push, 1));
  CHECK(same(entry(b_push, 1)->grad, {50, 51}, {2}));
  CHECK_FALSE(entry(other, 1));
  // Sparse: emb rows 0..4 on server 0, 5..9 on server 1.
  REQUIRE(entry(p0[0], 2));
  CHECK(entry(p0[0], 2)->rows.to_vector<int64_t>() == std::vector<int64_t>{2});
  CHECK(same(entry(p0[0], 2)->grad, {102, 103}, {1, 2}));
  REQUIRE(entry(p1[0], 2));
  CHECK(entry(p1[0], 2)->rows.to_vector<int64_t>() == std::vector<int64_t>{2, 4});
  CHECK(same(entry(p1[0], 2)->grad, {100, 101, 104, 105}, {2, 2}));

  // A step with nothing for server 1: its push is still sent, empty, with the next clock.
  client.push(0, {{1, gb, {}}});
  client.push(1, {});
  const auto later = cluster.received_of<ps::Push>(1);
  REQUIRE(later.size() == 2);
  CHECK(later[1].clock == 2);
  CHECK(later[1].entries.empty());
  CHECK(client.steps() == 2);
  client.finish();
  // Goodbye to every server with its clock.
  for (int s = 0; s < 2; ++s) {
    const auto bye = cluster.received_of<ps::Goodbye>(s);
    REQUIRE(bye.size() == 1);
    CHECK(bye[0].clock == 2);
    CHECK(bye[0].worker == 0);
  }
}

TEST_CASE("push: bad arguments are errors that count no step") {
  const auto placements = place(1, {{"w", {3, 2}}});
  FakeCluster cluster(1, 1, placements, {table({3, 2}, 0)});
  ps::WorkerClient client(config(1), placements, cluster.transport());
  client.start();
  test::check_throws<fl::InvalidArgument>([&] { client.push(0, {{5, table({3, 2}, 0), {}}}); }, {"id 5"});
  test::check_throws<fl::InvalidArgument>([&] { client.push(1, {}); }, {"server 1"});
  test::check_throws<fl::ShapeError>([&] { client.push(0, {{0, table({2, 3}, 0), {}}}); }, {"'w'", "[2, 3]", "[3, 2]"});
  test::check_throws<fl::DTypeError>([&] { client.push(0, {{0, table({3, 2}, 0).astype(fl::f64), {}}}); },
                                     {"'w'", "f64"});
  const fl::Tensor bad_ids = fl::tensor(std::vector<int64_t>{3}, fl::Shape{1});
  test::check_throws<fl::OutOfRange>([&] { client.push(0, {{0, table({1, 2}, 0), bad_ids}}); }, {"'w'", "id 3"});
  CHECK(client.steps() == 0);
  CHECK(cluster.received(0).empty());
  client.finish();
}

TEST_CASE("versions: a push carries the smallest version read since the last push; sync asks for the next") {
  const auto placements = place(1, {{"w", {2}}});
  FakeCluster cluster(1, 1, placements, {table({2}, 0)});
  auto c = config(1);
  c.mode = fl::TrainingMode::sync;
  ps::WorkerClient client(c, placements, cluster.transport());
  client.start();
  cluster.set_version(0, 5);
  REQUIRE_FALSE(pull(client, 0).error);
  cluster.set_version(0, 3);
  REQUIRE_FALSE(pull(client, 0).error);
  cluster.set_version(0, 4);
  REQUIRE_FALSE(pull(client, 0).error);
  client.push(0, {});
  auto pushes = cluster.received_of<ps::Push>(0);
  REQUIRE(pushes.size() == 1);
  CHECK(pushes[0].read_version == 3);
  // sync: the next pull waits for read_version + 1, and carries the clock.
  REQUIRE_FALSE(pull(client, 0).error);
  auto pulls = cluster.received_of<ps::PullRequest>(0);
  REQUIRE(pulls.size() == 4);
  CHECK(pulls[0].min_version == 0);
  CHECK(pulls[3].min_version == 4);
  CHECK(pulls[3].clock == 1);
  // No pull since this push: the last version seen (4).
  client.push(0, {});
  client.push(0, {});
  pushes = cluster.received_of<ps::Push>(0);
  REQUIRE(pushes.size() == 3);
  CHECK(pushes[1].read_version == 4);
  CHECK(pushes[2].read_version == 4);
  client.finish();
}

TEST_CASE("versions: async pulls ask for no version") {
  const auto placements = place(1, {{"w", {2}}});
  FakeCluster cluster(1, 1, placements, {table({2}, 0)});
  ps::WorkerClient client(config(1), placements, cluster.transport());
  client.start();
  cluster.set_version(0, 9);
  REQUIRE_FALSE(pull(client, 0).error);
  client.push(0, {});
  REQUIRE_FALSE(pull(client, 0).error);
  const auto pulls = cluster.received_of<ps::PullRequest>(0);
  REQUIRE(pulls.size() == 2);
  CHECK(pulls[1].min_version == 0);
  CHECK(pulls[1].clock == 1);
  CHECK(cluster.received_of<ps::Push>(0)[0].read_version == 9);
  client.finish();
}

TEST_CASE("errors: an ErrorReply fails its pull with the matching type; a push's is thrown by the next call") {
  const auto placements = place(1, {{"w", {2}}});
  FakeCluster cluster(1, 1, placements, {table({2}, 0)});
  ps::WorkerClient client(config(1), placements, cluster.transport());
  client.start();
  ps::ErrorCode code = ps::ErrorCode::invalid_argument;
  cluster.set_script([&code](int, const ps::Message& m) -> std::optional<ps::Message> {
    if (const auto* p = std::get_if<ps::PullRequest>(&m)) return ps::ErrorReply{p->request_id, code, "server says no"};
    if (std::holds_alternative<ps::Push>(m)) {
      return ps::ErrorReply{0, ps::ErrorCode::invalid_argument, "push of 'w' rejected: bad rows"};
    }
    return std::nullopt;
  });
  test::check_throws<fl::InvalidArgument>([&] { rethrow(pull(client, 0)); }, {"server says no"});
  code = ps::ErrorCode::deadline_exceeded;
  test::check_throws<fl::DeadlineExceeded>([&] { rethrow(pull(client, 0)); }, {"server says no"});
  code = ps::ErrorCode::internal;
  test::check_throws<fl::Error>([&] { rethrow(pull(client, 0)); }, {"server says no"});
  cluster.set_script({});
  cluster.set_script([](int, const ps::Message& m) -> std::optional<ps::Message> {
    if (std::holds_alternative<ps::Push>(m)) {
      return ps::ErrorReply{0, ps::ErrorCode::invalid_argument, "push of 'w' rejected: bad rows"};
    }
    return std::nullopt;
  });
  client.push(0, {});  // returns once sent; the error comes back afterwards
  test::check_throws<fl::InvalidArgument>([&] { rethrow(pull(client, 0)); }, {"bad rows"});
  CHECK_FALSE(pull(client, 0).error);  // reported once
  client.push(0, {});
  test::check_throws<fl::InvalidArgument>([&] { client.push(0, {}); }, {"bad rows"});
  client.finish();
}

TEST_CASE("timeout: a pull with no reply fails with DeadlineExceeded within timeout + 0.5 s") {
  const auto placements = place(2, {{"a", {2}}, {"quiet", {2}}});
  FakeCluster cluster(2, 1, placements, {table({2}, 0), table({2}, 0)});
  cluster.set_script([](int server, const ps::Message& m) -> std::optional<ps::Message> {
    if (server == 1 && std::holds_alternative<ps::PullRequest>(m)) return ps::Goodbye{};  // not an answer
    return std::nullopt;
  });
  ps::WorkerClient client(config(2, 1, 0, 0.3), placements, cluster.transport());
  client.start();
  // The Goodbye sent back is no reply: the client reports it as an unexpected message later.
  const auto start = Clock::now();
  const Result r = pull(client, 1);
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  test::check_throws<fl::DeadlineExceeded>(
      [&] { rethrow(r); }, {"ps pull of 'quiet' from server 1: no reply within 0.3 s (worker 0)"});
  CHECK(took >= 0.3);
  CHECK(took < 0.8);
  test::check_throws<fl::Error>([&] { rethrow(pull(client, 0)); }, {"goodbye", "endpoint 1"});
  CHECK_FALSE(pull(client, 0).error);
  client.finish();
}

TEST_CASE("faults: a worker stopped at step k throws WorkerStopped and sends nothing more") {
  const auto placements = place(2, {{"a", {2}}, {"b", {2}}});
  FakeCluster cluster(2, 1, placements, {table({2}, 0), table({2}, 0)});
  auto c = config(2);
  c.faults.stop_worker_at_step = {{1, 1}, {0, 2}};  // worker 1's stop is not ours
  ps::WorkerClient client(c, placements, cluster.transport());
  client.start();
  client.push(0, {});
  client.push(1, {});
  CHECK(client.steps() == 1);
  test::check_throws<ps::WorkerStopped>([&] { client.push(1, {}); }, {"worker 0", "step 2"});
  CHECK(client.stopped());
  const int64_t sent = client.stats().messages_sent;
  CHECK(sent == 2);
  test::check_throws<ps::WorkerStopped>([&] { client.push(0, {}); }, {"worker 0"});
  test::check_throws<ps::WorkerStopped>([&] { rethrow(pull(client, 0)); }, {"worker 0"});
  client.finish();
  CHECK(client.stats().messages_sent == sent);
  CHECK(cluster.received_of<ps::Goodbye>(0).empty());
  CHECK(cluster.received_of<ps::Goodbye>(1).empty());
  const fl::WorkerStats stats = client.stats();
  CHECK(stats.stopped);
  CHECK(stats.steps == 1);
}

TEST_CASE("faults: a constant step delay is slept once per step, and step times record it") {
  const auto placements = place(2, {{"a", {2}}, {"b", {2}}});
  FakeCluster cluster(2, 1, placements, {table({2}, 0), table({2}, 0)});
  auto c = config(2);
  c.faults.step_delay = fl::StepDelay::constant(0.05);
  ps::WorkerClient client(c, placements, cluster.transport());
  client.start();
  const auto start = Clock::now();
  for (int step = 0; step < 3; ++step) {
    client.push(0, {});
    client.push(1, {});  // same step: no second delay
  }
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  CHECK(took >= 0.15);
  CHECK(took < 0.15 + 0.5);  // generous: the machine is shared
  const fl::WorkerStats stats = client.stats();
  CHECK(stats.steps == 3);
  REQUIRE(stats.step_seconds.size() == 3);
  for (double s : stats.step_seconds) {
    CHECK(s >= 0.05);
    CHECK(s < 0.05 + 0.2);
  }
  client.finish();
}

TEST_CASE("faults: log-normal delays have the configured median; a straggler takes factor x as long") {
  const auto placements = place(1, {{"a", {2}}});
  {
    FakeCluster cluster(1, 1, placements, {table({2}, 0)});
    auto c = config(1);
    c.faults.step_delay = fl::StepDelay::log_normal(0.004, 0.5);
    c.faults.seed = 7;
    ps::WorkerClient client(c, placements, cluster.transport());
    client.start();
    for (int i = 0; i < 41; ++i) client.push(0, {});
    std::vector<double> s = client.stats().step_seconds;
    std::sort(s.begin(), s.end());
    const double median = s[s.size() / 2];
    CHECK(median > 0.004 * 0.7);  // exp(N(log 0.004, 0.5)); 41 draws
    CHECK(median < 0.004 * 1.5 + 0.003);  // sleeps overshoot a little
    CHECK(s.front() < s.back());
    client.finish();
  }
  {
    FakeCluster cluster(1, 1, placements, {table({2}, 0)});
    auto c = config(1);
    c.faults.step_delay = fl::StepDelay::straggler(0, 3.0);
    ps::WorkerClient client(c, placements, cluster.transport());
    client.start();
    for (int i = 0; i < 3; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the step's own work
      client.push(0, {});
    }
    for (double s : client.stats().step_seconds) {
      CHECK(s >= 0.06);  // 20 ms measured, then 2 x that slept
      CHECK(s < 0.06 + 0.2);
    }
    client.finish();
  }
}

TEST_CASE("faults: push_async returns at once; the delayed push leaves when its delay ends, before later pulls") {
  const auto placements = place(2, {{"a", {2}}, {"b", {2}}});
  FakeCluster cluster(2, 1, placements, {table({2}, 0), table({2}, 10)});
  auto c = config(2);
  c.faults.step_delay = fl::StepDelay::constant(0.1);
  ps::WorkerClient client(c, placements, cluster.transport());
  client.start();
  std::mutex mutex;
  std::vector<double> sent_after(2, -1);
  const auto start = Clock::now();
  for (int server = 0; server < 2; ++server) {
    client.push_async(server, {}, [&, server](std::exception_ptr error) {
      CHECK(!error);
      std::lock_guard lock(mutex);
      sent_after[static_cast<size_t>(server)] = std::chrono::duration<double>(Clock::now() - start).count();
    });
  }
  CHECK(std::chrono::duration<double>(Clock::now() - start).count() < 0.05);  // nothing slept here
  CHECK(client.steps() == 1);
  CHECK(cluster.received(0).empty());  // waiting for the delay
  // Issued after the delayed pushes: sent after them, with the clock they set.
  const Result b = pull(client, 1);
  rethrow(b);
  CHECK(same(b.value, {10, 11}, {2}));
  const double pulled_after = std::chrono::duration<double>(Clock::now() - start).count();
  CHECK(pulled_after >= 0.1);
  {
    std::lock_guard lock(mutex);
    for (double t : sent_after) {
      CHECK(t >= 0.1);
      CHECK(t < 0.1 + 0.3);
    }
  }
  const std::vector<ps::Message> got = cluster.received(1);
  REQUIRE(got.size() == 2);
  CHECK(std::holds_alternative<ps::Push>(got[0]));
  REQUIRE(std::holds_alternative<ps::PullRequest>(got[1]));
  CHECK(std::get<ps::PullRequest>(got[1]).clock == 1);
  REQUIRE(cluster.received_of<ps::Push>(0).size() == 1);
  // A refused push_async reports through done and throws nothing.
  std::exception_ptr refused;
  client.push_async(5, {}, [&](std::exception_ptr e) { refused = e; });
  test::check_throws<fl::InvalidArgument>([&] { std::rethrow_exception(refused); }, {"server 5"});
  // finish() lets a queued push leave before its Goodbye.
  client.push_async(0, {}, [](std::exception_ptr e) { CHECK(!e); });
  client.push_async(1, {}, [](std::exception_ptr e) { CHECK(!e); });
  client.finish();
  const std::vector<ps::Message> last = cluster.received(0);
  REQUIRE(last.size() == 3);
  CHECK(std::get<ps::Push>(last[1]).clock == 2);
  CHECK(std::holds_alternative<ps::Goodbye>(last[2]));
  CHECK(client.stats().steps == 2);
}

TEST_CASE("faults: destroying a client with a delayed push queued fails the push with Cancelled, sends nothing") {
  const auto placements = place(1, {{"a", {2}}});
  FakeCluster cluster(1, 1, placements, {table({2}, 0)});
  auto c = config(1);
  c.faults.step_delay = fl::StepDelay::constant(5.0);
  std::exception_ptr late;
  const auto start = Clock::now();
  {
    ps::WorkerClient client(c, placements, cluster.transport());
    client.start();
    client.push_async(0, {}, [&late](std::exception_ptr e) { late = e; });
  }
  CHECK(std::chrono::duration<double>(Clock::now() - start).count() < 1.0);
  test::check_throws<fl::Cancelled>([&] { std::rethrow_exception(late); }, {"worker 0"});
  CHECK(cluster.received(0).empty());
}

TEST_CASE("client: calls before start() and after finish() are errors; destruction cancels pending pulls") {
  const auto placements = place(1, {{"w", {2}}});
  FakeCluster cluster(1, 1, placements, {table({2}, 0)});
  cluster.set_script([](int, const ps::Message& m) -> std::optional<ps::Message> {
    if (std::holds_alternative<ps::PullRequest>(m)) return ps::Goodbye{};  // never answers
    return std::nullopt;
  });
  std::exception_ptr late;
  {
    ps::WorkerClient client(config(1), placements, cluster.transport());
    test::check_throws<fl::InvalidArgument>([&] { rethrow(pull(client, 0)); }, {"start()"});
    client.start();
    client.pull(0, [&late](fl::Tensor, std::exception_ptr e) { late = e; });
  }
  test::check_throws<fl::Cancelled>([&] { std::rethrow_exception(late); }, {"'w'"});
  CHECK_THROWS_AS(ps::WorkerClient(config(1, 1, 1), placements, cluster.transport()), fl::InvalidArgument);
}

// ---- ServerVariables and the ps ops ----

namespace {

const char strategy_identity = 0;

// Local variables registered as server variables of a fake strategy, servers answering from tables
// that differ from the local values (so a test can tell which it got).
struct Fixture {
  std::shared_ptr<ps::ServerVariables> vars =
      std::make_shared<ps::ServerVariables>(&strategy_identity, 2, fl::ShardingPolicy{64, 0});
  std::vector<fl::Variable> locals;
  std::vector<fl::Tensor> server_tables;
  std::unique_ptr<FakeCluster> cluster;
  std::unique_ptr<ps::WorkerClient> client;
  ps::WorkerContext context;

  explicit Fixture(const std::vector<std::pair<std::string, fl::Shape>>& shapes, double message_delay = 0) {
    double base = 1;
    for (const auto& [name, shape] : shapes) {
      locals.emplace_back(fl::zeros(shape), name);
      vars->add(vars, fd::VariableAccess::state(locals.back()));
      server_tables.push_back(table(shape, base));
      base += 1000;
    }
    cluster = std::make_unique<FakeCluster>(2, 1, vars->placements(), server_tables, message_delay);
    client = std::make_unique<ps::WorkerClient>(config(2), vars->placements(), cluster->transport());
    client->start();
    context = ps::WorkerContext{client.get(), &strategy_identity};
  }
  ~Fixture() { client->finish(); }
};

std::vector<std::string> op_names(const fl::Graph& graph) {
  std::vector<std::string> names;
  for (const fl::Node& n : graph.nodes()) {
    if (!n.removed && n.kind == fl::NodeKind::op) names.emplace_back(n.op->name);
  }
  return names;
}

}  // namespace

TEST_CASE("ServerVariables: placements in creation order; non-floating variables refused") {
  Fixture f({{"w", {4, 8}}, {"b", {8}}, {"c", {}}});
  const auto placements = f.vars->placements();
  REQUIRE(placements.size() == 3);
  CHECK(placements[0].pieces.size() == 2);  // 128 bytes >= 64
  CHECK(placements[1].pieces.size() == 1);
  CHECK(placements[1].pieces[0].server == 0);
  CHECK(placements[2].pieces[0].server == 1);
  CHECK(f.vars->id_of(*fd::VariableAccess::state(f.locals[2])) == 2);
  fl::Variable other(fl::zeros({2}), "other");
  CHECK(f.vars->id_of(*fd::VariableAccess::state(other)) == -1);
  fl::Variable ints(fl::zeros({2}, fl::i32), "ints");
  test::check_throws<fl::InvalidArgument>([&] { f.vars->add(f.vars, fd::VariableAccess::state(ints)); },
                                          {"'ints'", "floating"});
}

TEST_CASE("ServerVariables: reads under a WorkerScope pull; without one they read the local value") {
  Fixture f({{"w", {4, 8}}, {"b", {8}}});
  std::vector<double> want_w(32), want_b(8);
  for (size_t i = 0; i < 32; ++i) want_w[i] = 1 + static_cast<double>(i);
  for (size_t i = 0; i < 8; ++i) want_b[i] = 1001 + static_cast<double>(i);
  CHECK(same(f.locals[0].value(), std::vector<double>(32, 0), {4, 8}));
  {
    ps::WorkerScope scope(&f.context);
    CHECK(same(f.locals[0].value(), want_w, {4, 8}));
    CHECK(same(f.locals[1].value(), want_b, {8}));
    // Another strategy's worker reads locally.
    const char other = 0;
    ps::WorkerContext foreign{f.client.get(), &other};
    ps::WorkerScope inner(&foreign);
    CHECK(same(f.locals[1].value(), std::vector<double>(8, 0), {8}));
  }
  CHECK(same(f.locals[1].value(), std::vector<double>(8, 0), {8}));
  CHECK(f.cluster->received_of<ps::PullRequest>(0).size() == 2);  // w's first piece, b
  CHECK(f.cluster->received_of<ps::PullRequest>(1).size() == 1);  // w's second piece
}

TEST_CASE("ServerVariables: assign inside a WorkerScope is InvalidArgument, outside it works") {
  Fixture f({{"w", {2}}});
  {
    ps::WorkerScope scope(&f.context);
    test::check_throws<fl::InvalidArgument>([&] { f.locals[0].assign(fl::ones({2})); },
                                            {"assign", "'w'", "Worker::apply_gradients"});
    test::check_throws<fl::InvalidArgument>([&] { f.locals[0].assign_add(fl::ones({2})); }, {"assign_add"});
  }
  f.locals[0].assign(fl::ones({2}));
  CHECK(same(f.locals[0].value(), {1, 1}, {2}));
}

TEST_CASE("ServerVariables: a traced step with two pulls and pushes matches the eager step") {
  Fixture f({{"w", {4, 8}}, {"b", {8}}});
  const fl::Tensor x = table({3, 4}, 0) * 0.01f;
  auto step = [&](fl::Tensor input) {
    fl::GradientTape tape;
    fl::Tensor y = fl::matmul(input, f.locals[0]) + f.locals[1];
    fl::Tensor loss = fl::sum(y * y);
    const std::vector<fl::Tensor> grads = tape.gradient(loss, {f.locals[0], f.locals[1]});
    f.vars->push(grads, f.locals);
    return loss;
  };
  ps::WorkerScope scope(&f.context);
  const fl::Tensor eager = step(x);
  auto traced = fl::trace(step);
  const fl::Tensor first = traced(x);
  const fl::Tensor second = traced(x);
  CHECK(same(first, test::values(eager), {}));
  CHECK(same(second, test::values(eager), {}));
  const std::vector<std::string> names = op_names(traced.graph(x));
  CHECK(std::count(names.begin(), names.end(), "ps_pull") == 2);
  CHECK(std::count(names.begin(), names.end(), "ps_push") == 2);  // one per server
  bool named = false;
  for (const fl::Node& n : traced.graph(x).nodes()) named |= n.name.rfind("pull_w", 0) == 0;
  CHECK(named);
  // Three steps, each one push per server; the gradients equal the eager step's.
  const auto p0 = f.cluster->received_of<ps::Push>(0);
  const auto p1 = f.cluster->received_of<ps::Push>(1);
  REQUIRE(p0.size() == 3);
  REQUIRE(p1.size() == 3);
  CHECK(p0[2].clock == 3);
  for (size_t e = 0; e < p0[0].entries.size(); ++e) {
    CHECK(same(p0[2].entries[e].grad, test::values(p0[0].entries[e].grad), p0[0].entries[e].grad.shape()));
  }
  CHECK(f.client->steps() == 3);
}

TEST_CASE("ServerVariables: gather with repeated ids pulls unique rows; its gradient scatters to the dense one") {
  Fixture f({{"emb", {10, 3}}});
  const fl::Tensor ids = fl::tensor(std::vector<int64_t>{7, 2, 7, 9, 2, 4}, fl::Shape{2, 3});
  const fl::Tensor weights = table({2, 3, 3}, 1) * 0.1f;
  // Reference: the dense gather of the server's table, and its gradient.
  fl::Variable dense(f.server_tables[0], "dense");
  fl::Tensor want_rows, want_grad;
  {
    fl::GradientTape tape;
    want_rows = fl::gather(dense.value(), ids);
    want_grad = tape.gradient(fl::sum(want_rows * weights), {dense})[0];
  }
  ps::WorkerScope scope(&f.context);
  fl::GradientTape tape;
  const fl::Tensor rows = fl::gather(f.locals[0], ids);
  CHECK(same(rows, test::values(want_rows), {2, 3, 3}));
  const fl::Tensor grad = tape.gradient(fl::sum(rows * weights), {f.locals[0]})[0];
  CHECK(test::shape_text(grad.shape()) == "[6, 3]");  // n rows: 4 unique, then zeros
  // One sparse pull per server with the unique ids (7, 2, 9, 4 -> server 0: 2, 4; server 1: 7, 9).
  const auto s0 = f.cluster->received_of<ps::SparsePullRequest>(0);
  const auto s1 = f.cluster->received_of<ps::SparsePullRequest>(1);
  REQUIRE(s0.size() == 1);
  REQUIRE(s1.size() == 1);
  CHECK(s0[0].rows.to_vector<int64_t>() == std::vector<int64_t>{2, 4});
  CHECK(s1[0].rows.to_vector<int64_t>() == std::vector<int64_t>{2, 4});  // 7 - 5, 9 - 5
  // Scattered back through the unique ids, it is the dense gradient.
  const fl::Tensor unique = fl::tensor(std::vector<int64_t>{7, 2, 9, 4}, fl::Shape{4});
  const fl::Tensor scattered = fl::scatter_add(unique, fl::slice(grad, 0, 0, 4), 10);
  CHECK(same(scattered, test::values(want_grad), {10, 3}));
  CHECK(same(fl::slice(grad, 0, 4, 2), std::vector<double>(6, 0), {2, 3}));
  // Pushed as (ids, rows) to the owners, local ids.
  f.vars->push(std::vector<fl::Tensor>{grad}, f.locals);
  const auto p0 = f.cluster->received_of<ps::Push>(0);
  const auto p1 = f.cluster->received_of<ps::Push>(1);
  REQUIRE(p0.size() == 1);
  REQUIRE(p1.size() == 1);
  REQUIRE(p0[0].entries.size() == 1);
  REQUIRE(p1[0].entries.size() == 1);
  CHECK(p0[0].entries[0].rows.to_vector<int64_t>() == std::vector<int64_t>{2, 4});
  CHECK(p1[0].entries[0].rows.to_vector<int64_t>() == std::vector<int64_t>{2, 4});
  const std::vector<double> g = test::values(grad);
  CHECK(same(p0[0].entries[0].grad, {g[3], g[4], g[5], g[9], g[10], g[11]}, {2, 3}));
  CHECK(same(p1[0].entries[0].grad, {g[0], g[1], g[2], g[6], g[7], g[8]}, {2, 3}));
  // After the push the variable is dense again: a [6, 3] gradient is the wrong shape now.
  test::check_throws<fl::ShapeError>([&] { f.vars->push(std::vector<fl::Tensor>{grad}, f.locals); },
                                     {"'emb'", "[6, 3]", "[10, 3]"});
  // An id out of range.
  const fl::Tensor bad = fl::tensor(std::vector<int64_t>{1, 10}, fl::Shape{2});
  test::check_throws<fl::OutOfRange>([&] { (void)fl::gather(f.locals[0], bad); }, {"ps_lookup", "id 10", "'emb'"});
}

TEST_CASE("ServerVariables: a traced gather step matches the eager one") {
  Fixture f({{"emb", {10, 3}}});
  const fl::Tensor ids = fl::tensor(std::vector<int32_t>{3, 8, 3, 0}, fl::Shape{4});
  auto step = [&](fl::Tensor i) {
    fl::GradientTape tape;
    fl::Tensor loss = fl::sum(fl::gather(f.locals[0], i) * 2.0f);
    f.vars->push(tape.gradient(loss, {f.locals[0]}), f.locals);
    return loss;
  };
  ps::WorkerScope scope(&f.context);
  const fl::Tensor eager = step(ids);
  auto traced = fl::trace(step);
  CHECK(same(traced(ids), test::values(eager), {}));
  const std::vector<std::string> names = op_names(traced.graph(ids));
  CHECK(std::count(names.begin(), names.end(), "ps_lookup") == 1);
  const auto p1 = f.cluster->received_of<ps::Push>(1);
  REQUIRE(p1.size() == 2);
  REQUIRE(p1[1].entries.size() == 1);
  CHECK(p1[1].entries[0].rows.to_vector<int64_t>() == std::vector<int64_t>{3});  // id 8
  CHECK(same(p1[1].entries[0].grad, {2, 2, 2}, {1, 3}));
  const auto p0 = f.cluster->received_of<ps::Push>(0);
  REQUIRE(p0[1].entries.size() == 1);
  CHECK(p0[1].entries[0].rows.to_vector<int64_t>() == std::vector<int64_t>{3, 0});
  CHECK(same(p0[1].entries[0].grad, {4, 4, 4, 2, 2, 2}, {2, 3}));
}

TEST_CASE("ServerVariables::push (apply_gradients) checks its arguments") {
  Fixture f({{"w", {4, 8}}, {"b", {8}}});
  const std::vector<fl::Variable> both = f.locals;
  test::check_throws<fl::InvalidArgument>([&] { f.vars->push(std::vector<fl::Tensor>{fl::zeros({8})}, {&both[1], 1}); },
                                          {"apply_gradients", "worker"});
  ps::WorkerScope scope(&f.context);
  fl::Variable stranger(fl::zeros({8}), "stranger");
  test::check_throws<fl::InvalidArgument>(
      [&] { f.vars->push(std::vector<fl::Tensor>{fl::zeros({8})}, std::vector<fl::Variable>{stranger}); },
      {"apply_gradients", "'stranger'", "not a server variable"});
  test::check_throws<fl::ShapeError>(
      [&] { f.vars->push(std::vector<fl::Tensor>{fl::zeros({4, 8}), fl::zeros({9})}, both); },
      {"apply_gradients", "'b'", "[9]", "[8]"});
  test::check_throws<fl::DTypeError>(
      [&] { f.vars->push(std::vector<fl::Tensor>{fl::zeros({4, 8}), fl::zeros({8}, fl::f64)}, both); },
      {"apply_gradients", "'b'", "f64"});
  test::check_throws<fl::InvalidArgument>([&] { f.vars->push(std::vector<fl::Tensor>{fl::zeros({8})}, both); },
                                          {"apply_gradients", "1 gradients for 2 variables"});
  CHECK(f.cluster->received_of<ps::Push>(0).empty());
  CHECK(f.client->steps() == 0);
  // An empty gradient is skipped: the push still goes to every server.
  f.vars->push(std::vector<fl::Tensor>{fl::Tensor(), fl::ones({8})}, both);
  CHECK(f.cluster->received_of<ps::Push>(0).size() == 1);
  CHECK(f.cluster->received_of<ps::Push>(1).size() == 1);
  CHECK(f.client->steps() == 1);
}

TEST_CASE("ServerVariables: a traced step over a transport that delays messages matches the eager step") {
  // Replies come on the transport's delivery threads, 5 ms late: the async nodes complete there.
  Fixture f({{"w", {4, 8}}, {"emb", {10, 8}}}, 0.005);
  const fl::Tensor x = table({3, 4}, 0) * 0.01f;
  const fl::Tensor ids = fl::tensor(std::vector<int64_t>{9, 1, 9}, fl::Shape{3});
  auto step = [&](fl::Tensor input, fl::Tensor i) {
    fl::GradientTape tape;
    fl::Tensor y = fl::matmul(input, f.locals[0]) + fl::gather(f.locals[1], i);
    fl::Tensor loss = fl::sum(y * y);
    f.vars->push(tape.gradient(loss, {f.locals[0], f.locals[1]}), f.locals);
    return loss;
  };
  ps::WorkerScope scope(&f.context);
  const fl::Tensor eager = step(x, ids);
  auto traced = fl::trace(step);
  for (int i = 0; i < 3; ++i) CHECK(same(traced(x, ids), test::values(eager), {}));
  CHECK(f.client->steps() == 4);
  // Every push arrives, in clock order, each with the same gradients.
  std::vector<ps::Push> p0;
  for (int wait = 0; wait < 200 && p0.size() < 4; ++wait) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    p0 = f.cluster->received_of<ps::Push>(0);
  }
  REQUIRE(p0.size() == 4);
  for (size_t k = 0; k < 4; ++k) {
    CHECK(p0[k].clock == static_cast<int64_t>(k) + 1);
    REQUIRE(p0[k].entries.size() == p0[0].entries.size());
    for (size_t e = 0; e < p0[k].entries.size(); ++e) {
      CHECK(same(p0[k].entries[e].grad, test::values(p0[0].entries[e].grad), p0[0].entries[e].grad.shape()));
    }
  }
}

TEST_CASE("ps ops: a step traced with one worker client refuses to run once that client is gone") {
  auto vars = std::make_shared<ps::ServerVariables>(&strategy_identity, 1, fl::ShardingPolicy{});
  fl::Variable w(fl::zeros({2}), "w");
  vars->add(vars, fd::VariableAccess::state(w));
  const auto placements = vars->placements();
  auto traced = fl::trace([&](fl::Tensor x) { return x * w; });
  const fl::Tensor x = fl::ones({2});
  {
    FakeCluster cluster(1, 1, placements, {table({2}, 5)});
    ps::WorkerClient client(config(1), placements, cluster.transport());
    client.start();
    ps::WorkerContext context{&client, &strategy_identity};
    ps::WorkerScope scope(&context);
    CHECK(same(traced(x), {5, 6}, {2}));
    client.finish();
  }
  FakeCluster cluster(1, 1, placements, {table({2}, 7)});
  ps::WorkerClient client(config(1), placements, cluster.transport());
  client.start();
  ps::WorkerContext context{&client, &strategy_identity};
  ps::WorkerScope scope(&context);
  test::check_throws<fl::InvalidArgument>([&] { (void)traced(x); }, {"ps_pull", "earlier"});
  CHECK(same(x * w, {7, 8}, {2}));  // eagerly, the current client
  client.finish();
}

TEST_CASE("errors: bytes that are no message, and a reply of the wrong shape, are DataLoss") {
  const auto placements = place(1, {{"w", {3, 2}}});
  FakeCluster cluster(1, 1, placements, {table({3, 2}, 0)});
  ps::WorkerClient client(config(1), placements, cluster.transport());
  client.start();
  // Garbage from the server's endpoint: nobody can tell which pull it was for, so the next call fails.
  cluster.transport().send(0, 1, ps::Bytes{std::byte{1}, std::byte{2}, std::byte{3}});
  test::check_throws<fl::DataLoss>([&] { rethrow(pull(client, 0)); });
  CHECK_FALSE(pull(client, 0).error);
  // A reply whose tensor is not the piece asked for fails that pull.
  cluster.set_script([](int, const ps::Message& m) -> std::optional<ps::Message> {
    if (const auto* p = std::get_if<ps::PullRequest>(&m)) return ps::PullReply{p->request_id, 0, fl::zeros({2, 3})};
    return std::nullopt;
  });
  test::check_throws<fl::DataLoss>([&] { rethrow(pull(client, 0)); }, {"'w'", "server 0", "[2, 3]", "[3, 2]"});
  client.finish();
}

TEST_CASE("faults: a straggler's delay in a traced step holds no pool thread; the other worker keeps its pace") {
  // Two in-process workers trace a step that reads a server variable and pushes. Worker 0's steps
  // are delayed 50 ms (its computing time); worker 1's are not. The ps_push nodes run on the shared
  // thread pool, which has a single worker thread here: if worker 0's delay held it, worker 1
  // would do about one step per worker 0 step (seen: 3 or 4 steps).
  (void)threads_configured;
  REQUIRE(fd::thread_budget() == 2);
  auto vars = std::make_shared<ps::ServerVariables>(&strategy_identity, 1, fl::ShardingPolicy{});
  fl::Variable w(fl::zeros({4}), "w");
  vars->add(vars, fd::VariableAccess::state(w));
  const auto placements = vars->placements();
  // Replies 1 ms late, on the transport's delivery thread: a node that waited for one continues on
  // the pool (an immediate reply would let each worker's own thread run its whole step).
  FakeCluster cluster(1, 2, placements, {table({4}, 1)}, 0.001);
  auto c0 = config(1, 2, 0);
  c0.faults.step_delay = fl::StepDelay::constant(0.05);
  ps::WorkerClient slow(c0, placements, cluster.transport());
  ps::WorkerClient fast(config(1, 2, 1), placements, cluster.transport());
  slow.start();
  fast.start();

  const fl::Tensor x = table({4}, 0);
  std::atomic<int> traced_workers{0};
  std::atomic<bool> slow_finished{false};
  double slow_seconds = 0;
  int fast_steps = 0;
  auto run_worker = [&](ps::WorkerClient& client, bool is_slow) {
    ps::WorkerContext context{&client, &strategy_identity};
    ps::WorkerScope scope(&context);
    auto traced = fl::trace([&](fl::Tensor input) {
      fl::GradientTape tape;
      fl::Tensor loss = fl::sum(input * w);
      vars->push(tape.gradient(loss, {w}), std::vector<fl::Variable>{w});
      return loss;
    });
    CHECK(same(traced(x), {0 * 1 + 1 * 2 + 2 * 3 + 3 * 4}, {}));  // traced and run once
    ++traced_workers;
    const auto ready_by = Clock::now() + std::chrono::seconds(20);
    while (traced_workers.load() < 2 && Clock::now() < ready_by) std::this_thread::yield();
    const auto start = Clock::now();
    if (is_slow) {
      for (int i = 0; i < 3; ++i) (void)traced(x);
      slow_seconds = std::chrono::duration<double>(Clock::now() - start).count();
      slow_finished = true;
    } else {
      const auto give_up = start + std::chrono::seconds(20);
      while (!slow_finished.load() && Clock::now() < give_up) {
        (void)traced(x);
        ++fast_steps;
      }
    }
  };
  std::thread slow_thread([&] { run_worker(slow, true); });
  std::thread fast_thread([&] { run_worker(fast, false); });
  slow_thread.join();
  fast_thread.join();
  CHECK(slow_seconds >= 0.15);
  // Unhindered, worker 1 does about 60 steps meanwhile (1 ms per message); when worker 0's delay
  // held the pool's thread it did 6.
  CHECK(fast_steps >= 15);
  MESSAGE("worker 0: 3 steps in ", slow_seconds, " s; worker 1: ", fast_steps, " steps meanwhile");
  CHECK(slow.steps() == 4);
  CHECK(fast.steps() == fast_steps + 1);
  slow.finish();
  fast.finish();
  // The transport delivers 1 ms late: wait for both Goodbyes.
  for (int wait = 0; wait < 400 && cluster.received_of<ps::Goodbye>(0).size() < 2; ++wait) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  REQUIRE(cluster.received_of<ps::Goodbye>(0).size() == 2);
  // Each worker's messages arrive in the order issued: its pushes by clock, and every pull after
  // the pushes before it (it carries the clock of the pushes already received).
  for (int worker = 0; worker < 2; ++worker) {
    int64_t pushes = 0, pulls = 0, out_of_order = 0;
    for (const ps::Message& m : cluster.received(0)) {
      if (const auto* push = std::get_if<ps::Push>(&m); push && push->worker == worker) {
        out_of_order += push->clock != ++pushes;
      } else if (const auto* p = std::get_if<ps::PullRequest>(&m); p && p->worker == worker) {
        out_of_order += p->clock != pushes;
        ++pulls;
      }
    }
    CHECK(out_of_order == 0);
    CHECK(pushes == (worker == 0 ? slow.steps() : fast.steps()));
    CHECK(pulls == pushes);  // one pull per step
  }
}
