// Reductions: sum and max over any axes (keepdims either way), argmax, and mean as a composite.
//
// A contiguous input whose reduced axes form one block of adjacent dimensions is seen as [outer,
// reduced, inner] in place. Other layouts (axes 0, 2, 3 of NCHW as batch norm reduces, views) are
// read in place through offsets when their innermost dimension is contiguous
// (ops/reduce_strided.hpp: runs of the innermost reduced axis, or rows of the innermost kept one);
// only the rest (an innermost stride other than 1, runs shorter than 8 elements) is copied into
// that block first. Floating sums accumulate in f64 over fixed chunks whose partial sums are added
// in order, so the result is accurate and bit-identical whatever the thread count: long rows split
// into 32K-element chunks, column reductions (axis 0 of [N, C]) into row blocks and column tiles
// fixed by the shape (reduce_column_blocks); many short rows split by whole rows. Work is spread
// in pieces claimed as threads come free (for_pieces). Within a chunk,
// f32 rows go through sum_f32_run and f32 columns through sum_f32_columns (pairwise f32 trees of 16
// or 8 elements, then f64: relative error <= 4 * 2^-24 for inputs of one sign, at memory speed); other
// floating types accumulate every element in f64 over 16 lanes. f32 row maxima go through
// max_f32_run (branch-free vector lanes), argmax through a branch-free scan (argmax_run). f16/bf16 are read as float (sums still accumulate in
// f64, max compares in float) and the result is rounded once to the input dtype, as PyTorch does.

#include "flowlet/ops/reduce.hpp"

#include <algorithm>
#include <limits>
#include <memory>
#include <optional>

#include "flowlet/dispatch.hpp"
#include "flowlet/ops/elementwise.hpp"
#include "flowlet/ops/shape.hpp"
#include "ops/grad_helpers.hpp"
#include "kernels/elementwise_loop.hpp"
#include "kernels/reduce_f32.hpp"
#include "ops/attributes.hpp"
#include "ops/reduce_layout.hpp"
#include "ops/reduce_strided.hpp"
#include "ops/registry.hpp"

namespace flowlet {
namespace detail {

// The reduced axes, sorted and checked (InvalidArgument on out-of-range or repeated axes).
std::vector<int64_t> reduced_axes(std::string_view op, const Tensor& t, const ReduceAttrs& a) {
  std::vector<int64_t> axes;
  if (a.all_axes) {
    for (int64_t d = 0; d < t.rank(); ++d) axes.push_back(d);
    return axes;
  }
  for (int64_t axis : a.axes) axes.push_back(normalize_axis(op, axis, t.rank()));
  std::sort(axes.begin(), axes.end());
  if (std::adjacent_find(axes.begin(), axes.end()) != axes.end()) {
    fail<InvalidArgument>("{}: axes repeat; got [{}]", op, fmt::join(a.axes, ", "));
  }
  return axes;
}

Shape reduced_shape(const Tensor& t, const std::vector<int64_t>& axes, bool keepdims) {
  Shape shape;
  for (int64_t d = 0; d < t.rank(); ++d) {
    const bool reduced = std::binary_search(axes.begin(), axes.end(), d);
    if (!reduced) shape.push_back(t.shape()[static_cast<size_t>(d)]);
    else if (keepdims) shape.push_back(1);
  }
  return shape;
}

Blocked block_input(const Tensor& t, const std::vector<int64_t>& axes) {
  Blocked b;
  const bool adjacent = axes.empty() || axes.back() - axes.front() + 1 == static_cast<int64_t>(axes.size());
  if (adjacent) {
    b.data = t.contiguous();
    for (int64_t d = 0; d < t.rank(); ++d) {
      const int64_t extent = t.shape()[static_cast<size_t>(d)];
      if (!axes.empty() && d < axes.front()) b.outer *= extent;
      else if (!axes.empty() && d <= axes.back()) b.reduced *= extent;
      else b.inner *= extent;
    }
    if (axes.empty()) std::swap(b.outer, b.inner);  // nothing reduced: every element its own row
    return b;
  }
  std::vector<int64_t> perm;
  for (int64_t d = 0; d < t.rank(); ++d) {
    if (!std::binary_search(axes.begin(), axes.end(), d)) {
      perm.push_back(d);
      b.outer *= t.shape()[static_cast<size_t>(d)];
    }
  }
  for (int64_t d : axes) {
    perm.push_back(d);
    b.reduced *= t.shape()[static_cast<size_t>(d)];
  }
  b.data = permute(t, perm).contiguous();
  return b;
}

namespace {

// Floating element types, the 16-bit storage types included: they reduce through compute_t<T>.
template <class T>
inline constexpr bool kFloatElement = std::is_floating_point_v<compute_t<T>>;

template <class T>
struct SumPolicy {
  using Acc = std::conditional_t<kFloatElement<T>, double, int64_t>;
  static Acc init() { return Acc{0}; }
  static Acc step(Acc acc, T x) {
    if constexpr (kFloatElement<T>) {
      return acc + static_cast<double>(static_cast<compute_t<T>>(x));
    } else {  // wraps instead of overflowing
      return static_cast<int64_t>(static_cast<uint64_t>(acc) + static_cast<uint64_t>(static_cast<int64_t>(x)));
    }
  }
  static Acc combine(Acc a, Acc b) {
    if constexpr (kFloatElement<T>) return a + b;
    else return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
  }
};
template <>
struct SumPolicy<bool> {
  using Acc = int64_t;
  static Acc init() { return 0; }
  static Acc step(Acc acc, bool x) { return acc + (x ? 1 : 0); }
  static Acc combine(Acc a, Acc b) { return a + b; }
};

template <class T>
struct MaxPolicy {
  using Acc = compute_t<T>;  // float for f16/bf16: every half value is exact in float
  static Acc init() {
    if constexpr (std::is_floating_point_v<Acc>) return -std::numeric_limits<Acc>::infinity();
    else return std::numeric_limits<Acc>::lowest();
  }
  static Acc step(Acc acc, T x) { return combine(acc, static_cast<Acc>(x)); }
  // NaN wins and stays. `|` rather than `||`: without a branch the lane loop vectorizes.
  static Acc combine(Acc acc, Acc x) { return ((x > acc) | (x != x)) ? x : acc; }
};

constexpr int64_t kLanes = 16;
constexpr int64_t kChunk = 1 << 15;

// Calls body(begin, end) over [0, items), each item `cost` elements of input: on this thread when
// the whole is under 2 * kParallelGrain elements (waking a worker costs more), else in up to 8
// pieces per thread claimed as threads come free (run_chunks), so that a worker that wakes late
// or runs slower on a loaded machine takes fewer pieces instead of holding up a fixed half (what
// parallel_for's one piece per thread does). Bodies write disjoint outputs, so who runs which
// piece never changes a result.
template <class Body>
void for_pieces(int64_t items, int64_t cost, Body&& body) {
  if (items <= 0) return;
  const int64_t total = items * std::max<int64_t>(cost, 1);
  const int64_t pieces = total < 2 * kParallelGrain
                             ? 1
                             : std::min({items, 8 * int64_t{intra_op_threads()}, total / (kParallelGrain / 8)});
  if (pieces <= 1) {
    body(int64_t{0}, items);
    return;
  }
  auto run_piece = [&](int64_t piece) { body(items * piece / pieces, items * (piece + 1) / pieces); };
  run_chunks(pieces, FunctionRef<void(int64_t)>(run_piece));
}

// Reduces a contiguous run of n elements with independent lanes (vectorizable).
template <class P, class T>
typename P::Acc reduce_run(const T* x, int64_t n) {
  using Acc = typename P::Acc;
  if constexpr (!kFloatElement<T>) {
    // Integers are exact in any order, so a plain loop suffices. (GCC 12 at -O3 -march=native
    // miscompiles the lane loop below for u8 input: sums at lengths 32-47 lost 16 elements.)
    Acc total = P::init();
    for (int64_t i = 0; i < n; ++i) total = P::step(total, x[i]);
    return total;
  } else if constexpr (std::is_same_v<T, float> && std::is_same_v<P, SumPolicy<float>>) {
    if (n < kShortRun) return sum_f32_short_run(x, n);  // inline: rows of 10 classes, 65536 of them
    return sum_f32_run(x, n);  // f32 trees of 16 per lane over four streams, then f64 lanes
  } else if constexpr (std::is_same_v<T, float> && std::is_same_v<P, MaxPolicy<float>>) {
    return max_f32_run(x, n);  // branch-free lanes
  } else {  // floating: independent lanes (vectorizable, and accurate with f64 accumulators)
    Acc lanes[kLanes];
    std::fill(lanes, lanes + kLanes, P::init());
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      for (int64_t j = 0; j < kLanes; ++j) lanes[j] = P::step(lanes[j], x[i + j]);
    }
    Acc total = P::init();
    for (int64_t j = 0; j < kLanes; ++j) total = P::combine(total, lanes[j]);
    for (; i < n; ++i) total = P::step(total, x[i]);
    return total;
  }
}

// acc[j] = reduce over r in [0, rows) of x[r * stride + j] (acc starts at P::init()): f32 sums
// through sum_f32_columns (trees of 8 rows, f64 between them), everything else element by element;
// narrow contiguous rows ([N, 10] over axis 0) as m = 32 / cols rows side by side, one row of
// m * cols lanes, so that the inner loop is long enough to vectorize (10 lanes per row did not:
// f64 sum axis 0 of [65536, 10], one thread, 396 us against libtorch's 367, 13:57); the lanes fold
// into their columns at the end, in a fixed order.
template <class P, class T>
void reduce_columns(const T* x, int64_t rows, int64_t stride, int64_t cols, typename P::Acc* acc) {
  using Acc = typename P::Acc;
  constexpr int64_t kWide = 32;
  if constexpr (std::is_same_v<T, float> && std::is_same_v<P, SumPolicy<float>>) {
    sum_f32_columns(x, rows, stride, cols, acc);
  } else if (stride == cols && cols > 0 && 2 * cols <= kWide) {
    const int64_t m = kWide / cols, width = m * cols;
    Acc lane[kWide];
    std::fill(lane, lane + width, P::init());
    int64_t r = 0;
    for (; r + m <= rows; r += m) {
      const T* p = x + r * cols;
      for (int64_t w = 0; w < width; ++w) lane[w] = P::step(lane[w], p[w]);
    }
    for (; r < rows; ++r)
      for (int64_t j = 0; j < cols; ++j) lane[j] = P::step(lane[j], x[r * cols + j]);
    for (int64_t k = 0; k < m; ++k)
      for (int64_t j = 0; j < cols; ++j) acc[j] = P::combine(acc[j], lane[k * cols + j]);
  } else {
    int64_t r = 0;
    if constexpr (std::is_same_v<T, double> && std::is_same_v<P, SumPolicy<double>>) {
      // f64 sums: four rows per pass over acc, added pairwise first (f64 throughout), so acc is
      // loaded and stored once per four rows (sum axis 0 of [64, 784], one thread: 13.2 us
      // against libtorch's 12.2, 14:16, before).
      for (; r + 4 <= rows; r += 4) {
        const double* p = x + r * stride;
        for (int64_t j = 0; j < cols; ++j) acc[j] += (p[j] + p[stride + j]) + (p[2 * stride + j] + p[3 * stride + j]);
      }
    }
    for (; r < rows; ++r) {
      const T* row = x + r * stride;
      for (int64_t j = 0; j < cols; ++j) acc[j] = P::step(acc[j], row[j]);
    }
  }
}

// Reduces one contiguous row: fixed chunks, partials combined in order (deterministic).
template <class P, class T>
typename P::Acc reduce_row(const T* x, int64_t n, bool parallel) {
  using Acc = typename P::Acc;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  if (chunks <= 1) return reduce_run<P>(x, n);
  std::vector<Acc> partial(static_cast<size_t>(chunks));
  auto run = [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      partial[c] = reduce_run<P>(x + c * kChunk, std::min(kChunk, n - c * kChunk));
    }
  };
  // Many more pieces than threads, claimed as threads come free: a worker that wakes late (a
  // loaded machine) or runs slower takes fewer pieces instead of holding up a fixed half. The
  // partials stay per chunk, so the result does not depend on who ran what. 64 pieces per thread
  // (16M f32 at 2 threads: 128 pieces of 512 KiB): the thread that takes the last piece keeps the
  // other waiting at most that long. Against 16 per thread (2 MiB pieces), paced same-process
  // rounds at 2 threads (10:57 and 10:58, load 4.5-5.5): 34.2 vs 32.7 and 31.0 / 31.4 vs 29.0 /
  // 31.4 GB/s (docs/notes20/reduce.md).
  const int64_t pieces = parallel ? std::min<int64_t>(chunks / 4, 64 * int64_t{intra_op_threads()}) : 1;
  if (pieces > 1) {
    auto run_piece = [&](int64_t piece) { run(chunks * piece / pieces, chunks * (piece + 1) / pieces); };
    run_chunks(pieces, FunctionRef<void(int64_t)>(run_piece));
  } else {
    run(0, chunks);
  }
  Acc total = P::init();
  for (Acc p : partial) total = P::combine(total, p);
  return total;
}

// out[o * cols + j] = reduce over r in [0, rows) of base(o)[r * step + j], for every output row o
// in [0, outputs): the column reductions (axis 0 of [N, C], the contiguous [outer, reduced, inner]
// block, and the strided plan's rows a fixed step apart). The rows split into at most 8 blocks of
// a multiple of 8 rows (at least ~8K elements each; one block under 2 * kParallelGrain elements in
// all) and the columns into tiles of at most 1024;
// each (output row, tile, block) item reduces its rows into its own partials, and the blocks'
// partials are combined in block order. Block and tile sizes depend only on the shape, so the
// bits do not depend on the thread count; and f32 sums keep their trees of 8 rows aligned to the
// same rows as one pass would (blocks are whole groups of 8), so the bound stays 3 f32 roundings
// per element, then f64. Before, the outputs' columns were split between threads: with 10 columns
// each thread read every row (2 threads, [65536, 10]: 582 us against 120 us on one thread), and
// pieces of 16 columns read 64 bytes of each 1 KiB row of [4096, 256]. 8 blocks rather than 16:
// the combine pass and the per-block zeroing halve (sum axis 0 of [1024, 784], one thread: 71 us
// against libtorch's 74, 14:23, load 6.9; with 16 blocks 91 against 77 at 14:20).
template <class P, class T, class Out, class Base>
void reduce_column_blocks(int64_t outputs, Base base, int64_t rows, int64_t step, int64_t cols, Out* out) {
  using Acc = typename P::Acc;
  constexpr int64_t kMaxTile = 1024, kMaxBlocks = 8, kMinBlockElements = 8192;
  if (outputs == 0 || cols == 0) return;  // no output elements
  const int64_t tile = std::min(cols, kMaxTile);
  const int64_t tiles = (cols + tile - 1) / tile;
  auto round8 = [](int64_t r) { return (r + 7) / 8 * 8; };
  // One block when the whole runs on one thread anyway (for_pieces' threshold, a rule on the shape
  // only): blocks there cost partials and a combine pass for nothing (sum axis 0 of [64, 784]).
  const bool one_block = outputs * rows * cols < 2 * kParallelGrain;
  const int64_t block = one_block ? std::max<int64_t>(rows, 1)
                                  : std::max(round8((rows + kMaxBlocks - 1) / kMaxBlocks),
                                             round8((kMinBlockElements + tile - 1) / tile));
  const int64_t blocks = std::max<int64_t>(1, (rows + block - 1) / block);
  // partial[((o * tiles + t) * blocks + b) * tile + j]: item (o, t, b)'s column j of tile t.
  // Every slot is written before it is read (default-initialized: zeroing it first took 4% of a
  // [4096, 256] column sum).
  const std::unique_ptr<Acc[]> partial(new Acc[static_cast<size_t>(outputs * tiles * blocks * tile)]);
  const int64_t items = outputs * tiles * blocks;
  for_pieces(items, block * tile, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item % blocks, t = item / blocks % tiles, o = item / blocks / tiles;
      const int64_t j0 = t * tile, width = std::min(tile, cols - j0);
      const int64_t r0 = b * block, count = std::min(block, rows - r0);
      Acc* acc = partial.get() + item * tile;
      std::fill(acc, acc + width, P::init());
      if (count > 0) reduce_columns<P>(base(o) + r0 * step + j0, count, step, width, acc);
    }
  });
  for_pieces(outputs * tiles, blocks * tile, [&](int64_t begin, int64_t end) {
    for (int64_t ot = begin; ot < end; ++ot) {
      const int64_t o = ot / tiles, j0 = ot % tiles * tile, width = std::min(tile, cols - j0);
      const Acc* first = partial.get() + ot * blocks * tile;
      for (int64_t j = 0; j < width; ++j) {
        Acc acc = first[j];
        for (int64_t b = 1; b < blocks; ++b) acc = P::combine(acc, first[b * tile + j]);
        out[o * cols + j0 + j] = convert<Out>(acc);
      }
    }
  });
}

// out[o, j] = reduce over r of x[o, r, j], written as dtype Out.
template <class P, class T, class Out>
void reduce_blocked(const Blocked& b, Out* out) {
  const T* x = static_cast<const T*>(b.data.raw_data());
  const int64_t outer = b.outer, reduced = b.reduced, inner = b.inner;
  if (inner == 1) {
    if (reduced < kChunk * 2) {  // rows: one row per output, whole rows per piece
      for_pieces(outer, reduced, [&](int64_t begin, int64_t end) {
        if constexpr (std::is_same_v<T, float> && std::is_same_v<P, SumPolicy<float>>) {
          sum_f32_rows(x + begin * reduced, end - begin, reduced, out + begin);  // no call per row
        } else {
          for (int64_t o = begin; o < end; ++o) out[o] = convert<Out>(reduce_row<P>(x + o * reduced, reduced, false));
        }
      });
    } else {  // long rows split into chunks themselves
      for (int64_t o = 0; o < outer; ++o) out[o] = convert<Out>(reduce_row<P>(x + o * reduced, reduced, true));
    }
    return;
  }
  reduce_column_blocks<P, T>(
      outer, [&](int64_t o) { return x + o * reduced * inner; }, reduced, inner, inner, out);
}

// The strided layout (ops/reduce_strided.hpp), read in place. Runs: output o adds up its runs in
// order; when an output has many runs they split into groups of about kChunk elements, a count
// fixed by the shape, whose partials are combined in order, so the bits never depend on the thread
// count. Columns: as the contiguous column loop above, with the rows found through offsets.
template <class P, class T, class Out>
void reduce_strided(const StridedReduction& plan, const T* x, Out* out) {
  using Acc = typename P::Acc;
  const int64_t outputs = static_cast<int64_t>(plan.out_offsets.size());
  const int64_t runs = static_cast<int64_t>(plan.reduced_offsets.size());
  const int64_t run = plan.run;
  if (plan.kind == StridedReduction::Kind::runs) {
    const int64_t per_group = std::max<int64_t>(1, kChunk / run);
    const int64_t groups = (runs + per_group - 1) / per_group;
    auto reduce_group = [&](int64_t item) {
      const int64_t o = item / groups, g = item % groups;
      const T* base = x + plan.out_offsets[static_cast<size_t>(o)];
      Acc acc = P::init();
      for (int64_t r = g * per_group; r < std::min(runs, (g + 1) * per_group); ++r) {
        acc = P::combine(acc, reduce_run<P>(base + plan.reduced_offsets[static_cast<size_t>(r)], run));
      }
      return acc;
    };
    const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(std::min(runs, per_group) * run, 1));
    if (groups == 1) {
      parallel_for(outputs, grain, [&](int64_t begin, int64_t end) {
        for (int64_t o = begin; o < end; ++o) out[o] = convert<Out>(reduce_group(o));
      });
      return;
    }
    std::vector<Acc> partial(static_cast<size_t>(outputs * groups));
    parallel_for(outputs * groups, grain, [&](int64_t begin, int64_t end) {
      for (int64_t item = begin; item < end; ++item) partial[static_cast<size_t>(item)] = reduce_group(item);
    });
    for (int64_t o = 0; o < outputs; ++o) {
      Acc acc = P::init();
      for (int64_t g = 0; g < groups; ++g) acc = P::combine(acc, partial[static_cast<size_t>(o * groups + g)]);
      out[o] = convert<Out>(acc);
    }
    return;
  }
  // Reduced rows a fixed step apart (always so for one reduced dimension after merging).
  const int64_t step = runs > 1 ? plan.reduced_offsets[1] - plan.reduced_offsets[0] : 0;
  bool uniform = plan.reduced_offsets[0] == 0;
  for (int64_t r = 0; uniform && r < runs; ++r) uniform = plan.reduced_offsets[static_cast<size_t>(r)] == r * step;
  if (uniform) {  // one reduced dimension: rows a stride apart, as in the contiguous case
    reduce_column_blocks<P, T>(
        outputs, [&](int64_t o) { return x + plan.out_offsets[static_cast<size_t>(o)]; }, runs, step, run, out);
    return;
  }
  parallel_for(outputs * run, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(runs, 1)), [&](int64_t begin, int64_t end) {
    std::vector<Acc> acc;
    for (int64_t start = begin; start < end;) {
      const int64_t o = start / run;
      const int64_t j0 = start % run;
      const int64_t j1 = std::min(run, j0 + (end - start));
      acc.assign(static_cast<size_t>(j1 - j0), P::init());
      const T* base = x + plan.out_offsets[static_cast<size_t>(o)];
      for (int64_t r = 0; r < runs; ++r) {
        const T* row = base + plan.reduced_offsets[static_cast<size_t>(r)];
        for (int64_t j = j0; j < j1; ++j) acc[j - j0] = P::step(acc[j - j0], row[j]);
      }
      for (int64_t j = j0; j < j1; ++j) out[o * run + j] = convert<Out>(acc[j - j0]);
      start += j1 - j0;
    }
  });
}

constexpr DTypeSet kSumTypes = kFloating | kIntegers | bit(b8);
constexpr DTypeSet kOrderTypes = kFloating | kIntegers;

template <const char* Name, DTypeSet Allowed>
void reduce_infer(const OpCall& call, OutputSpec& spec) {
  const Tensor& t = call.inputs[0];
  const auto& a = call.attrs<ReduceAttrs>();
  check_dtype(Name, t.dtype(), Allowed);
  const auto axes = reduced_axes(Name, t, a);
  if constexpr (Allowed == kOrderTypes) {
    for (int64_t d : axes) {
      if (t.shape()[static_cast<size_t>(d)] == 0) {
        fail<InvalidArgument>("{}: cannot reduce a zero-size axis; got axis {} of shape {}", Name, d, t.shape());
      }
    }
  }
  const DType out = Allowed == kSumTypes && !is_floating(t.dtype()) ? i64 : t.dtype();
  spec.outputs[0] = {reduced_shape(t, axes, a.keepdims), out};
}

template <template <class> class Policy, DTypeSet Allowed>
void reduce_kernel(const OpCall& call, std::span<Tensor> out) {
  const Tensor& t = call.inputs[0];
  const std::vector<int64_t> axes = reduced_axes(call.op.name, t, call.attrs<ReduceAttrs>());
  // Floats (halves included) keep their dtype; integer and b8 sums widen to i64; max keeps T.
  auto output = [&]<class T>(TypeTag<T>) {
    using Acc = typename Policy<T>::Acc;
    using Out = std::conditional_t<kFloatElement<T>, T, std::conditional_t<std::is_same_v<Acc, int64_t>, int64_t, T>>;
    return static_cast<Out*>(out[0].raw_data());
  };
  if (const std::optional<StridedReduction> plan = plan_strided_reduction(t, axes)) {
    visit_dtype<Allowed>(t.dtype(), [&]<class T>(TypeTag<T> tag) {
      reduce_strided<Policy<T>, T>(*plan, static_cast<const T*>(t.raw_data()), output(tag));
    });
    return;
  }
  const Blocked b = block_input(t, axes);
  visit_dtype<Allowed>(t.dtype(), [&]<class T>(TypeTag<T> tag) { reduce_blocked<Policy<T>, T>(b, output(tag)); });
}

void argmax_infer(const OpCall& call, OutputSpec& spec) {
  const Tensor& t = call.inputs[0];
  check_dtype("argmax", t.dtype(), kOrderTypes);
  const int64_t axis = normalize_axis("argmax", call.attrs<ArgmaxAttrs>().axis, t.rank());
  if (t.shape()[static_cast<size_t>(axis)] == 0) {
    fail<InvalidArgument>("argmax: cannot reduce a zero-size axis; got axis {} of shape {}", axis, t.shape());
  }
  spec.outputs[0] = {reduced_shape(t, {axis}, false), i64};
}

// The index of the first maximum of x[0], x[stride], ... x[(n - 1) * stride] (n >= 1), a NaN
// counting as the maximum (the first NaN wins; halves compare as float). Branch-free: the
// compare-and-branch loop mispredicted on every new maximum of random rows (65536 x 10 f32, 2
// threads: 3.2 ms against libtorch's 1.7). Once m is NaN nothing replaces it: v > NaN is false,
// and a NaN v replaces only a non-NaN m. For the columns of argmax over an inner axis.
template <class T>
int64_t argmax_run(const T* x, int64_t n, int64_t stride) {
  using V = compute_t<T>;
  V m = static_cast<V>(x[0]);
  int64_t best = 0;
  for (int64_t r = 1; r < n; ++r) {
    const V v = static_cast<V>(x[r * stride]);
    const bool take = (v > m) | ((v != v) & (m == m));
    m = take ? v : m;
    best = take ? r : best;
  }
  return best;
}

// argmax_run over a contiguous row, in two passes that carry no index through a compare chain:
// the maximum and whether a NaN occurs, then the first index equal to the maximum (or the first
// NaN). Equal to argmax_run: the first element that no later one exceeds is the first equal to the
// maximum (-0 and +0 compare equal in both). Short rows (classes) take both passes branch-free,
// the second backwards with a conditional move; longer rows find the maximum with max_f32_run
// (f32) or in 16 independent lanes (vector max instructions), then stop at the first match. The one-pass scan kept the
// index in its dependency chain: 2.7 ms for 65536 rows of 10 on one thread (libtorch 3.0, a plain
// branchy loop 0.57), 1.6 ms for 4096 rows of 256 (libtorch 2.1).
template <class T>
int64_t argmax_row(const T* x, int64_t n) {
  using V = compute_t<T>;
  constexpr int64_t kLanes16 = 16;
  V m = static_cast<V>(x[0]);
  bool nan = false;
  int64_t r = 0;
  if constexpr (std::is_same_v<T, float>) {
    if (n >= 2 * kLanes16) {  // the f32 max kernel: NaN if any element is NaN
      m = max_f32_run(x, n);
      nan = m != m;
      r = n;
    }
  }
  if (r < n && n >= 2 * kLanes16) {
    V lane[kLanes16];
    bool lane_nan[kLanes16] = {};
    for (int64_t j = 0; j < kLanes16; ++j) lane[j] = static_cast<V>(x[j]);
    for (; r + kLanes16 <= n; r += kLanes16) {
      for (int64_t j = 0; j < kLanes16; ++j) {
        const V v = static_cast<V>(x[r + j]);
        lane[j] = v > lane[j] ? v : lane[j];
        lane_nan[j] |= v != v;
      }
    }
    for (int64_t j = 0; j < kLanes16; ++j) {
      m = lane[j] > m ? lane[j] : m;
      nan |= lane_nan[j];
    }
  }
  for (; r < n; ++r) {
    const V v = static_cast<V>(x[r]);
    m = v > m ? v : m;
    nan |= v != v;
  }
  if (n >= 2 * kLanes16) {  // one mispredicted exit per row
    for (r = 0; r < n; ++r) {
      const V v = static_cast<V>(x[r]);
      if (nan ? v != v : v == m) return r;
    }
    return n - 1;  // unreachable: some element equals the maximum
  }
  int64_t best = n - 1;
  for (r = n - 1; r >= 0; --r) {
    const V v = static_cast<V>(x[r]);
    best = (nan ? v != v : v == m) ? r : best;
  }
  return best;
}

void argmax_kernel(const OpCall& call, std::span<Tensor> out) {
  const Tensor& t = call.inputs[0];
  const int64_t axis = normalize_axis("argmax", call.attrs<ArgmaxAttrs>().axis, t.rank());
  const Blocked b = block_input(t, {axis});
  auto* result = static_cast<int64_t*>(out[0].raw_data());
  visit_dtype<kOrderTypes>(t.dtype(), [&]<class T>(TypeTag<T>) {
    const T* x = static_cast<const T*>(b.data.raw_data());
    if (b.inner == 1) {  // rows: classes of a batch, as accuracy code asks
      for_pieces(b.outer, b.reduced, [&](int64_t begin, int64_t end) {
        for (int64_t o = begin; o < end; ++o) result[o] = argmax_row(x + o * b.reduced, b.reduced);
      });
      return;
    }
    for_pieces(b.outer * b.inner, b.reduced, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) {
        const int64_t o = k / b.inner, j = k % b.inner;
        result[k] = argmax_run(x + o * b.reduced * b.inner + j, b.reduced, b.inner);
      }
    });
  });
}

// The input's shape with the reduced axes kept as 1: the shape a gradient is broadcast from.
Shape kept_shape(const Tensor& t, const std::vector<int64_t>& axes) {
  return reduced_shape(t, axes, /*keepdims=*/true);
}

void sum_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> dx) {
  const Tensor& x = c.inputs[0];
  const auto axes = reduced_axes("sum", x, c.attrs<ReduceAttrs>());
  dx[0] = expand(reshape(g[0], kept_shape(x, axes)), x.shape());
}

// The gradient goes to the maximal elements, split evenly between ties (as TensorFlow does).
void max_grad(const GradCall& c, std::span<const Tensor> g, std::span<Tensor> dx) {
  const Tensor& x = c.inputs[0];
  const auto axes = reduced_axes("max", x, c.attrs<ReduceAttrs>());
  const Shape kept = kept_shape(x, axes);
  const Tensor is_max = cast(x == reshape(c.outputs[0], kept), x.dtype());
  dx[0] = expand(reshape(g[0], kept), x.shape()) * is_max / sum(is_max, axes, /*keepdims=*/true);
}

constexpr char kSum[] = "sum";
constexpr char kMax[] = "max";

Op sum_op{"sum", 1, 1, kNoFlags, &reduce_infer<kSum, kSumTypes>, {&reduce_kernel<SumPolicy, kSumTypes>, nullptr},
          &sum_grad, &copy_attributes<ReduceAttrs>, &describe_attributes<ReduceAttrs>};
Op max_op{"max", 1, 1, kNoFlags, &reduce_infer<kMax, kOrderTypes>, {&reduce_kernel<MaxPolicy, kOrderTypes>, nullptr},
          &max_grad, &copy_attributes<ReduceAttrs>, &describe_attributes<ReduceAttrs>};
Op argmax_op{"argmax", 1, 1, kNoFlags, &argmax_infer, {&argmax_kernel, nullptr}, nullptr, &copy_attributes<ArgmaxAttrs>,
             &describe_attributes<ArgmaxAttrs>};

}  // namespace

void add_reduce_ops(std::vector<Op*>& ops) { ops.insert(ops.end(), {&sum_op, &max_op, &argmax_op}); }

}  // namespace detail

Tensor sum(const Tensor& t) { return dispatch(detail::sum_op, {t}, detail::ReduceAttrs{{}, false, true}); }
Tensor sum(const Tensor& t, const std::vector<int64_t>& axes, bool keepdims) {
  return dispatch(detail::sum_op, {t}, detail::ReduceAttrs{axes, keepdims, false});
}
Tensor max(const Tensor& t) { return dispatch(detail::max_op, {t}, detail::ReduceAttrs{{}, false, true}); }
Tensor max(const Tensor& t, const std::vector<int64_t>& axes, bool keepdims) {
  return dispatch(detail::max_op, {t}, detail::ReduceAttrs{axes, keepdims, false});
}
Tensor argmax(const Tensor& t, int64_t axis) { return dispatch(detail::argmax_op, {t}, detail::ArgmaxAttrs{axis}); }

namespace {
// mean = sum / count. Floating dtypes only: an integer mean would silently truncate.
Tensor divide_by_count(const Tensor& t, const Tensor& total) {
  const int64_t count = total.numel() == 0 ? 0 : t.numel() / total.numel();
  return total / scalar_like(total, static_cast<double>(count), "mean");
}
void check_mean_dtype(const Tensor& t) {
  if (!is_floating(t.dtype())) {
    detail::fail<DTypeError>("mean: needs a floating dtype; got {}; convert with astype(f32)", t.dtype());
  }
}
}  // namespace

Tensor mean(const Tensor& t) {
  check_mean_dtype(t);
  return divide_by_count(t, sum(t));
}
Tensor mean(const Tensor& t, const std::vector<int64_t>& axes, bool keepdims) {
  check_mean_dtype(t);
  return divide_by_count(t, sum(t, axes, keepdims));
}

}  // namespace flowlet
