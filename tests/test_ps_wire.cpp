// The parameter-server wire format (src/ps/wire): round trips of every message kind and dtype, the
// exact byte layout of hand-written messages, and the decoder against hostile bytes: every
// truncation, named malformed messages, and 200k seeded random mutations (each either decodes to a
// message whose encoding is the very same bytes, or throws DataLoss; nothing else, never a crash).
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <flowlet/flowlet.hpp>
#include <random>
#include <string>
#include <vector>

#include "ps/wire/messages.hpp"

namespace fl = flowlet;
namespace ps = flowlet::detail::ps;
using ps::Bytes;

namespace {

// Little-endian bytes of hand-written messages.
struct ByteWriter {
  Bytes bytes;
  template <class T>
  ByteWriter& put(T v) {
    for (size_t i = 0; i < sizeof(T); ++i) bytes.push_back(static_cast<std::byte>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff));
    return *this;
  }
  ByteWriter& header(uint8_t kind) {
    for (char c : std::string("FLPS")) put<uint8_t>(static_cast<uint8_t>(c));
    return put<uint8_t>(1).put<uint8_t>(kind);
  }
};

std::string decode_error(const Bytes& bytes) {
  try {
    ps::decode(bytes);
  } catch (const fl::DataLoss& e) {
    return e.what();
  }
  return "(decoded)";
}

bool same_tensor(const fl::Tensor& a, const fl::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.dtype() != b.dtype() || !(a.shape() == b.shape())) return false;
  const fl::Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.raw_data(), cb.raw_data(), static_cast<size_t>(a.numel()) * fl::dtype_size(a.dtype())) == 0;
}

// One tensor of every dtype, with distinct elements.
std::vector<fl::Tensor> tensors_of_every_dtype(const fl::Shape& shape) {
  const auto n = static_cast<size_t>(shape.numel());
  std::vector<double> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = static_cast<double>(i % 7) + 0.5 * static_cast<double>(i % 3);
  std::vector<fl::Tensor> out;
  for (int d = 0; d < fl::kNumDTypes; ++d) {
    const auto dtype = static_cast<fl::DType>(d);
    out.push_back(fl::tensor(values, shape).astype(dtype));
  }
  return out;
}

std::vector<ps::Message> sample_messages() {
  ps::SparsePullRequest sparse{7, 2, 11, 3, 10, fl::tensor(std::vector<int64_t>{4, 0, 9}, {3})};
  ps::Push push{1, 5, 4, {}};
  push.entries.push_back({0, fl::Tensor(), fl::tensor(std::vector<float>{1.5f, -2, 0.25f, 8}, {2, 2})});
  push.entries.push_back(
      {3, fl::tensor(std::vector<int64_t>{1, 6}, {2}), fl::tensor(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3})});
  return {
      ps::PullRequest{0x0102030405060708ull, 3, -4, 12, 99},
      sparse,
      ps::PullReply{42, 17, fl::tensor(std::vector<float>{1, 2, 3, 4, 5, 6}, {3, 2})},
      push,
      ps::Push{2, 1, 0, {}},
      ps::Goodbye{6, 1000},
      ps::ErrorReply{9, ps::ErrorCode::deadline_exceeded, "pull: waited 30 s for version 4"},
      ps::ErrorReply{0, ps::ErrorCode::invalid_argument, ""},
  };
}

// Field-by-field equality of two messages.
bool same_message(const ps::Message& a, const ps::Message& b) {
  if (a.index() != b.index()) return false;
  if (auto* x = std::get_if<ps::PullRequest>(&a)) {
    auto& y = std::get<ps::PullRequest>(b);
    return x->request_id == y.request_id && x->worker == y.worker && x->clock == y.clock && x->var_id == y.var_id &&
           x->min_version == y.min_version;
  }
  if (auto* x = std::get_if<ps::SparsePullRequest>(&a)) {
    auto& y = std::get<ps::SparsePullRequest>(b);
    return x->request_id == y.request_id && x->worker == y.worker && x->clock == y.clock && x->var_id == y.var_id &&
           x->min_version == y.min_version && same_tensor(x->rows, y.rows);
  }
  if (auto* x = std::get_if<ps::PullReply>(&a)) {
    auto& y = std::get<ps::PullReply>(b);
    return x->request_id == y.request_id && x->version == y.version && same_tensor(x->value, y.value);
  }
  if (auto* x = std::get_if<ps::Push>(&a)) {
    auto& y = std::get<ps::Push>(b);
    if (x->worker != y.worker || x->clock != y.clock || x->read_version != y.read_version ||
        x->entries.size() != y.entries.size())
      return false;
    for (size_t i = 0; i < x->entries.size(); ++i) {
      if (x->entries[i].var_id != y.entries[i].var_id || !same_tensor(x->entries[i].rows, y.entries[i].rows) ||
          !same_tensor(x->entries[i].grad, y.entries[i].grad))
        return false;
    }
    return true;
  }
  if (auto* x = std::get_if<ps::Goodbye>(&a)) {
    auto& y = std::get<ps::Goodbye>(b);
    return x->worker == y.worker && x->clock == y.clock;
  }
  auto& x = std::get<ps::ErrorReply>(a);
  auto& y = std::get<ps::ErrorReply>(b);
  return x.request_id == y.request_id && x.code == y.code && x.message == y.message;
}

}  // namespace

TEST_CASE("ps wire: every message kind round-trips field for field") {
  for (const ps::Message& m : sample_messages()) {
    CAPTURE(ps::message_name(m));
    const Bytes bytes = ps::encode(m);
    const ps::Message back = ps::decode(bytes);
    CHECK(same_message(m, back));
    CHECK(ps::encode(back) == bytes);
  }
}

TEST_CASE("ps wire: message names") {
  const std::vector<std::string> want = {"pull_request", "sparse_pull_request", "pull_reply", "push",
                                         "push",         "goodbye",             "error_reply", "error_reply"};
  const auto messages = sample_messages();
  for (size_t i = 0; i < messages.size(); ++i) CHECK(ps::message_name(messages[i]) == want[i]);
}

TEST_CASE("ps wire: the byte layout of a goodbye and a pull request, written by hand") {
  ByteWriter goodbye;
  goodbye.header(5).put<int32_t>(-3).put<int64_t>(0x1122334455667788);
  CHECK(ps::encode(ps::Goodbye{-3, 0x1122334455667788}) == goodbye.bytes);
  CHECK(goodbye.bytes.size() == 18);

  ByteWriter pull;
  pull.header(1).put<uint64_t>(5).put<int32_t>(1).put<int64_t>(2).put<int32_t>(3).put<int64_t>(4);
  CHECK(ps::encode(ps::PullRequest{5, 1, 2, 3, 4}) == pull.bytes);

  // A pull reply with an i32 [2] tensor: dtype code 2 (DType::i32), rank 1, dim 2, then 8 bytes.
  ByteWriter reply;
  reply.header(3).put<uint64_t>(1).put<int64_t>(2).put<uint8_t>(2).put<uint8_t>(1).put<int64_t>(2);
  reply.put<int32_t>(-1).put<int32_t>(70000);
  CHECK(ps::encode(ps::PullReply{1, 2, fl::tensor(std::vector<int32_t>{-1, 70000}, {2})}) == reply.bytes);
  const auto back = std::get<ps::PullReply>(ps::decode(reply.bytes));
  CHECK(back.value.to_vector<int32_t>() == std::vector<int32_t>{-1, 70000});
  CHECK(back.value.device() == fl::Device("cpu:0"));
}

TEST_CASE("ps wire: every dtype, rank 0, empty and high-rank tensors round-trip") {
  const std::vector<fl::Shape> shapes = {fl::Shape{}, fl::Shape{0}, fl::Shape{3, 0, 2}, fl::Shape{5},
                                         fl::Shape{2, 3}, fl::Shape{1, 2, 1, 2, 1, 2, 1, 2}};
  for (const fl::Shape& shape : shapes) {
    for (const fl::Tensor& t : tensors_of_every_dtype(shape)) {
      CAPTURE(shape);
      CAPTURE(t.dtype());
      const Bytes bytes = ps::encode(ps::PullReply{1, 2, t});
      // 6 header + 16 fields + dtype + rank + 8 per dimension + the elements.
      CHECK(bytes.size() == 6 + 16 + 2 + 8 * shape.size() + static_cast<size_t>(t.numel()) * fl::dtype_size(t.dtype()));
      const auto back = std::get<ps::PullReply>(ps::decode(bytes));
      CHECK(same_tensor(back.value, t));
      CHECK(back.value.is_contiguous());
    }
  }
}

TEST_CASE("ps wire: an undefined tensor travels as absent") {
  ps::Push push{1, 1, 0, {{4, fl::Tensor(), fl::Tensor()}}};
  const Bytes bytes = ps::encode(push);
  CHECK(bytes.size() == 6 + 20 + 4 + 4 + 2 + 2);
  const auto back = std::get<ps::Push>(ps::decode(bytes));
  REQUIRE(back.entries.size() == 1);
  CHECK(!back.entries[0].rows.defined());
  CHECK(!back.entries[0].grad.defined());
}

TEST_CASE("ps wire: a strided view is encoded row-major") {
  const fl::Tensor t = fl::tensor(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  const fl::Tensor view = fl::transpose(t);  // [3, 2]: 1 4 2 5 3 6
  REQUIRE(!view.is_contiguous());
  const auto back = std::get<ps::PullReply>(ps::decode(ps::encode(ps::PullReply{1, 1, view})));
  CHECK(back.value.shape() == fl::Shape{3, 2});
  CHECK(back.value.to_vector<float>() == std::vector<float>{1, 4, 2, 5, 3, 6});
}

TEST_CASE("ps wire: a dense 4 MB push encodes to its size plus the header") {
  const fl::Tensor grad = fl::full({1024, 1024}, 0.5, fl::f32);
  const Bytes bytes = ps::encode(ps::Push{0, 1, 0, {{0, fl::Tensor(), grad}}});
  CHECK(bytes.size() == 6 + 20 + 4 + 4 + 2 + 2 + 16 + (size_t{4} << 20));
  CHECK(bytes.capacity() == bytes.size() + ps::kFrameSpare);  // sized once: no reallocation, no second copy
  const auto back = std::get<ps::Push>(ps::decode(bytes));
  CHECK(same_tensor(back.entries[0].grad, grad));
}

// Whether `t`'s elements lie inside [first, first + size) and at a multiple of its element size.
bool inside_and_aligned(const fl::Tensor& t, const std::byte* first, size_t size) {
  const auto* p = static_cast<const std::byte*>(t.raw_data());
  return p >= first && p + static_cast<size_t>(t.numel()) * fl::dtype_size(t.dtype()) <= first + size &&
         reinterpret_cast<uintptr_t>(p) % fl::dtype_size(t.dtype()) == 0;
}

TEST_CASE("ps wire: decode(Bytes&&) views large tensors in the message's buffer, aligned, with the same values") {
  // Every dtype at two positions: a pull reply (elements at 24 + 8 x rank: aligned) and the grad of a
  // dense push entry (at 38 + 8 x rank: 2 bytes off for 4- and 8-byte elements, moved back in place).
  for (const fl::Tensor& t : tensors_of_every_dtype({64, 130})) {
    CAPTURE(t.dtype());
    const fl::Tensor sparse_ids = fl::tensor(std::vector<int64_t>{3, 1}, {2});
    for (const ps::Message& m : {ps::Message(ps::PullReply{5, 6, t}), ps::Message(ps::Push{1, 2, 0, {{4, fl::Tensor(), t}}}),
                                  ps::Message(ps::Push{1, 2, 0, {{4, sparse_ids, t}, {5, fl::Tensor(), t}}})}) {
      CAPTURE(ps::message_name(m));
      Bytes bytes = ps::encode(m);
      const Bytes original = bytes;
      const std::byte* first = bytes.data();
      const size_t size = bytes.size();
      const ps::Message back = ps::decode(std::move(bytes));
      CHECK(same_message(m, back));
      CHECK(ps::encode(back) == original);
      if (const auto* reply = std::get_if<ps::PullReply>(&back)) {
        CHECK(inside_and_aligned(reply->value, first, size));
      } else {
        for (const ps::PushEntry& e : std::get<ps::Push>(back).entries) {
          CHECK(inside_and_aligned(e.grad, first, size));
          if (e.rows.defined()) CHECK(!inside_and_aligned(e.rows, first, size));  // 16 bytes: copied
        }
      }
    }
  }
}

TEST_CASE("ps wire: a tensor decode(Bytes&&) made outlives the message and its siblings") {
  const fl::Tensor grad = fl::full({1024, 8}, 0.25, fl::f32);
  fl::Tensor kept;
  {
    const Bytes bytes = ps::encode(ps::Push{0, 1, 0, {{0, fl::Tensor(), grad}, {1, fl::Tensor(), grad * 2.0}}});
    ps::Push push = std::get<ps::Push>(ps::decode(Bytes(bytes)));
    kept = push.entries[1].grad;
  }
  CHECK(same_tensor(kept, grad * 2.0));
  CHECK(kept.device() == fl::Device());
}

TEST_CASE("ps wire: decode(Bytes&&) rejects what decode(span) rejects") {
  for (const ps::Message& m : sample_messages()) {
    const Bytes bytes = ps::encode(m);
    for (size_t n = 0; n < bytes.size(); ++n) {
      CAPTURE(ps::message_name(m));
      CAPTURE(n);
      CHECK_THROWS_AS(ps::decode(Bytes(bytes.begin(), bytes.begin() + static_cast<long>(n))), fl::DataLoss);
    }
  }
  // A large b8 tensor with an element that is neither 0 nor 1: checked before it is adopted.
  Bytes bad = ps::encode(ps::PullReply{1, 1, fl::zeros({8192}, fl::b8)});
  bad[bad.size() - 5] = std::byte{2};
  CHECK_THROWS_WITH_AS(ps::decode(std::move(bad)), doctest::Contains("neither 0 nor 1"), fl::DataLoss);
}

TEST_CASE("ps wire: encode rejects a tensor above the wire's rank") {
  fl::Shape shape;
  for (int k = 0; k < ps::kMaxWireRank + 1; ++k) shape.push_back(1);
  const fl::Tensor t = fl::zeros(shape, fl::f32);
  CHECK_THROWS_WITH_AS(ps::encode(ps::PullReply{1, 1, t}), doctest::Contains("rank 65"), fl::InvalidArgument);
}

TEST_CASE("ps wire: every truncation of a valid message is DataLoss") {
  for (const ps::Message& m : sample_messages()) {
    const Bytes bytes = ps::encode(m);
    for (size_t n = 0; n < bytes.size(); ++n) {
      CAPTURE(ps::message_name(m));
      CAPTURE(n);
      const Bytes cut(bytes.begin(), bytes.begin() + static_cast<long>(n));
      CHECK_THROWS_AS(ps::decode(cut), fl::DataLoss);
    }
  }
}

TEST_CASE("ps wire: named malformed messages") {
  const Bytes good = ps::encode(ps::PullReply{1, 2, fl::tensor(std::vector<float>{1, 2}, {2})});
  // Offsets in `good`: header 0..5, request_id 6, version 14, dtype 22, rank 23, dim 24, data 32.

  SUBCASE("bad magic") {
    Bytes b = good;
    b[0] = std::byte{'X'};
    CHECK(decode_error(b) == "ps message: bad magic (want \"FLPS\"); got 0x53504c58 at byte 0 of 40");
  }
  SUBCASE("unsupported version") {
    Bytes b = good;
    b[4] = std::byte{2};
    CHECK(decode_error(b) == "ps message: unsupported format version (want 1); got 2 at byte 4 of 40");
  }
  SUBCASE("unknown kind") {
    Bytes b = good;
    b[5] = std::byte{0};
    CHECK(decode_error(b) == "ps message: unknown message kind (want 1..6); got 0 at byte 5 of 40");
    b[5] = std::byte{7};
    CHECK(decode_error(b) == "ps message: unknown message kind (want 1..6); got 7 at byte 5 of 40");
  }
  SUBCASE("unknown dtype") {
    Bytes b = good;
    b[22] = std::byte{8};
    CHECK(decode_error(b) == "ps message: pull_reply.value: unknown dtype code; got 8 at byte 22 of 40");
  }
  SUBCASE("rank 200") {
    Bytes b = good;
    b[23] = std::byte{200};
    CHECK(decode_error(b) == "ps message: pull_reply.value: rank above the maximum 64; got 200 at byte 23 of 40");
  }
  SUBCASE("dimension -1") {
    ByteWriter w;
    w.header(3).put<uint64_t>(1).put<int64_t>(2).put<uint8_t>(0).put<uint8_t>(2).put<int64_t>(1).put<int64_t>(-1);
    CHECK(decode_error(w.bytes) == "ps message: pull_reply.value: negative dimension 1; got -1 at byte 32 of 40");
  }
  SUBCASE("dimensions whose product overflows") {
    ByteWriter w;
    w.header(3).put<uint64_t>(1).put<int64_t>(2).put<uint8_t>(0).put<uint8_t>(2);
    w.put<int64_t>(int64_t{1} << 31).put<int64_t>(int64_t{1} << 31);  // 2^62 elements x 4 bytes
    CHECK(decode_error(w.bytes) ==
          "ps message: pull_reply.value: the size of f32 dimensions overflows int64 bytes; got [2147483648, "
          "2147483648] at byte 32 of 40");
  }
  SUBCASE("a zero dimension does not hide an overflow") {
    ByteWriter w;
    w.header(3).put<uint64_t>(1).put<int64_t>(2).put<uint8_t>(1).put<uint8_t>(3);
    w.put<int64_t>(0).put<int64_t>(int64_t{1} << 40).put<int64_t>(int64_t{1} << 40);
    CHECK(decode_error(w.bytes).find("overflows") != std::string::npos);
  }
  SUBCASE("more elements than bytes") {
    Bytes b = good;
    b[24] = std::byte{3};  // [3] f32 needs 12 bytes, 8 are there
    CHECK(decode_error(b) == "ps message: pull_reply.value: f32 [3] needs 12 bytes, 8 left; got [3] at byte 32 of 40");
  }
  SUBCASE("a count of 2^31 entries in 20 bytes") {
    ByteWriter w;
    w.header(4).put<int32_t>(0).put<int64_t>(1).put<int64_t>(0).put<uint32_t>(uint32_t{1} << 31);
    w.put<uint64_t>(0).put<uint64_t>(0).put<uint32_t>(0);  // 20 bytes after the count
    CHECK(decode_error(w.bytes) ==
          "ps message: push.entries count needs at least 8 bytes each, 20 left; got 2147483648 at byte 26 of 50");
  }
  SUBCASE("a string longer than the message") {
    ByteWriter w;
    w.header(6).put<uint64_t>(1).put<uint8_t>(3).put<uint32_t>(0xffffffffu).put<uint8_t>('x');
    CHECK(decode_error(w.bytes) ==
          "ps message: error_reply.message count needs at least 1 bytes each, 1 left; got 4294967295 at byte 15 of 20");
  }
  SUBCASE("an unknown error code") {
    ByteWriter w;
    w.header(6).put<uint64_t>(1).put<uint8_t>(9).put<uint32_t>(0);
    CHECK(decode_error(w.bytes) == "ps message: error_reply.code: unknown error code; got 9 at byte 14 of 19");
  }
  SUBCASE("a b8 element that is not 0 or 1") {
    ByteWriter w;
    w.header(3).put<uint64_t>(1).put<int64_t>(2).put<uint8_t>(5).put<uint8_t>(1).put<int64_t>(2);
    w.put<uint8_t>(1).put<uint8_t>(2);
    CHECK(decode_error(w.bytes) == "ps message: pull_reply.value: a b8 element is neither 0 nor 1; got 2 at byte 33 of 34");
  }
  SUBCASE("an absent tensor with a rank") {
    ByteWriter w;
    w.header(3).put<uint64_t>(1).put<int64_t>(2).put<uint8_t>(0xff).put<uint8_t>(1);
    CHECK(decode_error(w.bytes) == "ps message: pull_reply.value: an absent tensor has rank 0; got 1 at byte 23 of 24");
  }
  SUBCASE("trailing garbage") {
    Bytes b = good;
    b.push_back(std::byte{0});
    b.push_back(std::byte{0x5a});
    CHECK(decode_error(b) == "ps message: 2 trailing bytes after the pull_reply; got 2 at byte 40 of 42");
  }
  SUBCASE("empty input") {
    CHECK(decode_error({}) == "ps message: the header (magic, version, kind) needs 6 bytes; got 0 left at byte 0 of 0");
  }
}

TEST_CASE("ps wire: 200k seeded random mutations decode to the same bytes or throw DataLoss") {
  std::vector<Bytes> seeds;
  for (const ps::Message& m : sample_messages()) seeds.push_back(ps::encode(m));
  std::mt19937_64 rng(20261201);
  // Values that land on length, count, rank and dimension fields.
  const uint64_t interesting[] = {0, 1, 2, 7, 8, 64, 65, 200, 255, 0x7fffffff, 0x80000000, 0xffffffff,
                                  uint64_t{1} << 31 << 31, ~uint64_t{0}, uint64_t{1} << 63};
  int64_t decoded = 0, rejected = 0;
  for (int i = 0; i < 200000; ++i) {
    Bytes b = seeds[rng() % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      const size_t at = b.empty() ? 0 : rng() % b.size();
      switch (rng() % 5) {
        case 0:  // flip bits of one byte
          if (!b.empty()) b[at] ^= static_cast<std::byte>(1 + rng() % 255);
          break;
        case 1:  // insert bytes
          b.insert(b.begin() + static_cast<long>(at), 1 + rng() % 8, static_cast<std::byte>(rng()));
          break;
        case 2:  // remove bytes
          if (!b.empty()) b.erase(b.begin() + static_cast<long>(at), b.begin() + static_cast<long>(std::min(b.size(), at + 1 + rng() % 8)));
          break;
        default: {  // overwrite a 1, 4 or 8-byte field with an interesting value
          const size_t width = std::vector<size_t>{1, 4, 8}[rng() % 3];
          const uint64_t v = interesting[rng() % std::size(interesting)];
          for (size_t k = 0; k < width && at + k < b.size(); ++k) b[at + k] = static_cast<std::byte>(v >> (8 * k));
        }
      }
    }
    try {
      const ps::Message m = ps::decode(b);
      ++decoded;
      // The format has one encoding per message: whatever decodes re-encodes to the same bytes.
      if (ps::encode(m) != b) FAIL_CHECK("mutation " << i << " decoded but re-encodes differently");
    } catch (const fl::DataLoss&) {
      ++rejected;
    } catch (const std::exception& e) {
      FAIL_CHECK("mutation " << i << " threw something other than DataLoss: " << e.what());
    }
  }
  MESSAGE("decoded " << decoded << ", rejected " << rejected);
  CHECK(decoded + rejected == 200000);
  CHECK(decoded > 0);    // some mutations (a flipped payload byte) are still messages
  CHECK(rejected > 0);
}
