// The IDX reader (gzip through zlib, or plain), Fashion-MNIST's file names and checks, and Batches.
#include "flowlet/data/fashion_mnist.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <new>
#include <span>
#include <system_error>
#include <utility>

#include "core/check.hpp"
#include "core/user_text.hpp"
#include "flowlet/ops/creation.hpp"
#include "flowlet/ops/shape.hpp"

namespace flowlet::data {
namespace {

using detail::fail;

constexpr uint32_t kImagesMagic = 0x00000803;  // unsigned bytes, rank 3
constexpr uint32_t kLabelsMagic = 0x00000801;  // unsigned bytes, rank 1
constexpr std::string_view kInstallHint = "install it with: apt-get install dataset-fashion-mnist";
// Deflate's largest expansion: a 258-byte match coded in 2 bits. No gzip file of n bytes inflates
// to more than n * 1032 bytes, so a header declaring more is refused before anything is allocated.
constexpr uint64_t kMaxInflateRatio = 1032;

struct GzClose {
  void operator()(gzFile_s* file) const { gzclose(file); }
};
using GzFile = std::unique_ptr<gzFile_s, GzClose>;

// Leaves the bytes that resize() adds uninitialized: the reader overwrites them, and zero-filling a
// buffer sized from a header costs as much as the data, which a hostile file never sends.
template <class T>
struct UninitializedAllocator : std::allocator<T> {
  UninitializedAllocator() = default;
  template <class U>
  UninitializedAllocator(const UninitializedAllocator<U>&) noexcept {}
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

// One IDX file read whole: its dimensions and its data bytes.
struct IdxFile {
  std::vector<uint32_t> dims;
  std::vector<uint8_t, UninitializedAllocator<uint8_t>> data;
};

// Who is reading, for messages: the public function's name and what to add when a file is missing.
struct Reader {
  std::string_view op;
  std::string_view missing_hint;  // empty: none
};

class IdxStream {
 public:
  IdxStream(const Reader& reader, const std::string& path) : reader_(reader), path_(path) {
    detail::check_path(reader.op, "path", path);
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever. The type is
    // checked on the open descriptor (no window to swap the file), which zlib then reads.
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
      const std::string reason = std::generic_category().message(errno);
      if (reader.missing_hint.empty()) fail<InvalidArgument>("{}: cannot open {} ({})", reader.op, path, reason);
      fail<InvalidArgument>("{}: cannot open {} ({}); {}", reader.op, path, reason, reader.missing_hint);
    }
    struct stat info {};
    if (::fstat(fd, &info) != 0) {
      const std::string reason = std::generic_category().message(errno);
      ::close(fd);
      fail<InvalidArgument>("{}: cannot stat {} ({})", reader.op, path, reason);
    }
    if (!S_ISREG(info.st_mode)) {
      ::close(fd);
      fail<InvalidArgument>("{}: {} is not a regular file; got a {}; IDX files are regular files", reader.op, path,
                            detail::file_type_name(info.st_mode));
    }
    file_bytes_ = static_cast<uint64_t>(info.st_size);
    file_.reset(gzdopen(fd, "rb"));  // gzclose closes fd from here on; a failed gzdopen leaves it open
    if (!file_) {
      ::close(fd);
      fail<InvalidArgument>("{}: cannot open {} (out of memory)", reader.op, path);
    }
    gzbuffer(file_.get(), 1 << 18);  // larger than the 8 KiB default: fewer read calls, faster inflate
  }

  // Whether the file is gzip (rather than plain); known once something was read.
  bool compressed() { return gzdirect(file_.get()) == 0; }
  uint64_t file_bytes() const { return file_bytes_; }
  // The most bytes a gzip file of this size can inflate to.
  uint64_t max_inflated_bytes() const {
    return file_bytes_ > UINT64_MAX / kMaxInflateRatio ? UINT64_MAX : file_bytes_ * kMaxInflateRatio;
  }

  // Reads up to `count` bytes at `destination`; returns how many there were before the end of the data.
  size_t read(uint8_t* destination, size_t count) {
    size_t total = 0;
    while (total < count) {
      const auto chunk = static_cast<unsigned>(std::min<size_t>(count - total, 1u << 30));
      const int got = gzread(file_.get(), destination + total, chunk);
      if (got < 0) fail_decompress();
      total += static_cast<size_t>(got);
      if (static_cast<unsigned>(got) < chunk) {
        int status = Z_OK;
        gzerror(file_.get(), &status);
        if (status == Z_BUF_ERROR) truncated_stream_ = true;  // the gzip stream stops early
        else if (status != Z_OK) fail_decompress();
        break;
      }
    }
    return total;
  }

  // Exactly `count` bytes, else InvalidArgument naming what was being read.
  void read_exact(uint8_t* destination, size_t count, std::string_view what) {
    const size_t got = read(destination, count);
    if (got < count)
      fail<InvalidArgument>("{}: {} is truncated; got {} of {} {} bytes", reader_.op, path_, got, count, what);
  }

  // InvalidArgument if anything follows the data, or if a gzip stream lacks its end (the checksum).
  void expect_end(uint64_t data_end) {
    uint8_t extra = 0;
    if (read(&extra, 1) != 0)
      fail<InvalidArgument>("{}: {} has bytes after the expected {} bytes; got a longer file", reader_.op, path_,
                            data_end);
    if (truncated_stream_)
      fail<InvalidArgument>("{}: {} is truncated; got a gzip stream without its end; download or reinstall the file",
                            reader_.op, path_);
  }

 private:
  [[noreturn]] void fail_decompress() {
    int status = Z_OK;
    const char* message = gzerror(file_.get(), &status);
    fail<InvalidArgument>("{}: cannot decompress {}; got zlib error {} ({})", reader_.op, path_, status,
                          message ? message : "unknown");
  }

  const Reader& reader_;
  const std::string& path_;
  GzFile file_;
  uint64_t file_bytes_ = 0;
  bool truncated_stream_ = false;
};

uint32_t big_endian_u32(const uint8_t* bytes) {
  return (uint32_t{bytes[0]} << 24) | (uint32_t{bytes[1]} << 16) | (uint32_t{bytes[2]} << 8) | uint32_t{bytes[3]};
}

// Reads an IDX file of unsigned bytes whose magic number must be `magic` (type 0x08, rank = low byte).
IdxFile read_idx(const Reader& reader, const std::string& path, uint32_t magic, std::string_view kind) {
  IdxStream stream(reader, path);
  const size_t rank = magic & 0xFF;
  const size_t header_bytes = 4 + 4 * rank;

  std::array<uint8_t, 4 + 4 * 3> header{};
  stream.read_exact(header.data(), 4, "header");
  const uint32_t found = big_endian_u32(header.data());
  if (found != magic)
    fail<InvalidArgument>("{}: bad magic number in {}; got 0x{:08X}, expected 0x{:08X} (IDX {} of unsigned bytes)",
                          reader.op, path, found, magic, kind);
  stream.read_exact(header.data() + 4, header_bytes - 4, "header");

  // The product of the nonzero dimensions must fit, not just the element count: with 0 examples
  // the count is 0 whatever the image size, but rows * cols still becomes a tensor dimension.
  // Bounded by INT64_MAX / 8 so that the largest output (i64 labels, f32 pixels) has a byte size.
  IdxFile idx;
  uint64_t count = 1, nonzero = 1;
  for (size_t k = 0; k < rank; ++k) {
    const uint32_t dim = big_endian_u32(header.data() + 4 + 4 * k);
    idx.dims.push_back(dim);
    if (dim != 0 && (__builtin_mul_overflow(nonzero, uint64_t{dim}, &nonzero) || nonzero > uint64_t{INT64_MAX} / 8))
      fail<InvalidArgument>("{}: {} declares too many elements; got dimensions {}", reader.op, path,
                            fmt::join(idx.dims, " x "));
    count *= dim;  // 0, or the checked `nonzero`
  }

  // A gzip bomb, or a header declaring more than the file can hold, stops here, before any allocation.
  if (stream.compressed() && header_bytes + count > stream.max_inflated_bytes())
    fail<InvalidArgument>(
        "{}: {} is truncated; got a {}-byte gzip file, which inflates to at most {} bytes, but its header declares {} "
        "data bytes ({})",
        reader.op, path, stream.file_bytes(), stream.max_inflated_bytes(), count, fmt::join(idx.dims, " x "));
  if (!stream.compressed() && header_bytes + count > stream.file_bytes())
    fail<InvalidArgument>("{}: {} is truncated; got {} of {} data bytes ({})", reader.op, path,
                          stream.file_bytes() - header_bytes, count, fmt::join(idx.dims, " x "));

  // Grow while reading, so that a gzip stream shorter than its header declares reports truncation
  // without allocating it all up front, and a real but huge file fails where memory runs out.
  constexpr size_t kStep = size_t{64} << 20;
  size_t have = 0;
  while (have < count) {
    const size_t want = std::min<size_t>(count - have, std::max(kStep, have));
    try {
      idx.data.resize(have + want);
    } catch (const std::bad_alloc&) {
      fail<InvalidArgument>("{}: out of memory reading {}; got {} of {} data bytes ({}) when {} more could not be "
                            "allocated",
                            reader.op, path, have, count, fmt::join(idx.dims, " x "), want);
    }
    const size_t got = stream.read(idx.data.data() + have, want);
    have += got;
    if (got < want)
      fail<InvalidArgument>("{}: {} is truncated; got {} of {} data bytes ({})", reader.op, path, have, count,
                            fmt::join(idx.dims, " x "));
  }
  stream.expect_end(header_bytes + count);
  return idx;
}

// Both files of a dataset, with the image and label counts checked against each other.
std::pair<IdxFile, IdxFile> read_pair(const Reader& reader, const std::string& images_path,
                                      const std::string& labels_path) {
  IdxFile images = read_idx(reader, images_path, kImagesMagic, "images");
  IdxFile labels = read_idx(reader, labels_path, kLabelsMagic, "labels");
  if (images.dims[0] != labels.dims[0])
    fail<ShapeError>("{}: image and label counts differ; got {} images in {} and {} labels in {}", reader.op,
                     images.dims[0], images_path, labels.dims[0], labels_path);
  return {std::move(images), std::move(labels)};
}

// Pixels to f32 in [0, 1] (byte / 255, correctly rounded) and labels to i64, each in one flat loop.
Dataset to_dataset(const IdxFile& images, const IdxFile& labels) {
  const auto n = static_cast<int64_t>(images.dims[0]);
  const auto pixels = static_cast<int64_t>(images.dims[1]) * images.dims[2];
  Dataset dataset{Tensor::empty(Shape{n, pixels}, f32), Tensor::empty(Shape{n}, i64)};
  float* image_values = dataset.images.data<float>();
  const uint8_t* image_bytes = images.data.data();
  const size_t image_count = images.data.size();
  for (size_t i = 0; i < image_count; ++i) image_values[i] = static_cast<float>(image_bytes[i]) / 255.0f;
  int64_t* label_values = dataset.labels.data<int64_t>();
  for (size_t i = 0; i < labels.data.size(); ++i) label_values[i] = labels.data[i];
  return dataset;
}

// splitmix64 (Steele, Lea and Flood 2014): a counter-based generator, plenty for shuffling.
uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in [0, bound) without modulo bias (Lemire 2019), drawing counter values from `counter`.
uint64_t uniform_below(uint64_t key, uint64_t& counter, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;
  for (;;) {
    const unsigned __int128 product = static_cast<unsigned __int128>(splitmix64(key + counter++)) * bound;
    if (static_cast<uint64_t>(product) >= threshold) return static_cast<uint64_t>(product >> 64);
  }
}

}  // namespace

Dataset load_idx_images_and_labels(const std::string& images_path, const std::string& labels_path) {
  const auto [images, labels] = read_pair(Reader{"load_idx_images_and_labels", ""}, images_path, labels_path);
  return to_dataset(images, labels);
}

Dataset load_fashion_mnist(std::string_view split, std::string directory) {
  constexpr std::string_view op = "load_fashion_mnist";
  detail::check_path(op, "directory", directory);
  if (split != "train" && split != "test")
    fail<InvalidArgument>("{}: unknown split; got \"{}\"; use \"train\" or \"test\"", op, split);
  const std::string prefix = split == "train" ? "train" : "t10k";
  // Prefer the package's .gz files; fall back to uncompressed copies when only those exist.
  const auto path_of = [&](const std::string& name) {
    const std::string plain = (std::filesystem::path(directory) / name).string();
    const std::string gz = plain + ".gz";
    std::error_code ignored;
    return !std::filesystem::exists(gz, ignored) && std::filesystem::exists(plain, ignored) ? plain : gz;
  };
  const std::string images_path = path_of(prefix + "-images-idx3-ubyte");
  const std::string labels_path = path_of(prefix + "-labels-idx1-ubyte");

  const auto [images, labels] = read_pair(Reader{op, kInstallHint}, images_path, labels_path);
  if (images.dims[1] != 28 || images.dims[2] != 28)
    fail<ShapeError>("{}: images in {} are not 28x28; got {}x{}", op, images_path, images.dims[1], images.dims[2]);
  for (size_t i = 0; i < labels.data.size(); ++i)
    if (labels.data[i] > 9)
      fail<OutOfRange>("{}: label out of range 0..9 in {}; got {} at index {}", op, labels_path, labels.data[i], i);
  return to_dataset(images, labels);
}

Batches::Batches(const Dataset& dataset, int64_t batch_size, uint64_t seed, bool drop_last)
    : dataset_(dataset), batch_size_(batch_size), seed_(seed), drop_last_(drop_last) {
  constexpr std::string_view op = "Batches";
  if (batch_size <= 0) fail<InvalidArgument>("{}: batch_size must be positive; got {}", op, batch_size);
  if (!dataset.images.defined() || !dataset.labels.defined())
    fail<InvalidArgument>("{}: dataset holds an empty Tensor handle; got images {} and labels {}", op,
                          dataset.images.defined() ? "defined" : "empty", dataset.labels.defined() ? "defined" : "empty");
  if (dataset.images.rank() < 1 || dataset.labels.rank() < 1 ||
      dataset.images.shape()[0] != dataset.labels.shape()[0])
    fail<ShapeError>("{}: images and labels need the same first dimension; got images {} and labels {}", op,
                     dataset.images.shape(), dataset.labels.shape());
  // Rows are copied with memcpy (operator[]): views (a slice, a transpose) become row-major once here.
  dataset_ = Dataset{dataset.images.contiguous(), dataset.labels.contiguous()};
  reshuffle(0);
}

int64_t Batches::size() const {
  const auto n = static_cast<int64_t>(order_.size());
  // Not (n + batch_size - 1) / batch_size: that overflows for a batch_size near INT64_MAX.
  const int64_t full = n / batch_size_;
  return drop_last_ || n % batch_size_ == 0 ? full : full + 1;
}

namespace {

// Rows `rows` of `source` (contiguous, on a CPU device) copied into a new tensor, one memcpy per row
// on the calling thread. Not the gather op: a batch is a few hundred KiB, which gather would split
// over the thread pool, and the prefetcher's thread calling into the pool takes a share of the
// thread budget (and wakes a worker) while the training step wants all of it.
Tensor gather_rows(const Tensor& source, std::span<const int64_t> rows) {
  Shape shape = source.shape();
  shape[0] = static_cast<int64_t>(rows.size());
  Tensor batch = Tensor::empty(shape, source.dtype(), source.device());
  const int64_t count = source.shape()[0];
  const size_t row_bytes =
      count == 0 ? 0 : static_cast<size_t>(source.numel() / count) * dtype_size(source.dtype());
  const auto* from = static_cast<const char*>(source.raw_data());
  auto* to = static_cast<char*>(batch.raw_data());
  if (row_bytes == 0) return batch;  // [n, 0, ...]: nothing to copy (and no buffer to copy into)
  // Rows are scattered over the dataset (188 MB for Fashion-MNIST): each one starts with a cache
  // and TLB miss. Touching the rows kAhead places ahead first overlaps those misses with the copy.
  constexpr size_t kAhead = 4;
  constexpr size_t kLine = 64;
  const auto prefetch_row = [&](size_t k) {
    const char* row = from + static_cast<size_t>(rows[k]) * row_bytes;
    for (size_t offset = 0; offset < row_bytes; offset += kLine) __builtin_prefetch(row + offset, 0, 0);
  };
  for (size_t k = 0; k < std::min(kAhead, rows.size()); ++k) prefetch_row(k);
  for (size_t k = 0; k < rows.size(); ++k) {  // rows come from the permutation: all in [0, count)
    if (k + kAhead < rows.size()) prefetch_row(k + kAhead);
    std::memcpy(to + k * row_bytes, from + static_cast<size_t>(rows[k]) * row_bytes, row_bytes);
  }
  return batch;
}

}  // namespace

Dataset Batches::operator[](int64_t i) const {
  if (i < 0 || i >= size())
    fail<OutOfRange>("Batches: batch index out of range; got {} with {} batches", i, size());
  const int64_t begin = i * batch_size_;  // < N, as i < size()
  const int64_t end = begin + std::min(batch_size_, static_cast<int64_t>(order_.size()) - begin);
  const std::span<const int64_t> rows(order_.data() + begin, static_cast<size_t>(end - begin));
  if (dataset_.images.device().kind() == DeviceKind::cpu && dataset_.labels.device().kind() == DeviceKind::cpu)
    return Dataset{gather_rows(dataset_.images, rows), gather_rows(dataset_.labels, rows)};
  const Tensor indices = tensor(std::vector<int64_t>(rows.begin(), rows.end()), Shape{end - begin});
  return Dataset{gather(dataset_.images, indices), gather(dataset_.labels, indices)};
}

void Batches::reshuffle(uint64_t epoch) {
  const auto n = static_cast<size_t>(dataset_.labels.shape()[0]);
  order_.resize(n);
  for (size_t i = 0; i < n; ++i) order_[i] = static_cast<int64_t>(i);
  // Key from (seed, epoch) through two mixing steps, so that nearby seeds and epochs give unrelated
  // streams ((seed 1, epoch 1) and (seed 2, epoch 0) differ).
  const uint64_t key = splitmix64(splitmix64(seed_) ^ epoch);
  uint64_t counter = 0;
  for (size_t i = n; i > 1; --i) {
    const uint64_t j = uniform_below(key, counter, i);
    std::swap(order_[i - 1], order_[j]);
  }
}

}  // namespace flowlet::data
