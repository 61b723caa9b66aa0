// Prefetcher: the producer thread, epochs of Batches as a batch source, and handing failures on.
#include "flowlet/data/pipeline.hpp"

#include <exception>
#include <utility>
#include <vector>

#include "core/check.hpp"

namespace flowlet::data {
namespace {

using detail::fail;

constexpr std::string_view kOp = "Prefetcher";

const PrefetchOptions& checked(const PrefetchOptions& options) {
  if (options.depth < 1) fail<InvalidArgument>("{}: depth must be at least 1; got {}", kOp, options.depth);
  if (options.epochs && *options.epochs < 0)
    fail<InvalidArgument>("{}: epochs must be non-negative; got {}", kOp, *options.epochs);
  return options;
}

// The batches of epochs first_epoch, first_epoch + 1, ... (`epochs` of them; all, when nullopt).
BatchSource epochs_of(Batches batches, std::optional<int64_t> epochs, uint64_t first_epoch) {
  if (batches.size() == 0)
    fail<InvalidArgument>("{}: an epoch of these batches is empty; got {} examples with batch_size {}", kOp,
                          batches.order().size(), batches.batch_size());
  return [batches = std::move(batches), epochs, first_epoch, done = int64_t{0}, index = int64_t{-1}]() mutable
         -> std::optional<Dataset> {
    for (;;) {
      if (epochs && done == *epochs) return std::nullopt;
      if (index < 0) {  // starting an epoch
        batches.reshuffle(first_epoch + static_cast<uint64_t>(done));
        index = 0;
      }
      if (index < batches.size()) return batches[index++];
      ++done;
      index = -1;
    }
  };
}

// The producer thread: enqueue until the source ends, then close; on failure, close with the error.
void produce(FIFOQueue queue, BatchSource source, std::atomic<bool>& failed) {
  try {
    while (std::optional<Dataset> batch = source()) queue.enqueue({std::move(batch->images), std::move(batch->labels)});
    queue.close();
  } catch (...) {
    // Closed or cancelled from outside (the destructor cancels): the consumers know already.
    if (queue.is_closed()) return;
    failed.store(true);
    queue.close_with_error(std::current_exception());
  }
}

}  // namespace

Prefetcher::Prefetcher(Batches batches, PrefetchOptions options)
    : Prefetcher(epochs_of(std::move(batches), checked(options).epochs, options.first_epoch),
                 PrefetchOptions{.depth = options.depth, .name = std::move(options.name)}) {}

Prefetcher::Prefetcher(BatchSource source, PrefetchOptions options)
    : queue_(checked(options).depth, std::move(options.name)) {
  if (options.epochs || options.first_epoch != 0)
    fail<InvalidArgument>("{}: epochs and first_epoch apply to Batches; got epochs {} and first_epoch {} with a "
                          "BatchSource",
                          kOp, options.epochs ? fmt::to_string(*options.epochs) : "unset", options.first_epoch);
  if (!source) fail<InvalidArgument>("{}: the batch source is an empty std::function", kOp);
  producer_ = std::thread(produce, queue_, std::move(source), std::ref(producer_failed_));
}

Prefetcher::~Prefetcher() {
  queue_.cancel();  // wakes the producer if it waits for room; its next enqueue fails
  if (producer_.joinable()) producer_.join();
}

std::optional<Dataset> Prefetcher::next() {
  std::vector<Tensor> item;
  try {
    item = queue_.dequeue();
  } catch (const OutOfRange&) {
    if (producer_failed_.load()) throw;  // the producer's own OutOfRange, rethrown by the queue
    return std::nullopt;                 // every batch was taken
  }
  if (item.size() != 2)
    fail<InvalidArgument>("{}: an item of queue '{}' is not {{images, labels}}; got {} tensors", kOp, queue_.name(),
                          item.size());
  return Dataset{std::move(item[0]), std::move(item[1])};
}

}  // namespace flowlet::data
