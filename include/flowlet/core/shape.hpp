// Shape: the dimensions of a tensor, inline for rank up to 6, plus the strides type and shape helpers.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "flowlet/core/small_vector.hpp"

namespace flowlet {

// Shape{2, 3}. Dimensions are int64_t; a -1 is allowed only where an op says so (reshape).
class Shape {
 public:
  using Dims = SmallVector<int64_t, 6>;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  explicit Shape(const std::vector<int64_t>& dims) : dims_(dims.begin(), dims.end()) {}
  explicit Shape(Dims dims) : dims_(std::move(dims)) {}
  template <class It>
  Shape(It first, It last) : dims_(first, last) {}

  size_t size() const { return dims_.size(); }
  int64_t rank() const { return static_cast<int64_t>(dims_.size()); }
  int64_t operator[](size_t i) const { return dims_[i]; }
  int64_t& operator[](size_t i) { return dims_[i]; }
  const int64_t* begin() const { return dims_.begin(); }
  const int64_t* end() const { return dims_.end(); }
  const int64_t* data() const { return dims_.data(); }
  void push_back(int64_t d) { dims_.push_back(d); }
  std::vector<int64_t> to_vector() const { return {begin(), end()}; }
  const Dims& dims() const { return dims_; }

  // Product of the dimensions (1 for rank 0). Meaningful only when every dimension is >= 0.
  // ShapeError when the product of the non-zero dimensions overflows int64 (every shape an op
  // accepted fits: see detail::check_size), so a zero dimension never hides an overflow.
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : dims_) {
      if (__builtin_mul_overflow(n, d, &n)) [[unlikely]] return numel_slow();
    }
    return n;
  }
  std::string str() const;  // "[2, 3]"

  friend bool operator==(const Shape& a, const Shape& b) { return a.dims_ == b.dims_; }

 private:
  int64_t numel_slow() const;  // 0 when a dimension is 0, else throws ShapeError

  Dims dims_;
};

// Element strides of a tensor view, one per dimension.
using Strides = SmallVector<int64_t, 6>;

namespace detail {
[[noreturn]] void throw_strides_overflow(const Shape& shape);
}  // namespace detail

// Row-major strides for a shape. ShapeError when a stride overflows int64 (never for a shape that
// passed detail::check_size).
inline Strides contiguous_strides(const Shape& shape) {
  Strides strides(shape.size(), 1);
  int64_t step = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = step;
    if (__builtin_mul_overflow(step, shape[i] > 0 ? shape[i] : 1, &step)) [[unlikely]] {
      detail::throw_strides_overflow(shape);
    }
  }
  return strides;
}

}  // namespace flowlet
