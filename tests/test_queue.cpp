// Queues and the prefetcher: FIFO order, backpressure, close and cancel waking blocked callers, many
// producers and consumers, the random shuffle queue's pool and seed, item checks, and Prefetcher
// against Batches (order, epochs, stopping, failures reaching the consumer).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <thread>
#include <vector>

#include "support/reference.hpp"

using fl::FIFOQueue;
using fl::RandomShuffleQueue;
using fl::data::Batches;
using fl::data::Dataset;
using fl::data::Prefetcher;
using test::check_throws;
using namespace std::chrono_literals;

namespace {

// Upper bound for anything expected to happen; a hang fails the test instead of stalling the run.
constexpr std::chrono::milliseconds kTimeout{30'000};
// How long a call must stay blocked to count as blocked (a bounded "still waiting" check).
constexpr std::chrono::milliseconds kStillBlocked{50};

std::vector<fl::Tensor> item_of(int64_t value) { return {fl::scalar(value)}; }
int64_t value_of(const std::vector<fl::Tensor>& item) { return item.at(0).item<int64_t>(); }

// Runs `body` on its own thread. finished_within() waits for it with a bound; result() rethrows what
// it threw. The destructor cancels `queue` (so a body still blocked in it returns) and joins.
class Background {
 public:
  Background(fl::Queue queue, std::function<void()> body) : queue_(std::move(queue)) {
    std::packaged_task<void()> task(std::move(body));
    result_ = task.get_future();
    thread_ = std::thread(std::move(task));
  }
  ~Background() {
    queue_.cancel();
    if (thread_.joinable()) thread_.join();
  }
  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;

  bool finished_within(std::chrono::milliseconds timeout) {
    return result_.wait_for(timeout) == std::future_status::ready;
  }
  // Call after finished_within() returned true. Joins first, so that the thread has dropped its
  // reference to a thrown exception and the last one is released here (TSan cannot see the
  // reference counting inside libstdc++ and would report the exception's destruction otherwise).
  void result() {
    thread_.join();
    result_.get();
  }

 private:
  fl::Queue queue_;
  std::future<void> result_;
  std::thread thread_;
};

// Runs `fn` on a thread and reports whether it returned within `timeout`; if not, the thread is
// left behind (detached) so that the test fails rather than hangs.
bool returns_within(std::function<void()> fn, std::chrono::milliseconds timeout) {
  std::packaged_task<void()> task(std::move(fn));
  std::future<void> done = task.get_future();
  std::thread thread(std::move(task));
  if (done.wait_for(timeout) != std::future_status::ready) {
    thread.detach();
    return false;
  }
  thread.join();
  done.get();
  return true;
}

// Waits (bounded) until `condition` holds, polling: for states that have no event to wait on.
bool eventually(const std::function<bool()>& condition) {
  const auto deadline = std::chrono::steady_clock::now() + kTimeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// Everything left in a closed queue, in dequeue order.
std::vector<int64_t> drain(fl::Queue q) {
  std::vector<int64_t> values;
  for (;;) {
    try {
      values.push_back(value_of(q.dequeue()));
    } catch (const fl::OutOfRange&) {
      return values;
    }
  }
}

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> values(static_cast<size_t>(n));
  std::iota(values.begin(), values.end(), int64_t{0});
  return values;
}

}  // namespace

TEST_CASE("a FIFOQueue returns items in the order they were enqueued, and its copies share it") {
  FIFOQueue q(8, "fifo");
  CHECK(q.name() == "fifo");
  CHECK(q.capacity() == 8);
  CHECK(q.size() == 0);
  FIFOQueue other = q;  // a handle to the same queue
  CHECK(same_queue(q, other));
  CHECK_FALSE(same_queue(q, FIFOQueue(8)));
  for (int64_t i = 0; i < 5; ++i) other.enqueue(item_of(i));
  CHECK(q.size() == 5);
  for (int64_t i = 0; i < 5; ++i) CHECK(value_of(q.dequeue()) == i);
  CHECK(other.size() == 0);

  // Items are tuples of tensors, handed over as they are (same storage, shapes may vary).
  FIFOQueue pairs(2, "pairs");
  const fl::Tensor images = test::make({1, 2, 3, 4, 5, 6}, {2, 3});
  pairs.enqueue({images, fl::scalar(int64_t{7})});
  pairs.enqueue({test::make({1, 2, 3}, {1, 3}), fl::scalar(int64_t{8})});
  const std::vector<fl::Tensor> first = pairs.dequeue();
  REQUIRE(first.size() == 2);
  CHECK(first[0].data<float>() == images.data<float>());
  CHECK(first[1].item<int64_t>() == 7);
  CHECK(pairs.dequeue()[0].shape() == fl::Shape{1, 3});
}

TEST_CASE("enqueue blocks on a full queue until a dequeue makes room") {
  FIFOQueue q(2, "full");
  q.enqueue(item_of(0));
  q.enqueue(item_of(1));
  CHECK_FALSE(q.try_enqueue(item_of(99)));  // full: nothing added
  CHECK(q.size() == 2);

  Background producer(q, [q]() mutable { q.enqueue(item_of(2)); });
  CHECK_FALSE(producer.finished_within(kStillBlocked));
  CHECK(q.size() == 2);
  CHECK(value_of(q.dequeue()) == 0);
  REQUIRE(producer.finished_within(kTimeout));
  producer.result();
  CHECK(value_of(q.dequeue()) == 1);
  CHECK(value_of(q.dequeue()) == 2);
}

TEST_CASE("dequeue blocks on an empty queue until an item arrives") {
  FIFOQueue q(4, "empty");
  CHECK_FALSE(q.try_dequeue().has_value());
  CHECK_FALSE(q.try_dequeue_for(10ms).has_value());

  std::atomic<int64_t> got{-1};
  Background consumer(q, [q, &got]() mutable { got = value_of(q.dequeue()); });
  CHECK_FALSE(consumer.finished_within(kStillBlocked));
  CHECK(q.try_enqueue(item_of(5)));
  REQUIRE(consumer.finished_within(kTimeout));
  consumer.result();
  CHECK(got == 5);

  // try_dequeue_for returns as soon as an item comes.
  Background producer(q, [q]() mutable { q.enqueue(item_of(6)); });
  const std::optional<std::vector<fl::Tensor>> item = q.try_dequeue_for(kTimeout);
  REQUIRE(item.has_value());
  CHECK(value_of(*item) == 6);
}

TEST_CASE("close lets consumers drain what is held, then dequeue throws OutOfRange and enqueue Cancelled") {
  FIFOQueue q(4, "drain");
  for (int64_t i = 0; i < 3; ++i) q.enqueue(item_of(i));
  q.close();
  CHECK(q.is_closed());
  CHECK_FALSE(q.is_cancelled());
  check_throws<fl::Cancelled>([&] { q.enqueue(item_of(9)); }, {"enqueue: queue 'drain' is closed"});
  check_throws<fl::Cancelled>([&] { q.try_enqueue(item_of(9)); }, {"try_enqueue: queue 'drain' is closed"});
  CHECK(q.size() == 3);
  for (int64_t i = 0; i < 3; ++i) CHECK(value_of(q.dequeue()) == i);
  check_throws<fl::OutOfRange>([&] { q.dequeue(); }, {"dequeue: queue 'drain' is closed and empty"});
  check_throws<fl::OutOfRange>([&] { q.try_dequeue(); }, {"try_dequeue: queue 'drain' is closed and empty"});
  check_throws<fl::OutOfRange>([&] { q.try_dequeue_for(10ms); }, {"queue 'drain' is closed and empty"});
  q.close();  // idempotent
  check_throws<fl::OutOfRange>([&] { q.dequeue(); }, {"closed and empty"});
}

TEST_CASE("close wakes blocked consumers with OutOfRange and blocked producers with Cancelled") {
  FIFOQueue empty(1, "empty");
  Background consumer(empty, [empty]() mutable { empty.dequeue(); });
  CHECK_FALSE(consumer.finished_within(kStillBlocked));

  FIFOQueue full(1, "full");
  full.enqueue(item_of(1));
  Background producer(full, [full]() mutable { full.enqueue(item_of(2)); });
  CHECK_FALSE(producer.finished_within(kStillBlocked));

  empty.close();
  full.close();
  REQUIRE(consumer.finished_within(kTimeout));
  check_throws<fl::OutOfRange>([&] { consumer.result(); }, {"dequeue: queue 'empty' is closed and empty"});
  REQUIRE(producer.finished_within(kTimeout));
  check_throws<fl::Cancelled>([&] { producer.result(); }, {"enqueue: queue 'full' is closed"});
  CHECK(drain(full) == std::vector<int64_t>{1});  // the held item survives; the blocked one never entered
}

TEST_CASE("close_with_error hands the error to consumers once the queue is drained") {
  FIFOQueue q(4, "failing");
  q.enqueue(item_of(1));
  q.close_with_error(std::make_exception_ptr(fl::ShapeError("producer: bad batch; got [2, 3]")));
  q.close();  // the first close decides
  CHECK(value_of(q.dequeue()) == 1);
  check_throws<fl::ShapeError>([&] { q.dequeue(); }, {"producer: bad batch; got [2, 3]"});
  check_throws<fl::ShapeError>([&] { q.try_dequeue(); }, {"producer: bad batch"});
}

TEST_CASE("cancel wakes every blocked enqueue and dequeue with Cancelled, and later calls fail too") {
  FIFOQueue empty(1, "starved");
  Background consumer1(empty, [empty]() mutable { empty.dequeue(); });
  Background consumer2(empty, [empty]() mutable { empty.try_dequeue_for(std::chrono::minutes(5)); });
  FIFOQueue full(1, "stuffed");
  full.enqueue(item_of(1));
  Background producer1(full, [full]() mutable { full.enqueue(item_of(2)); });
  Background producer2(full, [full]() mutable { full.enqueue(item_of(3)); });
  CHECK_FALSE(consumer1.finished_within(kStillBlocked));
  CHECK_FALSE(consumer2.finished_within(0ms));
  CHECK_FALSE(producer1.finished_within(0ms));
  CHECK_FALSE(producer2.finished_within(0ms));

  empty.cancel();
  full.cancel();
  for (Background* b : {&consumer1, &consumer2}) {
    REQUIRE(b->finished_within(kTimeout));
    check_throws<fl::Cancelled>([&] { b->result(); }, {"queue 'starved' was cancelled"});
  }
  for (Background* b : {&producer1, &producer2}) {
    REQUIRE(b->finished_within(kTimeout));
    check_throws<fl::Cancelled>([&] { b->result(); }, {"enqueue: queue 'stuffed' was cancelled"});
  }
  CHECK(full.is_cancelled());
  CHECK(full.is_closed());
  CHECK(full.size() == 0);  // held items are dropped
  check_throws<fl::Cancelled>([&] { full.dequeue(); }, {"dequeue: queue 'stuffed' was cancelled"});
  check_throws<fl::Cancelled>([&] { full.try_dequeue(); }, {"try_dequeue: queue 'stuffed' was cancelled"});
  check_throws<fl::Cancelled>([&] { full.enqueue(item_of(4)); }, {"enqueue: queue 'stuffed' was cancelled"});
  full.close();  // no effect on a cancelled queue
  check_throws<fl::Cancelled>([&] { full.dequeue(); }, {"was cancelled"});
}

// Producers enqueue disjoint ranges and close the queue when all are done; consumers dequeue until
// OutOfRange. Returns what each consumer got, in its order.
std::vector<std::vector<int64_t>> run_many(fl::Queue q, int producers, int consumers, int64_t per_producer) {
  std::vector<std::vector<int64_t>> got(static_cast<size_t>(consumers));
  std::atomic<int> producers_left{producers};
  std::vector<std::thread> threads;
  for (int p = 0; p < producers; ++p)
    threads.emplace_back([q, p, per_producer, &producers_left]() mutable {
      for (int64_t i = 0; i < per_producer; ++i) q.enqueue(item_of(p * per_producer + i));
      if (--producers_left == 0) q.close();
    });
  for (int c = 0; c < consumers; ++c)
    threads.emplace_back([q, &mine = got[static_cast<size_t>(c)]]() mutable { mine = drain(q); });
  for (std::thread& t : threads) t.join();
  return got;
}

TEST_CASE("many producers and many consumers deliver every item exactly once") {
  constexpr int kProducers = 4;
  constexpr int kConsumers = 4;
  constexpr int64_t kPerProducer = 2500;
  constexpr int64_t kTotal = kProducers * kPerProducer;

  SUBCASE("FIFOQueue: and each producer's items in the order it enqueued them") {
    FIFOQueue q(8, "many");
    const auto got = run_many(q, kProducers, kConsumers, kPerProducer);
    std::vector<int64_t> all;
    for (const std::vector<int64_t>& mine : got) {
      all.insert(all.end(), mine.begin(), mine.end());
      std::map<int64_t, int64_t> last;  // producer -> last value this consumer saw from it
      bool ordered = true;
      for (int64_t v : mine) {
        const int64_t producer = v / kPerProducer;
        if (last.count(producer) && last[producer] >= v) ordered = false;
        last[producer] = v;
      }
      CHECK(ordered);
    }
    std::sort(all.begin(), all.end());
    CHECK(all == iota(kTotal));
    CHECK(q.size() == 0);
  }
  SUBCASE("RandomShuffleQueue") {
    RandomShuffleQueue q(16, 4, /*seed=*/3, "many_shuffled");
    const auto got = run_many(q, kProducers, kConsumers, kPerProducer);
    std::vector<int64_t> all;
    for (const std::vector<int64_t>& mine : got) all.insert(all.end(), mine.begin(), mine.end());
    std::sort(all.begin(), all.end());
    CHECK(all == iota(kTotal));
  }
}

TEST_CASE("a RandomShuffleQueue dequeues only while more than min_after_dequeue items are held") {
  RandomShuffleQueue q(10, 3, /*seed=*/1, "pool");
  CHECK(q.min_after_dequeue() == 3);
  for (int64_t i = 0; i < 3; ++i) q.enqueue(item_of(i));
  CHECK_FALSE(q.try_dequeue().has_value());
  CHECK_FALSE(q.try_dequeue_for(10ms).has_value());

  std::atomic<int64_t> got{-1};
  Background consumer(q, [q, &got]() mutable { got = value_of(q.dequeue()); });
  CHECK_FALSE(consumer.finished_within(kStillBlocked));
  q.enqueue(item_of(3));  // four held: one may go
  REQUIRE(consumer.finished_within(kTimeout));
  consumer.result();
  CHECK(got >= 0);
  CHECK(got <= 3);
  CHECK(q.size() == 3);
  CHECK_FALSE(q.try_dequeue().has_value());

  q.close();  // now everything drains
  std::vector<int64_t> rest = drain(q);
  rest.push_back(got);
  std::sort(rest.begin(), rest.end());
  CHECK(rest == iota(4));
}

// One producer and one consumer on one thread: enqueue 0..n-1, dequeuing whenever one may go, then
// close and drain.
std::vector<int64_t> shuffled_run(uint64_t seed, int64_t n = 200) {
  RandomShuffleQueue q(20, 10, seed, "run");
  std::vector<int64_t> order;
  for (int64_t i = 0; i < n; ++i) {
    q.enqueue(item_of(i));
    if (std::optional<std::vector<fl::Tensor>> item = q.try_dequeue()) order.push_back(value_of(*item));
  }
  q.close();
  for (int64_t v : drain(q)) order.push_back(v);
  return order;
}

TEST_CASE("a RandomShuffleQueue delivers every item once, in an order fixed by its seed") {
  const std::vector<int64_t> a = shuffled_run(42);
  CHECK(a == shuffled_run(42));
  CHECK(a != shuffled_run(43));
  CHECK(a != iota(200));  // not FIFO
  std::vector<int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == iota(200));
  // Dequeue k comes after item k + 10 arrived (a pool of 11), so it cannot be a later item.
  bool pool_kept = true;
  for (size_t k = 0; k < a.size(); ++k) pool_kept = pool_kept && a[k] <= static_cast<int64_t>(k) + 10;
  CHECK(pool_kept);
}

TEST_CASE("a RandomShuffleQueue picks each held item with equal probability") {
  // 4 items held, one dequeue, over 4000 seeds: each item about 1000 times (binomial sd ~27).
  std::vector<int> counts(4, 0);
  for (uint64_t seed = 0; seed < 4000; ++seed) {
    RandomShuffleQueue q(4, 0, seed);
    for (int64_t i = 0; i < 4; ++i) q.enqueue(item_of(i));
    ++counts[static_cast<size_t>(value_of(q.dequeue()))];
  }
  for (int count : counts) {
    CHECK(count > 850);
    CHECK(count < 1150);
  }
}

TEST_CASE("bad queue arguments throw InvalidArgument naming the values") {
  check_throws<fl::InvalidArgument>([] { FIFOQueue(0); }, {"FIFOQueue: capacity must be at least 1; got 0"});
  check_throws<fl::InvalidArgument>([] { FIFOQueue(-3, "q"); }, {"FIFOQueue:", "got -3 for 'q'"});
  check_throws<fl::InvalidArgument>([] { RandomShuffleQueue(0, 0, 1); },
                                    {"RandomShuffleQueue: capacity must be at least 1; got 0"});
  check_throws<fl::InvalidArgument>([] { RandomShuffleQueue(4, 4, 1, "s"); },
                                    {"RandomShuffleQueue: min_after_dequeue must be in [0, capacity)",
                                     "got min_after_dequeue 4 and capacity 4 for 's'"});
  check_throws<fl::InvalidArgument>([] { RandomShuffleQueue(4, -1, 1); }, {"got min_after_dequeue -1"});
}

TEST_CASE("the first item fixes the count and dtypes of items; a mismatch leaves the queue unchanged") {
  FIFOQueue q(4, "sig");
  const fl::Tensor images = test::make({1, 2, 3}, {1, 3});
  const fl::Tensor labels = fl::tensor({int64_t{4}});
  q.enqueue({images, labels});
  q.enqueue({test::make({1, 2, 3, 4, 5, 6}, {2, 3}), fl::tensor({int64_t{1}, int64_t{2}})});  // shapes may vary

  check_throws<fl::InvalidArgument>([&] { q.enqueue({images}); },
                                    {"enqueue: item has the wrong number of tensors for queue 'sig'",
                                     "got 1, expected 2"});
  check_throws<fl::DTypeError>([&] { q.enqueue({images, test::make({1}, fl::i32)}); },
                               {"enqueue: component 1 of the item has the wrong dtype for queue 'sig'",
                                "got i32, expected i64"});
  check_throws<fl::DTypeError>([&] { q.try_enqueue({test::make({1}, fl::f64), labels}); },
                               {"try_enqueue: component 0", "got f64, expected f32"});
  check_throws<fl::InvalidArgument>([&] { q.enqueue({images, fl::Tensor()}); },
                                    {"enqueue: component 1 of the item for queue 'sig' is an empty Tensor handle"});
  CHECK(q.size() == 2);
  CHECK(q.dequeue()[0].data<float>() == images.data<float>());

  // A producer whose item does not fit fails at once instead of waiting for room.
  q.enqueue({images, labels});
  q.enqueue({images, labels});
  q.enqueue({images, labels});
  REQUIRE(q.size() == 4);
  Background producer(q, [q, images]() mutable { q.enqueue({images}); });
  REQUIRE(producer.finished_within(kTimeout));
  check_throws<fl::InvalidArgument>([&] { producer.result(); }, {"wrong number of tensors"});
  CHECK(q.size() == 4);

  FIFOQueue any(4, "any", fl::ItemSignature::any);
  any.enqueue({images, labels});
  any.enqueue({labels});
  any.enqueue({});
  CHECK(any.size() == 3);
}

// ---------------------------------------------------------------------------------------------
// Prefetcher.

namespace {

// Ten examples: images f32 [10, 3] = 3i + j, labels i64 [10] = i.
Dataset tiny_dataset() {
  std::vector<double> pixels;
  std::vector<double> labels;
  for (int i = 0; i < 10; ++i) {
    for (int j = 0; j < 3; ++j) pixels.push_back(3 * i + j);
    labels.push_back(i);
  }
  return Dataset{test::make(pixels, {10, 3}), test::make(labels, {10}, fl::i64)};
}

void check_same_batch(const Dataset& got, const Dataset& want) {
  CHECK(got.images.shape() == want.images.shape());
  CHECK(got.labels.shape() == want.labels.shape());
  CHECK(got.images.to_vector<float>() == want.images.to_vector<float>());
  CHECK(got.labels.to_vector<int64_t>() == want.labels.to_vector<int64_t>());
}

// A source of `count` copies of the tiny dataset, counting its calls; after that, nullopt.
fl::data::BatchSource counting_source(std::shared_ptr<std::atomic<int>> calls, int count) {
  return [calls, count]() -> std::optional<Dataset> {
    if (calls->fetch_add(1) >= count) return std::nullopt;
    return tiny_dataset();
  };
}

}  // namespace

TEST_CASE("a Prefetcher yields the batches Batches yields, in order, epoch after epoch") {
  const Dataset dataset = tiny_dataset();
  Batches batches(dataset, /*batch_size=*/4, /*seed=*/7);
  REQUIRE(batches.size() == 3);

  SUBCASE("for a given number of epochs, then nullopt") {
    Prefetcher prefetch(batches, {.depth = 2, .epochs = 2, .name = "tiny"});
    CHECK(prefetch.queue().name() == "tiny");
    CHECK(prefetch.queue().capacity() == 2);
    for (uint64_t epoch = 0; epoch < 2; ++epoch) {
      batches.reshuffle(epoch);
      for (const Dataset& want : batches) {
        const std::optional<Dataset> got = prefetch.next();
        REQUIRE(got.has_value());
        check_same_batch(*got, want);
      }
    }
    CHECK_FALSE(prefetch.next().has_value());
    CHECK_FALSE(prefetch.next().has_value());
  }
  SUBCASE("starting at first_epoch") {
    Prefetcher prefetch(batches, {.epochs = 1, .first_epoch = 3});
    batches.reshuffle(3);
    for (const Dataset& want : batches) check_same_batch(prefetch.next().value(), want);
    CHECK_FALSE(prefetch.next().has_value());
  }
  SUBCASE("forever, until destroyed") {
    auto prefetch = std::make_unique<Prefetcher>(batches, fl::data::PrefetchOptions{.depth = 3});
    for (uint64_t epoch = 0; epoch < 3; ++epoch) {
      batches.reshuffle(epoch);
      for (const Dataset& want : batches) check_same_batch(prefetch->next().value(), want);
    }
    // The producer refills the queue and then waits for room; destroying the prefetcher stops it.
    fl::FIFOQueue queue = prefetch->queue();
    REQUIRE(eventually([&] { return queue.size() == 3; }));
    CHECK(returns_within([&] { prefetch.reset(); }, kTimeout));
    CHECK(queue.is_cancelled());
  }
  SUBCASE("zero epochs: nothing") {
    Prefetcher prefetch(batches, {.epochs = 0});
    CHECK_FALSE(prefetch.next().has_value());
  }
}

TEST_CASE("a Prefetcher builds at most depth batches ahead of its consumer") {
  auto calls = std::make_shared<std::atomic<int>>(0);
  Prefetcher prefetch(counting_source(calls, 100), {.depth = 2});
  // Two batches wait in the queue and a third is built, then the producer blocks in enqueue.
  REQUIRE(eventually([&] { return calls->load() == 3; }));
  std::this_thread::sleep_for(kStillBlocked);
  CHECK(calls->load() == 3);
  CHECK(prefetch.queue().size() == 2);
  CHECK(prefetch.next().has_value());
  CHECK(eventually([&] { return calls->load() == 4; }));
}

TEST_CASE("destroying a Prefetcher whose producer is blocked returns promptly") {
  auto calls = std::make_shared<std::atomic<int>>(0);
  auto prefetch = std::make_unique<Prefetcher>(counting_source(calls, 1000), fl::data::PrefetchOptions{.depth = 1});
  REQUIRE(eventually([&] { return calls->load() == 2 && prefetch->queue().size() == 1; }));
  CHECK(returns_within([&] { prefetch.reset(); }, kTimeout));
  CHECK(calls->load() == 2);  // nothing was built after the stop
}

TEST_CASE("a failure in the producer reaches the consumer after the batches built before it") {
  SUBCASE("an exception from the source, rethrown by next() and by a dequeue on queue()") {
    auto calls = std::make_shared<std::atomic<int>>(0);
    Prefetcher prefetch(
        [calls]() -> std::optional<Dataset> {
          if (calls->fetch_add(1) == 2) throw fl::ShapeError("decode: image 17 is 27x28; got a truncated record");
          return tiny_dataset();
        },
        {.depth = 4});
    CHECK(prefetch.next().has_value());
    CHECK(prefetch.next().has_value());
    check_throws<fl::ShapeError>([&] { prefetch.next(); }, {"decode: image 17 is 27x28"});
    check_throws<fl::ShapeError>([&] { prefetch.queue().dequeue(); }, {"decode: image 17"});
  }
  SUBCASE("an OutOfRange from the source is an error, not the end of the data") {
    Prefetcher prefetch([]() -> std::optional<Dataset> { throw fl::OutOfRange("reader: index 9 past the end"); });
    check_throws<fl::OutOfRange>([&] { prefetch.next(); }, {"reader: index 9 past the end"});
  }
  SUBCASE("a batch holding an empty Tensor handle") {
    Prefetcher prefetch([]() -> std::optional<Dataset> { return Dataset{}; });
    check_throws<fl::InvalidArgument>([&] { prefetch.next(); },
                                      {"enqueue: component 0 of the item for queue 'prefetch' is an empty Tensor"});
  }
}

TEST_CASE("bad Prefetcher options throw InvalidArgument naming the values") {
  const Dataset dataset = tiny_dataset();
  const Batches batches(dataset, 4, 1);
  check_throws<fl::InvalidArgument>([&] { Prefetcher(batches, {.depth = 0}); },
                                    {"Prefetcher: depth must be at least 1; got 0"});
  check_throws<fl::InvalidArgument>([&] { Prefetcher(batches, {.epochs = -1}); },
                                    {"Prefetcher: epochs must be non-negative; got -1"});
  check_throws<fl::InvalidArgument>([&] { Prefetcher(Batches(dataset, 11, 1, /*drop_last=*/true)); },
                                    {"Prefetcher: an epoch of these batches is empty",
                                     "got 10 examples with batch_size 11"});
  auto calls = std::make_shared<std::atomic<int>>(0);
  check_throws<fl::InvalidArgument>([&] { Prefetcher(counting_source(calls, 1), {.epochs = 2}); },
                                    {"Prefetcher: epochs and first_epoch apply to Batches", "got epochs 2"});
  check_throws<fl::InvalidArgument>([&] { Prefetcher prefetch{fl::data::BatchSource()}; }, {"empty std::function"});
}
