// Broadcasting rules shared by every elementwise op, and dtype-set names for error messages.
#include "kernels/elementwise_loop.hpp"

namespace flowlet::detail {

std::string dtype_set_text(DTypeSet set) {
  std::string text;
  for (int i = 0; i < kNumDTypes; ++i) {
    if (!(set & (DTypeSet{1} << i))) continue;
    if (!text.empty()) text += ", ";
    text += dtype_name(static_cast<DType>(i));
  }
  return text;
}

void fail_unsupported_dtype(const char* kernel, DType dt) {
  fail<DTypeError>("{}: internal: no kernel was built for dtype {}", kernel, dt);
}

Shape broadcast_shapes(std::string_view op, const Shape& a, const Shape& b) {
  if (a == b) return a;
  const size_t rank = std::max(a.size(), b.size());
  Shape result;
  for (size_t i = 0; i < rank; ++i) {
    const int64_t da = i + a.size() >= rank ? a[i + a.size() - rank] : 1;
    const int64_t db = i + b.size() >= rank ? b[i + b.size() - rank] : 1;
    if (da != db && da != 1 && db != 1) {
      fail<ShapeError>("{}: cannot broadcast; got a {} and b {}", op, a, b);
    }
    result.push_back(da == 1 ? db : da);
  }
  return result;
}

Strides broadcast_strides(const Tensor& t, const Shape& shape) {
  const size_t rank = shape.size();
  const size_t own = t.shape().size();
  Strides strides(rank, 0);
  for (size_t i = 0; i < own; ++i) {
    const size_t d = rank - own + i;
    strides[d] = t.shape()[i] == 1 && shape[d] != 1 ? 0 : t.strides()[i];
  }
  return strides;
}

template <size_t N>
MergedLayout<N> merge_dimensions(const Tensor& out, const std::array<const Tensor*, N - 1>& inputs) {
  MergedLayout<N> m;
  std::array<Strides, N> raw;
  raw[0] = out.strides();
  for (size_t k = 1; k < N; ++k) raw[k] = broadcast_strides(*inputs[k - 1], out.shape());
  // Drop size-1 dimensions, then merge dimension d into the one outside it when every operand
  // steps through both as one run.
  for (size_t d = 0; d < out.shape().size(); ++d) {
    const int64_t extent = out.shape()[d];
    if (extent == 1) continue;
    if (!m.shape.empty()) {
      bool mergeable = true;
      for (size_t k = 0; k < N; ++k) mergeable &= m.strides[k].back() == raw[k][d] * extent;
      if (mergeable) {
        m.shape.back() *= extent;
        for (size_t k = 0; k < N; ++k) m.strides[k].back() = raw[k][d];
        continue;
      }
    }
    m.shape.push_back(extent);
    for (size_t k = 0; k < N; ++k) m.strides[k].push_back(raw[k][d]);
  }
  if (m.shape.empty()) {  // a single element
    m.shape.push_back(1);
    for (size_t k = 0; k < N; ++k) m.strides[k].push_back(0);
  }
  return m;
}

namespace {

// Operand 0 is the output, then the inputs, with dimensions merged where possible.
template <size_t N>
struct StridedLoop {
  Shape::Dims shape;               // after merging; innermost last
  std::array<Strides, N> strides;  // in elements
  std::array<char*, N> base;
  std::array<int64_t, N> element_size;

  StridedLoop(const Tensor& out, const std::array<const Tensor*, N - 1>& inputs) {
    MergedLayout<N> layout = merge_dimensions<N>(out, inputs);
    shape = std::move(layout.shape);
    strides = std::move(layout.strides);
    base[0] = static_cast<char*>(out.raw_data());
    element_size[0] = static_cast<int64_t>(dtype_size(out.dtype()));
    for (size_t k = 1; k < N; ++k) {
      base[k] = static_cast<char*>(inputs[k - 1]->raw_data());
      element_size[k] = static_cast<int64_t>(dtype_size(inputs[k - 1]->dtype()));
    }
  }

  // Calls row() for the rows covering linear indices [begin, end).
  void for_rows(int64_t begin, int64_t end, RowFn<N> row) const {
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
    for (int64_t position = begin; position < end;) {
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
};

}  // namespace

template <size_t N>
void for_each_row(const Tensor& out, const std::array<const Tensor*, N - 1>& inputs, RowFn<N> row) {
  const int64_t n = out.numel();
  if (n == 0) return;
  std::array<char*, N> base{static_cast<char*>(out.raw_data())};
  std::array<int64_t, N> step{1};
  std::array<int64_t, N> element_size{static_cast<int64_t>(dtype_size(out.dtype()))};
  bool simple = out.is_contiguous();
  for (size_t k = 1; k < N && simple; ++k) {
    const Tensor& t = *inputs[k - 1];
    base[k] = static_cast<char*>(t.raw_data());
    step[k] = t.numel() == n ? 1 : 0;
    element_size[k] = static_cast<int64_t>(dtype_size(t.dtype()));
    simple = t.numel() == 1 || (t.shape() == out.shape() && t.is_contiguous());
  }
  if (simple) {
    parallel_for(n, kParallelGrain, [&](int64_t begin, int64_t end) {
      std::array<char*, N> p;
      for (size_t k = 0; k < N; ++k) p[k] = base[k] + begin * step[k] * element_size[k];
      row(p, step, end - begin);
    });
    return;
  }
  const StridedLoop<N> loop(out, inputs);
  parallel_for(n, kParallelGrain, [&](int64_t begin, int64_t end) { loop.for_rows(begin, end, row); });
}

template MergedLayout<2> merge_dimensions<2>(const Tensor&, const std::array<const Tensor*, 1>&);
template MergedLayout<3> merge_dimensions<3>(const Tensor&, const std::array<const Tensor*, 2>&);
template MergedLayout<4> merge_dimensions<4>(const Tensor&, const std::array<const Tensor*, 3>&);
template void for_each_row<2>(const Tensor&, const std::array<const Tensor*, 1>&, RowFn<2>);
template void for_each_row<3>(const Tensor&, const std::array<const Tensor*, 2>&, RowFn<3>);
template void for_each_row<4>(const Tensor&, const std::array<const Tensor*, 3>&, RowFn<4>);

}  // namespace flowlet::detail
