// Sizes at the limits: shapes whose element count or byte size overflows (eager and traced, with the
// zero dimension anywhere), and out-of-memory errors and the release of cached memory.
#include <cstdint>
#include <functional>
#include <future>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "support/reference.hpp"

using test::check_throws;

// An allocation of 2^47..2^50 bytes must fail in posix_memalign with ENOMEM, as it does without
// sanitizers, instead of stopping the test binary with an "allocation size too big" report.
#if defined(__SANITIZE_ADDRESS__)
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }
#endif
#if defined(__SANITIZE_THREAD__)
extern "C" const char* __tsan_default_options() { return "allocator_may_return_null=1"; }
#endif

namespace {

constexpr int64_t k2_40 = int64_t{1} << 40;
constexpr int64_t k2_60 = int64_t{1} << 60;
constexpr int64_t k2_61 = int64_t{1} << 61;
constexpr int64_t k2_62 = int64_t{1} << 62;
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// Runs `make` eagerly, or inside a traced function (which records the op's node and checks its
// shape rule at trace time).
fl::Tensor run(bool traced, const std::function<fl::Tensor()>& make) {
  if (!traced) return make();
  auto f = fl::trace([&](fl::Tensor) { return make(); });
  return f(fl::zeros({1}));
}

// The ShapeError of a shape that cannot be allocated, from `op`, naming the shape.
void check_too_large(const std::string& op, const std::string& shape, const std::function<fl::Tensor()>& make) {
  for (const bool traced : {false, true}) {
    CAPTURE(traced);
    check_throws<fl::ShapeError>([&] { run(traced, make); }, {op + ": ", shape});
  }
}

}  // namespace

TEST_CASE("a shape whose byte size overflows int64 is a ShapeError naming the op and the shape") {
  // 2^61 f64 elements: the count fits int64, the 2^64 bytes do not (they used to wrap to 0).
  check_too_large("full", "[2305843009213693952] of f64", [] { return fl::zeros({k2_61}, fl::f64); });
  check_too_large("one_hot", "[1, 4611686018427387904]", [] { return fl::one_hot(fl::tensor({0}), k2_62); });
  check_too_large("arange", "[4611686018427387904]", [] { return fl::arange(k2_62, fl::f64); });
  check_too_large("randn", "[4611686018427387904]", [] { return fl::randn({k2_62}, 1); });
  check_too_large("uniform", "[4611686018427387904]", [] { return fl::uniform({k2_62}, 0.0, 1.0, 1); });
  // rows * 2 f32 elements: 2^61 elements fit, 2^63 bytes do not.
  check_too_large("scatter_add", "[1152921504606846976, 2]",
                  [] { return fl::scatter_add(fl::tensor({0}), fl::ones({1, 2}), k2_60); });
  check_too_large("scatter_add", "[4611686018427387904, 4]",
                  [] { return fl::scatter_add(fl::tensor({0}), fl::ones({1, 4}), k2_62); });
}

TEST_CASE("batched matmul with k = 0 checks its output shape") {
  // Both operands hold no elements, but the [2^20, 2^20, 2^22] f32 output would need 2^64 bytes.
  check_too_large("matmul", "[1048576, 1048576, 4194304]", [] {
    return fl::matmul(fl::zeros({1 << 20, 1 << 20, 0}), fl::zeros({1 << 20, 0, 1 << 22}));
  });
  // A small k = 0 product is still zeros.
  const fl::Tensor c = fl::matmul(fl::ones({2, 3, 0}), fl::ones({2, 0, 4}));
  CHECK(c.shape() == fl::Shape{2, 3, 4});
  CHECK(c.to_vector<float>() == std::vector<float>(24, 0.0f));
}

TEST_CASE("concat checks the sum along its axis and the output's byte size") {
  const fl::Tensor half = fl::zeros({k2_62, 0}, fl::u8);  // 2^62 one-byte rows of nothing: allocatable
  CHECK(half.numel() == 0);
  check_too_large("concat", "overflows int64", [&] { return fl::concat({half, half}, 0); });
  const fl::Tensor quarter = fl::zeros({k2_60, 0});  // f32: 2^62 bytes if it had a column
  check_too_large("concat", "[2305843009213693952, 0]", [&] { return fl::concat({quarter, quarter}, 0); });
  CHECK(fl::concat({quarter, fl::zeros({5, 0})}, 0).shape() == fl::Shape{k2_60 + 5, 0});
}

TEST_CASE("the size rule ignores where a zero dimension sits") {
  for (const fl::Shape& shape : {fl::Shape{0, k2_62, 4}, fl::Shape{k2_62, 4, 0}, fl::Shape{k2_62, 0, 4},
                                 fl::Shape{0, k2_61}, fl::Shape{k2_61, 0}}) {
    CAPTURE(shape);
    check_too_large("full", fmt::format("{}", shape), [&] { return fl::zeros(shape); });
  }
  // At the limit: (2^61 - 1) * 4 bytes fit, and so do int64-max one-byte rows.
  for (const fl::Shape& shape : {fl::Shape{0, k2_61 - 1}, fl::Shape{k2_61 - 1, 0}, fl::Shape{3, 0, int64_t{1} << 59}}) {
    CAPTURE(shape);
    const fl::Tensor t = fl::zeros(shape);
    CHECK(t.numel() == 0);
    CHECK(t.shape() == shape);
  }
  const fl::Tensor widest = fl::zeros({0, kInt64Max}, fl::u8);
  CHECK(widest.strides()[0] == kInt64Max);
  check_too_large("full", "of f32", [] { return fl::zeros({0, kInt64Max}, fl::f32); });
}

TEST_CASE("reshape rejects a requested shape whose size overflows, without signed overflow") {
  check_too_large("reshape", "overflows int64", [] { return fl::reshape(fl::zeros({6}), {-1, k2_40, k2_40}); });
  check_too_large("reshape", "overflows int64", [] { return fl::reshape(fl::zeros({6}), {6, k2_40, k2_40}); });
  check_too_large("reshape", "overflows int64", [] { return fl::reshape(fl::zeros({0}), {0, k2_40, k2_40, -1}); });
  CHECK(fl::reshape(fl::zeros({6}), {-1, 2}).shape() == fl::Shape{3, 2});
}

TEST_CASE("Tensor::empty, Shape::numel and contiguous_strides check their arithmetic") {
  check_throws<fl::ShapeError>([] { fl::Tensor::empty({k2_62}, fl::f32); }, {"empty: ", "[4611686018427387904]"});
  check_throws<fl::ShapeError>([] { fl::Tensor::empty({-1}, fl::f32); }, {"empty: ", "must be >= 0", "[-1]"});
  check_throws<fl::ShapeError>([] { (void)fl::Shape{k2_62, 4}.numel(); }, {"numel: ", "[4611686018427387904, 4]"});
  CHECK(fl::Shape{k2_62, 4, 0}.numel() == 0);  // a zero anywhere makes the count 0
  CHECK(fl::Shape{0, k2_62, 4}.numel() == 0);
  CHECK(fl::Shape{k2_61, 3}.numel() == 3 * k2_61);
  check_throws<fl::ShapeError>([] { fl::contiguous_strides({k2_62, 4, 2}); }, {"strides: ", "[4611686018427387904, 4, 2]"});
  const fl::Strides strides = fl::contiguous_strides({k2_60, 0, 4});
  CHECK(strides[0] == 4);
  CHECK(strides[1] == 4);
  CHECK(strides[2] == 1);
}

TEST_CASE("tensor() checks the byte size of its shape") {
  const std::vector<float> none;
  check_throws<fl::ShapeError>([&] { fl::tensor(none, {0, k2_62}); }, {"tensor: ", "[0, 4611686018427387904]"});
}

TEST_CASE("running out of memory is a ResourceExhausted naming the op, the device and the bytes") {
  // 2^50 bytes fail in posix_memalign on any machine this runs on (and the cache holds none of them).
  check_throws<fl::ResourceExhausted>([] { fl::zeros({int64_t{1} << 47}, fl::f64); },
                                      {"full: out of memory on cpu:0", "1125899906842624 bytes"});
  // [2^23, 1] x [1, 2^24] f32: a 2^49-byte output.
  check_throws<fl::ResourceExhausted>(
      [] { fl::matmul(fl::ones({1 << 23, 1}), fl::ones({1, 1 << 24})); },
      {"matmul: out of memory on cpu:0", "562949953421312 bytes", "release_cached_memory"});
  // Beyond 2^52 bytes no allocation is tried.
  check_throws<fl::ResourceExhausted>([] { fl::zeros({int64_t{1} << 53}, fl::u8); },
                                      {"full: out of memory on cpu:0", "9007199254740992 bytes", "more than any"});
  // Tensor::empty outside an op names no op.
  check_throws<fl::ResourceExhausted>([] { fl::Tensor::empty({int64_t{1} << 47}, fl::f64); },
                                      {"storage: out of memory on cpu:0", "1125899906842624 bytes"});
  // Any flowlet::Error handler catches it.
  check_throws<fl::Error>([] { fl::zeros({int64_t{1} << 47}, fl::f64); }, {"out of memory"});
}

TEST_CASE("running out of memory inside a traced function is an Error naming the bytes") {
  // The executor reports the node; once it keeps the subclass of the error it wraps, this is a
  // ResourceExhausted as it is eagerly.
  auto f = fl::trace([](fl::Tensor x) { return fl::ones({int64_t{1} << 47}, fl::f64) + x; });
  check_throws<fl::Error>([&] { f(fl::ones({1}, fl::f64)); },
                                      {"out of memory on cpu:0", "1125899906842624 bytes"});
}

TEST_CASE("release_cached_memory returns freed blocks, and a failed allocation releases them first") {
  const fl::Device cpu;
  constexpr int64_t kBlock = int64_t{64} << 20;  // 64 MiB: cached in the shared pool when freed
  fl::release_cached_memory();
  const fl::DeviceMemoryStats start = fl::memory_stats(cpu);
  { const fl::Tensor big = fl::zeros({kBlock / 4}); }
  const fl::DeviceMemoryStats freed = fl::memory_stats(cpu);
  CHECK(freed.bytes_in_use == start.bytes_in_use);
  CHECK(freed.bytes_cached >= start.bytes_cached + kBlock);

  fl::release_cached_memory();
  const fl::DeviceMemoryStats released = fl::memory_stats(cpu);
  CHECK(released.bytes_in_use == start.bytes_in_use);
  CHECK(released.bytes_cached < start.bytes_cached + kBlock);

  // The cache is refilled, then an allocation that cannot succeed releases it before it fails.
  { const fl::Tensor big = fl::zeros({kBlock / 4}); }
  CHECK(fl::memory_stats(cpu).bytes_cached >= start.bytes_cached + kBlock);
  check_throws<fl::ResourceExhausted>([] { fl::zeros({int64_t{1} << 47}, fl::f64); }, {"after releasing"});
  CHECK(fl::memory_stats(cpu).bytes_cached < start.bytes_cached + kBlock);
  // And the allocator works afterwards.
  CHECK(fl::ones({3}).to_vector<float>() == std::vector<float>{1, 1, 1});
}

TEST_CASE("softmax of an empty tensor with huge other dimensions returns at once") {
  // Found by fuzz_op_args: [2, 0, 2^31] along axis 1 used to walk 2^32 empty lines.
  const fl::Tensor x = fl::zeros({2, 0, int64_t{1} << 31});
  for (const int64_t axis : {0, 1, 2}) {
    CAPTURE(axis);
    CHECK(fl::softmax(x, axis).shape() == x.shape());
    CHECK(fl::log_softmax(x, axis).shape() == x.shape());
  }
}

TEST_CASE("another thread's cache of small blocks is released at that thread's next allocation") {
  const fl::Device cpu;
  constexpr int kBlocks = 32;
  constexpr int64_t kBlockBytes = 64 * 1024;  // small enough for the per-thread cache
  std::promise<void> filled, released, refreshed;
  std::thread worker([&] {
    {
      std::vector<fl::Tensor> blocks;
      for (int i = 0; i < kBlocks; ++i) blocks.push_back(fl::zeros({kBlockBytes / 4}));
    }  // freed into this thread's cache
    filled.set_value();
    released.get_future().wait();
    (void)fl::zeros({1});  // the first allocation after the release empties this thread's cache
    refreshed.set_value();
  });
  filled.get_future().wait();
  const int64_t with_worker_cache = fl::memory_stats(cpu).bytes_cached;
  fl::release_cached_memory();
  // The worker's blocks are still cached: only the worker may touch its cache.
  CHECK(fl::memory_stats(cpu).bytes_cached >= kBlocks * kBlockBytes);
  CHECK(with_worker_cache >= kBlocks * kBlockBytes);
  released.set_value();
  refreshed.get_future().wait();
  CHECK(fl::memory_stats(cpu).bytes_cached < kBlocks * kBlockBytes);
  worker.join();
}
