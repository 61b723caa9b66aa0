// The elementwise engine: broadcast every operand to the output shape (stride 0 where it repeats),
// merge dimensions that are contiguous for all operands, and run an inner loop over rows, with
// fast paths for contiguous and scalar operands and threads for large outputs.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <tuple>
#include <utility>

#include "exec/thread_pool.hpp"
#include "flowlet/core/tensor.hpp"
#include "kernels/dtypes.hpp"

namespace flowlet::detail {

// The broadcast shape of a and b (NumPy rules) or ShapeError naming the op.
Shape broadcast_shapes(std::string_view op, const Shape& a, const Shape& b);

// Element strides of `t` viewed at `shape` (which it broadcasts to): 0 on repeated dimensions.
Strides broadcast_strides(const Tensor& t, const Shape& shape);

// Operand 0 is the output, then the inputs. Dimensions are merged where possible.
template <size_t N>
struct StridedLoop {
  Shape::Dims shape;                         // after merging; innermost last
  std::array<Strides, N> strides;            // in elements
  std::array<char*, N> base;
  std::array<int64_t, N> element_size;

  StridedLoop(const Tensor& out, const std::array<const Tensor*, N - 1>& inputs) {
    std::array<Strides, N> raw;
    raw[0] = out.strides();
    base[0] = static_cast<char*>(out.raw_data());
    element_size[0] = static_cast<int64_t>(dtype_size(out.dtype()));
    for (size_t k = 1; k < N; ++k) {
      raw[k] = broadcast_strides(*inputs[k - 1], out.shape());
      base[k] = static_cast<char*>(inputs[k - 1]->raw_data());
      element_size[k] = static_cast<int64_t>(dtype_size(inputs[k - 1]->dtype()));
    }
    // Drop size-1 dimensions, then merge dimension i into i+1 when every operand steps through
    // both as one run.
    for (size_t d = 0; d < out.shape().size(); ++d) {
      const int64_t extent = out.shape()[d];
      if (extent == 1) continue;
      if (!shape.empty()) {
        bool mergeable = true;
        for (size_t k = 0; k < N; ++k) mergeable &= strides[k].back() == raw[k][d] * extent;
        if (mergeable) {
          shape.back() *= extent;
          for (size_t k = 0; k < N; ++k) strides[k].back() = raw[k][d];
          continue;
        }
      }
      shape.push_back(extent);
      for (size_t k = 0; k < N; ++k) strides[k].push_back(raw[k][d]);
    }
    if (shape.empty()) {  // a single element
      shape.push_back(1);
      for (size_t k = 0; k < N; ++k) strides[k].push_back(0);
    }
  }

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }

  // Calls row(pointers, inner_strides, count) for the rows covering linear indices [begin, end).
  template <class Row>
  void for_rows(int64_t begin, int64_t end, Row&& row) const {
    const size_t rank = shape.size();
    const int64_t inner = shape[rank - 1];
    Shape::Dims index(rank, 0);
    int64_t rest = begin;
    for (size_t d = rank; d-- > 0;) {
      index[d] = rest % shape[d];
      rest /= shape[d];
    }
    std::array<int64_t, N> inner_strides;
    for (size_t k = 0; k < N; ++k) inner_strides[k] = strides[k][rank - 1];
    int64_t position = begin;
    while (position < end) {
      std::array<char*, N> pointers;
      for (size_t k = 0; k < N; ++k) {
        int64_t offset = 0;
        for (size_t d = 0; d < rank; ++d) offset += index[d] * strides[k][d];
        pointers[k] = base[k] + offset * element_size[k];
      }
      const int64_t count = std::min(inner - index[rank - 1], end - position);
      row(pointers, inner_strides, count);
      position += count;
      index[rank - 1] += count;
      for (size_t d = rank - 1; d > 0 && index[d] == shape[d]; --d) {
        index[d] = 0;
        ++index[d - 1];
      }
    }
  }

  template <class Row>
  void run(Row&& row) const {
    parallel_for(numel(), kParallelGrain, [&](int64_t begin, int64_t end) { for_rows(begin, end, row); });
  }
};

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
  const int64_t n = out.numel();
  if (n == 0) return;
  // Fast path (most calls): every operand contiguous and either full-size or a single element.
  // Skips building the strided loop, which dominates the cost of small ops.
  std::array<char*, N> base{static_cast<char*>(out.raw_data())};
  std::array<int64_t, N> step{1};
  bool simple = out.is_contiguous();
  for (size_t k = 1; k < N && simple; ++k) {
    const Tensor& t = *inputs[k - 1];
    base[k] = static_cast<char*>(t.raw_data());
    step[k] = t.numel() == n ? 1 : 0;
    simple = (t.numel() == 1 || (t.shape() == out.shape() && t.is_contiguous()));
  }
  if (simple) {
    constexpr std::array<size_t, N> sizes{sizeof(Out), sizeof(In)...};
    parallel_for(n, kParallelGrain, [&](int64_t begin, int64_t end) {
      std::array<char*, N> p;
      for (size_t k = 0; k < N; ++k) p[k] = base[k] + begin * step[k] * static_cast<int64_t>(sizes[k]);
      row(p, step, end - begin);
    });
    return;
  }
  StridedLoop<N>(out, inputs).run(row);
}

}  // namespace flowlet::detail
