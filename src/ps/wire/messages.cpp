// The byte encoding of the parameter-server messages (layout in messages.hpp) and its hostile-input
// decoder.
//
// encode() walks a message twice with the same code: once counting bytes (and checking that every
// tensor can travel), once appending to a byte string reserved to exactly that size, so a tensor's
// elements are copied once, straight from its storage into the message. decode() reads through a
// cursor that checks every length against the bytes left before it reads or allocates anything:
// the largest allocation a message can cause is the size of the message itself. decode(Bytes&&)
// takes the message's buffer over, and its large tensors view their elements there: a received
// 4 MB push or reply is not copied again.
#include "ps/wire/messages.hpp"

#include <fmt/format.h>

#include <bit>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>

#include "core/check.hpp"
#include "flowlet/core/error.hpp"
#include "flowlet/core/format.hpp"

namespace flowlet::detail::ps {

static_assert(std::endian::native == std::endian::little, "the ps wire format is written as the host's little-endian");

namespace {

constexpr uint8_t kMagic[4] = {'F', 'L', 'P', 'S'};
constexpr uint8_t kVersion = 1;
constexpr size_t kHeaderBytes = 6;  // magic, version, kind
constexpr size_t kKinds = std::variant_size_v<Message>;

// The smallest encoding of a tensor (an undefined one, or rank 0 without its element) and of a push
// entry: what a vector count is checked against before anything is read.
constexpr uint64_t kMinTensorBytes = 2;
constexpr uint64_t kMinPushEntryBytes = 4 + 2 * kMinTensorBytes;
// decode(Bytes&&) copies tensors smaller than this (a copy costs less than a Storage over the
// message's buffer, and a small tensor then does not keep a large message alive).
constexpr uint64_t kMinAdoptedBytes = 4096;

// ---- encoding ---------------------------------------------------------------------------------------

// Counts the bytes of a message, and checks what encode() promises to reject.
class Counter {
 public:
  explicit Counter(const char* kind) : kind_(kind) {}
  void put(const void*, size_t bytes) { size_ += bytes; }
  template <class T>
  void value(T) {
    size_ += sizeof(T);
  }
  void count(size_t n, const char* what) {
    if (n > std::numeric_limits<uint32_t>::max()) {
      fail<InvalidArgument>("encode: {} has {} {}; the wire format holds at most 2^32 - 1", kind_, n, what);
    }
    size_ += 4;
  }
  void tensor(const Tensor& t, const char* field) {
    size_ += 2;
    if (!t.defined()) return;
    if (t.is_symbolic()) {
      fail<InvalidArgument>("encode: {} field {} is a symbolic tensor (a value being traced); only computed tensors travel",
                            kind_, field);
    }
    if (t.device().kind() != DeviceKind::cpu) {
      fail<InvalidArgument>("encode: {} field {} is on {}; the wire carries CPU tensors", kind_, field, t.device().str());
    }
    if (t.rank() > kMaxWireRank) {
      fail<InvalidArgument>("encode: {} field {} has rank {}; the wire carries at most {} dimensions", kind_, field,
                            t.rank(), kMaxWireRank);
    }
    size_ += static_cast<size_t>(t.rank()) * 8 + static_cast<size_t>(t.numel()) * dtype_size(t.dtype());
  }
  size_t size() const { return size_; }

 private:
  const char* kind_;
  size_t size_ = 0;
};

// Appends a message to a byte string whose capacity the Counter sized.
class Appender {
 public:
  explicit Appender(Bytes& out) : out_(out) {}
  void put(const void* data, size_t bytes) {
    const auto* first = static_cast<const std::byte*>(data);
    out_.insert(out_.end(), first, first + bytes);
  }
  template <class T>
  void value(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    put(&v, sizeof v);
  }
  void count(size_t n, const char*) { value(static_cast<uint32_t>(n)); }
  void tensor(const Tensor& t, const char*) {
    if (!t.defined()) {
      value(kNoTensor);
      value(uint8_t{0});
      return;
    }
    value(static_cast<uint8_t>(t.dtype()));
    value(static_cast<uint8_t>(t.rank()));
    for (int64_t d : t.shape()) value(d);
    const size_t bytes = static_cast<size_t>(t.numel()) * dtype_size(t.dtype());
    if (bytes == 0) return;
    if (t.is_contiguous()) {
      put(t.raw_data(), bytes);
    } else {
      const Tensor dense = t.contiguous();  // a strided view: gathered once, then copied in
      put(dense.raw_data(), bytes);
    }
  }

 private:
  Bytes& out_;
};

template <class Sink>
void put_string(Sink& sink, const std::string& s, const char* what) {
  sink.count(s.size(), what);
  sink.put(s.data(), s.size());
}

template <class Sink>
void put_body(Sink& sink, const PullRequest& m) {
  sink.value(m.request_id);
  sink.value(m.worker);
  sink.value(m.clock);
  sink.value(m.var_id);
  sink.value(m.min_version);
}
template <class Sink>
void put_body(Sink& sink, const SparsePullRequest& m) {
  sink.value(m.request_id);
  sink.value(m.worker);
  sink.value(m.clock);
  sink.value(m.var_id);
  sink.value(m.min_version);
  sink.tensor(m.rows, "rows");
}
template <class Sink>
void put_body(Sink& sink, const PullReply& m) {
  sink.value(m.request_id);
  sink.value(m.version);
  sink.tensor(m.value, "value");
}
template <class Sink>
void put_body(Sink& sink, const Push& m) {
  sink.value(m.worker);
  sink.value(m.clock);
  sink.value(m.read_version);
  sink.count(m.entries.size(), "entries");
  for (const PushEntry& e : m.entries) {
    sink.value(e.var_id);
    sink.tensor(e.rows, "entries[].rows");
    sink.tensor(e.grad, "entries[].grad");
  }
}
template <class Sink>
void put_body(Sink& sink, const Goodbye& m) {
  sink.value(m.worker);
  sink.value(m.clock);
}
template <class Sink>
void put_body(Sink& sink, const ErrorReply& m) {
  sink.value(m.request_id);
  sink.value(static_cast<uint8_t>(m.code));
  put_string(sink, m.message, "message bytes");
}

template <class Sink>
void put_message(Sink& sink, const Message& message) {
  sink.put(kMagic, sizeof kMagic);
  sink.value(kVersion);
  sink.value(static_cast<uint8_t>(message.index() + 1));
  std::visit([&](const auto& m) { put_body(sink, m); }, message);
}

// ---- decoding ---------------------------------------------------------------------------------------

// A cursor over hostile bytes: every read checks the bytes left first. Given the message's buffer
// (`owner`), tensors view their elements in it instead of copying them.
class Reader {
 public:
  explicit Reader(std::span<const std::byte> bytes) : bytes_(bytes) {}
  explicit Reader(std::shared_ptr<Bytes> owner) : bytes_(*owner), owner_(std::move(owner)) {}

  size_t offset() const { return offset_; }
  size_t left() const { return bytes_.size() - offset_; }

  // DataLoss "ps message: <what>; got <value> at byte <offset> of <size>".
  template <class V>
  [[noreturn]] void fail_at(size_t at, const std::string& what, const V& value) const {
    fail<DataLoss>("ps message: {}; got {} at byte {} of {}", what, value, at, bytes_.size());
  }

  void need(uint64_t bytes, const char* field) const {
    if (bytes > left()) fail_at(offset_, fmt::format("{} needs {} bytes", field, bytes), fmt::format("{} left", left()));
  }

  template <class T>
  T take(const char* field) {
    need(sizeof(T), field);
    T v;
    std::memcpy(&v, bytes_.data() + offset_, sizeof v);
    offset_ += sizeof v;
    return v;
  }

  // A u32 count of elements of at least `min_bytes` each, checked against the bytes left.
  size_t count(const char* field, uint64_t min_bytes) {
    const size_t at = offset_;
    const uint32_t n = take<uint32_t>(field);
    if (uint64_t{n} * min_bytes > left()) {
      fail_at(at, fmt::format("{} count needs at least {} bytes each, {} left", field, min_bytes, left()), n);
    }
    return n;
  }

  std::string string(const char* field) {
    const size_t n = count(field, 1);
    std::string s(reinterpret_cast<const char*>(bytes_.data() + offset_), n);
    offset_ += n;
    return s;
  }

  Tensor tensor(const char* field) {
    const size_t at = offset_;
    const uint8_t code = take<uint8_t>(field);
    const size_t rank_at = offset_;
    const uint8_t rank = take<uint8_t>(field);
    if (code == kNoTensor) {
      if (rank != 0) fail_at(rank_at, fmt::format("{}: an absent tensor has rank 0", field), int{rank});
      return Tensor();
    }
    if (code >= kNumDTypes) fail_at(at, fmt::format("{}: unknown dtype code", field), int{code});
    const auto dtype = static_cast<DType>(code);
    if (rank > kMaxWireRank) {
      fail_at(rank_at, fmt::format("{}: rank above the maximum {}", field, kMaxWireRank), int{rank});
    }
    need(uint64_t{rank} * 8, field);
    Shape shape;
    // The size rule of every tensor (core/check.hpp, check_size): the item size times the non-zero
    // dimensions fits int64, so the strides Tensor::empty computes do too.
    int64_t nonzero_bytes = static_cast<int64_t>(dtype_size(dtype));
    bool has_zero = false;
    for (int k = 0; k < rank; ++k) {
      const size_t dim_at = offset_;
      const int64_t d = take<int64_t>(field);
      if (d < 0) fail_at(dim_at, fmt::format("{}: negative dimension {}", field, k), d);
      shape.push_back(d);
      if (d == 0) {
        has_zero = true;
      } else if (__builtin_mul_overflow(nonzero_bytes, d, &nonzero_bytes)) {
        fail_at(dim_at, fmt::format("{}: the size of {} dimensions overflows int64 bytes", field, dtype_name(dtype)),
                shape);
      }
    }
    const uint64_t bytes = has_zero ? 0 : static_cast<uint64_t>(nonzero_bytes);
    if (bytes > left()) {
      fail_at(offset_, fmt::format("{}: {} {} needs {} bytes, {} left", field, dtype_name(dtype), shape, bytes, left()),
              shape);
    }
    const std::byte* data = bytes_.data() + offset_;
    if (dtype == DType::b8) {  // a bool that is neither 0 nor 1 is undefined behaviour to read
      for (uint64_t i = 0; i < bytes; ++i) {
        const auto b = static_cast<uint8_t>(data[i]);
        if (b > 1) fail_at(offset_ + i, fmt::format("{}: a b8 element is neither 0 nor 1", field), int{b});
      }
    }
    Tensor t = bytes >= kMinAdoptedBytes && owner_ ? adopt(shape, dtype, bytes) : copy(shape, dtype, data, bytes);
    offset_ += bytes;
    return t;
  }

 private:
  static Tensor copy(const Shape& shape, DType dtype, const std::byte* data, uint64_t bytes) {
    Tensor t = Tensor::empty(shape, dtype, Device());
    if (bytes > 0) std::memcpy(t.raw_data(), data, bytes);
    return t;
  }

  // A tensor over the `bytes` at the cursor, in the message's own buffer. Its elements must sit at a
  // multiple of the element size (kernels read them as typed arrays); where the layout puts them
  // off by a few bytes, they move back that far, over bytes already read (this tensor's dtype,
  // rank and dimensions at least): one pass in place, no new buffer. The buffer is the vector's
  // allocation (aligned for any element type), so only the offset decides.
  Tensor adopt(const Shape& shape, DType dtype, uint64_t bytes) {
    std::byte* base = owner_->data();
    const size_t misaligned = offset_ % dtype_size(dtype);
    std::byte* elements = base + offset_ - misaligned;
    if (misaligned != 0) std::memmove(elements, base + offset_, bytes);
    Ref<Storage> storage = make_ref<Storage>(static_cast<void*>(elements), static_cast<size_t>(bytes), Device(),
                                             std::shared_ptr<void>(owner_, elements));
    return Tensor::view(std::move(storage), shape, contiguous_strides(shape), 0, dtype);
  }

  std::span<const std::byte> bytes_;
  std::shared_ptr<Bytes> owner_;  // set when decoding a message handed over (decode(Bytes&&))
  size_t offset_ = 0;
};

Message read_body(Reader& r, uint8_t kind) {
  switch (kind) {
    case 1: {
      PullRequest m;
      m.request_id = r.take<uint64_t>("pull_request.request_id");
      m.worker = r.take<int32_t>("pull_request.worker");
      m.clock = r.take<int64_t>("pull_request.clock");
      m.var_id = r.take<int32_t>("pull_request.var_id");
      m.min_version = r.take<int64_t>("pull_request.min_version");
      return m;
    }
    case 2: {
      SparsePullRequest m;
      m.request_id = r.take<uint64_t>("sparse_pull_request.request_id");
      m.worker = r.take<int32_t>("sparse_pull_request.worker");
      m.clock = r.take<int64_t>("sparse_pull_request.clock");
      m.var_id = r.take<int32_t>("sparse_pull_request.var_id");
      m.min_version = r.take<int64_t>("sparse_pull_request.min_version");
      m.rows = r.tensor("sparse_pull_request.rows");
      return m;
    }
    case 3: {
      PullReply m;
      m.request_id = r.take<uint64_t>("pull_reply.request_id");
      m.version = r.take<int64_t>("pull_reply.version");
      m.value = r.tensor("pull_reply.value");
      return m;
    }
    case 4: {
      Push m;
      m.worker = r.take<int32_t>("push.worker");
      m.clock = r.take<int64_t>("push.clock");
      m.read_version = r.take<int64_t>("push.read_version");
      const size_t n = r.count("push.entries", kMinPushEntryBytes);
      m.entries.reserve(n);  // checked above: n entries of at least 8 bytes fit in what is left
      for (size_t i = 0; i < n; ++i) {
        PushEntry e;
        e.var_id = r.take<int32_t>("push.entries[].var_id");
        e.rows = r.tensor("push.entries[].rows");
        e.grad = r.tensor("push.entries[].grad");
        m.entries.push_back(std::move(e));
      }
      return m;
    }
    case 5: {
      Goodbye m;
      m.worker = r.take<int32_t>("goodbye.worker");
      m.clock = r.take<int64_t>("goodbye.clock");
      return m;
    }
    case 6: {
      ErrorReply m;
      m.request_id = r.take<uint64_t>("error_reply.request_id");
      const size_t code_at = r.offset();
      const auto code = r.take<uint8_t>("error_reply.code");
      if (code < static_cast<uint8_t>(ErrorCode::invalid_argument) || code > static_cast<uint8_t>(ErrorCode::internal)) {
        r.fail_at(code_at, "error_reply.code: unknown error code", int{code});
      }
      m.code = static_cast<ErrorCode>(code);
      m.message = r.string("error_reply.message");
      return m;
    }
  }
  r.fail_at(5, "unknown message kind", int{kind});
}

}  // namespace

const char* message_name(const Message& message) {
  constexpr const char* names[kKinds] = {"pull_request", "sparse_pull_request", "pull_reply",
                                         "push",         "goodbye",             "error_reply"};
  return names[message.index()];
}

Bytes encode(const Message& message) {
  Counter counter(message_name(message));
  put_message(counter, message);
  Bytes out;
  out.reserve(counter.size() + kFrameSpare);
  Appender appender(out);
  put_message(appender, message);
  return out;
}

namespace {

Message decode_with(Reader& r, std::span<const std::byte> bytes) {
  r.need(kHeaderBytes, "the header (magic, version, kind)");
  if (std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) {
    uint32_t magic;
    std::memcpy(&magic, bytes.data(), sizeof magic);
    r.fail_at(0, "bad magic (want \"FLPS\")", fmt::format("{:#010x}", magic));
  }
  r.take<uint32_t>("magic");
  const uint8_t version = r.take<uint8_t>("version");
  if (version != kVersion) r.fail_at(4, fmt::format("unsupported format version (want {})", kVersion), int{version});
  const uint8_t kind = r.take<uint8_t>("kind");
  if (kind < 1 || kind > kKinds) r.fail_at(5, fmt::format("unknown message kind (want 1..{})", kKinds), int{kind});
  Message message = read_body(r, kind);
  if (r.left() != 0) r.fail_at(r.offset(), fmt::format("{} trailing bytes after the {}", r.left(), message_name(message)), r.left());
  return message;
}

}  // namespace

Message decode(std::span<const std::byte> bytes) {
  Reader r(bytes);
  return decode_with(r, bytes);
}

Message decode(Bytes&& bytes) {
  auto owner = std::make_shared<Bytes>(std::move(bytes));
  const std::span<const std::byte> view(*owner);
  Reader r(std::move(owner));
  return decode_with(r, view);
}

}  // namespace flowlet::detail::ps
