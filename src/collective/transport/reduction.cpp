#include "collective/transport/reduction.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/dtype_visit.hpp"
#include "runtime/thread_pool.hpp"

namespace flowlet::detail {

namespace {

// The element-wise combinations, one type each so that the loops below inline them and vectorize.
struct Sum {
  template <class T>
  T operator()(T a, T b) const {
    if constexpr (std::is_same_v<T, bool>) {
      return a || b;
    } else if constexpr (std::is_integral_v<T>) {  // wrap through the unsigned type: defined there
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    } else {
      return a + b;
    }
  }
};
struct Max {
  template <class T>
  T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(a) || std::isnan(b)) return a + b;  // NaN propagates
    }
    return a < b ? b : a;
  }
};
struct Min {
  template <class T>
  T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(a) || std::isnan(b)) return a + b;
    }
    return b < a ? b : a;
  }
};
struct All {  // b8 min and mean
  bool operator()(bool a, bool b) const { return a && b; }
};

// Wire type of a stored type: halves accumulate in float.
template <class T>
using Wire = std::conditional_t<std::is_same_v<T, f16_t> || std::is_same_v<T, bf16_t>, float, T>;

// Blocks keep a block of every input in cache while it is combined; ranges of blocks go to the
// thread pool's workers.
constexpr int64_t kBlock = 4096;

template <class T, class Combine>
void accumulate_range(Combine combine, const std::vector<const void*>& inputs, Wire<T>* out, int64_t begin,
                      int64_t end) {
  using W = Wire<T>;
  const auto* first = static_cast<const T*>(inputs[0]);
  for (int64_t start = begin; start < end; start += kBlock) {
    const int64_t stop = std::min(end, start + kBlock);
    if (inputs.size() == 1) {
      if constexpr (std::is_same_v<W, T>) {
        if (out != first) std::memcpy(out + start, first + start, static_cast<size_t>(stop - start) * sizeof(T));
      } else {
        for (int64_t i = start; i < stop; ++i) out[i] = static_cast<W>(first[i]);
      }
      continue;
    }
    const auto* second = static_cast<const T*>(inputs[1]);
    for (int64_t i = start; i < stop; ++i) out[i] = combine(static_cast<W>(first[i]), static_cast<W>(second[i]));
    for (size_t p = 2; p < inputs.size(); ++p) {
      const auto* in = static_cast<const T*>(inputs[p]);
      for (int64_t i = start; i < stop; ++i) out[i] = combine(out[i], static_cast<W>(in[i]));
    }
  }
}

template <class T>
void accumulate_typed(ReduceOp op, const std::vector<const void*>& inputs, void* out_raw, int64_t count) {
  auto* out = static_cast<Wire<T>*>(out_raw);
  auto run = [&](auto combine) {
    parallel_for(count, kParallelGrain,
                 [&](int64_t begin, int64_t end) { accumulate_range<T>(combine, inputs, out, begin, end); });
  };
  if constexpr (std::is_same_v<T, bool>) {
    if (op == ReduceOp::min || op == ReduceOp::mean) {
      run(All{});
    } else {
      run(Sum{});
    }
  } else {
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::mean:
        run(Sum{});
        break;
      case ReduceOp::max:
        run(Max{});
        break;
      case ReduceOp::min:
        run(Min{});
        break;
    }
  }
}

template <class T>
void finish_typed(ReduceOp op, int participants, const void* wire_raw, void* out_raw, int64_t count) {
  using W = Wire<T>;
  const auto* wire = static_cast<const W*>(wire_raw);
  auto* out = static_cast<T*>(out_raw);
  const bool divide = op == ReduceOp::mean && !std::is_same_v<T, bool>;
  parallel_for(count, kParallelGrain, [&](int64_t begin, int64_t end) {
    if constexpr (std::is_same_v<W, T>) {
      if (!divide) {
        if (static_cast<const void*>(out) != wire_raw) {
          std::memcpy(out + begin, wire + begin, static_cast<size_t>(end - begin) * sizeof(T));
        }
        return;
      }
    }
    for (int64_t i = begin; i < end; ++i) {
      W value = wire[i];
      if constexpr (!std::is_same_v<T, bool>) {
        if (divide) value = static_cast<W>(value / static_cast<W>(participants));
      }
      out[i] = static_cast<T>(value);
    }
  });
}

}  // namespace

DType wire_dtype(DType dtype) { return (dtype == f16 || dtype == bf16) ? f32 : dtype; }

bool needs_finish(DType dtype, ReduceOp op) {
  return wire_dtype(dtype) != dtype || (op == ReduceOp::mean && dtype != b8);
}

ReduceOp wire_op(DType dtype, ReduceOp op) {
  if (dtype == b8) return (op == ReduceOp::min || op == ReduceOp::mean) ? ReduceOp::min : ReduceOp::max;
  return op == ReduceOp::mean ? ReduceOp::sum : op;
}

void accumulate(DType dtype, ReduceOp op, const std::vector<const void*>& inputs, void* out, int64_t count) {
  if (count == 0 || inputs.empty()) return;
  visit_dtype<kAll>(
      dtype, [&](auto tag) { accumulate_typed<typename decltype(tag)::type>(op, inputs, out, count); },
      "collective reduction");
}

void finish(DType dtype, ReduceOp op, int participants, const void* wire, void* out, int64_t count) {
  if (count == 0) return;
  visit_dtype<kAll>(
      dtype, [&](auto tag) { finish_typed<typename decltype(tag)::type>(op, participants, wire, out, count); },
      "collective reduction");
}

}  // namespace flowlet::detail
