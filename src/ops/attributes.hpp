// Attribute structs that more than one file reads: ops whose kernels live in more than one backend
// (src/ops for the CPU, src/cuda for CUDA), and ops a pass inspects.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "flowlet/core/device.hpp"
#include "flowlet/core/dtype.hpp"
#include "flowlet/core/format.hpp"
#include "flowlet/core/shape.hpp"

namespace flowlet::detail {

// shape: permute (also read by the algebraic pass, which cancels inverse permutations)
struct PermuteAttrs {
  std::vector<int64_t> perm;
  std::string describe() const { return fmt::format("perm=[{}]", fmt::join(perm, ", ")); }
};

// creation: full, arange, randn and uniform
struct FullAttrs {
  Shape shape;
  double value;
  DType dtype;
  Device device;
  std::string describe() const {
    return fmt::format("shape={}, value={}, dtype={}, device={}", shape, value, dtype, device);
  }
};

struct ArangeAttrs {
  int64_t n;
  DType dtype;
  Device device;
  std::string describe() const { return fmt::format("n={}, dtype={}, device={}", n, dtype, device); }
};

struct RandomAttrs {
  Shape shape;
  double lo;
  double hi;
  uint64_t seed;
  DType dtype;
  Device device;
  std::string describe() const {
    return fmt::format("shape={}, lo={}, hi={}, seed={}, dtype={}, device={}", shape, lo, hi, seed, dtype, device);
  }
};

// elementwise
struct CastAttrs {
  DType dtype;
  std::string describe() const { return fmt::format("dtype={}", dtype); }
};

// reductions
struct ReduceAttrs {
  std::vector<int64_t> axes;
  bool keepdims;
  bool all_axes;  // sum(t): every axis
  std::string describe() const {
    return fmt::format("axes=[{}], keepdims={}, all_axes={}", fmt::join(axes, ", "), keepdims, all_axes);
  }
};

// One axis: argmax, softmax and log_softmax, concat.
struct AxisAttrs {
  int64_t axis;
  std::string describe() const { return fmt::format("axis={}", axis); }
};
using ArgmaxAttrs = AxisAttrs;

// nn
struct OneHotAttrs {
  int64_t depth;
  std::string describe() const { return fmt::format("depth={}", depth); }
};

// shape
struct ToDeviceAttrs {
  Device device;
  std::string describe() const { return fmt::format("device={}", device); }
};

using ConcatAttrs = AxisAttrs;

}  // namespace flowlet::detail
