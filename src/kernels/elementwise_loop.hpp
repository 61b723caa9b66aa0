// The elementwise engine: broadcast every operand to the output shape (stride 0 where it repeats),
// merge dimensions that are contiguous for all operands, and run an inner loop over rows, with
// fast paths for contiguous and scalar operands and threads for large outputs.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <tuple>
#include <utility>

#include "runtime/thread_pool.hpp"
#include "flowlet/core/tensor.hpp"
#include "kernels/dtypes.hpp"

namespace flowlet::detail {

// The broadcast shape of a and b (NumPy rules) or ShapeError naming the op.
Shape broadcast_shapes(std::string_view op, const Shape& a, const Shape& b);

// Element strides of `t` viewed at `shape` (which it broadcasts to): 0 on repeated dimensions.
Strides broadcast_strides(const Tensor& t, const Shape& shape);

// The operands of an elementwise loop, output first, broadcast to the output's shape: size-1
// dimensions dropped, and neighbouring dimensions merged where every operand steps through both as
// one run (so contiguous operands and scalars become one dimension). The CPU loop below and the
// CUDA elementwise kernels walk this layout.
template <size_t N>
struct MergedLayout {
  Shape::Dims shape;               // innermost last; never empty (a single element is [1])
  std::array<Strides, N> strides;  // in elements
};
template <size_t N>
MergedLayout<N> merge_dimensions(const Tensor& out, const std::array<const Tensor*, N - 1>& inputs);

// A row of an elementwise loop: pointers to the first element of each operand (output first),
// their element strides along the row, and the row length.
template <size_t N>
using RowFn = FunctionRef<void(const std::array<char*, N>&, const std::array<int64_t, N>&, int64_t)>;

// Calls `row` over every element of `out` with the inputs broadcast to its shape, in parallel for
// large outputs. Type-independent (compiled once per operand count in elementwise_loop.cpp), so
// each op instantiates only its row body. When every operand is contiguous and full-size or a
// single element (most calls) it skips the general strided walk.
template <size_t N>
void for_each_row(const Tensor& out, const std::array<const Tensor*, N - 1>& inputs, RowFn<N> row);

// out[i] = f(in[i]...) for element types Out and In..., computing in compute_t.
template <class Out, class... In, class F>
void map_elements(const Tensor& out, const std::array<const Tensor*, sizeof...(In)>& inputs, F f) {
  constexpr size_t N = sizeof...(In) + 1;
  auto row = [&](const std::array<char*, N>& p, const std::array<int64_t, N>& s, int64_t count) {
    auto* o = reinterpret_cast<Out*>(p[0]);
    bool all_unit = true;
    for (size_t k = 0; k < N; ++k) all_unit &= s[k] == 1;
    if (all_unit) {
      // Contiguous: constant unit strides let the compiler vectorize.
      [&]<size_t... K>(std::index_sequence<K...>) {
        const std::tuple<const In*...> in{reinterpret_cast<const In*>(p[K + 1])...};
        for (int64_t i = 0; i < count; ++i) {
          o[i] = convert<Out>(f(convert<compute_t<In>>(std::get<K>(in)[i])...));
        }
      }(std::index_sequence_for<In...>{});
      return;
    }
    if constexpr (N == 3) {  // a binary op with one side repeated (tensor op scalar)
      using A = std::tuple_element_t<0, std::tuple<In...>>;
      using B = std::tuple_element_t<1, std::tuple<In...>>;
      if (s[0] == 1 && s[1] == 1 && s[2] == 0) {
        const auto* a = reinterpret_cast<const A*>(p[1]);
        const compute_t<B> b = convert<compute_t<B>>(*reinterpret_cast<const B*>(p[2]));
        for (int64_t i = 0; i < count; ++i) o[i] = convert<Out>(f(convert<compute_t<A>>(a[i]), b));
        return;
      }
      if (s[0] == 1 && s[1] == 0 && s[2] == 1) {
        const compute_t<A> a = convert<compute_t<A>>(*reinterpret_cast<const A*>(p[1]));
        const auto* b = reinterpret_cast<const B*>(p[2]);
        for (int64_t i = 0; i < count; ++i) o[i] = convert<Out>(f(a, convert<compute_t<B>>(b[i])));
        return;
      }
    }
    [&]<size_t... K>(std::index_sequence<K...>) {
      for (int64_t i = 0; i < count; ++i) {
        o[i * s[0]] = convert<Out>(f(convert<compute_t<In>>(reinterpret_cast<const In*>(p[K + 1])[i * s[K + 1]])...));
      }
    }(std::index_sequence_for<In...>{});
  };
  for_each_row<N>(out, inputs, RowFn<N>(row));
}

}  // namespace flowlet::detail
