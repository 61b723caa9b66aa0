// Datasets for training demos: the IDX reader, Fashion-MNIST from Debian's package, and seeded mini-batches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "flowlet/core/tensor.hpp"

namespace flowlet::data {

// Examples along axis 0: images f32 [N, rows * cols] scaled to [0, 1], labels i64 [N].
struct Dataset {
  Tensor images;
  Tensor labels;
};

// Reads an IDX image file (magic 0x00000803, unsigned bytes, [N, rows, cols]) and an IDX label file
// (magic 0x00000801, [N]); each may be gzip-compressed or plain. Pixels become f32 byte / 255.
// Errors name the file: InvalidArgument when it cannot be opened or decompressed, has a bad magic
// number, is truncated or has bytes after the data; ShapeError when the counts differ.
//   Dataset d = load_idx_images_and_labels("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz");
Dataset load_idx_images_and_labels(const std::string& images_path, const std::string& labels_path);

// Fashion-MNIST as installed by `apt-get install dataset-fashion-mnist`: split "train" (60000
// examples) or "test" (10000), images [N, 784] in [0, 1], labels in 0..9. Also reads the
// uncompressed files when the .gz ones are absent. Besides the reader's errors: InvalidArgument
// for another split name, ShapeError for images other than 28x28, OutOfRange for a label above 9.
//   Dataset train = load_fashion_mnist("train");
Dataset load_fashion_mnist(std::string_view split, std::string directory = "/usr/share/datasets/fashion-mnist");

// Shuffled mini-batches of a dataset. The order is a Fisher-Yates permutation drawn from a
// counter-based generator keyed by (seed, epoch): the same seed and epoch give the same batches
// on every run and platform. Batch i holds examples order[i * batch_size, ...) gathered into new
// tensors; the last batch is smaller unless drop_last. Not thread-safe while reshuffle runs.
//   Batches batches(train, /*batch_size=*/64, /*seed=*/1);
//   for (uint64_t epoch = 0; epoch < 10; ++epoch) {
//     batches.reshuffle(epoch);
//     for (const Dataset& batch : batches) step(batch.images, batch.labels);
//   }
class Batches {
 public:
  // InvalidArgument if batch_size <= 0 or a tensor is empty; ShapeError unless images and labels
  // have rank >= 1 and the same first dimension. Starts with the order of epoch 0.
  Batches(const Dataset& dataset, int64_t batch_size, uint64_t seed, bool drop_last = false);

  // Number of batches: ceil(N / batch_size), or floor(N / batch_size) with drop_last.
  int64_t size() const;
  int64_t batch_size() const { return batch_size_; }
  // Batch i of the current epoch; OutOfRange unless 0 <= i < size().
  Dataset operator[](int64_t i) const;
  // Switches to the permutation of (seed, epoch); reshuffle(0) restores the initial order.
  void reshuffle(uint64_t epoch);
  // The current permutation of 0..N-1 (example indices in batch order).
  const std::vector<int64_t>& order() const { return order_; }

  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Dataset;
    using difference_type = std::ptrdiff_t;
    using pointer = void;
    using reference = Dataset;

    Iterator() = default;
    Iterator(const Batches* batches, int64_t index) : batches_(batches), index_(index) {}
    Dataset operator*() const { return (*batches_)[index_]; }
    Iterator& operator++() {
      ++index_;
      return *this;
    }
    Iterator operator++(int) {
      Iterator previous = *this;
      ++index_;
      return previous;
    }
    bool operator==(const Iterator& other) const { return index_ == other.index_; }

   private:
    const Batches* batches_ = nullptr;
    int64_t index_ = 0;
  };
  Iterator begin() const { return Iterator(this, 0); }
  Iterator end() const { return Iterator(this, size()); }

 private:
  Dataset dataset_;
  int64_t batch_size_;
  uint64_t seed_;
  bool drop_last_;
  std::vector<int64_t> order_;
};

}  // namespace flowlet::data
