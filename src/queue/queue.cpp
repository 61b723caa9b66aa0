// The blocking core every queue shares (one mutex, a condition variable for each side, close and
// cancel); FIFOQueue and RandomShuffleQueue differ only in which held item a dequeue may take.
// Graph nodes wait differently: they park a callback (dequeue_async, enqueue_async), and every
// change of state serves parked callbacks first (serve_parked), then wakes blocked threads.
#include "flowlet/queue.hpp"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <utility>

#include "core/check.hpp"
#include "queue/queue_internal.hpp"
#include "trace/tracer.hpp"

namespace flowlet {
namespace detail {

struct QueueState {
  std::string name;
  int64_t capacity = 1;
  // Dequeues wait until more than this many items are held (0 for FIFO); after close, any can go.
  int64_t min_after_dequeue = 0;
  bool shuffle = false;  // take a uniformly random held item instead of the oldest
  ItemSignature signature = ItemSignature::from_first;

  std::mutex mutex;                   // guards everything below
  std::condition_variable not_empty;  // consumers wait here: an item became available, or the queue closed
  std::condition_variable not_full;   // producers wait here: a slot became free, or the queue closed
  std::deque<std::vector<Tensor>> items;
  std::mt19937_64 random;             // the shuffle's choices (mt19937_64's output is fixed by the standard)
  std::optional<std::vector<DType>> dtypes;  // with from_first: fixed by the first item enqueued
  bool closed = false;                // set by close, close_with_error and cancel
  bool cancelled = false;
  std::exception_ptr error;           // what consumers get instead of OutOfRange once drained

  // Graph nodes waiting without a thread, in arrival order.
  struct ParkedConsumer {
    int64_t id;
    DequeueDone done;
  };
  struct ParkedProducer {
    int64_t id;
    std::vector<Tensor> item;
    EnqueueDone done;
  };
  std::deque<ParkedConsumer> parked_consumers;
  std::deque<ParkedProducer> parked_producers;
  int64_t next_waiter = 0;
};

}  // namespace detail

namespace {

using detail::fail;
using detail::QueueState;
using detail::DequeueDone;
using detail::EnqueueDone;

// Uniform in [0, bound) without modulo bias (Lemire 2019); unlike std::uniform_int_distribution,
// the same on every standard library.
uint64_t uniform_below(std::mt19937_64& random, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;
  for (;;) {
    const unsigned __int128 product = static_cast<unsigned __int128>(random()) * bound;
    if (static_cast<uint64_t>(product) >= threshold) return static_cast<uint64_t>(product >> 64);
  }
}

// Checks that need no lock: every tensor is a defined, concrete handle.
void check_tensors(const QueueState& s, const char* op, const std::vector<Tensor>& item) {
  for (size_t k = 0; k < item.size(); ++k) {
    if (!item[k].defined())
      fail<InvalidArgument>("{}: component {} of the item for queue '{}' is an empty Tensor handle; got Tensor()", op,
                            k, s.name);
    if (item[k].is_symbolic())
      fail<InvalidArgument>(
          "{}: component {} of the item for queue '{}' is a symbolic tensor computed inside a traced function; got "
          "{} {}; enqueue concrete tensors",
          op, k, s.name, item[k].dtype(), item[k].shape());
  }
}

// try_* return whether they took or gave an item, which a graph cannot know at trace time.
void fail_if_tracing(const char* op, const QueueState& s) {
  if (detail::active_trace()) {
    fail<InvalidArgument>(
        "{}: cannot be traced (queue '{}'): whether it succeeds is known only when it runs; use enqueue or dequeue "
        "inside a traced function",
        op, s.name);
  }
}

// Under the lock: the item matches the signature fixed by the first item (if one is fixed yet).
void check_signature(const QueueState& s, const char* op, const std::vector<Tensor>& item) {
  if (!s.dtypes) return;
  const std::vector<DType>& dtypes = *s.dtypes;
  if (item.size() != dtypes.size())
    fail<InvalidArgument>("{}: item has the wrong number of tensors for queue '{}'; got {}, expected {} (fixed by "
                          "the first item)",
                          op, s.name, item.size(), dtypes.size());
  for (size_t k = 0; k < item.size(); ++k)
    if (item[k].dtype() != dtypes[k])
      fail<DTypeError>("{}: component {} of the item has the wrong dtype for queue '{}'; got {}, expected {} (fixed "
                       "by the first item)",
                       op, k, s.name, item[k].dtype(), dtypes[k]);
}

// Under the lock: Cancelled once the queue takes no more items.
void check_enqueue_open(const QueueState& s, const char* op) {
  if (s.cancelled) fail<Cancelled>("{}: queue '{}' was cancelled", op, s.name);
  if (s.closed) fail<Cancelled>("{}: queue '{}' is closed", op, s.name);
}

// Under the lock, once there is room: the final checks, then the item goes in.
void push(QueueState& s, const char* op, std::vector<Tensor> item) {
  check_enqueue_open(s, op);
  check_signature(s, op, item);
  if (s.signature == ItemSignature::from_first && !s.dtypes) {
    std::vector<DType> dtypes;
    dtypes.reserve(item.size());
    for (const Tensor& t : item) dtypes.push_back(t.dtype());
    s.dtypes = std::move(dtypes);
  }
  s.items.push_back(std::move(item));
}

bool has_room(const QueueState& s) { return static_cast<int64_t>(s.items.size()) < s.capacity; }

// Under the lock: a dequeue may take an item now.
bool item_ready(const QueueState& s) {
  return !s.items.empty() && (s.closed || static_cast<int64_t>(s.items.size()) > s.min_after_dequeue);
}

// Under the lock: a dequeue has something to do now (take an item or fail).
bool dequeue_can_finish(const QueueState& s) { return s.cancelled || item_ready(s) || (s.closed && s.items.empty()); }

// Under the lock: throws when no dequeue can ever take an item again.
void check_dequeue_open(const QueueState& s, const char* op) {
  if (s.cancelled) fail<Cancelled>("{}: queue '{}' was cancelled", op, s.name);
  if (s.closed && s.items.empty()) {
    if (s.error) std::rethrow_exception(s.error);
    fail<OutOfRange>("{}: queue '{}' is closed and empty", op, s.name);
  }
}

// Under the lock, with item_ready(s): removes the oldest item, or a uniformly random one.
std::vector<Tensor> take(QueueState& s) {
  if (s.shuffle) {
    const auto index = static_cast<size_t>(uniform_below(s.random, s.items.size()));
    if (index != 0) std::swap(s.items[index], s.items.front());
  }
  std::vector<Tensor> item = std::move(s.items.front());
  s.items.pop_front();
  return item;
}

// The callbacks serve_parked settled, run once the lock is released (they may call back into the
// queue), and which blocked threads to wake.
struct Settled {
  std::vector<std::pair<DequeueDone, std::vector<Tensor>>> items;
  std::vector<std::pair<DequeueDone, std::exception_ptr>> failed_dequeues;
  std::vector<std::pair<EnqueueDone, std::exception_ptr>> enqueues;
  bool took = false;    // a slot became free
  bool pushed = false;  // an item arrived

  void run(QueueState& s) {
    if (took) s.not_full.notify_all();
    if (pushed) s.not_empty.notify_all();
    for (auto& [done, item] : items) done(std::move(item), nullptr);
    for (auto& [done, error] : failed_dequeues) done({}, error);
    for (auto& [done, error] : enqueues) done(error);
  }
};

// Under the lock: lets parked consumers and producers go while they can (an item handed to a
// consumer frees a slot for a producer, whose item may serve the next consumer).
void serve_parked(QueueState& s, Settled& settled) {
  for (bool progress = true; progress;) {
    progress = false;
    while (!s.parked_consumers.empty() && dequeue_can_finish(s)) {
      QueueState::ParkedConsumer c = std::move(s.parked_consumers.front());
      s.parked_consumers.pop_front();
      try {
        check_dequeue_open(s, "dequeue");
        settled.items.emplace_back(std::move(c.done), take(s));
        settled.took = true;
      } catch (...) {
        settled.failed_dequeues.emplace_back(std::move(c.done), std::current_exception());
      }
      progress = true;
    }
    while (!s.parked_producers.empty() && (s.closed || has_room(s))) {
      QueueState::ParkedProducer p = std::move(s.parked_producers.front());
      s.parked_producers.pop_front();
      try {
        push(s, "enqueue", std::move(p.item));
        settled.enqueues.emplace_back(std::move(p.done), nullptr);
        settled.pushed = true;
      } catch (...) {
        settled.enqueues.emplace_back(std::move(p.done), std::current_exception());
      }
      progress = true;
    }
  }
}

// Under the lock, once a dequeue may finish: its checks, its item, and what the freed slot lets
// parked graph nodes do. The caller then calls after_take outside the lock.
std::vector<Tensor> take_checked(QueueState& s, const char* op, Settled& settled) {
  check_dequeue_open(s, op);
  std::vector<Tensor> item = take(s);
  serve_parked(s, settled);
  return item;
}

void after_take(QueueState& s, Settled& settled) {
  s.not_full.notify_one();
  settled.run(s);
}

std::shared_ptr<QueueState> make_state(std::string name, int64_t capacity, ItemSignature signature) {
  auto state = std::make_shared<QueueState>();
  state->name = std::move(name);
  state->capacity = capacity;
  state->signature = signature;
  return state;
}

}  // namespace

// Each enqueue makes at most one more dequeue possible (and each dequeue one more enqueue), so
// waking one waiter per item is enough: a waiter re-checks under the lock, even after a timeout.
// close and cancel change what every waiter may do, so they wake all of them.

void Queue::enqueue(std::vector<Tensor> item) {
  if (detail::active_trace()) return detail::record_enqueue(state_, state_->name, item);
  QueueState& s = *state_;
  check_tensors(s, "enqueue", item);
  Settled settled;
  {
    std::unique_lock lock(s.mutex);
    check_enqueue_open(s, "enqueue");
    check_signature(s, "enqueue", item);  // fail before blocking; push checks again after the wait
    // Parked graph producers came first: wait behind them.
    s.not_full.wait(lock, [&] { return s.closed || (has_room(s) && s.parked_producers.empty()); });
    try {
      push(s, "enqueue", std::move(item));
    } catch (...) {
      // Another producer fixed a different signature while this one waited: pass on the wakeup
      // this one may have taken, so the free slot is not left with every other producer asleep.
      lock.unlock();
      s.not_full.notify_one();
      throw;
    }
    serve_parked(s, settled);
  }
  s.not_empty.notify_one();
  settled.run(s);
}

bool Queue::try_enqueue(const std::vector<Tensor>& item) {
  QueueState& s = *state_;
  fail_if_tracing("try_enqueue", s);
  check_tensors(s, "try_enqueue", item);
  Settled settled;
  {
    std::lock_guard lock(s.mutex);
    check_enqueue_open(s, "try_enqueue");
    check_signature(s, "try_enqueue", item);
    if (!has_room(s) || !s.parked_producers.empty()) return false;
    push(s, "try_enqueue", item);
    serve_parked(s, settled);
  }
  s.not_empty.notify_one();
  settled.run(s);
  return true;
}

std::vector<Tensor> Queue::dequeue() {
  if (detail::active_trace()) return detail::record_dequeue(state_, state_->name);
  QueueState& s = *state_;
  std::vector<Tensor> item;
  Settled settled;
  {
    std::unique_lock lock(s.mutex);
    s.not_empty.wait(lock, [&] { return dequeue_can_finish(s); });
    item = take_checked(s, "dequeue", settled);
  }
  after_take(s, settled);
  return item;
}

std::optional<std::vector<Tensor>> Queue::try_dequeue() {
  QueueState& s = *state_;
  fail_if_tracing("try_dequeue", s);
  std::vector<Tensor> item;
  Settled settled;
  {
    std::lock_guard lock(s.mutex);
    check_dequeue_open(s, "try_dequeue");
    if (!item_ready(s)) return std::nullopt;
    item = take_checked(s, "try_dequeue", settled);
  }
  after_take(s, settled);
  return item;
}

std::optional<std::vector<Tensor>> Queue::try_dequeue_for(std::chrono::milliseconds timeout) {
  QueueState& s = *state_;
  fail_if_tracing("try_dequeue_for", s);
  std::vector<Tensor> item;
  Settled settled;
  {
    std::unique_lock lock(s.mutex);
    if (!s.not_empty.wait_for(lock, timeout, [&] { return dequeue_can_finish(s); })) return std::nullopt;
    item = take_checked(s, "try_dequeue_for", settled);
  }
  after_take(s, settled);
  return item;
}

void Queue::close() { close_with_error(nullptr); }

void Queue::close_with_error(std::exception_ptr error) {
  QueueState& s = *state_;
  Settled settled;
  {
    std::lock_guard lock(s.mutex);
    if (s.closed) return;  // the first close decides what drained consumers get
    s.closed = true;
    s.error = std::move(error);
    serve_parked(s, settled);
  }
  s.not_empty.notify_all();
  s.not_full.notify_all();
  settled.run(s);
}

void Queue::cancel() {
  QueueState& s = *state_;
  std::deque<std::vector<Tensor>> dropped;  // freed after the lock is released
  Settled settled;
  {
    std::lock_guard lock(s.mutex);
    s.closed = true;
    s.cancelled = true;
    dropped.swap(s.items);
    serve_parked(s, settled);
  }
  s.not_empty.notify_all();
  s.not_full.notify_all();
  settled.run(s);
}

int64_t Queue::size() const {
  std::lock_guard lock(state_->mutex);
  return static_cast<int64_t>(state_->items.size());
}

int64_t Queue::capacity() const { return state_->capacity; }

bool Queue::is_closed() const {
  std::lock_guard lock(state_->mutex);
  return state_->closed;
}

bool Queue::is_cancelled() const {
  std::lock_guard lock(state_->mutex);
  return state_->cancelled;
}

const std::string& Queue::name() const { return state_->name; }

FIFOQueue::FIFOQueue(int64_t capacity, std::string name, ItemSignature signature)
    : Queue([&] {
        if (capacity < 1)
          fail<InvalidArgument>("FIFOQueue: capacity must be at least 1; got {} for '{}'", capacity, name);
        return make_state(std::move(name), capacity, signature);
      }()) {}

RandomShuffleQueue::RandomShuffleQueue(int64_t capacity, int64_t min_after_dequeue, uint64_t seed, std::string name,
                                       ItemSignature signature)
    : Queue([&] {
        constexpr std::string_view op = "RandomShuffleQueue";
        if (capacity < 1) fail<InvalidArgument>("{}: capacity must be at least 1; got {} for '{}'", op, capacity, name);
        if (min_after_dequeue < 0 || min_after_dequeue >= capacity)
          fail<InvalidArgument>(
              "{}: min_after_dequeue must be in [0, capacity); got min_after_dequeue {} and capacity {} for '{}'", op,
              min_after_dequeue, capacity, name);
        auto state = make_state(std::move(name), capacity, signature);
        state->min_after_dequeue = min_after_dequeue;
        state->shuffle = true;
        state->random.seed(seed);
        return state;
      }()) {}

int64_t RandomShuffleQueue::min_after_dequeue() const { return state_->min_after_dequeue; }

namespace detail {

int64_t dequeue_async(QueueState& s, DequeueDone done) {
  Settled settled;
  int64_t id;
  {
    std::lock_guard lock(s.mutex);
    id = s.next_waiter++;
    s.parked_consumers.push_back({id, std::move(done)});
    serve_parked(s, settled);  // settles it now if it can (and only it: earlier ones could not)
  }
  settled.run(s);
  return id;
}

int64_t enqueue_async(QueueState& s, std::vector<Tensor> item, EnqueueDone done) {
  check_tensors(s, "enqueue", item);
  Settled settled;
  int64_t id;
  {
    std::lock_guard lock(s.mutex);
    check_enqueue_open(s, "enqueue");
    check_signature(s, "enqueue", item);
    id = s.next_waiter++;
    s.parked_producers.push_back({id, std::move(item), std::move(done)});
    serve_parked(s, settled);
  }
  settled.run(s);
  return id;
}

bool abandon_waiter(QueueState& s, int64_t id, std::exception_ptr error) {
  DequeueDone consumer;
  EnqueueDone producer;
  {
    std::lock_guard lock(s.mutex);
    auto c = std::find_if(s.parked_consumers.begin(), s.parked_consumers.end(), [&](const auto& w) { return w.id == id; });
    if (c != s.parked_consumers.end()) {
      consumer = std::move(c->done);
      s.parked_consumers.erase(c);
    } else {
      auto p = std::find_if(s.parked_producers.begin(), s.parked_producers.end(), [&](const auto& w) { return w.id == id; });
      if (p == s.parked_producers.end()) return false;
      producer = std::move(p->done);
      s.parked_producers.erase(p);
    }
  }
  if (consumer) consumer({}, std::move(error));
  if (producer) producer(std::move(error));
  return true;
}

std::vector<Tensor> wait_for_first_item(QueueState& s, const char* op) {
  std::unique_lock lock(s.mutex);
  s.not_empty.wait(lock, [&] { return s.cancelled || s.closed || !s.items.empty(); });
  check_dequeue_open(s, op);
  if (s.items.empty()) fail<OutOfRange>("{}: queue '{}' is closed and empty", op, s.name);
  return s.items.front();
}

}  // namespace detail

}  // namespace flowlet
