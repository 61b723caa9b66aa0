// A process's end-of-run report as bytes: fixed-size fields in this machine's byte order (every
// process of the job runs the same build), counts before vectors and strings, every read checked
// against the bytes that are there.
#include "ps/strategy/process_report.hpp"

#include <cstring>
#include <type_traits>

#include "core/check.hpp"

namespace flowlet::detail::ps {

namespace {

constexpr uint32_t kMagic = 0x52505350;  // "PSPR"

class Writer {
 public:
  template <class T>
  requires std::is_trivially_copyable_v<T>
  void put(T value) {
    const auto* p = reinterpret_cast<const std::byte*>(&value);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  void put(const std::string& s) {
    put(static_cast<uint64_t>(s.size()));
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    bytes_.insert(bytes_.end(), p, p + s.size());
  }
  template <class T>
  void put(const std::vector<T>& values) {
    put(static_cast<uint64_t>(values.size()));
    for (const T& v : values) put(v);
  }
  Bytes take() { return std::move(bytes_); }

 private:
  Bytes bytes_;
};

class Reader {
 public:
  explicit Reader(std::span<const std::byte> bytes) : bytes_(bytes) {}

  template <class T>
  requires std::is_trivially_copyable_v<T> T get(const char* field) {
    need(sizeof(T), field);
    T value;
    std::memcpy(&value, bytes_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return value;
  }
  std::string get_string(const char* field) {
    const uint64_t n = get<uint64_t>(field);
    need(n, field);
    std::string s(reinterpret_cast<const char*>(bytes_.data() + at_), n);
    at_ += n;
    return s;
  }
  template <class T>
  std::vector<T> get_vector(const char* field) {
    const uint64_t n = get<uint64_t>(field);
    if (n > (bytes_.size() - at_) / sizeof(T)) fail_at(field, n * sizeof(T));
    std::vector<T> values;
    values.reserve(n);
    for (uint64_t i = 0; i < n; ++i) values.push_back(get<T>(field));
    return values;
  }
  void expect_end() const {
    if (at_ != bytes_.size()) {
      fail<DataLoss>("ParameterServerStrategy: a process's end-of-run report has {} bytes after its last field (of {})",
                     bytes_.size() - at_, bytes_.size());
    }
  }

 private:
  void need(uint64_t n, const char* field) const {
    if (n > bytes_.size() - at_) fail_at(field, n);
  }
  [[noreturn]] void fail_at(const char* field, uint64_t n) const {
    fail<DataLoss>(
        "ParameterServerStrategy: a process's end-of-run report is truncated: field '{}' needs {} bytes at "
        "offset {}, {} are left",
        field, n, at_, bytes_.size() - at_);
  }

  std::span<const std::byte> bytes_;
  size_t at_ = 0;
};

}  // namespace

ErrorKind error_kind(const std::exception_ptr& error) {
  if (!error) return ErrorKind::none;
  try {
    std::rethrow_exception(error);
  } catch (const ShapeError&) {
    return ErrorKind::shape;
  } catch (const DTypeError&) {
    return ErrorKind::dtype;
  } catch (const DeviceError&) {
    return ErrorKind::device;
  } catch (const InvalidArgument&) {
    return ErrorKind::invalid_argument;
  } catch (const OutOfRange&) {
    return ErrorKind::out_of_range;
  } catch (const ResourceExhausted&) {
    return ErrorKind::resource_exhausted;
  } catch (const DeadlineExceeded&) {
    return ErrorKind::deadline_exceeded;
  } catch (const Cancelled&) {
    return ErrorKind::cancelled;
  } catch (const DataLoss&) {
    return ErrorKind::data_loss;
  } catch (const Error&) {
    return ErrorKind::error;
  } catch (...) {
    return ErrorKind::other;
  }
}

void throw_error(ErrorKind kind, const std::string& message) {
  switch (kind) {
    case ErrorKind::shape:
      throw ShapeError(message);
    case ErrorKind::dtype:
      throw DTypeError(message);
    case ErrorKind::device:
      throw DeviceError(message);
    case ErrorKind::invalid_argument:
      throw InvalidArgument(message);
    case ErrorKind::out_of_range:
      throw OutOfRange(message);
    case ErrorKind::resource_exhausted:
      throw ResourceExhausted(message);
    case ErrorKind::cancelled:
      throw Cancelled(message);
    case ErrorKind::deadline_exceeded:
      throw DeadlineExceeded(message);
    case ErrorKind::data_loss:
      throw DataLoss(message);
    default:
      throw Error(message);
  }
}

Bytes encode_report(const ProcessReport& r) {
  Writer w;
  w.put(kMagic);
  w.put(r.wall_seconds);
  w.put(static_cast<uint8_t>(r.server.has_value()));
  if (r.server) {
    const ServerStats& s = *r.server;
    w.put(static_cast<int32_t>(s.server));
    for (int64_t v : {s.version, s.updates_applied, s.updates_dropped, s.steps, s.max_staleness, s.bytes_received,
                      s.bytes_sent, s.messages_received, s.messages_sent}) {
      w.put(v);
    }
    w.put(s.staleness_histogram);
  }
  w.put(static_cast<uint8_t>(r.worker.has_value()));
  if (r.worker) {
    const WorkerStats& k = *r.worker;
    w.put(static_cast<int32_t>(k.worker));
    w.put(static_cast<uint8_t>(k.stopped));
    for (int64_t v : {k.steps, k.bytes_received, k.bytes_sent, k.messages_received, k.messages_sent}) w.put(v);
    w.put(k.step_seconds);
    w.put(k.error);
  }
  w.put(static_cast<uint8_t>(r.worker_error));
  w.put(static_cast<uint8_t>(r.server_error));
  w.put(r.server_message);
  return w.take();
}

ProcessReport decode_report(std::span<const std::byte> bytes) {
  Reader in(bytes);
  if (const uint32_t magic = in.get<uint32_t>("magic"); magic != kMagic) {
    fail<DataLoss>("ParameterServerStrategy: a process's end-of-run report starts with {:#x}, not {:#x}", magic,
                   kMagic);
  }
  ProcessReport r;
  r.wall_seconds = in.get<double>("wall_seconds");
  if (in.get<uint8_t>("has_server") != 0) {
    ServerStats s;
    s.server = in.get<int32_t>("server");
    for (int64_t* v : {&s.version, &s.updates_applied, &s.updates_dropped, &s.steps, &s.max_staleness,
                       &s.bytes_received, &s.bytes_sent, &s.messages_received, &s.messages_sent}) {
      *v = in.get<int64_t>("server counters");
    }
    s.staleness_histogram = in.get_vector<int64_t>("staleness_histogram");
    r.server = std::move(s);
  }
  if (in.get<uint8_t>("has_worker") != 0) {
    WorkerStats k;
    k.worker = in.get<int32_t>("worker");
    k.stopped = in.get<uint8_t>("stopped") != 0;
    for (int64_t* v : {&k.steps, &k.bytes_received, &k.bytes_sent, &k.messages_received, &k.messages_sent}) {
      *v = in.get<int64_t>("worker counters");
    }
    k.step_seconds = in.get_vector<double>("step_seconds");
    k.error = in.get_string("error");
    r.worker = std::move(k);
  }
  const auto kind = [&](const char* field) {
    const uint8_t k = in.get<uint8_t>(field);
    if (k > static_cast<uint8_t>(ErrorKind::other)) {
      fail<DataLoss>("ParameterServerStrategy: a process's end-of-run report has error kind {} in '{}'", k, field);
    }
    return static_cast<ErrorKind>(k);
  };
  r.worker_error = kind("worker_error");
  r.server_error = kind("server_error");
  r.server_message = in.get_string("server_message");
  in.expect_end();
  return r;
}

}  // namespace flowlet::detail::ps
