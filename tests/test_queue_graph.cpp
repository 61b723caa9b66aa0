// Queues inside traced functions: enqueue and dequeue as stateful graph nodes (program order, every
// call), waiting without holding a thread, backpressure, the traced item signature, cancellation of
// a waiting node by a failing step, and what cannot be traced.
#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "support/reference.hpp"

using fl::FIFOQueue;
using test::check_throws;
using namespace std::chrono_literals;

namespace {

constexpr std::chrono::milliseconds kTimeout{30'000};

// Runs fn on another thread and fails the test (instead of hanging the run) if it takes too long.
template <class F>
auto within_timeout(F fn) {
  auto future = std::async(std::launch::async, std::move(fn));
  REQUIRE(future.wait_for(kTimeout) == std::future_status::ready);
  return future.get();
}

const fl::Node* find_op(const fl::Graph& g, std::string_view op) {
  for (const fl::Node& n : g.nodes()) {
    if (!n.removed && n.op != nullptr && n.op->name == op) return &n;
  }
  return nullptr;
}

}  // namespace

TEST_CASE("a traced step dequeues its batch from a queue at every call, in order") {
  FIFOQueue q(4, "batches");
  std::thread producer([q]() mutable {
    for (int i = 0; i < 20; ++i) q.enqueue({fl::full({2, 3}, static_cast<double>(i)), fl::full({2}, 1.0)});
    q.close();
  });
  auto step = fl::trace([&] {
    std::vector<fl::Tensor> batch = q.dequeue();
    return fl::sum(batch[0] * 2.0f) + fl::sum(batch[1]);
  });
  std::vector<double> got;
  try {
    for (;;) got.push_back(within_timeout([&] { return step().item<float>(); }));
  } catch (const fl::OutOfRange& e) {
    CHECK(std::string(e.what()).find("closed and empty") != std::string::npos);
    CHECK(std::string(e.what()).find("node 'dequeue_batches") != std::string::npos);
  }
  producer.join();
  REQUIRE(got.size() == 20);
  for (int i = 0; i < 20; ++i) CHECK(got[static_cast<size_t>(i)] == 12.0 * i + 2.0);
  CHECK(step.trace_count() == 1);
  const fl::Node* dequeue = find_op(step.graph(), "queue_dequeue");
  REQUIRE(dequeue != nullptr);
  CHECK(dequeue->is_stateful());
}

TEST_CASE("a dequeue waiting in a graph holds no thread: the same step's other node can fill the queue") {
  // The dequeue and the callback touch different resources, so nothing orders them; the executor
  // starts the one recorded first. When that is the dequeue, a dequeue that blocked its thread
  // would keep the callback that fills the queue from ever running.
  for (bool dequeue_first : {true, false}) {
    CAPTURE(dequeue_first);
    FIFOQueue q(2, "inbox");
    q.enqueue({fl::ones({3})});  // tracing reads the item signature from it
    auto fill = [&] {
      fl::host_callback([q](const std::vector<fl::Tensor>&) mutable { q.enqueue({fl::full({3}, 5.0)}); }, {});
    };
    auto step = fl::trace([&] {
      if (!dequeue_first) fill();
      fl::Tensor got = q.dequeue()[0];
      if (dequeue_first) fill();
      return got;
    });
    (void)step.graph();  // trace now, without running
    (void)q.dequeue();   // empty again: every call's dequeue waits for its own callback
    for (int i = 0; i < 3; ++i) {
      CHECK(within_timeout([&] { return step(); }).to_vector<float>() == std::vector<float>(3, 5.0f));
      CHECK(q.size() == 0);
    }
  }
}

TEST_CASE("a traced enqueue feeds eager consumers, and a full queue holds the step back") {
  FIFOQueue out(1, "results");
  auto produce = fl::trace([&](fl::Tensor x) {
    out.enqueue({x * 2.0f});
    out.enqueue({x * 3.0f});  // the queue holds one: this waits for the consumer
    return x;
  });
  std::atomic<bool> returned{false};
  auto call = std::async(std::launch::async, [&] {
    produce(fl::ones({2}));
    returned = true;
  });
  std::this_thread::sleep_for(50ms);
  CHECK_FALSE(returned.load());  // backpressure: the second enqueue waits
  CHECK(out.dequeue()[0].to_vector<float>() == std::vector<float>{2.0f, 2.0f});
  REQUIRE(call.wait_for(kTimeout) == std::future_status::ready);
  call.get();
  CHECK(out.dequeue()[0].to_vector<float>() == std::vector<float>{3.0f, 3.0f});
  CHECK(out.size() == 0);
}

TEST_CASE("an item whose shape differs from the traced one is refused, and the function keeps working") {
  FIFOQueue q(4, "shapes");
  q.enqueue({fl::ones({2, 3})});
  auto step = fl::trace([&] { return fl::sum(q.dequeue()[0]); });
  CHECK(step().item<float>() == 6.0f);
  q.enqueue({fl::ones({4, 3})});
  check_throws<fl::InvalidArgument>([&] { within_timeout([&] { return step(); }); },
                                    {"queue_dequeue", "'shapes'", "[4, 3]", "[2, 3]"});
  q.enqueue({fl::full({2, 3}, 2.0)});
  CHECK(within_timeout([&] { return step(); }).item<float>() == 12.0f);
}

TEST_CASE("a failing node cancels a dequeue waiting in the same step; the queue keeps its items for later") {
  FIFOQueue q(4, "never_filled");
  q.enqueue({fl::ones({2})});
  auto step = fl::trace([&](fl::Tensor params, fl::Tensor ids) {
    fl::Tensor item = q.dequeue()[0];
    return std::vector<fl::Tensor>{item, fl::gather(params, ids)};
  });
  const fl::Tensor params = fl::randn({3, 2}, 1);
  CHECK(step(params, test::make({0}, {1}, fl::i64))[0].numel() == 2);  // trace, and take the one item
  // Now the queue is empty: the dequeue parks, the gather fails, and the step must end.
  check_throws<fl::OutOfRange>([&] { within_timeout([&] { return step(params, test::make({7}, {1}, fl::i64)); }); },
                               {"gather", "7"});
  // The abandoned dequeue took nothing: an item enqueued now is there for the next call.
  q.enqueue({fl::full({2}, 4.0)});
  CHECK(q.size() == 1);
  const std::vector<fl::Tensor> out = within_timeout([&] { return step(params, test::make({2}, {1}, fl::i64)); });
  CHECK(out[0].to_vector<float>() == std::vector<float>{4.0f, 4.0f});
}

TEST_CASE("cancelling a queue wakes a graph dequeue waiting on it with Cancelled") {
  FIFOQueue q(2, "cancel_me");
  q.enqueue({fl::ones({1})});
  auto step = fl::trace([&] { return q.dequeue()[0]; });
  step();
  auto call = std::async(std::launch::async, [&] { return step(); });
  std::this_thread::sleep_for(20ms);
  q.cancel();
  REQUIRE(call.wait_for(kTimeout) == std::future_status::ready);
  check_throws<fl::Cancelled>([&] { call.get(); }, {"cancel_me", "cancelled"});
}

TEST_CASE("try_ calls cannot be traced, and a traced item holds at most four tensors") {
  FIFOQueue q(8, "limits");
  q.enqueue({fl::ones({1})});
  check_throws<fl::InvalidArgument>([&] { fl::trace([&] { (void)q.try_dequeue(); return fl::ones({1}); })(); },
                                    {"try_dequeue", "cannot be traced", "'limits'"});
  check_throws<fl::InvalidArgument>(
      [&] { fl::trace([&](fl::Tensor x) { (void)q.try_enqueue({x}); return x; })(fl::ones({1})); },
      {"try_enqueue", "cannot be traced"});
  FIFOQueue wide(2, "wide", fl::ItemSignature::any);
  check_throws<fl::InvalidArgument>(
      [&] {
        fl::trace([&](fl::Tensor x) {
          wide.enqueue({x, x, x, x, x});
          return x;
        })(fl::ones({1}));
      },
      {"enqueue", "'wide'", "at most 4", "got 5"});
}

TEST_CASE("traced enqueues and dequeues of one queue are named after it and keep their program order") {
  FIFOQueue q(4, "inbox");
  q.enqueue({fl::full({2}, 1.0)});  // tracing reads the dequeue's item signature from it
  auto step = fl::trace([&](fl::Tensor x) {
    fl::Tensor got = q.dequeue()[0];
    q.enqueue({x + got});
    return got;
  });
  const fl::Graph& g = step.graph(fl::ones({2}));
  const fl::Node* dequeue = find_op(g, "queue_dequeue");
  const fl::Node* enqueue = find_op(g, "queue_enqueue");
  REQUIRE(dequeue != nullptr);
  REQUIRE(enqueue != nullptr);
  const auto id = [&](const fl::Node* n) { return static_cast<int32_t>(n - g.nodes().data()); };
  CHECK(dequeue->name == fmt::format("dequeue_inbox_{}", id(dequeue)));
  CHECK(enqueue->name == fmt::format("enqueue_inbox_{}", id(enqueue)));
  // Both change the queue, so the enqueue recorded second waits for the dequeue, and both are
  // effects of the graph.
  CHECK(std::count(enqueue->control_inputs.begin(), enqueue->control_inputs.end(), id(dequeue)) == 1);
  CHECK(std::count(g.effects().begin(), g.effects().end(), id(enqueue)) == 1);
  CHECK(std::count(g.effects().begin(), g.effects().end(), id(dequeue)) == 1);
  // Running it: the step takes the item put there for tracing and puts back item + x.
  q.enqueue({fl::full({2}, 4.0)});
  (void)q.dequeue();  // the tracing item is consumed here; the 4s remain for the step
  CHECK(within_timeout([&] { return step(fl::ones({2})); }).to_vector<float>() == std::vector<float>{4.0f, 4.0f});
  CHECK(q.dequeue()[0].to_vector<float>() == std::vector<float>{5.0f, 5.0f});
}
