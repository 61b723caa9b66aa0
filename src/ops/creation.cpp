// Creation ops: full (zeros, ones), arange, randn, uniform, and copies of host values. They take
// no tensor inputs, so their rule sets the device from the attributes.
#include "flowlet/ops/creation.hpp"

#include <cmath>
#include <cstring>

#include "flowlet/dispatch.hpp"
#include "kernels/dtypes.hpp"
#include "kernels/philox.hpp"
#include "runtime/thread_pool.hpp"
#include "ops/attributes.hpp"
#include "ops/registry.hpp"

namespace flowlet {
namespace detail {
namespace {

// Fills out[i] = value_of(i) for every element, in parallel for large tensors.
template <DTypeSet Allowed, class ValueOf>
void fill_elements(Tensor& out, ValueOf value_of) {
  visit_dtype<Allowed>(out.dtype(), [&]<class T>(TypeTag<T>) {
    T* data = static_cast<T*>(out.raw_data());
    parallel_for(out.numel(), kParallelGrain / 4, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) data[i] = convert<T>(value_of(i));
    });
  });
}

void check_fits(std::string_view op, double value, DType dt) {
  bool fits = true;
  if (dt == b8) fits = value == 0.0 || value == 1.0;
  if (is_integral(dt)) {
    const double lo = dt == u8 ? 0.0 : dt == i32 ? -2147483648.0 : -9223372036854775808.0;
    const double hi = dt == u8 ? 255.0 : dt == i32 ? 2147483647.0 : 9223372036854775807.0;
    fits = value == std::trunc(value) && value >= lo && value < hi + 1.0;
  }
  if (!fits) fail<InvalidArgument>("{}: value is not representable in {}; got {}", op, dt, value);
}

void full_infer(const OpCall& call, OutputSpec& spec) {
  const auto& a = call.attrs<FullAttrs>();
  check_shape("full", a.shape);
  check_fits("full", a.value, a.dtype);
  spec.outputs[0] = {a.shape, a.dtype};
  spec.device = a.device;
}

void full_kernel(const OpCall& call, std::span<Tensor> out) {
  const double value = call.attrs<FullAttrs>().value;
  fill_elements<kAll>(out[0], [value](int64_t) { return value; });
}

void arange_infer(const OpCall& call, OutputSpec& spec) {
  const auto& a = call.attrs<ArangeAttrs>();
  if (a.n < 0) fail<InvalidArgument>("arange: n must be >= 0; got {}", a.n);
  check_dtype("arange", a.dtype, kNumbers);
  if (a.n > 0) check_fits("arange", static_cast<double>(a.n - 1), a.dtype);
  spec.outputs[0] = {Shape{a.n}, a.dtype};
  spec.device = a.device;
}

void arange_kernel(const OpCall&, std::span<Tensor> out) {
  if (out[0].dtype() == i64) {  // exact beyond 2^53
    fill_elements<bit(i64)>(out[0], [](int64_t i) { return i; });
  } else {
    fill_elements<kNumbers>(out[0], [](int64_t i) { return static_cast<double>(i); });
  }
}

template <const char* Name>
void random_infer(const OpCall& call, OutputSpec& spec) {
  const auto& a = call.attrs<RandomAttrs>();
  check_shape(Name, a.shape);
  check_dtype(Name, a.dtype, kFloating);
  if (!(a.lo < a.hi) || !std::isfinite(a.lo) || !std::isfinite(a.hi)) {
    fail<InvalidArgument>("{}: need finite lo < hi; got lo {} and hi {}", Name, a.lo, a.hi);
  }
  spec.outputs[0] = {a.shape, a.dtype};
  spec.device = a.device;
}

void randn_kernel(const OpCall& call, std::span<Tensor> out) {
  const uint64_t seed = call.attrs<RandomAttrs>().seed;
  fill_elements<kFloating>(out[0], [seed](int64_t i) { return normal_element(seed, static_cast<uint64_t>(i)); });
}

void uniform_kernel(const OpCall& call, std::span<Tensor> out) {
  const auto& a = call.attrs<RandomAttrs>();
  const DType dt = out[0].dtype();
  fill_elements<kFloating>(out[0], [&](int64_t i) {
    const double v = a.lo + (a.hi - a.lo) * uniform_element(a.seed, static_cast<uint64_t>(i));
    // Rounding to the output dtype may reach hi; step back inside [lo, hi).
    const double stored = dt == f64 ? v : visit_dtype<kHalves | bit(f32)>(dt, [&]<class T>(TypeTag<T>) {
      return static_cast<double>(static_cast<float>(convert<T>(v)));
    });
    return stored >= a.hi ? a.lo : v;
  });
}

constexpr char kRandn[] = "randn";
constexpr char kUniform[] = "uniform";

// Creation ops keep their attributes too: a traced graph records them like any other op.
Op full_op{"full", 0, 0, kNoFlags, &full_infer, {&full_kernel, nullptr}, nullptr, &copy_attributes<FullAttrs>,
           &describe_attributes<FullAttrs>};
Op arange_op{"arange", 0, 0, kNoFlags, &arange_infer, {&arange_kernel, nullptr}, nullptr,
             &copy_attributes<ArangeAttrs>, &describe_attributes<ArangeAttrs>};
Op randn_op{"randn", 0, 0, kNoFlags, &random_infer<kRandn>, {&randn_kernel, nullptr}, nullptr,
            &copy_attributes<RandomAttrs>, &describe_attributes<RandomAttrs>};
Op uniform_op{"uniform", 0, 0, kNoFlags, &random_infer<kUniform>, {&uniform_kernel, nullptr}, nullptr,
              &copy_attributes<RandomAttrs>, &describe_attributes<RandomAttrs>};

}  // namespace

void add_creation_ops(std::vector<Op*>& ops) { ops.insert(ops.end(), {&full_op, &arange_op, &randn_op, &uniform_op}); }

Tensor tensor_from_host(const void* values, size_t count, DType dtype, const Shape& shape, Device device) {
  check_size("tensor", shape, dtype);
  if (count != static_cast<uint64_t>(shape.numel())) {
    fail<ShapeError>("tensor: values do not fill the shape; got {} values for shape {} ({} elements)", count, shape,
                     shape.numel());
  }
  // CPU devices share one memory, so the values are copied straight into the destination.
  const Device host = device.kind() == DeviceKind::cpu ? device : Device();
  if (host != Device()) check_device_exists("tensor", host);
  Tensor out = Tensor::empty(shape, dtype, host);
  if (count > 0) std::memcpy(out.raw_data(), values, count * dtype_size(dtype));
  return device == host ? out : out.to(device);
}

}  // namespace detail

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  return dispatch(detail::full_op, {}, detail::FullAttrs{shape, value, dtype, device});
}
Tensor zeros(const Shape& shape, DType dtype, Device device) { return full(shape, 0.0, dtype, device); }
Tensor ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1.0, dtype, device); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.dtype(), t.device()); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), t.dtype(), t.device()); }

Tensor arange(int64_t n, DType dtype, Device device) {
  return dispatch(detail::arange_op, {}, detail::ArangeAttrs{n, dtype, device});
}

Tensor randn(const Shape& shape, uint64_t seed, DType dtype, Device device) {
  return dispatch(detail::randn_op, {}, detail::RandomAttrs{shape, 0.0, 1.0, seed, dtype, device});
}

Tensor uniform(const Shape& shape, double lo, double hi, uint64_t seed, DType dtype, Device device) {
  return dispatch(detail::uniform_op, {}, detail::RandomAttrs{shape, lo, hi, seed, dtype, device});
}

}  // namespace flowlet
