// libFuzzer target for op arguments: decodes an op, input shapes (huge, zero and negative
// dimensions included), dtypes, values and attributes from bytes, and runs the op eagerly and, for
// some inputs, traced. Success and flowlet::Error are the only accepted outcomes: a crash, a
// sanitizer report, any other exception, or a traced result whose shape or dtype differs from the
// eager one is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iterator>
#include <limits>
#include <vector>

#include "flowlet/flowlet.hpp"

namespace fl = flowlet;

namespace {

// Reads the fuzzer's bytes in order; past the end every read is 0.
class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t byte() { return position_ < size_ ? data_[position_++] : 0; }
  int64_t small(int64_t bound) { return static_cast<int64_t>(byte()) % bound; }
  // Mostly small dimensions; sometimes one at or beyond a limit of int, int64 or the size rule.
  int64_t dimension() {
    static constexpr int64_t kEdges[] = {int64_t{1} << 31,
                                         (int64_t{1} << 31) - 1,
                                         int64_t{1} << 32,
                                         int64_t{1} << 40,
                                         int64_t{1} << 60,
                                         (int64_t{1} << 61) - 1,
                                         int64_t{1} << 61,
                                         int64_t{1} << 62,
                                         std::numeric_limits<int64_t>::max(),
                                         -1,
                                         -2,
                                         std::numeric_limits<int64_t>::min()};
    const uint8_t b = byte();
    if (b < 224) return b % 6;
    return kEdges[(b - 224) % std::size(kEdges)];
  }
  fl::Shape shape() {
    fl::Shape s;
    const int64_t rank = small(5);
    for (int64_t d = 0; d < rank; ++d) s.push_back(dimension());
    return s;
  }
  fl::DType dtype() {
    static constexpr fl::DType kDTypes[] = {fl::f32, fl::f64, fl::i32, fl::i64, fl::u8, fl::b8, fl::f16, fl::bf16};
    return kDTypes[small(std::size(kDTypes))];
  }
  int64_t axis() { return small(9) - 4; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t position_ = 0;
};

// Inputs are kept small: the target looks for wrong answers to sizes, not for slow kernels.
constexpr int64_t kMaxInputElements = 256;
// Outputs beyond this are checked for their shape rule only (traced, without running).
constexpr int64_t kMaxOutputBytes = int64_t{16} << 20;

// An input tensor with values from the bytes (in range for its dtype, so the conversion is defined).
fl::Tensor make_input(ByteReader& in) {
  const fl::Shape shape = in.shape();
  const fl::DType dtype = in.dtype();
  int64_t count = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(count, d, &count)) return fl::zeros(shape, dtype);  // the size rule's error is the outcome
  }
  // Valid but large: a small stand-in (real allocations of gigabytes would only slow the search).
  if (count > kMaxInputElements) return fl::zeros({count % 7}, dtype);
  std::vector<double> values(static_cast<size_t>(count));
  for (double& v : values) {
    const auto b = static_cast<int8_t>(in.byte());
    v = dtype == fl::b8 ? (b & 1) : dtype == fl::u8 ? (b & 0x7f) : b / 4.0;
    if (fl::is_integral(dtype)) v = static_cast<int>(v);
  }
  return fl::tensor(values, shape).astype(dtype);
}

constexpr int kOpCount = 42;

// Op `which` on `xs` with attributes read from `in`.
fl::Tensor apply(int which, const std::vector<fl::Tensor>& xs, ByteReader& in) {
  const fl::Tensor& a = xs[0];
  const fl::Tensor& b = xs[1];
  const fl::Tensor& c = xs[2];
  switch (which) {
    case 0: return fl::zeros(in.shape(), in.dtype());
    case 1: return fl::full(in.shape(), static_cast<double>(static_cast<int8_t>(in.byte())), in.dtype());
    case 2: return fl::arange(in.dimension(), in.dtype());
    case 3: return fl::randn(in.shape(), in.byte(), in.dtype());
    case 4: return fl::uniform(in.shape(), -1.0, static_cast<double>(in.small(4)), in.byte(), in.dtype());
    case 5: return fl::one_hot(a, in.dimension());
    case 6: return fl::scatter_add(a, b, in.dimension());
    case 7: return fl::gather(a, b);
    case 8: return fl::matmul(a, b);
    case 9: return fl::reshape(a, in.shape());
    case 10: return fl::transpose(a);
    case 11: {
      std::vector<int64_t> perm;
      for (int64_t i = 0, n = in.small(5); i < n; ++i) perm.push_back(in.axis());
      return fl::permute(a, perm);
    }
    case 12: return fl::concat({a, b}, in.axis());
    case 13: return fl::concat({a, b, c}, in.axis());
    case 14: return fl::slice(a, in.axis(), in.dimension(), in.dimension());
    case 15: return fl::sum(a, {in.axis()}, in.byte() & 1);
    case 16: return fl::mean(a, {in.axis()}, in.byte() & 1);
    case 17: return fl::max(a, {in.axis(), in.axis()}, in.byte() & 1);
    case 18: return fl::argmax(a, in.axis());
    case 19: return fl::softmax(a, in.axis());
    case 20: return fl::log_softmax(a, in.axis());
    case 21: return fl::softmax_cross_entropy(a, b);
    case 22: return fl::add(a, b);
    case 23: return fl::sub(a, b);
    case 24: return fl::mul(a, b);
    case 25: return fl::div(a, b);
    case 26: return fl::pow(a, b);
    case 27: return fl::maximum(a, b);
    case 28: return fl::minimum(a, b);
    case 29: return fl::where(a, b, c);
    case 30: return fl::cast(a, in.dtype());
    case 31: return fl::less(a, b);
    case 32: return fl::equal(a, b);
    case 33: return fl::exp(a);
    case 34: return fl::log(a);
    case 35: return fl::sqrt(a);
    case 36: return fl::tanh(a);
    case 37: return fl::sigmoid(a);
    case 38: return fl::relu(a);
    case 39: return fl::abs(a);
    case 40: return fl::square(a);
    default: return fl::neg(a);
  }
}

// Thrown from inside a trace to stop it once the output's shape is known.
struct ShapeKnown {};

// The bytes of a tensor of this shape if every zero dimension were 1 (the size rule bounds this
// product), or -1 when it overflows int64, which no op's output may do.
int64_t size_rule_bytes(const fl::Shape& shape, fl::DType dtype) {
  auto bytes = static_cast<int64_t>(fl::dtype_size(dtype));
  for (int64_t d : shape) {
    if (d < 0 || (d > 0 && __builtin_mul_overflow(bytes, d, &bytes))) return -1;
  }
  return bytes;
}

[[noreturn]] void finding(const char* what, const char* detail) {
  std::fprintf(stderr, "fuzz_op_args: %s: %s\n", what, detail);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ByteReader in(data, size);
  const int which = static_cast<int>(in.small(kOpCount));
  const bool traced = (in.byte() & 3) == 0;
  try {
    const std::vector<fl::Tensor> xs{make_input(in), make_input(in), make_input(in)};
    // The attributes come from the bytes after the inputs, the same for every run below.
    const ByteReader probe = in;
    // 1. The shape rule alone: trace the op and stop before anything runs or is allocated.
    int64_t output_bytes = -1;
    fl::Shape output_shape;
    fl::DType output_dtype = fl::f32;
    try {
      auto shape_only = fl::trace([&](std::vector<fl::Tensor> symbolic) -> fl::Tensor {
        ByteReader attributes = probe;
        const fl::Tensor y = apply(which, symbolic, attributes);
        output_shape = y.shape();
        output_dtype = y.dtype();
        output_bytes = size_rule_bytes(output_shape, output_dtype);
        throw ShapeKnown{};
      });
      (void)shape_only.graph(xs);
    } catch (const ShapeKnown&) {
    }
    if (output_bytes < 0) {
      finding("an op accepted an output that breaks the size rule",
              fmt::format("{} of {}", output_shape, output_dtype).c_str());
    }
    // Valid, but too slow to run here. Empty outputs always run: their kernels must not walk the
    // huge non-zero dimensions.
    if (output_shape.numel() != 0 && output_bytes > kMaxOutputBytes) return 0;
    // 2. Eagerly.
    ByteReader eager_attributes = probe;
    const fl::Tensor eager = apply(which, xs, eager_attributes);
    if (!(eager.shape() == output_shape) || eager.dtype() != output_dtype) {
      finding("eager result differs from the traced shape rule", fmt::format("{} {} vs {} {}", eager.shape(),
                                                                             eager.dtype(), output_shape, output_dtype)
                                                                     .c_str());
    }
    // 3. Traced and run.
    if (traced) {
      auto run = fl::trace([&](std::vector<fl::Tensor> symbolic) {
        ByteReader attributes = probe;
        return apply(which, symbolic, attributes);
      });
      const fl::Tensor result = run(xs);
      if (!(result.shape() == eager.shape()) || result.dtype() != eager.dtype()) {
        finding("traced result differs from eager",
                fmt::format("{} {} vs {} {}", result.shape(), result.dtype(), eager.shape(), eager.dtype()).c_str());
      }
    }
  } catch (const fl::Error&) {
    // The documented outcome of bad arguments.
  } catch (const std::exception& e) {
    finding("an exception that is not a flowlet::Error", e.what());
  }
  return 0;
}
