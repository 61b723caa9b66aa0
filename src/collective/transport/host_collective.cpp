#include "collective/transport/host_collective.hpp"

#include <fmt/format.h>

#include <cstring>

#include "collective/transport/reduction.hpp"
#include "flowlet/core/error.hpp"
#include "flowlet/core/format.hpp"
#include "runtime/thread_pool.hpp"

namespace flowlet::detail {

namespace {

size_t byte_count(int64_t elements, DType dtype) { return static_cast<size_t>(elements) * dtype_size(dtype); }

Tensor flat(const Tensor& t, const Shape& shape) {
  return Tensor::view(t.storage(), shape, contiguous_strides(shape), t.offset(), t.dtype());
}

// memcpy split over the thread pool for large buffers (a result per participant is a full copy).
void copy_bytes(void* to, const void* from, size_t bytes) {
  constexpr int64_t kGrain = int64_t{1} << 20;
  parallel_for(static_cast<int64_t>(bytes), kGrain, [&](int64_t begin, int64_t end) {
    std::memcpy(static_cast<std::byte*>(to) + begin, static_cast<const std::byte*>(from) + begin,
                static_cast<size_t>(end - begin));
  });
}

}  // namespace

void prepare_call(CollectiveCall& call, int participants, int rank, Device expected, const std::string& describe) {
  const char* name = collective_name(call.kind);
  if (call.kind == CollectiveKind::barrier) {
    call.input = Tensor();
    return;
  }
  if (!call.input.defined()) {
    throw InvalidArgument(fmt::format("{}: participant {} of {} passed an empty tensor handle", name, rank, describe));
  }
  if (call.input.is_symbolic()) {
    throw InvalidArgument(
        fmt::format("{}: participant {} passed a symbolic tensor (a value a traced graph computes "
                    "later); the communicator needs its elements",
                    name, rank));
  }
  if (!(call.input.device() == expected)) {
    throw DeviceError(fmt::format("{}: participant {} of {} runs on {}; got a tensor on {}", name, rank, describe,
                                  expected, call.input.device()));
  }
  if (reduces(call.kind) && static_cast<uint8_t>(call.op) > 3) {
    throw InvalidArgument(fmt::format("{}: unknown reduction {}", name, static_cast<int>(call.op)));
  }
  if (call.kind == CollectiveKind::broadcast && (call.root < 0 || call.root >= participants)) {
    throw InvalidArgument(
        fmt::format("broadcast: root {} is not a participant of {} (0 .. {})", call.root, describe, participants - 1));
  }
  if (call.kind == CollectiveKind::reduce_scatter &&
      (call.input.rank() == 0 || call.input.shape()[0] % participants != 0)) {
    throw ShapeError(
        fmt::format("reduce_scatter: axis 0 must divide into {} equal parts (the participants of {}); got "
                    "shape {}",
                    participants, describe, call.input.shape()));
  }
  if (!call.input.is_contiguous()) call.input = call.input.contiguous();
}

Shape result_shape(const CollectiveCall& call, int participants) {
  const Shape& in = call.input.shape();
  switch (call.kind) {
    case CollectiveKind::all_reduce:
    case CollectiveKind::broadcast:
      return in;
    case CollectiveKind::all_gather: {
      if (in.rank() == 0) return Shape{participants};
      Shape out = in;
      out[0] = in[0] * participants;
      return out;
    }
    case CollectiveKind::reduce_scatter: {
      Shape out = in;
      out[0] = in[0] / participants;
      return out;
    }
    case CollectiveKind::barrier:
      return Shape{};
  }
  return in;
}

Tensor combine_local(const std::vector<Arrival>& arrivals, int root_local) {
  const CollectiveCall& first = arrivals.front().call;
  if (first.kind == CollectiveKind::barrier) return Tensor();
  const DType dtype = first.input.dtype();
  const int64_t n = first.input.numel();
  const Device device = first.input.device();
  switch (first.kind) {
    case CollectiveKind::all_reduce:
    case CollectiveKind::reduce_scatter: {
      Tensor wire = Tensor::empty(Shape{n}, wire_dtype(dtype), device);
      std::vector<const void*> inputs;
      inputs.reserve(arrivals.size());
      for (const Arrival& a : arrivals) inputs.push_back(a.call.input.raw_data());
      accumulate(dtype, first.op, inputs, wire.raw_data(), n);
      return wire;
    }
    case CollectiveKind::all_gather: {
      Tensor wire = Tensor::empty(Shape{n * static_cast<int64_t>(arrivals.size())}, dtype, device);
      auto* out = static_cast<std::byte*>(wire.raw_data());
      for (size_t i = 0; i < arrivals.size(); ++i) {
        if (n > 0) copy_bytes(out + i * byte_count(n, dtype), arrivals[i].call.input.raw_data(), byte_count(n, dtype));
      }
      return wire;
    }
    case CollectiveKind::broadcast:
      if (root_local >= 0) return flat(arrivals[static_cast<size_t>(root_local)].call.input, Shape{n});
      return Tensor::empty(Shape{n}, dtype, device);
    case CollectiveKind::barrier:
      break;
  }
  return Tensor();
}

std::vector<Tensor> distribute(const std::vector<Arrival>& arrivals, const Tensor& global_wire, int participants,
                               const std::vector<Device>& devices) {
  const CollectiveCall& first = arrivals.front().call;
  std::vector<Tensor> results(arrivals.size());
  if (first.kind == CollectiveKind::barrier) return results;
  const DType dtype = first.input.dtype();
  const Shape shape = result_shape(first, participants);
  const int64_t n = shape.numel();
  // Participant 0's result first; the others copy it, except reduce_scatter's distinct parts.
  if (first.kind == CollectiveKind::reduce_scatter) {
    const size_t part_bytes = byte_count(n, wire_dtype(dtype));
    for (size_t i = 0; i < arrivals.size(); ++i) {
      results[i] = Tensor::empty(shape, dtype, devices[i]);
      finish(dtype, first.op, participants, static_cast<const std::byte*>(global_wire.raw_data()) + i * part_bytes,
             results[i].raw_data(), n);
    }
    return results;
  }
  if (first.kind == CollectiveKind::all_reduce && needs_finish(dtype, first.op)) {
    results[0] = Tensor::empty(shape, dtype, devices[0]);
    finish(dtype, first.op, participants, global_wire.raw_data(), results[0].raw_data(), n);
  } else if (first.kind == CollectiveKind::broadcast) {
    // The wire buffer may be the root's own input: every participant gets a fresh tensor.
    results[0] = Tensor::empty(shape, dtype, devices[0]);
    if (n > 0) copy_bytes(results[0].raw_data(), global_wire.raw_data(), byte_count(n, dtype));
  } else {
    results[0] = flat(global_wire, shape);
  }
  for (size_t i = 1; i < arrivals.size(); ++i) {
    results[i] = Tensor::empty(shape, dtype, devices[i]);
    if (n > 0) copy_bytes(results[i].raw_data(), results[0].raw_data(), byte_count(n, dtype));
  }
  return results;
}

void deliver(std::vector<Arrival>& arrivals, std::vector<Tensor> results, std::exception_ptr error) {
  for (size_t i = 0; i < arrivals.size(); ++i) {
    CollectiveDone done = std::move(arrivals[i].done);
    if (!done) continue;
    if (error != nullptr) {
      // The last participant takes the delivering thread's reference: once the waiting thread has
      // the error, no copy is released here. (libstdc++ counts an exception_ptr's references in
      // code ThreadSanitizer does not see, so a release here after the waiter read the error is
      // reported as a race on the exception.)
      done(Tensor(), i + 1 == arrivals.size() ? std::move(error) : error);
    } else {
      done(std::move(results[i]), nullptr);
    }
  }
}

}  // namespace flowlet::detail
