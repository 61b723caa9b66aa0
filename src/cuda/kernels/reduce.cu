// Reductions (sum, max, argmax) over the middle axis of a contiguous [outer, reduced, inner] block.
//
// Rows (inner == 1, e.g. a sum over the last axis or over everything): a group of threads (a warp,
// or a whole block for long rows) reduces one chunk of a row with shuffles. Columns (inner > 1):
// one thread per output column walks its chunk of the reduced axis, reading neighbouring columns
// together (coalesced). When the outputs alone cannot fill the GPU the reduced axis is cut into
// chunks whose partial results a second pass combines, in a fixed order: results are
// deterministic for a given shape (though not bit-identical to the CPU's summation order).
// f16/bf16 load as float (sums accumulate in f64, max and argmax compare in float) and the result
// is rounded once to the input dtype, as on the CPU.
#include "cuda/kernels/device_types.cuh"

namespace flowlet::detail::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kBlock = 256;
// Outputs (rows or columns) at which one pass already fills an H100-class GPU.
constexpr int64_t kEnoughGroups = 4096;
constexpr int64_t kEnoughColumns = 64 * 1024;

template <class T>
struct Sum {
  using Value = compute_t<T>;
  using Acc = std::conditional_t<std::is_floating_point_v<Value>, double, int64_t>;
  static __device__ Acc init() { return Acc{0}; }
  static __device__ Acc step(Acc acc, Value x) {
    if constexpr (std::is_floating_point_v<Value>) {
      return acc + static_cast<double>(x);
    } else {  // wraps instead of overflowing, as on the CPU
      return static_cast<int64_t>(static_cast<uint64_t>(acc) + static_cast<uint64_t>(static_cast<int64_t>(x)));
    }
  }
  static __device__ Acc combine(Acc a, Acc b) {
    if constexpr (std::is_floating_point_v<Acc>) return a + b;
    else return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
  }
};

template <class T>
struct Max {
  using Value = compute_t<T>;
  using Acc = Value;
  static __device__ Acc init() {
    if constexpr (std::is_floating_point_v<Value>) return -std::numeric_limits<Value>::infinity();
    else return std::numeric_limits<Value>::lowest();
  }
  static __device__ Acc step(Acc acc, Value x) { return (x > acc || x != x) ? x : acc; }  // NaN wins and stays
  static __device__ Acc combine(Acc a, Acc b) { return step(a, b); }
};

// A second pass reads the first pass's accumulators: same policy, accumulator in and out.
template <class P>
struct Partials {
  using Value = typename P::Acc;
  using Acc = typename P::Acc;
  static __device__ Acc init() { return P::init(); }
  static __device__ Acc step(Acc acc, Value x) { return P::combine(acc, x); }
  static __device__ Acc combine(Acc a, Acc b) { return P::combine(a, b); }
};

// Writes an accumulator as the output element type (rounding to f16/bf16 through float).
template <class Out, class Acc>
__device__ void store_result(Out* p, Acc acc) {
  if constexpr (std::is_same_v<compute_t<Out>, Out>) *p = static_cast<Out>(acc);
  else Element<Out>::store(p, static_cast<float>(acc));
}

template <class P, class T>
__device__ typename P::Acc warp_combine(typename P::Acc acc) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) acc = P::combine(acc, __shfl_down_sync(0xffffffffu, acc, offset));
  return acc;
}

// Groups of `group` threads (32, or kBlock for long rows) each reduce x[row, begin:end) of one
// (row, chunk) and write out[row * chunks + chunk].
template <class P, class In, class Out>
__global__ void __launch_bounds__(kBlock) reduce_rows(const In* x, Out* out, int64_t outer, int64_t reduced,
                                                      int64_t chunks, int64_t chunk_length, int group) {
  using Acc = typename P::Acc;
  __shared__ Acc warp_results[kBlock / kWarp];
  const int lane_in_group = static_cast<int>(threadIdx.x) % group;
  const int64_t groups_per_block = kBlock / group;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * groups_per_block + threadIdx.x / group;
  const int64_t step = static_cast<int64_t>(gridDim.x) * groups_per_block;
  const int64_t total = outer * chunks;
  // Every thread of a block runs the same number of iterations (needed for __syncthreads when the
  // group is the whole block).
  const int64_t rounds = (total + step - 1) / step;
  for (int64_t round = 0, g = first; round < rounds; ++round, g += step) {
    Acc acc = P::init();
    if (g < total) {
      const int64_t row = g / chunks, chunk = g % chunks;
      const int64_t begin = chunk * chunk_length;
      const int64_t end = begin + chunk_length < reduced ? begin + chunk_length : reduced;
      const In* line = x + row * reduced;
      for (int64_t i = begin + lane_in_group; i < end; i += group) acc = P::step(acc, Element<In>::load(line + i));
    }
    acc = warp_combine<P, In>(acc);
    if (group == kWarp) {
      if (lane_in_group == 0 && g < total) store_result(out + g, acc);
      continue;
    }
    if (threadIdx.x % kWarp == 0) warp_results[threadIdx.x / kWarp] = acc;
    __syncthreads();
    if (threadIdx.x == 0 && g < total) {
      Acc block_acc = warp_results[0];
      for (int w = 1; w < kBlock / kWarp; ++w) block_acc = P::combine(block_acc, warp_results[w]);
      store_result(out + g, block_acc);
    }
    __syncthreads();
  }
}

// One thread per (outer, chunk, column): out[(o * chunks + chunk) * inner + j] = reduction of
// x[o, begin:end, j].
template <class P, class In, class Out>
__global__ void __launch_bounds__(kBlock) reduce_columns(const In* x, Out* out, int64_t outer, int64_t reduced,
                                                         int64_t inner, int64_t chunks, int64_t chunk_length) {
  using Acc = typename P::Acc;
  const int64_t total = outer * chunks * inner;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * kBlock) {
    const int64_t j = t % inner;
    const int64_t g = t / inner;
    const int64_t o = g / chunks, chunk = g % chunks;
    const int64_t begin = chunk * chunk_length;
    const int64_t end = begin + chunk_length < reduced ? begin + chunk_length : reduced;
    Acc acc = P::init();
    const In* column = x + o * reduced * inner + j;
    for (int64_t r = begin; r < end; ++r) acc = P::step(acc, Element<In>::load(column + r * inner));
    store_result(out + t, acc);
  }
}

// How one pass splits the reduced axis: enough (output, chunk) work items to fill the GPU.
struct Split {
  int64_t chunks = 1;
  int64_t chunk_length = 1;
};
Split split_for(int64_t outer, int64_t reduced, int64_t inner) {
  Split s;
  const int64_t outputs = outer * inner;
  const int64_t enough = inner == 1 ? kEnoughGroups : kEnoughColumns;
  if (outputs < enough && reduced > 4 * kBlock) {
    const int64_t wanted = (enough + outputs - 1) / outputs;
    const int64_t most = (reduced + kBlock - 1) / kBlock;  // chunks of at least kBlock elements
    s.chunks = wanted < most ? wanted : most;
  }
  s.chunk_length = (reduced + s.chunks - 1) / s.chunks;
  if (s.chunk_length == 0) s.chunk_length = 1;
  return s;
}

template <class P, class In, class Out>
void reduce_pass(const In* x, Out* out, int64_t outer, int64_t reduced, int64_t inner, Split s, const Launch& where) {
  if (inner == 1) {
    const int group = s.chunk_length >= 8 * kBlock ? kBlock : kWarp;
    const int64_t groups = outer * s.chunks;
    reduce_rows<P, In, Out><<<blocks_for(groups, kBlock / group, where), kBlock, 0, where.stream>>>(
        x, out, outer, reduced, s.chunks, s.chunk_length, group);
  } else {
    reduce_columns<P, In, Out><<<blocks_for(outer * s.chunks * inner, kBlock, where), kBlock, 0, where.stream>>>(
        x, out, outer, reduced, inner, s.chunks, s.chunk_length);
  }
  FLOWLET_CUDA_CHECK_LAUNCH(where.device, "reduce");
}

template <template <class> class Policy, class T, class Out>
void run_reduce(const void* in, void* out, int64_t outer, int64_t reduced, int64_t inner, void* scratch,
                const Launch& where) {
  using P = Policy<T>;
  using Acc = typename P::Acc;
  const Split s = split_for(outer, reduced, inner);
  if (s.chunks == 1) {
    return reduce_pass<P, T, Out>(static_cast<const T*>(in), static_cast<Out*>(out), outer, reduced, inner, s, where);
  }
  // Partials laid out [outer, chunks, inner]: the second pass is the same reduction with
  // `chunks` as the reduced axis, small enough for one pass.
  Acc* partial = static_cast<Acc*>(scratch);
  reduce_pass<P, T, Acc>(static_cast<const T*>(in), partial, outer, reduced, inner, s, where);
  const Split second{1, s.chunks};
  reduce_pass<Partials<P>, Acc, Out>(partial, static_cast<Out*>(out), outer, s.chunks, inner, second, where);
}

// Sum writes the input type for floats (f16/bf16 included) and i64 for integers and b8; max writes
// the input type.
template <class F>
void visit_reduction(Reduction op, ElementType type, F&& f) {
  if (op == Reduction::sum) {
    visit_type<kNumbers | bit(DType::b8)>("sum", type, [&]<class T>(TypeTag<T>) {
      using Out = std::conditional_t<std::is_floating_point_v<compute_t<T>>, T, int64_t>;
      f.template operator()<Sum, T, Out>();
    });
  } else {
    visit_type<kNumbers>("max", type, [&]<class T>(TypeTag<T>) { f.template operator()<Max, T, T>(); });
  }
}

// argmax: one warp per line; ties and NaNs resolve to the first index, as on the CPU.
template <class T>
struct Candidate {
  T value;
  int64_t index;
};
template <class T>
__device__ bool better(const Candidate<T>& b, const Candidate<T>& a) {  // is b preferred over a?
  const bool a_nan = a.value != a.value, b_nan = b.value != b.value;
  if (a_nan || b_nan) return b_nan && (!a_nan || b.index < a.index);
  return b.value > a.value || (b.value == a.value && b.index < a.index);
}

template <class In>
__global__ void __launch_bounds__(kBlock) argmax_lines(const In* x, int64_t* out, int64_t outer, int64_t reduced,
                                                       int64_t inner) {
  using T = compute_t<In>;  // halves compare as float
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t lines = outer * inner;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kBlock / kWarp);
  for (int64_t line = static_cast<int64_t>(blockIdx.x) * (kBlock / kWarp) + threadIdx.x / kWarp; line < lines;
       line += warps) {
    const In* start = x + (line / inner) * reduced * inner + line % inner;
    Candidate<T> best{Element<In>::load(start), reduced};  // index `reduced`: loses to any real element
    for (int64_t r = lane; r < reduced; r += kWarp) {
      const Candidate<T> c{Element<In>::load(start + r * inner), r};
      if (best.index == reduced || better(c, best)) best = c;
    }
#pragma unroll
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      const Candidate<T> other{static_cast<T>(__shfl_down_sync(0xffffffffu, best.value, offset)),
                               __shfl_down_sync(0xffffffffu, best.index, offset)};
      if (other.index != reduced && (best.index == reduced || better(other, best))) best = other;
    }
    if (lane == 0) out[line] = best.index;
  }
}

}  // namespace

int64_t reduce_scratch_bytes(Reduction op, ElementType type, int64_t outer, int64_t reduced, int64_t inner,
                             const Launch&) {
  const Split s = split_for(outer, reduced, inner);
  if (s.chunks == 1) return 0;
  int64_t bytes = 0;
  visit_reduction(op, type, [&]<template <class> class Policy, class T, class Out>() {
    bytes = outer * s.chunks * inner * static_cast<int64_t>(sizeof(typename Policy<T>::Acc));
  });
  return bytes;
}

void launch_reduce(Reduction op, const void* in, void* out, ElementType type, int64_t outer, int64_t reduced,
                   int64_t inner, void* scratch, const Launch& where) {
  if (outer * inner == 0) return;
  visit_reduction(op, type, [&]<template <class> class Policy, class T, class Out>() {
    run_reduce<Policy, T, Out>(in, out, outer, reduced, inner, scratch, where);
  });
}

void launch_argmax(const void* in, int64_t* out, ElementType type, int64_t outer, int64_t reduced, int64_t inner,
                   const Launch& where) {
  if (outer * inner == 0) return;
  visit_type<kNumbers>("argmax", type, [&]<class T>(TypeTag<T>) {
    argmax_lines<T><<<blocks_for(outer * inner, kBlock / kWarp, where), kBlock, 0, where.stream>>>(
        static_cast<const T*>(in), out, outer, reduced, inner);
    FLOWLET_CUDA_CHECK_LAUNCH(where.device, "argmax");
  });
}

}  // namespace flowlet::detail::cuda
