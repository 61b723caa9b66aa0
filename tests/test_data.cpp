// Datasets: the IDX reader on gzip and plain fixtures written here, its errors (hostile files and paths
// included), Fashion-MNIST's file names and checks, Batches (every example once per epoch,
// deterministic orders, extreme batch sizes, rows of views and of every element size), and the real files.
#include <stdlib.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "support/fifo_watchdog.hpp"
#include "support/reference.hpp"

namespace fs = std::filesystem;
using fl::data::Batches;
using fl::data::Dataset;
using test::check_op_throws;
using test::check_throws;

namespace {

constexpr uint32_t kImagesMagic = 0x00000803;
constexpr uint32_t kLabelsMagic = 0x00000801;

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "flowlet_data_XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

// An IDX file's bytes: big-endian magic and dimensions, then the data.
std::vector<uint8_t> idx_bytes(uint32_t magic, const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> bytes;
  const auto put = [&](uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(static_cast<uint8_t>(v >> shift));
  };
  put(magic);
  for (uint32_t d : dims) put(d);
  bytes.insert(bytes.end(), data.begin(), data.end());
  return bytes;
}

void write_plain(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

void write_gzip(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  REQUIRE(file != nullptr);
  if (!bytes.empty()) REQUIRE(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())) == static_cast<int>(bytes.size()));
  REQUIRE(gzclose(file) == Z_OK);
}

std::vector<uint8_t> read_plain(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Bytes 0..255 and a few repeats: every pixel value appears.
std::vector<uint8_t> pixel_pattern(size_t count) {
  std::vector<uint8_t> pixels(count);
  for (size_t i = 0; i < count; ++i) pixels[i] = static_cast<uint8_t>((i * 37 + 11) % 256);
  return pixels;
}

void check_round_trip(const Dataset& d, uint32_t n, uint32_t rows, uint32_t cols, const std::vector<uint8_t>& pixels,
                      const std::vector<uint8_t>& labels) {
  REQUIRE(d.images.dtype() == fl::f32);
  REQUIRE(d.labels.dtype() == fl::i64);
  REQUIRE(d.images.shape() == fl::Shape{n, int64_t{rows} * cols});
  REQUIRE(d.labels.shape() == fl::Shape{n});
  const std::vector<float> images = d.images.to_vector<float>();
  size_t mismatches = 0;
  for (size_t i = 0; i < pixels.size(); ++i)
    if (images[i] != static_cast<float>(pixels[i]) / 255.0f) ++mismatches;
  CHECK(mismatches == 0);
  const std::vector<int64_t> read_labels = d.labels.to_vector<int64_t>();
  CHECK(read_labels == std::vector<int64_t>(labels.begin(), labels.end()));
}

// Fashion-MNIST-shaped fixtures (28x28) named as Debian's package names them.
void write_fashion_split(const TempDir& dir, const std::string& prefix, uint32_t n, bool gzip,
                         const std::vector<uint8_t>& labels, uint32_t rows = 28, uint32_t cols = 28) {
  const std::string suffix = gzip ? ".gz" : "";
  const auto write = gzip ? write_gzip : write_plain;
  write(dir.file(prefix + "-images-idx3-ubyte" + suffix),
        idx_bytes(kImagesMagic, {n, rows, cols}, pixel_pattern(size_t{n} * rows * cols)));
  write(dir.file(prefix + "-labels-idx1-ubyte" + suffix), idx_bytes(kLabelsMagic, {n}, labels));
}

// A dataset whose row i holds the value i in every column, with label i: batches show which rows they took.
Dataset indexed_dataset(int64_t n, int64_t width = 3) {
  std::vector<float> images;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < width; ++j) images.push_back(static_cast<float>(i));
  std::vector<int64_t> labels(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) labels[static_cast<size_t>(i)] = i;
  return Dataset{fl::tensor(images, fl::Shape{n, width}), fl::tensor(labels, fl::Shape{n})};
}

// All labels of one epoch in batch order, checking each batch's rows match its labels.
std::vector<int64_t> epoch_labels(const Batches& batches) {
  std::vector<int64_t> seen;
  for (const Dataset& batch : batches) {
    const std::vector<int64_t> labels = batch.labels.to_vector<int64_t>();
    const std::vector<float> images = batch.images.to_vector<float>();
    const int64_t width = batch.images.shape()[1];
    for (size_t r = 0; r < labels.size(); ++r)
      for (int64_t j = 0; j < width; ++j)
        CHECK(images[r * static_cast<size_t>(width) + static_cast<size_t>(j)] == static_cast<float>(labels[r]));
    seen.insert(seen.end(), labels.begin(), labels.end());
  }
  return seen;
}

}  // namespace

TEST_CASE("load_idx_images_and_labels reads gzip files exactly") {
  TempDir dir;
  const std::vector<uint8_t> pixels = pixel_pattern(5 * 4 * 3);
  const std::vector<uint8_t> labels = {0, 9, 255, 3, 1};
  write_gzip(dir.file("images.gz"), idx_bytes(kImagesMagic, {5, 4, 3}, pixels));
  write_gzip(dir.file("labels.gz"), idx_bytes(kLabelsMagic, {5}, labels));
  const Dataset d = fl::data::load_idx_images_and_labels(dir.file("images.gz"), dir.file("labels.gz"));
  check_round_trip(d, 5, 4, 3, pixels, labels);
  // Extremes land exactly on 0 and 1.
  const Dataset extremes = [&] {
    write_gzip(dir.file("x.gz"), idx_bytes(kImagesMagic, {1, 1, 2}, {0, 255}));
    write_gzip(dir.file("y.gz"), idx_bytes(kLabelsMagic, {1}, {4}));
    return fl::data::load_idx_images_and_labels(dir.file("x.gz"), dir.file("y.gz"));
  }();
  CHECK(extremes.images.to_vector<float>() == std::vector<float>{0.0f, 1.0f});
}

TEST_CASE("load_idx_images_and_labels reads uncompressed files, and mixed with gzip") {
  TempDir dir;
  const std::vector<uint8_t> pixels = pixel_pattern(7 * 2 * 5);
  const std::vector<uint8_t> labels = {6, 5, 4, 3, 2, 1, 0};
  write_plain(dir.file("images"), idx_bytes(kImagesMagic, {7, 2, 5}, pixels));
  write_plain(dir.file("labels"), idx_bytes(kLabelsMagic, {7}, labels));
  write_gzip(dir.file("labels.gz"), idx_bytes(kLabelsMagic, {7}, labels));
  check_round_trip(fl::data::load_idx_images_and_labels(dir.file("images"), dir.file("labels")), 7, 2, 5, pixels,
                   labels);
  check_round_trip(fl::data::load_idx_images_and_labels(dir.file("images"), dir.file("labels.gz")), 7, 2, 5, pixels,
                   labels);
}

TEST_CASE("load_idx_images_and_labels reads an empty dataset") {
  TempDir dir;
  write_gzip(dir.file("images.gz"), idx_bytes(kImagesMagic, {0, 28, 28}, {}));
  write_gzip(dir.file("labels.gz"), idx_bytes(kLabelsMagic, {0}, {}));
  const Dataset d = fl::data::load_idx_images_and_labels(dir.file("images.gz"), dir.file("labels.gz"));
  CHECK(d.images.shape() == fl::Shape{0, 784});
  CHECK(d.labels.shape() == fl::Shape{0});
}

TEST_CASE("a missing file is an InvalidArgument naming the path") {
  TempDir dir;
  write_gzip(dir.file("labels.gz"), idx_bytes(kLabelsMagic, {1}, {0}));
  const std::string missing = dir.file("nope-images.gz");
  check_op_throws<fl::InvalidArgument>("load_idx_images_and_labels",
                                       [&] { fl::data::load_idx_images_and_labels(missing, dir.file("labels.gz")); },
                                       {"cannot open " + missing, "No such file"});
  // load_fashion_mnist adds how to get the files.
  const std::string expected = dir.file("train-images-idx3-ubyte.gz");
  check_op_throws<fl::InvalidArgument>("load_fashion_mnist", [&] { fl::data::load_fashion_mnist("train", dir.str()); },
                                       {"fashion_mnist: cannot open " + expected,
                                        "install it with: apt-get install dataset-fashion-mnist"});
}

TEST_CASE("a bad magic number is an InvalidArgument naming the file and both numbers") {
  TempDir dir;
  write_gzip(dir.file("images.gz"), idx_bytes(kImagesMagic, {1, 2, 2}, {1, 2, 3, 4}));
  write_gzip(dir.file("labels.gz"), idx_bytes(kLabelsMagic, {1}, {0}));
  // Labels passed as images and the other way round.
  check_op_throws<fl::InvalidArgument>(
      "load_idx_images_and_labels",
      [&] { fl::data::load_idx_images_and_labels(dir.file("labels.gz"), dir.file("images.gz")); },
      {"bad magic number", dir.file("labels.gz"), "got 0x00000801", "expected 0x00000803"});
  // Not an IDX file at all (a text file), and IDX of another element type (0x0D: f32).
  write_plain(dir.file("text"), {'h', 'e', 'l', 'l', 'o', '\n'});
  check_op_throws<fl::InvalidArgument>(
      "load_idx_images_and_labels",
      [&] { fl::data::load_idx_images_and_labels(dir.file("text"), dir.file("labels.gz")); },
      {"bad magic number", dir.file("text"), "0x68656C6C"});
  write_plain(dir.file("floats"), idx_bytes(0x00000D03, {1, 1, 1}, {0, 0, 0, 0}));
  check_op_throws<fl::InvalidArgument>(
      "load_idx_images_and_labels",
      [&] { fl::data::load_idx_images_and_labels(dir.file("floats"), dir.file("labels.gz")); },
      {"bad magic number", "0x00000D03"});
}

TEST_CASE("truncated files are InvalidArgument naming the file and how much was there") {
  TempDir dir;
  write_gzip(dir.file("labels.gz"), idx_bytes(kLabelsMagic, {3}, {0, 1, 2}));
  const std::vector<uint8_t> full = idx_bytes(kImagesMagic, {3, 2, 2}, pixel_pattern(12));

  SUBCASE("data cut short, gzip") {
    write_gzip(dir.file("images.gz"), std::vector<uint8_t>(full.begin(), full.end() - 5));
    check_op_throws<fl::InvalidArgument>(
        "load_idx_images_and_labels",
        [&] { fl::data::load_idx_images_and_labels(dir.file("images.gz"), dir.file("labels.gz")); },
        {dir.file("images.gz"), "truncated", "got 7 of 12 data bytes"});
  }
  SUBCASE("data cut short, plain") {
    write_plain(dir.file("images"), std::vector<uint8_t>(full.begin(), full.end() - 1));
    check_op_throws<fl::InvalidArgument>(
        "load_idx_images_and_labels",
        [&] { fl::data::load_idx_images_and_labels(dir.file("images"), dir.file("labels.gz")); },
        {dir.file("images"), "truncated", "got 11 of 12 data bytes"});
  }
  SUBCASE("header cut short") {
    write_plain(dir.file("images"), std::vector<uint8_t>(full.begin(), full.begin() + 10));
    check_op_throws<fl::InvalidArgument>(
        "load_idx_images_and_labels",
        [&] { fl::data::load_idx_images_and_labels(dir.file("images"), dir.file("labels.gz")); },
        {dir.file("images"), "truncated", "header"});
  }
  SUBCASE("empty file") {
    write_plain(dir.file("images"), {});
    check_op_throws<fl::InvalidArgument>(
        "load_idx_images_and_labels",
        [&] { fl::data::load_idx_images_and_labels(dir.file("images"), dir.file("labels.gz")); },
        {dir.file("images"), "truncated", "got 0 of 4 header bytes"});
  }
  SUBCASE("gzip stream cut short") {
    write_gzip(dir.file("whole.gz"), full);
    std::vector<uint8_t> compressed = read_plain(dir.file("whole.gz"));
    REQUIRE(compressed.size() > 12);
    for (size_t cut : {size_t{4}, size_t{8}, compressed.size() / 2}) {
      CAPTURE(cut);
      write_plain(dir.file("images.gz"), std::vector<uint8_t>(compressed.begin(), compressed.end() - static_cast<long>(cut)));
      check_op_throws<fl::InvalidArgument>(
          "load_idx_images_and_labels",
          [&] { fl::data::load_idx_images_and_labels(dir.file("images.gz"), dir.file("labels.gz")); },
          {dir.file("images.gz"), "truncated"});
    }
  }
  SUBCASE("a gzip header that declares far more data than the file can inflate to") {
    write_gzip(dir.file("images.gz"), idx_bytes(kImagesMagic, {4000000000u, 28, 28}, pixel_pattern(100)));
    const auto compressed_bytes = fs::file_size(dir.file("images.gz"));
    check_op_throws<fl::InvalidArgument>(
        "load_idx_images_and_labels",
        [&] { fl::data::load_idx_images_and_labels(dir.file("images.gz"), dir.file("labels.gz")); },
        {dir.file("images.gz"), "truncated",
         fmt::format("got a {}-byte gzip file, which inflates to at most {} bytes", compressed_bytes,
                     compressed_bytes * 1032),
         "declares 3136000000000 data bytes (4000000000 x 28 x 28)"});
  }
  SUBCASE("a plain header that declares far more data than the file holds") {
    write_plain(dir.file("images"), idx_bytes(kImagesMagic, {4000000000u, 28, 28}, pixel_pattern(100)));
    check_op_throws<fl::InvalidArgument>(
        "load_idx_images_and_labels",
        [&] { fl::data::load_idx_images_and_labels(dir.file("images"), dir.file("labels.gz")); },
        {dir.file("images"), "truncated", "got 100 of 3136000000000 data bytes"});
  }
}

TEST_CASE("corrupt gzip data and trailing bytes are InvalidArgument naming the file") {
  TempDir dir;
  write_gzip(dir.file("labels.gz"), idx_bytes(kLabelsMagic, {3}, {0, 1, 2}));
  const std::vector<uint8_t> full = idx_bytes(kImagesMagic, {3, 2, 2}, pixel_pattern(12));

  SUBCASE("checksum mismatch") {
    write_gzip(dir.file("whole.gz"), full);
    std::vector<uint8_t> compressed = read_plain(dir.file("whole.gz"));
    compressed[compressed.size() - 6] ^= 0xFF;  // inside the CRC-32 of the trailer
    write_plain(dir.file("images.gz"), compressed);
    check_op_throws<fl::InvalidArgument>(
        "load_idx_images_and_labels",
        [&] { fl::data::load_idx_images_and_labels(dir.file("images.gz"), dir.file("labels.gz")); },
        {"cannot decompress " + dir.file("images.gz")});
  }
  SUBCASE("bytes after the data") {
    std::vector<uint8_t> longer = full;
    longer.push_back(0);
    write_gzip(dir.file("images.gz"), longer);
    check_op_throws<fl::InvalidArgument>(
        "load_idx_images_and_labels",
        [&] { fl::data::load_idx_images_and_labels(dir.file("images.gz"), dir.file("labels.gz")); },
        {dir.file("images.gz"), "bytes after the expected 28 bytes"});
  }
}

TEST_CASE("image and label counts that differ are a ShapeError naming both files") {
  TempDir dir;
  write_gzip(dir.file("images.gz"), idx_bytes(kImagesMagic, {3, 2, 2}, pixel_pattern(12)));
  write_gzip(dir.file("labels.gz"), idx_bytes(kLabelsMagic, {2}, {0, 1}));
  check_op_throws<fl::ShapeError>(
      "load_idx_images_and_labels",
      [&] { fl::data::load_idx_images_and_labels(dir.file("images.gz"), dir.file("labels.gz")); },
      {"counts differ", "3 images in " + dir.file("images.gz"), "2 labels in " + dir.file("labels.gz")});
}

TEST_CASE("load_fashion_mnist reads Debian's file names from a directory") {
  TempDir dir;
  const std::vector<uint8_t> train_labels = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 9};
  write_fashion_split(dir, "train", 11, /*gzip=*/true, train_labels);
  const Dataset train = fl::data::load_fashion_mnist("train", dir.str());
  check_round_trip(train, 11, 28, 28, pixel_pattern(11 * 784), train_labels);

  // "test" is the t10k files; uncompressed copies are read when the .gz files are absent.
  write_fashion_split(dir, "t10k", 2, /*gzip=*/false, {3, 8});
  const Dataset test_split = fl::data::load_fashion_mnist("test", dir.str());
  check_round_trip(test_split, 2, 28, 28, pixel_pattern(2 * 784), {3, 8});
}

TEST_CASE("load_fashion_mnist rejects other splits, image sizes and labels above 9") {
  TempDir dir;
  check_op_throws<fl::InvalidArgument>("load_fashion_mnist", [&] { fl::data::load_fashion_mnist("validation", dir.str()); },
                                       {"unknown split", "\"validation\"", "\"train\" or \"test\""});
  write_fashion_split(dir, "train", 2, /*gzip=*/true, {1, 2}, /*rows=*/14, /*cols=*/56);
  check_op_throws<fl::ShapeError>("load_fashion_mnist", [&] { fl::data::load_fashion_mnist("train", dir.str()); },
                                  {"not 28x28", dir.file("train-images-idx3-ubyte.gz"), "got 14x56"});
  write_fashion_split(dir, "t10k", 3, /*gzip=*/true, {1, 10, 2});
  check_op_throws<fl::OutOfRange>("load_fashion_mnist", [&] { fl::data::load_fashion_mnist("test", dir.str()); },
                                  {"label out of range 0..9", dir.file("t10k-labels-idx1-ubyte.gz"),
                                   "got 10 at index 1"});
}

TEST_CASE("Batches covers every example exactly once per epoch, last partial batch included") {
  const Dataset d = indexed_dataset(10);
  Batches batches(d, 3, /*seed=*/42);
  REQUIRE(batches.size() == 4);
  CHECK(batches[0].images.shape() == fl::Shape{3, 3});
  CHECK(batches[3].images.shape() == fl::Shape{1, 3});
  CHECK(batches[3].labels.shape() == fl::Shape{1});
  for (uint64_t epoch = 0; epoch < 3; ++epoch) {
    batches.reshuffle(epoch);
    std::vector<int64_t> seen = epoch_labels(batches);
    CHECK(seen == batches.order());
    std::sort(seen.begin(), seen.end());
    CHECK(seen == d.labels.to_vector<int64_t>());
  }
}

TEST_CASE("Batches with drop_last leaves out the partial batch") {
  const Dataset d = indexed_dataset(10);
  Batches batches(d, 3, /*seed=*/42, /*drop_last=*/true);
  CHECK(batches.size() == 3);
  const std::vector<int64_t> seen = epoch_labels(batches);
  CHECK(seen.size() == 9);
  CHECK(std::set<int64_t>(seen.begin(), seen.end()).size() == 9);
  // An exact multiple loses nothing; fewer examples than a batch give no batches.
  CHECK(Batches(indexed_dataset(9), 3, 1, true).size() == 3);
  CHECK(Batches(indexed_dataset(2), 3, 1, true).size() == 0);
  CHECK(Batches(indexed_dataset(2), 3, 1, false).size() == 1);
  CHECK(Batches(indexed_dataset(0), 3, 1, false).size() == 0);
}

TEST_CASE("Batches orders are deterministic per seed and epoch, and differ between them") {
  const Dataset d = indexed_dataset(100, 1);
  Batches a(d, 8, /*seed=*/7);
  Batches b(d, 8, /*seed=*/7);
  const std::vector<int64_t> epoch0 = a.order();
  CHECK(epoch_labels(a) == epoch_labels(b));
  a.reshuffle(1);
  const std::vector<int64_t> epoch1 = a.order();
  CHECK(epoch1 != epoch0);
  b.reshuffle(1);
  CHECK(b.order() == epoch1);
  a.reshuffle(0);
  CHECK(a.order() == epoch0);
  // Another seed; and (seed 8, epoch 0) is not (seed 7, epoch 1).
  Batches c(d, 8, /*seed=*/8);
  CHECK(c.order() != epoch0);
  CHECK(c.order() != epoch1);
  // Shuffled, not the identity.
  std::vector<int64_t> identity(100);
  for (int64_t i = 0; i < 100; ++i) identity[static_cast<size_t>(i)] = i;
  CHECK(epoch0 != identity);
  // A fixed value pins the generator: orders must not change between versions or platforms.
  const std::vector<int64_t> small = Batches(indexed_dataset(8, 1), 8, /*seed=*/1).order();
  CHECK(small == std::vector<int64_t>{6, 1, 3, 4, 7, 0, 2, 5});
}

// Batch i of `batches` against the rows order[i * b, ...) picked one by one from the dataset's values.
template <class T>
void check_rows_match(const Batches& batches, const fl::Tensor& all, const fl::Tensor& batch, int64_t i) {
  const std::vector<T> values = all.to_vector<T>();  // row-major, whatever the strides
  const std::vector<T> got = batch.to_vector<T>();
  const int64_t rows = all.shape()[0];
  const auto width = static_cast<size_t>(rows == 0 ? 0 : all.numel() / rows);
  REQUIRE(batch.dtype() == all.dtype());
  REQUIRE(got.size() == width * static_cast<size_t>(batch.shape()[0]));
  for (int64_t r = 0; r < batch.shape()[0]; ++r) {
    const auto example = static_cast<size_t>(batches.order()[static_cast<size_t>(i * batches.batch_size() + r)]);
    for (size_t j = 0; j < width; ++j) CHECK(got[static_cast<size_t>(r) * width + j] == values[example * width + j]);
  }
}

TEST_CASE("Batches copies the rows of views and of every element size exactly") {
  // images: a transposed view ([7, 5], not contiguous) of distinct f64 values; labels: i32 at an
  // offset into a larger tensor (a slice).
  std::vector<double> base(35);
  for (size_t k = 0; k < base.size(); ++k) base[k] = 0.5 + static_cast<double>(k);
  const fl::Tensor images = fl::transpose(fl::tensor(base, fl::Shape{5, 7}));
  REQUIRE_FALSE(images.is_contiguous());
  const fl::Tensor labels = fl::slice(fl::tensor(std::vector<int32_t>{90, 91, 0, 1, 2, 3, 4, 5, 6}, fl::Shape{9}), 0, 2, 7);
  Batches batches(Dataset{images, labels}, 3, /*seed=*/5);
  REQUIRE(batches.size() == 3);
  for (uint64_t epoch = 0; epoch < 2; ++epoch) {
    batches.reshuffle(epoch);
    for (int64_t i = 0; i < batches.size(); ++i) {
      const Dataset batch = batches[i];
      CHECK(batch.images.shape() == fl::Shape{i == 2 ? 1 : 3, 5});
      check_rows_match<double>(batches, images, batch.images, i);
      check_rows_match<int32_t>(batches, labels, batch.labels, i);
    }
  }
  // u8 rows of rank 3, one-byte labels; and rows of zero elements ([4, 0]).
  std::vector<uint8_t> bytes(4 * 2 * 3);
  for (size_t k = 0; k < bytes.size(); ++k) bytes[k] = static_cast<uint8_t>(k * 7);
  const fl::Tensor cubes = fl::tensor(bytes, fl::Shape{4, 2, 3});
  Batches small(Dataset{cubes, fl::tensor(std::vector<uint8_t>{9, 8, 7, 6}, fl::Shape{4})}, 3, /*seed=*/2);
  for (int64_t i = 0; i < small.size(); ++i) {
    const Dataset batch = small[i];
    CHECK(batch.images.shape() == fl::Shape{i == 0 ? 3 : 1, 2, 3});
    check_rows_match<uint8_t>(small, cubes, batch.images, i);
  }
  const Dataset empty_rows{fl::Tensor::empty(fl::Shape{4, 0}, fl::f32), indexed_dataset(4).labels};
  Batches hollow(empty_rows, 3, /*seed=*/2);
  CHECK(hollow[0].images.shape() == fl::Shape{3, 0});
  CHECK(hollow[1].labels.to_vector<int64_t>() == std::vector<int64_t>{hollow.order()[3]});
  // A batch outlives the Batches it came from and does not alias the dataset.
  fl::Tensor kept;
  {
    const Dataset d = indexed_dataset(6);
    kept = Batches(d, 6, /*seed=*/1)[0].images;
    CHECK(kept.raw_data() != d.images.raw_data());
  }
  CHECK(kept.shape() == fl::Shape{6, 3});
}

TEST_CASE("Batches rejects bad arguments") {
  const Dataset d = indexed_dataset(5);
  check_op_throws<fl::InvalidArgument>("Batches", [&] { Batches(d, 0, 1); }, {"batch_size must be positive", "got 0"});
  check_op_throws<fl::InvalidArgument>("Batches", [&] { Batches(d, -3, 1); }, {"got -3"});
  check_op_throws<fl::InvalidArgument>("Batches", [&] { Batches(Dataset{d.images, fl::Tensor()}, 2, 1); },
                                       {"empty Tensor handle"});
  check_op_throws<fl::ShapeError>("Batches", [&] { Batches(Dataset{d.images, indexed_dataset(4).labels}, 2, 1); },
                                  {"same first dimension", "[5, 3]", "[4]"});
  Batches batches(d, 2, 1);
  check_op_throws<fl::OutOfRange>("Batches", [&] { (void)batches[3]; }, {"batch index out of range", "got 3 with 3"});
  check_op_throws<fl::OutOfRange>("Batches", [&] { (void)batches[-1]; }, {"got -1"});
}

TEST_CASE("a gzip bomb is refused from its header before anything is allocated") {
  TempDir dir;
  write_gzip(dir.file("labels.gz"), idx_bytes(kLabelsMagic, {1}, {0}));
  // 16 MiB of zeros compress about 1000-fold; the header claims 2^40 bytes, far beyond what it can inflate to.
  write_gzip(dir.file("bomb.gz"), idx_bytes(kImagesMagic, {1u << 20, 1u << 10, 1u << 10}, std::vector<uint8_t>(16 << 20)));
  const auto compressed_bytes = fs::file_size(dir.file("bomb.gz"));
  CHECK(compressed_bytes < (16u << 20) / 500);
  const auto start = std::chrono::steady_clock::now();
  check_op_throws<fl::InvalidArgument>(
      "load_idx_images_and_labels",
      [&] { fl::data::load_idx_images_and_labels(dir.file("bomb.gz"), dir.file("labels.gz")); },
      {dir.file("bomb.gz"), fmt::format("{}-byte gzip file", compressed_bytes), "declares 1099511627776 data bytes"});
  // Refused before inflating anything: far faster than inflating the 16 MiB that are there.
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::milliseconds(200));
}

TEST_CASE("dimensions whose product overflows are refused, also when the example count is 0") {
  TempDir dir;
  write_plain(dir.file("labels"), idx_bytes(kLabelsMagic, {0}, {}));
  // Found by the idx_reader fuzzer: 0 images of 2887305584 x 4252958720 pixels (the product wraps int64).
  for (const std::vector<uint32_t>& dims : std::vector<std::vector<uint32_t>>{
           {0, 2887305584u, 4252958720u}, {4294967295u, 4294967295u, 4294967295u}, {0, 0, 4294967295u}}) {
    write_plain(dir.file("images"), idx_bytes(kImagesMagic, dims, {}));
    const bool overflows = dims[2] != 4294967295u || dims[0] != 0;
    if (!overflows) {  // 0 x 0 x 4294967295 holds no element and nothing overflows
      CHECK(fl::data::load_idx_images_and_labels(dir.file("images"), dir.file("labels")).images.shape() ==
            fl::Shape{0, 0});
      continue;
    }
    check_op_throws<fl::InvalidArgument>(
        "load_idx_images_and_labels",
        [&] { fl::data::load_idx_images_and_labels(dir.file("images"), dir.file("labels")); },
        {dir.file("images"), "declares too many elements",
         fmt::format("got dimensions {} x {}", dims[0], dims[1])});  // up to the one that overflows
  }
}

TEST_CASE("a FIFO given as an IDX file is refused at once instead of waiting for a writer") {
  TempDir dir;
  write_gzip(dir.file("labels.gz"), idx_bytes(kLabelsMagic, {1}, {0}));
  const std::string fifo = dir.file("images.gz");
  test::make_fifo(fifo);
  CHECK(test::returns_without_blocking_on(fifo, [&] {
    check_op_throws<fl::InvalidArgument>("load_idx_images_and_labels",
                                         [&] { fl::data::load_idx_images_and_labels(fifo, dir.file("labels.gz")); },
                                         {fifo, "not a regular file", "got a FIFO"});
  }));
  // A directory is no IDX file either.
  check_op_throws<fl::InvalidArgument>(
      "load_idx_images_and_labels", [&] { fl::data::load_idx_images_and_labels(dir.str(), dir.file("labels.gz")); },
      {dir.str(), "got a directory"});
}

TEST_CASE("a path or directory with a NUL byte is rejected instead of naming a shorter file") {
  TempDir dir;
  write_gzip(dir.file("images.gz"), idx_bytes(kImagesMagic, {1, 2, 2}, pixel_pattern(4)));
  write_gzip(dir.file("labels.gz"), idx_bytes(kLabelsMagic, {1}, {0}));
  const std::string images_with_nul = dir.file("images.gz") + std::string("\0.bak", 5);  // C would open images.gz
  check_op_throws<fl::InvalidArgument>(
      "load_idx_images_and_labels",
      [&] { fl::data::load_idx_images_and_labels(images_with_nul, dir.file("labels.gz")); },
      {"path contains a NUL byte at offset " + std::to_string(dir.file("images.gz").size()), "\\x00.bak"});
  check_op_throws<fl::InvalidArgument>(
      "load_idx_images_and_labels",
      [&] { fl::data::load_idx_images_and_labels(dir.file("images.gz"), dir.file("labels.gz") + '\0'); },
      {"NUL byte"});
  write_fashion_split(dir, "train", 2, true, {1, 2});
  check_op_throws<fl::InvalidArgument>(
      "load_fashion_mnist", [&] { fl::data::load_fashion_mnist("train", dir.str() + std::string("\0/elsewhere", 11)); },
      {"directory contains a NUL byte"});
  CHECK(fl::data::load_fashion_mnist("train", dir.str()).labels.shape() == fl::Shape{2});
}

TEST_CASE("Batches counts batches exactly for batch sizes up to INT64_MAX") {
  const Dataset d = indexed_dataset(5);
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  for (const int64_t batch_size : {int64_t{5}, int64_t{6}, kMax / 2, kMax - 1, kMax}) {
    CAPTURE(batch_size);
    const Batches all(d, batch_size, 1);
    CHECK(all.size() == 1);
    CHECK(all[0].labels.shape() == fl::Shape{5});
    CHECK(Batches(d, batch_size, 1, /*drop_last=*/true).size() == (batch_size == 5 ? 1 : 0));
  }
  CHECK(Batches(d, 2, 1).size() == 3);
  CHECK(Batches(d, 2, 1, true).size() == 2);
  CHECK(Batches(d, 1, 1).size() == 5);
  // An empty dataset has no batch, whatever the size.
  CHECK(Batches(indexed_dataset(0), kMax, 1).size() == 0);
}

TEST_CASE("the installed Fashion-MNIST loads with the expected sizes, labels and pixel range") {
  const std::string directory = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(directory + "/train-images-idx3-ubyte.gz")) {
    MESSAGE("skipped: " << directory << " not installed (apt-get install dataset-fashion-mnist)");
    return;
  }
  struct Split {
    const char* name;
    int64_t size;
  };
  for (const Split& split : {Split{"train", 60000}, Split{"test", 10000}}) {
    const std::string name = split.name;
    CAPTURE(name);
    const auto start = std::chrono::steady_clock::now();
    const Dataset d = fl::data::load_fashion_mnist(split.name);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    MESSAGE(fmt::format("load_fashion_mnist(\"{}\"): {:.3f} s", split.name, seconds));
    REQUIRE(d.images.shape() == fl::Shape{split.size, 784});
    REQUIRE(d.labels.shape() == fl::Shape{split.size});
    const float* pixels = d.images.data<float>();
    const auto [lowest, highest] = std::minmax_element(pixels, pixels + d.images.numel());
    CHECK(*lowest == 0.0f);
    CHECK(*highest == 1.0f);
    // Fashion-MNIST is balanced: every class has a tenth of the examples.
    std::vector<int64_t> per_class(10, 0);
    const std::vector<int64_t> labels = d.labels.to_vector<int64_t>();
    REQUIRE(*std::min_element(labels.begin(), labels.end()) == 0);
    REQUIRE(*std::max_element(labels.begin(), labels.end()) == 9);
    for (int64_t label : labels) ++per_class[static_cast<size_t>(label)];
    CHECK(per_class == std::vector<int64_t>(10, split.size / 10));
  }
  const Batches batches(fl::data::load_fashion_mnist("test"), 64, /*seed=*/0);
  CHECK(batches.size() == 157);
  CHECK(batches[156].images.shape() == fl::Shape{10000 - 156 * 64, 784});
}
