// The op table: one row per registered op drives the generic checks for every op.
//
// A row names the op (as in all_ops()), the dtypes and cases (input shapes plus one op-specific
// integer: an axis, a depth, a variant) it runs, how to build seeded inputs and call the public
// function, a naive f64 reference computed from the inputs' values (or, for random ops, the
// documented properties), and the declared errors. The checks:
//   1. every op in all_ops() has exactly one row and every row names a registered op;
//   2. the result matches the reference for contiguous inputs;
//   3. the same for non-contiguous inputs (permuted and strided views) where the op takes tensors;
//   4. each declared error throws its type with a message that starts with "<op>:", and an empty
//      Tensor handle in any input position throws InvalidArgument;
//   5. traced (fl::trace) and eager calls give identical results, for every row that takes tensors;
//   6. every other device with a kernel for the op gives cpu:0's results: cpu:1 (a logical CPU
//      device, so the device plumbing is checked on every machine) and cuda:0 where a GPU is visible.
// Along the way every op is checked to leave its inputs unchanged.
// Adding an op means adding its row here; the first check fails until then.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "collective/communicator.hpp"
#include "collective/replica_context.hpp"
#include "flowlet/collective.hpp"
#include "flowlet/trace.hpp"
#include "support/gpu.hpp"
#include "support/reference.hpp"

using test::Domain;
using test::Host;

namespace {

using Inputs = std::vector<fl::Tensor>;

struct Case {
  std::vector<fl::Shape> shapes;  // input shapes; for creation ops the output shape
  int64_t arg = 0;                // op-specific: axis, depth, variant index
};

struct Expected {
  Host host;
  fl::DType dtype;
};

struct DeclaredError {
  std::string what;
  std::function<void(const std::string& op)> check;
};

// A declared error: `call` must throw E whose message starts with "<op>:" and contains `parts`.
template <class E>
DeclaredError error(std::string what, std::function<void()> call, std::vector<std::string> parts = {},
                    std::source_location loc = std::source_location::current()) {
  return {std::move(what), [call = std::move(call), parts = std::move(parts), loc](const std::string& op) {
            test::check_op_throws<E>(op, call, parts, loc);
          }};
}

struct Row {
  std::string name;
  std::vector<fl::DType> dtypes;
  std::vector<Case> cases;
  std::function<Inputs(const Case&, fl::DType, uint64_t seed)> make;
  std::function<fl::Tensor(const Inputs&, const Case&, fl::DType)> run;
  // nullopt: this case does not apply to this dtype/shape (counted, and at least one must apply).
  std::function<std::optional<Expected>(const std::vector<Host>&, const Case&, fl::DType)> reference;
  // For random ops instead of a reference: checks the documented properties of `got`.
  std::function<bool(const fl::Tensor& got, const Case&, fl::DType, uint64_t seed)> property;
  std::vector<DeclaredError> errors;
  // For f32/f64 results; f16/bf16 ones compare with their default tolerance, since rounding the
  // result to 11 (8) significant bits outweighs any f32 computation error.
  std::optional<test::Tolerance> tolerance;
};

// ---------------------------------------------------------------------------------------------
// Input builders

// One random tensor per domain, shaped by case.shapes[i], all of the row dtype.
std::function<Inputs(const Case&, fl::DType, uint64_t)> random_inputs(std::vector<Domain> domains) {
  return [domains](const Case& c, fl::DType dt, uint64_t seed) {
    Inputs in;
    for (size_t i = 0; i < domains.size(); ++i) in.push_back(test::random_tensor(c.shapes.at(i), seed + 7919 * i, dt, domains[i]));
    return in;
  };
}

// Integer indices in [0, bound) with `shape`.
fl::Tensor random_indices(const fl::Shape& shape, int64_t bound, uint64_t seed, fl::DType dt) {
  test::Rng rng(seed);
  std::vector<double> v;
  for (int64_t i = 0; i < shape.numel(); ++i) v.push_back(static_cast<double>(rng.integer(0, bound - 1)));
  return test::make(v, shape, dt);
}

Inputs no_inputs(const Case&, fl::DType, uint64_t) { return {}; }

// ---------------------------------------------------------------------------------------------
// Shared pieces

const std::vector<fl::DType> kArith = {fl::f32, fl::f64, fl::i32, fl::i64, fl::u8, fl::f16, fl::bf16};
const std::vector<fl::DType> kFloatMath = {fl::f32, fl::f64, fl::f16, fl::bf16};
const std::vector<fl::DType> kFloats = {fl::f32, fl::f64};
// f16/bf16 reductions read as float, accumulate in f64 (sum) and round the result once, so they
// compare with the half dtypes' default tolerance against the f64 reference.
const std::vector<fl::DType> kReducible = {fl::f32, fl::f64, fl::i32, fl::i64, fl::u8, fl::f16, fl::bf16};

const std::vector<Case> kBinaryCases = {
    {{{2, 3}, {2, 3}}}, {{{2, 3}, {3}}}, {{{4, 1}, {1, 5}}}, {{{2, 3, 4}, {}}}, {{{}, {3}}},
    {{{0, 3}, {3}}},    {{{3, 1, 2}, {4, 2}}}, {{{5}, {5}}},
};
const std::vector<Case> kUnaryCases = {{{{2, 3}}}, {{{7}}}, {{{}}}, {{{0, 4}}}, {{{2, 3, 4}}}};

using BinaryFn = fl::Tensor (*)(const fl::Tensor&, const fl::Tensor&);
using UnaryFn = fl::Tensor (*)(const fl::Tensor&);

bool is_integer_dtype(fl::DType dt) { return dt == fl::i32 || dt == fl::i64 || dt == fl::u8; }

Row binary_row(std::string name, BinaryFn fn, double (*f)(double, double), std::vector<fl::DType> dtypes, Domain a_domain,
               Domain b_domain, bool compares) {
  Row row;
  row.name = name;
  row.dtypes = std::move(dtypes);
  row.cases = kBinaryCases;
  row.make = random_inputs({a_domain, b_domain});
  row.run = [fn](const Inputs& in, const Case&, fl::DType) { return fn(in[0], in[1]); };
  row.reference = [f, compares](const std::vector<Host>& h, const Case&, fl::DType dt) -> std::optional<Expected> {
    Host out = test::binary_ref(h[0], h[1], f);
    if (!compares && is_integer_dtype(dt))
      for (double& v : out.values) v = std::trunc(v);  // integer division truncates toward zero
    return Expected{out, compares ? fl::b8 : dt};
  };
  row.errors = {
      error<fl::ShapeError>("shapes that do not broadcast",
                            [fn] { (void)fn(fl::zeros(fl::Shape{2, 3}), fl::zeros(fl::Shape{4})); },
                            {"cannot broadcast", "[2, 3]", "[4]"}),
      error<fl::DTypeError>("mixed dtypes", [fn] { (void)fn(fl::zeros(fl::Shape{2}), fl::zeros(fl::Shape{2}, fl::f64)); },
                            {"f32", "f64"}),
  };
  if (!compares)
    row.errors.push_back(error<fl::DTypeError>(
        "b8 arithmetic", [fn] { (void)fn(fl::zeros(fl::Shape{2}, fl::b8), fl::zeros(fl::Shape{2}, fl::b8)); }, {"b8"}));
  return row;
}

Row unary_row(std::string name, UnaryFn fn, double (*f)(double), std::vector<fl::DType> dtypes, Domain domain) {
  Row row;
  row.name = name;
  row.dtypes = dtypes;
  row.cases = kUnaryCases;
  row.make = random_inputs({domain});
  row.run = [fn](const Inputs& in, const Case&, fl::DType) { return fn(in[0]); };
  row.reference = [f](const std::vector<Host>& h, const Case&, fl::DType dt) -> std::optional<Expected> {
    return Expected{test::unary_ref(h[0], f), dt};
  };
  row.errors.push_back(
      error<fl::DTypeError>("b8 input", [fn] { (void)fn(fl::zeros(fl::Shape{2}, fl::b8)); }, {"b8"}));
  if (std::find(dtypes.begin(), dtypes.end(), fl::i32) == dtypes.end())
    row.errors.push_back(
        error<fl::DTypeError>("integer input", [fn] { (void)fn(fl::zeros(fl::Shape{2}, fl::i32)); }, {"i32"}));
  return row;
}

// Reduction variants for rank-3 inputs, picked by Case::arg.
struct AxesSpec {
  bool all;  // the overload without axes
  std::vector<int64_t> axes;
  bool keepdims;
};
const std::vector<AxesSpec> kAxesSpecs = {
    {true, {}, false},   {false, {0}, false},     {false, {-1}, true}, {false, {0, 2}, false},
    {false, {1, -3}, true}, {false, {}, false}, {false, {0, 1, 2}, true}, {false, {2, 1}, false},
};

std::vector<Case> reduction_cases() {
  std::vector<Case> cases;
  for (int64_t spec = 0; spec < static_cast<int64_t>(kAxesSpecs.size()); ++spec) {
    cases.push_back({{{3, 4, 5}}, spec});
    cases.push_back({{{2, 0, 3}}, spec});
  }
  cases.push_back({{{1, 1, 1}}, 0});
  return cases;
}

std::vector<int64_t> spec_axes(const AxesSpec& spec, size_t rank) { return spec.all ? test::all_axes(rank) : spec.axes; }

// True when a spec reduces a zero-size axis of `shape`.
bool reduces_empty_axis(const AxesSpec& spec, const fl::Shape& shape) {
  for (int64_t a : test::normalize_axes(spec_axes(spec, shape.size()), shape.size()))
    if (shape[static_cast<size_t>(a)] == 0) return true;
  return false;
}

fl::Tensor run_reduction(fl::Tensor (*all)(const fl::Tensor&),
                         fl::Tensor (*some)(const fl::Tensor&, const std::vector<int64_t>&, bool), const fl::Tensor& x,
                         const Case& c) {
  const AxesSpec& spec = kAxesSpecs[static_cast<size_t>(c.arg)];
  return spec.all ? all(x) : some(x, spec.axes, spec.keepdims);
}

fl::Tensor sum_all(const fl::Tensor& t) { return fl::sum(t); }
fl::Tensor sum_some(const fl::Tensor& t, const std::vector<int64_t>& axes, bool keepdims) { return fl::sum(t, axes, keepdims); }
fl::Tensor max_all(const fl::Tensor& t) { return fl::max(t); }
fl::Tensor max_some(const fl::Tensor& t, const std::vector<int64_t>& axes, bool keepdims) { return fl::max(t, axes, keepdims); }

const std::vector<std::vector<int64_t>> kPerms = {{2, 0, 1}, {0, 2, 1}, {1, 0}, {0, 1, 2}, {}, {0}};

// slice variants, picked by Case::arg: {axis, start, length}.
struct SliceSpec {
  int64_t axis, start, length;
};
const std::vector<SliceSpec> kSliceSpecs = {
    {0, 1, 2}, {1, 0, 3}, {-1, 2, 2}, {2, 0, 4}, {0, 0, 0}, {1, 3, 0}, {0, 0, 5}, {-2, 1, 1},
};

// Naive slice: elements [start, start + length) along axis.
Host slice_ref(const Host& x, const SliceSpec& spec) {
  const auto axis = static_cast<size_t>(spec.axis < 0 ? spec.axis + static_cast<int64_t>(x.shape.size()) : spec.axis);
  fl::Shape out_shape = x.shape;
  out_shape[axis] = spec.length;
  Host out{{}, out_shape};
  for (int64_t flat = 0; flat < out_shape.numel(); ++flat) {
    std::vector<int64_t> index = test::unravel(flat, out_shape);
    index[axis] += spec.start;
    out.values.push_back(x.values[static_cast<size_t>(test::ravel(index, x.shape))]);
  }
  return out;
}

// scatter_add variants, picked by Case::arg: the row count and the index dtype.
struct ScatterSpec {
  int64_t rows;
  fl::DType index_dtype;
};
const std::vector<ScatterSpec> kScatterSpecs = {
    {3, fl::i64}, {4, fl::i32}, {2, fl::i64}, {5, fl::i32}, {0, fl::i64}, {3, fl::i64}, {1, fl::i32},
};

// Naive scatter_add: zeros [rows, updates.shape[indices.rank():]...], updates[i] added at row indices[i].
Host scatter_add_ref(const Host& indices, const Host& updates, int64_t rows) {
  fl::Shape out_shape{rows};
  for (size_t k = indices.shape.size(); k < updates.shape.size(); ++k) out_shape.push_back(updates.shape[k]);
  const int64_t row = rows == 0 ? 0 : out_shape.numel() / rows;
  Host out{std::vector<double>(static_cast<size_t>(out_shape.numel()), 0.0), out_shape};
  for (size_t i = 0; i < indices.values.size(); ++i) {
    const auto r = static_cast<int64_t>(indices.values[i]);
    for (int64_t j = 0; j < row; ++j)
      out.values[static_cast<size_t>(r * row + j)] += updates.values[static_cast<size_t>(static_cast<int64_t>(i) * row + j)];
  }
  return out;
}

// Reshape targets (Case::shapes[1]) and what a -1 resolves to.
fl::Shape resolve(const fl::Shape& target, int64_t numel) {
  fl::Shape out = target;
  int64_t known = 1;
  for (int64_t d : target)
    if (d != -1) known *= d;
  for (size_t k = 0; k < out.size(); ++k)
    if (out[k] == -1) out[k] = known == 0 ? 0 : numel / known;
  return out;
}

double full_value(fl::DType dt) {
  if (dt == fl::b8) return 1;
  if (dt == fl::u8 || dt == fl::i32 || dt == fl::i64) return 3;
  return -1.5;
}

const fl::Shape kNegative{2, -1};
const fl::Shape kOverflow{int64_t{1} << 32, int64_t{1} << 32};

// Random ops: deterministic per seed, element i depends only on (seed, i), finite (uniform: in range).
bool random_properties(const fl::Tensor& got, const Case& c, fl::DType dt, uint64_t seed,
                       const std::function<fl::Tensor(const fl::Shape&)>& again, double lo, double hi) {
  bool ok = true;
  const fl::Shape shape = c.shapes[0];
  if (!(got.shape() == shape) || got.dtype() != dt) {
    FAIL_CHECK("shape " << test::shape_text(got.shape()) << " dtype " << fl::dtype_name(got.dtype()) << " expected "
                        << test::shape_text(shape) << " " << fl::dtype_name(dt));
    return false;
  }
  const std::vector<double> v = test::values(got);
  for (double x : v) {
    if (!std::isfinite(x) || x < lo || x >= hi) {
      FAIL_CHECK("value " << x << " outside [" << lo << ", " << hi << ")");
      ok = false;
      break;
    }
  }
  // The prefix property: a longer flat request starts with the same values.
  const std::vector<double> longer = test::values(again(fl::Shape{shape.numel() + 17}));
  if (!std::equal(v.begin(), v.end(), longer.begin())) {
    FAIL_CHECK("element i does not depend only on (seed, i)");
    ok = false;
  }
  if (test::values(again(shape)) != v) {
    FAIL_CHECK("not deterministic for seed " << seed);
    ok = false;
  }
  if (v.size() >= 1000) {  // loose moments; test_creation checks them tightly
    double mean = 0;
    for (double x : v) mean += x;
    mean /= static_cast<double>(v.size());
    const double want = std::isinf(lo) ? 0.0 : (lo + hi) / 2;
    if (std::abs(mean - want) > 0.1 * (std::isinf(lo) ? 1.0 : hi - lo)) {
      FAIL_CHECK("mean " << mean << " expected about " << want);
      ok = false;
    }
  }
  return ok;
}

// ---------------------------------------------------------------------------------------------
// Collectives over one participant: the world's in a plain run (on cpu:0), or for inputs on another
// device a one-participant communicator there (the world's participant lives on the default
// device). Each is then the identity, except that all_gather turns a scalar into [1] and
// reduce_scatter needs an axis 0. tests/test_collective_ops.cpp checks them with more participants.

const std::vector<fl::ReduceOp> kCollectiveReductions = {fl::ReduceOp::sum, fl::ReduceOp::mean, fl::ReduceOp::max,
                                                         fl::ReduceOp::min};

fl::Tensor as_participant_of(const fl::Tensor& t, const std::function<fl::Tensor()>& call) {
  if (!t.defined() || t.device() == fl::Device()) return call();
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<fl::detail::Communicator>> communicators;
  std::shared_ptr<fl::detail::Communicator> communicator;
  {
    std::lock_guard lock(mutex);
    auto& slot = communicators[t.device().str()];
    if (!slot) slot = fl::detail::make_communicator({t.device()});
    communicator = slot;
  }
  const fl::detail::ReplicaContext replica{communicator, 0, nullptr};
  const fl::detail::ReplicaScope scope(&replica);
  return call();
}

std::vector<Case> collective_cases(int64_t variants) {
  std::vector<Case> cases;
  for (const Case& c : kUnaryCases) {
    for (int64_t arg = 0; arg < variants; ++arg) cases.push_back(Case{c.shapes, arg});
  }
  return cases;
}

Row collective_row(std::string name, std::function<fl::Tensor(const fl::Tensor&, int64_t)> call, int64_t variants) {
  Row row;
  row.name = name;
  row.dtypes = kArith;
  row.cases = collective_cases(variants);
  row.make = random_inputs({Domain::normal});
  row.run = [call](const Inputs& in, const Case& c, fl::DType) {
    return as_participant_of(in[0], [&] { return call(in[0], c.arg); });
  };
  row.reference = [name](const std::vector<Host>& h, const Case&, fl::DType dt) -> std::optional<Expected> {
    if (h[0].shape.rank() == 0 && name == "reduce_scatter") return std::nullopt;  // needs an axis 0
    if (h[0].shape.rank() == 0 && name == "all_gather") return Expected{Host{h[0].values, fl::Shape{1}}, dt};
    return Expected{h[0], dt};
  };
  return row;
}

// ---------------------------------------------------------------------------------------------
// The table

// Rows of the convolution and normalization ops (issue 15), one file per part, included here so
// they see Row, Case and the helpers above.
#include "op_table/conv_rows.inc"
#include "op_table/norm_rows.inc"

std::vector<Row> build_table() {
  std::vector<Row> rows;
  const Domain N = Domain::normal;

  // Elementwise binary ops.
  rows.push_back(binary_row("add", &fl::add, [](double a, double b) { return a + b; }, kArith, N, N, false));
  rows.push_back(binary_row("sub", &fl::sub, [](double a, double b) { return a - b; }, kArith, Domain::big, N, false));
  rows.push_back(binary_row("mul", &fl::mul, [](double a, double b) { return a * b; }, kArith, N, N, false));
  rows.push_back(binary_row("div", &fl::div, [](double a, double b) { return a / b; }, kArith, N, Domain::nonzero, false));
  rows.back().errors.push_back(error<fl::InvalidArgument>(
      "integer division by zero", [] { (void)fl::div(fl::tensor({1, 2}), fl::tensor({1, 0})); }, {"zero"}));
  rows.push_back(binary_row("pow", &fl::pow, [](double a, double b) { return std::pow(a, b); }, kFloatMath,
                            Domain::positive, N, false));
  rows.back().errors.push_back(
      error<fl::DTypeError>("integer inputs", [] { (void)fl::pow(fl::tensor({1, 2}), fl::tensor({1, 2})); }, {"i32"}));
  rows.push_back(binary_row("maximum", &fl::maximum, [](double a, double b) { return std::max(a, b); }, kArith, N, N, false));
  rows.push_back(binary_row("minimum", &fl::minimum, [](double a, double b) { return std::min(a, b); }, kArith, N, N, false));
  const Domain S = Domain::small_ints;
  rows.push_back(binary_row("equal", &fl::equal, [](double a, double b) { return a == b ? 1.0 : 0.0; }, kArith, S, S, true));
  rows.push_back(binary_row("not_equal", &fl::not_equal, [](double a, double b) { return a != b ? 1.0 : 0.0; }, kArith, S, S, true));
  rows.push_back(binary_row("less", &fl::less, [](double a, double b) { return a < b ? 1.0 : 0.0; }, kArith, S, S, true));
  rows.push_back(binary_row("less_equal", &fl::less_equal, [](double a, double b) { return a <= b ? 1.0 : 0.0; }, kArith, S, S, true));
  rows.push_back(binary_row("greater", &fl::greater, [](double a, double b) { return a > b ? 1.0 : 0.0; }, kArith, S, S, true));
  rows.push_back(binary_row("greater_equal", &fl::greater_equal, [](double a, double b) { return a >= b ? 1.0 : 0.0; }, kArith, S, S, true));

  // Elementwise unary ops.
  rows.push_back(unary_row("neg", &fl::neg, [](double x) { return -x; }, {fl::f32, fl::f64, fl::i32, fl::i64, fl::f16, fl::bf16}, N));
  rows.push_back(unary_row("exp", &fl::exp, [](double x) { return std::exp(x); }, kFloatMath, N));
  rows.push_back(unary_row("log", &fl::log, [](double x) { return std::log(x); }, kFloatMath, Domain::positive));
  rows.push_back(unary_row("sqrt", &fl::sqrt, [](double x) { return std::sqrt(x); }, kFloatMath, Domain::positive));
  rows.push_back(unary_row("tanh", &fl::tanh, [](double x) { return std::tanh(x); }, kFloatMath, N));
  rows.push_back(unary_row("sigmoid", &fl::sigmoid, [](double x) { return 1 / (1 + std::exp(-x)); }, kFloatMath, N));
  rows.push_back(unary_row("relu", &fl::relu, [](double x) { return x > 0 ? x : 0.0; }, kArith, N));
  rows.push_back(unary_row("abs", &fl::abs, [](double x) { return std::abs(x); }, kArith, N));
  rows.push_back(unary_row("square", &fl::square, [](double x) { return x * x; }, kArith, N));
  rows.push_back(unary_row("log1p", &fl::log1p, [](double x) { return std::log1p(x); }, kFloatMath, Domain::positive));
  rows.push_back(unary_row("expm1", &fl::expm1, [](double x) { return std::expm1(x); }, kFloatMath, N));
  rows.push_back(unary_row("erf", &fl::erf, [](double x) { return std::erf(x); }, kFloatMath, N));
  rows.push_back(unary_row("gelu", &fl::gelu, [](double x) { return 0.5 * x * std::erfc(-x / std::sqrt(2.0)); },
                           kFloatMath, N));
  rows.push_back(unary_row("sign", &fl::sign, [](double x) { return x > 0 ? 1.0 : x < 0 ? -1.0 : x; }, kArith, N));
  // Castable values include k + 0.5, where round's halves-to-even rule shows.
  rows.push_back(unary_row("floor", &fl::floor, [](double x) { return std::floor(x); }, kFloatMath, Domain::castable));
  rows.push_back(unary_row("round", &fl::round, [](double x) { return std::nearbyint(x); }, kFloatMath, Domain::castable));
  {
    Row row;
    row.name = "clamp";
    row.dtypes = kArith;
    row.cases = {{{{2, 3}, {2, 3}, {2, 3}}}, {{{2, 3}, {}, {}}}, {{{4, 1}, {1, 5}, {5}}}, {{{0, 3}, {3}, {1}}}, {{{}, {}, {}}}};
    row.make = random_inputs({N, N, Domain::positive});
    row.run = [](const Inputs& in, const Case&, fl::DType) { return fl::clamp(in[0], in[1], in[2]); };
    row.reference = [](const std::vector<Host>& h, const Case&, fl::DType dt) -> std::optional<Expected> {
      const Host low = test::binary_ref(h[0], h[1], [](double x, double lo) { return x < lo ? lo : x; });
      return Expected{test::binary_ref(low, h[2], [](double x, double hi) { return x > hi ? hi : x; }), dt};
    };
    row.errors = {
        error<fl::ShapeError>("shapes that do not broadcast",
                              [] { (void)fl::clamp(fl::zeros(fl::Shape{2, 3}), fl::zeros(fl::Shape{4}), fl::zeros(fl::Shape{})); },
                              {"cannot broadcast", "[2, 3]", "[4]"}),
        error<fl::DTypeError>("mixed dtypes",
                              [] { (void)fl::clamp(fl::zeros(fl::Shape{2}), fl::zeros(fl::Shape{2}), fl::zeros(fl::Shape{2}, fl::f64)); },
                              {"f32", "f64"}),
        error<fl::DTypeError>("b8 input", [] { (void)fl::clamp(fl::zeros(fl::Shape{2}, fl::b8), 0.0, 1.0); }, {"b8"}),
        error<fl::InvalidArgument>("a bound the dtype cannot hold",
                                   [] { (void)fl::clamp(fl::tensor({1, 2}), 0.5, 2.0); }, {"0.5", "i32"}),
    };
    rows.push_back(std::move(row));
  }

  // where
  {
    Row row;
    row.name = "where";
    row.dtypes = {fl::f32, fl::f64, fl::i32, fl::i64, fl::u8, fl::f16, fl::bf16};
    row.cases = {{{{2, 3}, {2, 3}, {2, 3}}}, {{{2, 1}, {3}, {2, 3}}}, {{{}, {2, 3}, {}}}, {{{0, 3}, {3}, {1}}}};
    row.make = [](const Case& c, fl::DType dt, uint64_t seed) {
      return Inputs{test::random_tensor(c.shapes[0], seed, fl::b8), test::random_tensor(c.shapes[1], seed + 1, dt),
                    test::random_tensor(c.shapes[2], seed + 2, dt)};
    };
    row.run = [](const Inputs& in, const Case&, fl::DType) { return fl::where(in[0], in[1], in[2]); };
    row.reference = [](const std::vector<Host>& h, const Case&, fl::DType dt) -> std::optional<Expected> {
      return Expected{test::broadcast_map(h, [](const std::vector<double>& v) { return v[0] != 0 ? v[1] : v[2]; }), dt};
    };
    const fl::Tensor a = fl::zeros(fl::Shape{2});
    row.errors = {
        error<fl::DTypeError>("condition not b8", [a] { (void)fl::where(a, a, a); }, {"f32"}),
        error<fl::DTypeError>("a and b dtypes differ", [a] { (void)fl::where(a > 0.0f, a, fl::zeros(fl::Shape{2}, fl::f64)); },
                              {"f32", "f64"}),
        error<fl::ShapeError>("shapes that do not broadcast",
                              [a] { (void)fl::where(fl::zeros(fl::Shape{3}, fl::b8), a, a); }, {"[3]", "[2]"}),
    };
    rows.push_back(std::move(row));
  }

  // cast: Case::arg indexes the target dtype.
  {
    Row row;
    row.name = "cast";
    row.dtypes = test::kAllDTypes;
    for (int64_t target = 0; target < static_cast<int64_t>(test::kAllDTypes.size()); ++target) {
      row.cases.push_back({{{3, 4}}, target});
      row.cases.push_back({{{0, 2}}, target});
    }
    row.cases.push_back({{{}}, 1});
    row.make = random_inputs({Domain::castable});
    row.run = [](const Inputs& in, const Case& c, fl::DType) {
      return fl::cast(in[0], test::kAllDTypes[static_cast<size_t>(c.arg)]);
    };
    row.reference = [](const std::vector<Host>& h, const Case& c, fl::DType) -> std::optional<Expected> {
      const fl::DType to = test::kAllDTypes[static_cast<size_t>(c.arg)];
      return Expected{test::unary_ref(h[0], [to](double v) { return test::round_to(test::is_float(to) ? v : std::trunc(v), to); }),
                      to};
    };
    rows.push_back(std::move(row));
  }

  // sum and max
  {
    Row row;
    row.name = "sum";
    row.dtypes = {fl::f32, fl::f64, fl::i32, fl::i64, fl::u8, fl::b8, fl::f16, fl::bf16};
    row.cases = reduction_cases();
    row.make = random_inputs({N});
    row.run = [](const Inputs& in, const Case& c, fl::DType) { return run_reduction(&sum_all, &sum_some, in[0], c); };
    row.reference = [](const std::vector<Host>& h, const Case& c, fl::DType dt) -> std::optional<Expected> {
      const AxesSpec& spec = kAxesSpecs[static_cast<size_t>(c.arg)];
      const fl::DType out = test::is_float(dt) ? dt : fl::i64;  // halves sum to their own dtype
      return Expected{test::sum_ref(h[0], spec_axes(spec, h[0].shape.size()), spec.keepdims), out};
    };
    const fl::Tensor t = fl::zeros(fl::Shape{2, 3});
    row.errors = {
        error<fl::InvalidArgument>("axis out of range", [t] { (void)fl::sum(t, {2}); }, {"2"}),
        error<fl::InvalidArgument>("repeated axis", [t] { (void)fl::sum(t, {1, -1}); }),
        error<fl::InvalidArgument>("bf16 axis out of range", [] { (void)fl::sum(fl::zeros(fl::Shape{2}, fl::bf16), {1}); },
                                   {"1"}),
    };
    rows.push_back(std::move(row));
  }
  {
    Row row;
    row.name = "max";
    row.dtypes = kReducible;
    row.cases = reduction_cases();
    row.make = random_inputs({N});
    row.run = [](const Inputs& in, const Case& c, fl::DType) { return run_reduction(&max_all, &max_some, in[0], c); };
    row.reference = [](const std::vector<Host>& h, const Case& c, fl::DType dt) -> std::optional<Expected> {
      const AxesSpec& spec = kAxesSpecs[static_cast<size_t>(c.arg)];
      if (reduces_empty_axis(spec, h[0].shape)) return std::nullopt;  // an error, checked below
      return Expected{test::max_ref(h[0], spec_axes(spec, h[0].shape.size()), spec.keepdims), dt};
    };
    const fl::Tensor t = fl::zeros(fl::Shape{2, 3});
    row.errors = {
        error<fl::InvalidArgument>("zero-size axis", [] { (void)fl::max(fl::zeros(fl::Shape{0, 3}), {0}); }, {"[0, 3]"}),
        error<fl::InvalidArgument>("no elements at all", [] { (void)fl::max(fl::zeros(fl::Shape{0})); }),
        error<fl::InvalidArgument>("axis out of range", [t] { (void)fl::max(t, {-3}); }, {"-3"}),
        error<fl::InvalidArgument>("repeated axis", [t] { (void)fl::max(t, {0, 0}); }),
        error<fl::DTypeError>("b8 input", [] { (void)fl::max(fl::zeros(fl::Shape{2}, fl::b8)); }, {"b8"}),
        error<fl::InvalidArgument>("zero-size axis in f16", [] { (void)fl::max(fl::zeros(fl::Shape{0}, fl::f16)); }),
    };
    rows.push_back(std::move(row));
  }

  // argmax: Case::arg is the axis.
  {
    Row row;
    row.name = "argmax";
    row.dtypes = kReducible;
    row.cases = {{{{3, 4, 5}}, 0}, {{{3, 4, 5}}, 1}, {{{3, 4, 5}}, 2}, {{{3, 4, 5}}, -1}, {{{3, 0, 2}}, 2},
                 {{{6}}, 0},       {{{1, 1}}, -2}};
    row.make = random_inputs({Domain::small_ints});
    row.run = [](const Inputs& in, const Case& c, fl::DType) { return fl::argmax(in[0], c.arg); };
    row.reference = [](const std::vector<Host>& h, const Case& c, fl::DType) -> std::optional<Expected> {
      return Expected{test::argmax_ref(h[0], c.arg), fl::i64};
    };
    row.errors = {
        error<fl::InvalidArgument>("zero-size axis", [] { (void)fl::argmax(fl::zeros(fl::Shape{2, 0}), 1); }, {"[2, 0]"}),
        error<fl::InvalidArgument>("axis out of range", [] { (void)fl::argmax(fl::zeros(fl::Shape{2, 3}), 2); }, {"2"}),
        error<fl::DTypeError>("b8 input", [] { (void)fl::argmax(fl::zeros(fl::Shape{2}, fl::b8), 0); }, {"b8"}),
    };
    rows.push_back(std::move(row));
  }

  // matmul
  {
    Row row;
    row.name = "matmul";
    row.dtypes = kFloatMath;  // f16/bf16 multiply in f32 and round the result once
    row.cases = {{{{3, 4}, {4, 5}}},       {{{2, 3, 4}, {2, 4, 5}}}, {{{2, 3, 4}, {4, 5}}}, {{{3, 4}, {2, 4, 5}}},
                 {{{3, 0}, {0, 2}}},       {{{0, 3}, {3, 2}}},       {{{1, 1}, {1, 1}}},    {{{5, 8}, {8, 3}}}};
    row.make = random_inputs({N, N});
    row.run = [](const Inputs& in, const Case&, fl::DType) { return fl::matmul(in[0], in[1]); };
    row.reference = [](const std::vector<Host>& h, const Case&, fl::DType dt) -> std::optional<Expected> {
      return Expected{test::matmul_ref(h[0], h[1]), dt};
    };
    row.tolerance = test::Tolerance{1e-5, 1e-5};
    row.errors = {
        error<fl::ShapeError>("inner dimensions differ",
                              [] { (void)fl::matmul(fl::zeros(fl::Shape{2, 3}), fl::zeros(fl::Shape{4, 5})); },
                              {"inner dimensions differ; got a [2, 3] and b [4, 5]"}),
        error<fl::ShapeError>("rank 1", [] { (void)fl::matmul(fl::zeros(fl::Shape{3}), fl::zeros(fl::Shape{3, 1})); }, {"[3]"}),
        error<fl::ShapeError>("batch sizes differ",
                              [] { (void)fl::matmul(fl::zeros(fl::Shape{2, 3, 4}), fl::zeros(fl::Shape{3, 4, 5})); },
                              {"[2, 3, 4]", "[3, 4, 5]"}),
        error<fl::DTypeError>("integer inputs",
                              [] { (void)fl::matmul(fl::zeros(fl::Shape{2, 2}, fl::i32), fl::zeros(fl::Shape{2, 2}, fl::i32)); },
                              {"i32"}),
        error<fl::DTypeError>("f16 @ f32",
                              [] { (void)fl::matmul(fl::zeros(fl::Shape{2, 2}, fl::f16), fl::zeros(fl::Shape{2, 2})); },
                              {"f16", "f32"}),
        error<fl::DTypeError>("mixed dtypes",
                              [] { (void)fl::matmul(fl::zeros(fl::Shape{2, 2}), fl::zeros(fl::Shape{2, 2}, fl::f64)); },
                              {"f32", "f64"}),
    };
    rows.push_back(std::move(row));
  }

  // reshape: Case::shapes[1] is the target (not an input).
  {
    Row row;
    row.name = "reshape";
    row.dtypes = test::kAllDTypes;
    row.cases = {{{{2, 3, 4}, {-1}}}, {{{2, 3, 4}, {4, -1}}}, {{{2, 3, 4}, {3, 2, 2, 2}}}, {{{0, 3}, {3, 0}}},
                 {{{0, 3}, {-1, 3}}}, {{{}, {1, 1}}},          {{{1, 1}, {}}}};
    row.make = random_inputs({N});
    row.run = [](const Inputs& in, const Case& c, fl::DType) { return fl::reshape(in[0], c.shapes[1]); };
    row.reference = [](const std::vector<Host>& h, const Case& c, fl::DType dt) -> std::optional<Expected> {
      return Expected{Host{h[0].values, resolve(c.shapes[1], h[0].shape.numel())}, dt};
    };
    const fl::Tensor t = fl::zeros(fl::Shape{2, 3});
    row.errors = {
        error<fl::ShapeError>("element count differs", [t] { (void)fl::reshape(t, fl::Shape{4}); }, {"[2, 3]", "[4]"}),
        error<fl::ShapeError>("two -1", [t] { (void)fl::reshape(t, fl::Shape{-1, -1}); }, {"[-1, -1]"}),
        error<fl::ShapeError>("negative dimension", [t] { (void)fl::reshape(t, fl::Shape{-2, -3}); }, {"[-2, -3]"}),
    };
    rows.push_back(std::move(row));
  }

  // permute: Case::arg indexes kPerms.
  {
    Row row;
    row.name = "permute";
    row.dtypes = test::kAllDTypes;
    row.cases = {{{{2, 3, 4}}, 0}, {{{2, 3, 4}}, 1}, {{{3, 5}}, 2}, {{{2, 0, 3}}, 0}, {{{2, 3, 4}}, 3}, {{{}}, 4}, {{{4}}, 5}};
    row.make = random_inputs({N});
    row.run = [](const Inputs& in, const Case& c, fl::DType) { return fl::permute(in[0], kPerms[static_cast<size_t>(c.arg)]); };
    row.reference = [](const std::vector<Host>& h, const Case& c, fl::DType dt) -> std::optional<Expected> {
      return Expected{test::permute_ref(h[0], kPerms[static_cast<size_t>(c.arg)]), dt};
    };
    const fl::Tensor t = fl::zeros(fl::Shape{2, 3, 4});
    row.errors = {
        error<fl::InvalidArgument>("repeated axis", [t] { (void)fl::permute(t, {0, 0, 1}); }),
        error<fl::InvalidArgument>("wrong length", [t] { (void)fl::permute(t, {1, 0}); }),
        error<fl::InvalidArgument>("axis out of range", [t] { (void)fl::permute(t, {0, 1, 3}); }, {"3"}),
    };
    rows.push_back(std::move(row));
  }

  // concat: one input per shape; Case::arg is the axis.
  {
    Row row;
    row.name = "concat";
    row.dtypes = test::kAllDTypes;
    row.cases = {{{{2, 3}, {4, 3}}, 0},        {{{2, 3}, {2, 1}, {2, 2}}, -1}, {{{2, 0}, {2, 3}}, 1},
                 {{{1, 2, 3}, {1, 2, 3}}, 1}, {{{0, 3}, {0, 3}}, 0},          {{{5}}, 0}};
    row.make = [](const Case& c, fl::DType dt, uint64_t seed) {
      Inputs in;
      for (const fl::Shape& s : c.shapes) in.push_back(test::random_tensor(s, seed++, dt));
      return in;
    };
    row.run = [](const Inputs& in, const Case& c, fl::DType) { return fl::concat(in, c.arg); };
    row.reference = [](const std::vector<Host>& h, const Case& c, fl::DType dt) -> std::optional<Expected> {
      return Expected{test::concat_ref(h, c.arg), dt};
    };
    const fl::Tensor t = fl::zeros(fl::Shape{2, 3});
    row.errors = {
        error<fl::InvalidArgument>("no inputs", [] { (void)fl::concat({}, 0); }),
        error<fl::DTypeError>("mixed dtypes", [t] { (void)fl::concat({t, fl::zeros(fl::Shape{2, 3}, fl::i32)}, 0); },
                              {"f32", "i32"}),
        error<fl::ShapeError>("other dimensions differ", [t] { (void)fl::concat({t, fl::zeros(fl::Shape{2, 4})}, 0); },
                              {"[2, 3]", "[2, 4]"}),
        error<fl::ShapeError>("ranks differ", [t] { (void)fl::concat({t, fl::zeros(fl::Shape{3})}, 0); }),
        error<fl::InvalidArgument>("axis out of range", [t] { (void)fl::concat({t, t}, 2); }, {"2"}),
    };
    rows.push_back(std::move(row));
  }

  // gather: params of the row dtype, indices i64 (arg 0) or i32 (arg 1).
  {
    Row row;
    row.name = "gather";
    row.dtypes = test::kAllDTypes;
    row.cases = {{{{5, 3}, {4}}, 0}, {{{5, 3}, {2, 3}}, 1}, {{{4}, {6}}, 0}, {{{3, 2, 2}, {}}, 1}, {{{3, 2}, {0}}, 0},
                 {{{3, 0}, {2}}, 0}};
    row.make = [](const Case& c, fl::DType dt, uint64_t seed) {
      return Inputs{test::random_tensor(c.shapes[0], seed, dt),
                    random_indices(c.shapes[1], c.shapes[0][0], seed + 1, c.arg == 0 ? fl::i64 : fl::i32)};
    };
    row.run = [](const Inputs& in, const Case&, fl::DType) { return fl::gather(in[0], in[1]); };
    row.reference = [](const std::vector<Host>& h, const Case&, fl::DType dt) -> std::optional<Expected> {
      return Expected{test::gather_ref(h[0], h[1]), dt};
    };
    const fl::Tensor p = fl::zeros(fl::Shape{3, 2});
    row.errors = {
        error<fl::OutOfRange>("index past the end", [p] { (void)fl::gather(p, fl::tensor({int64_t{0}, int64_t{7}})); }, {"7"}),
        error<fl::OutOfRange>("negative index", [p] { (void)fl::gather(p, fl::tensor({-1})); }, {"-1"}),
        error<fl::DTypeError>("float indices", [p] { (void)fl::gather(p, fl::zeros(fl::Shape{2})); }, {"f32"}),
    };
    rows.push_back(std::move(row));
  }

  // slice: Case::arg indexes kSliceSpecs.
  {
    Row row;
    row.name = "slice";
    row.dtypes = test::kAllDTypes;
    row.cases = {{{{3, 4, 5}}, 0}, {{{3, 4, 5}}, 1}, {{{3, 4, 5}}, 2}, {{{3, 4, 5}}, 3}, {{{3, 4, 5}}, 4},
                 {{{2, 3}}, 5},    {{{5}}, 6},       {{{4, 2}}, 7},    {{{0, 3}}, 5},    {{{6}}, 0}};
    row.make = random_inputs({N});
    row.run = [](const Inputs& in, const Case& c, fl::DType) {
      const SliceSpec& s = kSliceSpecs[static_cast<size_t>(c.arg)];
      return fl::slice(in[0], s.axis, s.start, s.length);
    };
    row.reference = [](const std::vector<Host>& h, const Case& c, fl::DType dt) -> std::optional<Expected> {
      return Expected{slice_ref(h[0], kSliceSpecs[static_cast<size_t>(c.arg)]), dt};
    };
    const fl::Tensor t = fl::zeros(fl::Shape{3, 4});
    row.errors = {
        error<fl::OutOfRange>("range past the end", [t] { (void)fl::slice(t, 1, 2, 3); }, {"[3, 4]"}),
        error<fl::OutOfRange>("negative start", [t] { (void)fl::slice(t, 0, -1, 2); }, {"[3, 4]"}),
        error<fl::OutOfRange>("negative length", [t] { (void)fl::slice(t, 0, 1, -1); }, {"[3, 4]"}),
        error<fl::OutOfRange>("start past the end", [t] { (void)fl::slice(t, 0, 4, 0); }, {"[3, 4]"}),
        error<fl::OutOfRange>("huge length", [t] { (void)fl::slice(t, 0, 1, std::numeric_limits<int64_t>::max()); }),
        error<fl::ShapeError>("rank 0", [] { (void)fl::slice(fl::scalar(1.0f), 0, 0, 1); }, {"[]"}),
        error<fl::InvalidArgument>("axis out of range", [t] { (void)fl::slice(t, 2, 0, 1); }, {"2"}),
        error<fl::InvalidArgument>("negative axis out of range", [t] { (void)fl::slice(t, -3, 0, 1); }, {"-3"}),
    };
    rows.push_back(std::move(row));
  }

  // scatter_add: Case::shapes = {indices, updates}; Case::arg indexes kScatterSpecs (rows, index
  // dtype). More indices than rows, so repeated indices accumulate.
  {
    Row row;
    row.name = "scatter_add";
    row.dtypes = {fl::f32, fl::f64, fl::i32, fl::i64, fl::u8};
    row.cases = {{{{6}, {6, 2}}, 0},    {{{2, 3}, {2, 3, 2}}, 1}, {{{5}, {5}}, 2},   {{{}, {3}}, 3},
                 {{{0}, {0, 4}}, 4},    {{{4}, {4, 0}}, 5},       {{{3}, {3, 2, 2}}, 6}};
    row.make = [](const Case& c, fl::DType dt, uint64_t seed) {
      const ScatterSpec& s = kScatterSpecs[static_cast<size_t>(c.arg)];
      return Inputs{random_indices(c.shapes[0], std::max<int64_t>(s.rows, 1), seed, s.index_dtype),
                    test::random_tensor(c.shapes[1], seed + 1, dt)};
    };
    row.run = [](const Inputs& in, const Case& c, fl::DType) {
      return fl::scatter_add(in[0], in[1], kScatterSpecs[static_cast<size_t>(c.arg)].rows);
    };
    row.reference = [](const std::vector<Host>& h, const Case& c, fl::DType dt) -> std::optional<Expected> {
      return Expected{scatter_add_ref(h[0], h[1], kScatterSpecs[static_cast<size_t>(c.arg)].rows), dt};
    };
    row.tolerance = test::Tolerance{2e-5, 2e-6};  // f32 sums of up to six values
    const fl::Tensor idx = fl::tensor({int64_t{0}, int64_t{2}});
    const fl::Tensor upd = fl::zeros(fl::Shape{2, 3});
    row.errors = {
        error<fl::OutOfRange>("index past the end", [upd] { (void)fl::scatter_add(fl::tensor({int64_t{0}, int64_t{7}}), upd, 3); },
                              {"7"}),
        error<fl::OutOfRange>("negative index", [upd] { (void)fl::scatter_add(fl::tensor({0, -1}), upd, 3); }, {"-1"}),
        error<fl::DTypeError>("float indices", [upd] { (void)fl::scatter_add(fl::zeros(fl::Shape{2}), upd, 3); }, {"f32"}),
        error<fl::DTypeError>("u8 indices", [upd] { (void)fl::scatter_add(fl::zeros(fl::Shape{2}, fl::u8), upd, 3); }, {"u8"}),
        error<fl::DTypeError>("b8 updates", [idx] { (void)fl::scatter_add(idx, fl::zeros(fl::Shape{2, 3}, fl::b8), 3); },
                              {"b8"}),
        error<fl::DTypeError>("f16 updates", [idx] { (void)fl::scatter_add(idx, fl::zeros(fl::Shape{2, 3}, fl::f16), 3); },
                              {"f16"}),
        error<fl::InvalidArgument>("negative rows", [idx, upd] { (void)fl::scatter_add(idx, upd, -1); }, {"-1"}),
        error<fl::ShapeError>("updates do not start with the indices' shape",
                              [idx] { (void)fl::scatter_add(idx, fl::zeros(fl::Shape{3, 2}), 3); }, {"[2]", "[3, 2]"}),
        error<fl::ShapeError>("updates of lower rank than indices",
                              [] { (void)fl::scatter_add(fl::zeros(fl::Shape{2, 2}, fl::i64), fl::zeros(fl::Shape{2}), 3); },
                              {"[2, 2]", "[2]"}),
    };
    rows.push_back(std::move(row));
  }

  // copy (what Tensor::contiguous runs on a view), called through dispatch so contiguous inputs
  // exercise it too.
  {
    Row row;
    row.name = "copy";
    row.dtypes = test::kAllDTypes;
    row.cases = {{{{2, 3}}}, {{{3, 4, 2}}}, {{{}}}, {{{0, 5}}}, {{{9}}}};
    row.make = random_inputs({N});
    row.run = [](const Inputs& in, const Case&, fl::DType) {
      const fl::Op* op = fl::find_op("copy");
      REQUIRE(op != nullptr);
      const fl::Tensor out = fl::dispatch(*op, {in[0]});
      CHECK(out.is_contiguous());
      CHECK(in[0].contiguous().is_contiguous());
      return out;
    };
    row.reference = [](const std::vector<Host>& h, const Case&, fl::DType dt) -> std::optional<Expected> {
      return Expected{h[0], dt};
    };
    rows.push_back(std::move(row));
  }

  // to_device (Tensor::to): to the one existing device.
  {
    Row row;
    row.name = "to_device";
    row.dtypes = test::kAllDTypes;
    row.cases = {{{{2, 3}}}, {{{}}}, {{{0, 5}}}, {{{2, 2, 2}}}};
    row.make = random_inputs({N});
    row.run = [](const Inputs& in, const Case&, fl::DType) { return in[0].to(fl::Device("cpu:0")); };
    row.reference = [](const std::vector<Host>& h, const Case&, fl::DType dt) -> std::optional<Expected> {
      return Expected{h[0], dt};
    };
    row.errors = {
        // cpu:5: this file configures cpu:0 and cpu:1 (the other-devices check).
        error<fl::DeviceError>("missing cpu device", [] { (void)fl::zeros(fl::Shape{2}).to(fl::Device("cpu:5")); }, {"cpu:5"}),
        error<fl::DeviceError>("missing cuda device", [] { (void)fl::zeros(fl::Shape{2}).to(fl::Device("cuda:0")); },
                               {"cuda:0"}),
    };
    rows.push_back(std::move(row));
  }

  // one_hot: the row dtype is the index dtype; Case::arg is the depth.
  {
    Row row;
    row.name = "one_hot";
    row.dtypes = {fl::i32, fl::i64};
    row.cases = {{{{4}}, 5}, {{{2, 3}}, 4}, {{{}}, 3}, {{{0}}, 2}, {{{3}}, 1}};
    row.make = [](const Case& c, fl::DType dt, uint64_t seed) {
      return Inputs{random_indices(c.shapes[0], c.arg, seed, dt)};
    };
    row.run = [](const Inputs& in, const Case& c, fl::DType) { return fl::one_hot(in[0], c.arg); };
    row.reference = [](const std::vector<Host>& h, const Case& c, fl::DType) -> std::optional<Expected> {
      Host out{{}, h[0].shape};
      out.shape.push_back(c.arg);
      for (double index : h[0].values)
        for (int64_t j = 0; j < c.arg; ++j) out.values.push_back(static_cast<double>(j) == index ? 1.0 : 0.0);
      return Expected{out, fl::f32};
    };
    row.errors = {
        error<fl::InvalidArgument>("negative depth", [] { (void)fl::one_hot(fl::tensor({int64_t{0}}), -1); }, {"-1"}),
        error<fl::OutOfRange>("index not below depth", [] { (void)fl::one_hot(fl::tensor({int64_t{3}}), 3); }, {"3"}),
        error<fl::OutOfRange>("negative index", [] { (void)fl::one_hot(fl::tensor({-2}), 3); }, {"-2"}),
    };
    rows.push_back(std::move(row));
  }

  // softmax and log_softmax: Case::arg is the axis.
  for (const bool log : {false, true}) {
    Row row;
    row.name = log ? "log_softmax" : "softmax";
    row.dtypes = kFloats;
    row.cases = {{{{2, 5}}, -1}, {{{3, 4}}, 0}, {{{2, 3, 4}}, 1}, {{{0, 3}}, -1}, {{{7}}, 0}, {{{2, 3}}, -2}};
    row.make = random_inputs({N});
    if (log) {
      row.run = [](const Inputs& in, const Case& c, fl::DType) { return fl::log_softmax(in[0], c.arg); };
      row.reference = [](const std::vector<Host>& h, const Case& c, fl::DType dt) -> std::optional<Expected> {
        return Expected{test::log_softmax_ref(h[0], c.arg), dt};
      };
    } else {
      row.run = [](const Inputs& in, const Case& c, fl::DType) { return fl::softmax(in[0], c.arg); };
      row.reference = [](const std::vector<Host>& h, const Case& c, fl::DType dt) -> std::optional<Expected> {
        return Expected{test::softmax_ref(h[0], c.arg), dt};
      };
    }
    const auto fn = log ? +[](const fl::Tensor& t, int64_t axis) { return fl::log_softmax(t, axis); }
                        : +[](const fl::Tensor& t, int64_t axis) { return fl::softmax(t, axis); };
    row.errors = {
        error<fl::InvalidArgument>("axis out of range", [fn] { (void)fn(fl::zeros(fl::Shape{2, 3}), 2); }, {"2"}),
        error<fl::DTypeError>("integer input", [fn] { (void)fn(fl::zeros(fl::Shape{2, 3}, fl::i64), -1); }, {"i64"}),
    };
    rows.push_back(std::move(row));
  }

  // softmax_cross_entropy: logits of the row dtype, labels i64 (arg 0) or i32 (arg 1).
  {
    Row row;
    row.name = "softmax_cross_entropy";
    row.dtypes = kFloats;
    row.cases = {{{{4, 5}, {4}}, 0}, {{{4, 5}, {4}}, 1}, {{{1, 3}, {1}}, 0}, {{{0, 3}, {0}}, 0}, {{{6, 1}, {6}}, 1}};
    row.make = [](const Case& c, fl::DType dt, uint64_t seed) {
      return Inputs{test::random_tensor(c.shapes[0], seed, dt),
                    random_indices(c.shapes[1], c.shapes[0][1], seed + 1, c.arg == 0 ? fl::i64 : fl::i32)};
    };
    row.run = [](const Inputs& in, const Case&, fl::DType) { return fl::softmax_cross_entropy(in[0], in[1]); };
    row.reference = [](const std::vector<Host>& h, const Case&, fl::DType dt) -> std::optional<Expected> {
      const Host lsm = test::log_softmax_ref(h[0], -1);
      const int64_t classes = h[0].shape[1];
      Host out{{}, fl::Shape{h[0].shape[0]}};
      for (size_t i = 0; i < h[1].values.size(); ++i)
        out.values.push_back(-lsm.values[static_cast<size_t>(static_cast<int64_t>(i) * classes + static_cast<int64_t>(h[1].values[i]))]);
      return Expected{out, dt};
    };
    const fl::Tensor logits = fl::zeros(fl::Shape{4, 3});
    row.errors = {
        error<fl::ShapeError>("N differs", [logits] { (void)fl::softmax_cross_entropy(logits, fl::zeros(fl::Shape{5}, fl::i64)); },
                              {"[4, 3]", "[5]"}),
        error<fl::ShapeError>("logits not rank 2",
                              [] { (void)fl::softmax_cross_entropy(fl::zeros(fl::Shape{4}), fl::zeros(fl::Shape{4}, fl::i64)); },
                              {"[4]"}),
        error<fl::OutOfRange>("label not below C",
                              [logits] { (void)fl::softmax_cross_entropy(logits, fl::tensor({int64_t{0}, int64_t{3}, int64_t{1}, int64_t{1}})); },
                              {"3"}),
        error<fl::DTypeError>("float labels", [logits] { (void)fl::softmax_cross_entropy(logits, fl::zeros(fl::Shape{4})); },
                              {"f32"}),
    };
    rows.push_back(std::move(row));
  }

  // Creation ops.
  {
    Row row;
    row.name = "full";
    row.dtypes = test::kAllDTypes;
    row.cases = {{{{2, 3}}}, {{{}}}, {{{0, 4}}}, {{{2, 1, 2}}}};
    row.make = &no_inputs;
    row.run = [](const Inputs&, const Case& c, fl::DType dt) { return fl::full(c.shapes[0], full_value(dt), dt); };
    row.reference = [](const std::vector<Host>&, const Case& c, fl::DType dt) -> std::optional<Expected> {
      const double v = test::round_to(full_value(dt), dt);
      return Expected{Host{std::vector<double>(static_cast<size_t>(c.shapes[0].numel()), v), c.shapes[0]}, dt};
    };
    row.errors = {
        error<fl::ShapeError>("negative dimension", [] { (void)fl::full(kNegative, 1.0); }, {"[2, -1]"}),
        error<fl::ShapeError>("element count overflows", [] { (void)fl::full(kOverflow, 1.0); }),
        error<fl::InvalidArgument>("value not representable", [] { (void)fl::full(fl::Shape{2}, 2.5, fl::i32); }, {"2.5", "i32"}),
        error<fl::InvalidArgument>("value out of range", [] { (void)fl::full(fl::Shape{2}, 300, fl::u8); }, {"300", "u8"}),
        error<fl::DeviceError>("missing device", [] { (void)fl::full(fl::Shape{2}, 1.0, fl::f32, fl::Device("cuda:0")); },
                               {"cuda:0"}),
    };
    rows.push_back(std::move(row));
  }
  {
    Row row;
    row.name = "arange";
    row.dtypes = {fl::f32, fl::f64, fl::i32, fl::i64, fl::u8};
    row.cases = {{{{5}}}, {{{0}}}, {{{1}}}, {{{100}}}};
    row.make = &no_inputs;
    row.run = [](const Inputs&, const Case& c, fl::DType dt) { return fl::arange(c.shapes[0][0], dt); };
    row.reference = [](const std::vector<Host>&, const Case& c, fl::DType dt) -> std::optional<Expected> {
      Host out{{}, c.shapes[0]};
      for (int64_t i = 0; i < c.shapes[0][0]; ++i) out.values.push_back(static_cast<double>(i));
      return Expected{out, dt};
    };
    row.errors = {
        error<fl::DeviceError>("missing device", [] { (void)fl::arange(3, fl::i64, fl::Device("cpu:5")); }, {"cpu:5"}),
    };
    rows.push_back(std::move(row));
  }
  {
    Row row;
    row.name = "randn";
    row.dtypes = kFloats;
    row.cases = {{{{3, 4}}}, {{{0}}}, {{{2000}}}, {{{}}}, {{{5, 1, 7}}}};
    row.make = &no_inputs;
    row.run = [](const Inputs&, const Case& c, fl::DType dt) { return fl::randn(c.shapes[0], 99, dt); };
    row.property = [](const fl::Tensor& got, const Case& c, fl::DType dt, uint64_t) {
      return random_properties(got, c, dt, 99, [dt](const fl::Shape& s) { return fl::randn(s, 99, dt); },
                               -std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity());
    };
    row.errors = {
        error<fl::ShapeError>("negative dimension", [] { (void)fl::randn(kNegative, 1); }, {"[2, -1]"}),
        error<fl::ShapeError>("element count overflows", [] { (void)fl::randn(kOverflow, 1); }),
        error<fl::DeviceError>("missing device", [] { (void)fl::randn(fl::Shape{2}, 1, fl::f32, fl::Device("cuda:0")); },
                               {"cuda:0"}),
    };
    rows.push_back(std::move(row));
  }
  {
    Row row;
    row.name = "uniform";
    row.dtypes = kFloats;
    row.cases = {{{{3, 4}}}, {{{0}}}, {{{2000}}}, {{{}}}, {{{5, 1, 7}}}};
    row.make = &no_inputs;
    row.run = [](const Inputs&, const Case& c, fl::DType dt) { return fl::uniform(c.shapes[0], -2.0, 3.0, 98, dt); };
    row.property = [](const fl::Tensor& got, const Case& c, fl::DType dt, uint64_t) {
      return random_properties(got, c, dt, 98, [dt](const fl::Shape& s) { return fl::uniform(s, -2.0, 3.0, 98, dt); },
                               -2.0, 3.0);
    };
    row.errors = {
        error<fl::InvalidArgument>("empty range", [] { (void)fl::uniform(fl::Shape{2}, 1.0, 1.0, 0); }),
        error<fl::InvalidArgument>("reversed range", [] { (void)fl::uniform(fl::Shape{2}, 1.0, 0.0, 0); }),
        error<fl::ShapeError>("negative dimension", [] { (void)fl::uniform(kNegative, 0.0, 1.0, 1); }, {"[2, -1]"}),
    };
    rows.push_back(std::move(row));
  }
  rows.push_back(collective_row("all_reduce", [](const fl::Tensor& t, int64_t arg) {
    return fl::all_reduce(t, kCollectiveReductions.at(static_cast<size_t>(arg)));
  }, 4));
  rows.back().errors = {
      error<fl::DTypeError>("a b8 sum", [] { (void)fl::all_reduce(fl::zeros(fl::Shape{2}, fl::b8)); }, {"b8", "sum"}),
  };
  rows.push_back(collective_row("broadcast", [](const fl::Tensor& t, int64_t) { return fl::broadcast(t, 0); }, 1));
  rows.back().errors = {
      error<fl::InvalidArgument>("a root outside the participants", [] { (void)fl::broadcast(fl::zeros(fl::Shape{2}), 1); },
                                 {"root 1", "[0, 1)"}),
  };
  rows.push_back(collective_row("all_gather", [](const fl::Tensor& t, int64_t) { return fl::all_gather(t); }, 1));
  rows.push_back(collective_row("reduce_scatter", [](const fl::Tensor& t, int64_t arg) {
    return fl::reduce_scatter(t, kCollectiveReductions.at(static_cast<size_t>(arg)));
  }, 4));
  rows.back().errors = {
      error<fl::ShapeError>("a scalar", [] { (void)fl::reduce_scatter(fl::scalar(1.0f)); }, {"[]", "equal parts"}),
  };
  add_conv_rows(rows);
  add_norm_rows(rows);
  return rows;
}

const std::vector<Row>& table() {
  static const std::vector<Row> rows = build_table();
  return rows;
}

// The registered primitive ops listed in docs/SEMANTICS.md: all_ops() must hold at least these.
const std::vector<std::string> kDocumentedOps = {
    "add",  "sub",    "mul",     "div",       "pow",        "maximum", "minimum",     "neg",     "exp",    "log",
    "sqrt", "tanh",   "sigmoid", "relu",      "abs",        "square",  "equal",       "not_equal", "less", "less_equal",
    "greater", "greater_equal", "where", "cast", "sum",     "max",     "argmax",      "matmul",  "reshape", "permute",
    "concat", "gather", "copy",  "to_device", "one_hot",    "softmax", "log_softmax", "softmax_cross_entropy",
    "full", "arange", "randn",   "uniform",   "log1p",      "expm1",   "erf",         "gelu",    "sign",   "floor",
    "round", "clamp",
};

// Registered ops without a row, each with the reason and the tests that check it instead. The
// coverage test fails for an op that has neither a row nor an entry here.
const std::map<std::string, std::string> kWithoutRow = [] {
  std::map<std::string, std::string> ops = {
      {"read_variable", "graph-only, recorded by Variable::value() while tracing (test_trace, test_placement)"},
      {"assign_variable", "graph-only, recorded by Variable::assign* while tracing (test_trace, test_placement)"},
      {"assign_matmul", "graph-only, made by the fuse_variable_updates pass (test_trace, test_half_training)"},
      {"optimizer_update", "returns nothing; emitted by the built-in optimizers' apply() (test_optim checks it against update())"},
      {"send", "graph-only, inserted by the partition pass (test_partition)"},
      {"recv", "graph-only, inserted by the partition pass (test_partition)"},
      {"queue_enqueue", "graph-only, recorded by Queue::enqueue while tracing (test_queue_graph)"},
      {"queue_dequeue", "graph-only, recorded by Queue::dequeue while tracing (test_queue_graph)"},
      {"fused_elementwise", "inserted by the fusion pass, no public function (test_fusion checks it against the unfused ops)"},
      {"matmul_bias", "inserted by the fuse_matmul_bias pass, no public function (test_fusion_dense checks it against matmul, add and relu)"},
      {"relu_bias_grad", "inserted by the fuse_relu_bias_grad pass, no public function (test_fusion_dense checks it against where and sum)"},
      {"softmax_cross_entropy_grad", "inserted by the fuse_cross_entropy_grad pass, no public function (test_fusion_loss checks it against the unfused ops)"},
      {"softmax_cross_entropy_with_probs", "inserted by the fuse_cross_entropy_grad pass, no public function (test_fusion_loss checks its loss and probs against softmax_cross_entropy and softmax)"},
      {"softmax_cross_entropy_grad_from_probs", "inserted by the fuse_cross_entropy_grad pass, no public function (test_fusion_loss checks it against softmax_cross_entropy_grad)"},
      {"print", "writes to stderr and returns its input (test_trace)"},
      {"host_callback", "returns nothing; calls host code (test_trace)"},
      {"barrier", "returns nothing and takes no tensor (test_collective_ops)"},
      {"ps_pull", "a parameter-server worker's read; needs a WorkerClient and servers (test_ps_worker)"},
      {"ps_lookup", "a parameter-server worker's row gather; needs a WorkerClient and servers (test_ps_worker)"},
      {"ps_push", "a parameter-server worker's push; returns nothing, needs a WorkerClient (test_ps_worker)"},
  };
  add_conv_ops_without_row(ops);
  add_norm_ops_without_row(ops);
  return ops;
}();

struct Outcome {
  int compared = 0;
  int skipped = 0;
};

// Runs every case of `row` in every dtype through `transform` (identity, or a non-contiguous view).
Outcome run_row(const Row& row, const std::function<fl::Tensor(const fl::Tensor&)>& transform) {
  Outcome outcome;
  uint64_t seed = std::hash<std::string>{}(row.name) % 100000;
  for (fl::DType dt : row.dtypes) {
    for (const Case& c : row.cases) {
      ++seed;
      INFO("op ", row.name, ", dtype ", fl::dtype_name(dt), ", case ", test::shape_text(c.shapes.at(0)),
           c.shapes.size() > 1 ? " and more" : "", ", arg ", c.arg);
      Inputs inputs = row.make(c, dt, seed * 1000);
      std::vector<Host> hosts;
      for (const fl::Tensor& t : inputs) hosts.push_back(test::host(t));
      Inputs used;
      for (const fl::Tensor& t : inputs) used.push_back(transform ? transform(t) : t);
      if (row.property) {
        try {
          const fl::Tensor got = row.run(used, c, dt);
          if (row.property(got, c, dt, seed)) ++outcome.compared;
        } catch (const std::exception& e) {
          FAIL_CHECK("threw " << test::error_kind(e) << ": " << e.what());
        }
        continue;
      }
      const std::optional<Expected> want = row.reference(hosts, c, dt);
      if (!want) {
        ++outcome.skipped;
        continue;
      }
      try {
        const fl::Tensor got = row.run(used, c, dt);
        const bool half = want->dtype == fl::f16 || want->dtype == fl::bf16;
        test::check_tensor(got, want->host.values, want->host.shape, want->dtype,
                           half ? std::nullopt : row.tolerance);
        // Ops never write into their inputs.
        for (size_t i = 0; i < used.size(); ++i)
          if (test::values(used[i]) != hosts[i].values) FAIL_CHECK("input " << i << " was modified by the op");
      } catch (const std::exception& e) {
        FAIL_CHECK("threw " << test::error_kind(e) << ": " << e.what());
      }
      ++outcome.compared;
    }
  }
  return outcome;
}

bool takes_tensors(const Row& row) {
  const Case& c = row.cases.at(0);
  return !row.make(c, row.dtypes.at(0), 1).empty();
}

}  // namespace

TEST_CASE("every registered op has exactly one row in the op table, and every row names a registered op") {
  const std::vector<fl::Op*>& ops = fl::all_ops();
  REQUIRE_FALSE(ops.empty());
  std::set<std::string> registered;
  for (const fl::Op* op : ops) {
    REQUIRE(op != nullptr);
    const std::string name(op->name);
    CAPTURE(name);
    CHECK_FALSE(name.empty());
    CHECK(registered.insert(name).second);  // names are unique
    CHECK(fl::find_op(name) == op);
    const bool has_rule = op->infer != nullptr;
    CHECK(has_rule);
    CHECK(op->runs_on(fl::DeviceKind::cpu));  // every op has a CPU kernel (a graph-only one may be asynchronous)
    int rows_for_op = 0;
    for (const Row& row : table()) rows_for_op += row.name == name ? 1 : 0;
    if (kWithoutRow.count(name) == 1) {
      CHECK_MESSAGE(rows_for_op == 0, "op '" << name << "' has a row: take it off kWithoutRow");
    } else {
      CHECK_MESSAGE(rows_for_op == 1, "op '" << name << "' needs exactly one row in tests/test_op_table.cpp (or, "
                                      "when it cannot have one, an entry with the reason in kWithoutRow)");
    }
  }
  for (const auto& [name, reason] : kWithoutRow) {
    CAPTURE(name);
    CHECK_MESSAGE(registered.count(name) == 1, "kWithoutRow names '" << name << "', which is not a registered op");
  }
  for (const Row& row : table()) {
    CAPTURE(row.name);
    CHECK_MESSAGE(fl::find_op(row.name) != nullptr, "row '" << row.name << "' names no registered op");
    CHECK_FALSE(row.dtypes.empty());
    CHECK_FALSE(row.cases.empty());
    CHECK((static_cast<bool>(row.reference) != static_cast<bool>(row.property)));
  }
  for (const std::string& name : kDocumentedOps) {
    CAPTURE(name);
    CHECK_MESSAGE(registered.count(name) == 1, "documented op '" << name << "' is not registered");
  }
  CHECK(table().size() + kWithoutRow.size() == ops.size());
  CHECK(fl::find_op("no_such_op") == nullptr);
}

TEST_CASE("every row's inputs fit its op's declared arity") {
  int checked = 0;
  for (const Row& row : table()) {
    const fl::Op* op = fl::find_op(row.name);
    if (op == nullptr) continue;  // reported by the coverage test
    for (const Case& c : row.cases) {
      CAPTURE(row.name);
      const int n = static_cast<int>(row.make(c, row.dtypes.at(0), 3).size());
      CHECK(n >= op->min_inputs);
      if (op->max_inputs >= 0) CHECK(n <= op->max_inputs);
      ++checked;
    }
  }
  CHECK(checked > 100);
}

TEST_CASE("every op matches its f64 reference on contiguous inputs") {
  int rows_run = 0;
  for (const Row& row : table()) {
    CAPTURE(row.name);
    const Outcome outcome = run_row(row, nullptr);
    CHECK_MESSAGE(outcome.compared > 0, "row '" << row.name << "' compared nothing");
    CHECK(outcome.compared > outcome.skipped);
    ++rows_run;
  }
  CHECK(rows_run == static_cast<int>(table().size()));
  CHECK(rows_run >= static_cast<int>(kDocumentedOps.size()));
}

TEST_CASE("every op that takes tensors gives the same results for permuted views") {
  int rows_run = 0;
  for (const Row& row : table()) {
    if (!takes_tensors(row)) continue;
    CAPTURE(row.name);
    const Outcome outcome = run_row(row, [](const fl::Tensor& t) { return test::permuted_view(t); });
    CHECK(outcome.compared > 0);
    ++rows_run;
  }
  CHECK(rows_run >= 36);  // all but the four creation ops
}

TEST_CASE("every op that takes tensors gives the same results for strided views with an offset") {
  int rows_run = 0;
  for (const Row& row : table()) {
    if (!takes_tensors(row)) continue;
    CAPTURE(row.name);
    const Outcome outcome = run_row(row, [](const fl::Tensor& t) { return test::strided_view(t); });
    CHECK(outcome.compared > 0);
    ++rows_run;
  }
  CHECK(rows_run >= 36);
}

TEST_CASE("every op throws its declared errors with its type and a message starting with the op name") {
  int declared = 0;
  for (const Row& row : table()) {
    for (const DeclaredError& e : row.errors) {
      INFO("op ", row.name, ": ", e.what);
      e.check(row.name);
      ++declared;
    }
  }
  CHECK(declared > 60);
}

TEST_CASE("every op rejects an empty Tensor handle in any input position with InvalidArgument") {
  int checked = 0;
  for (const Row& row : table()) {
    if (!takes_tensors(row)) {
      CHECK_MESSAGE(!row.errors.empty(), "creation op '" << row.name << "' declares no errors");
      continue;
    }
    const Case& c = row.cases.at(0);
    const fl::DType dt = row.dtypes.at(0);
    const Inputs inputs = row.make(c, dt, 5);
    for (size_t i = 0; i < inputs.size(); ++i) {
      INFO("op ", row.name, ", input ", i);
      Inputs broken = inputs;
      broken[i] = fl::Tensor();
      test::check_throws<fl::InvalidArgument>([&] { (void)row.run(broken, c, dt); }, {"empty Tensor handle"});
      ++checked;
    }
  }
  CHECK(checked >= 36);
}

// Same values (NaN where NaN), shape and dtype.
bool identical(const fl::Tensor& a, const fl::Tensor& b) {
  if (!(a.shape() == b.shape()) || a.dtype() != b.dtype()) return false;
  const std::vector<double> x = test::values(a), y = test::values(b);
  for (size_t i = 0; i < x.size(); ++i)
    if (!(x[i] == y[i] || (std::isnan(x[i]) && std::isnan(y[i])))) return false;
  return true;
}

TEST_CASE("every op that takes tensors gives the same results traced as eagerly") {
  int rows_run = 0;
  for (const Row& row : table()) {
    if (!takes_tensors(row)) continue;
    CAPTURE(row.name);
    int compared = 0;
    uint64_t seed = std::hash<std::string>{}(row.name) % 100000;
    for (fl::DType dt : row.dtypes) {
      for (const Case& c : row.cases) {
        ++seed;
        INFO("dtype ", fl::dtype_name(dt), ", case ", test::shape_text(c.shapes.at(0)), ", arg ", c.arg);
        const Inputs inputs = row.make(c, dt, seed * 1000);
        if (row.reference) {
          std::vector<Host> hosts;
          for (const fl::Tensor& t : inputs) hosts.push_back(test::host(t));
          if (!row.reference(hosts, c, dt)) continue;  // the case does not apply
        }
        try {
          const fl::Tensor eager = row.run(inputs, c, dt);
          auto traced = fl::trace([&](std::vector<fl::Tensor> in) { return row.run(in, c, dt); });
          const fl::Tensor got = traced(inputs);
          CHECK_MESSAGE(identical(got, eager), "traced " << test::shape_text(got.shape()) << " "
                                                         << fl::dtype_name(got.dtype()) << " differs from eager "
                                                         << test::shape_text(eager.shape()));
        } catch (const std::exception& e) {
          FAIL_CHECK("threw " << test::error_kind(e) << ": " << e.what());
        }
        ++compared;
      }
    }
    CHECK(compared > 0);
    ++rows_run;
  }
  CHECK(rows_run >= 36);
}

TEST_CASE("every op that takes tensors gives cpu:0's results on every other device that has its kernel") {
  fl::set_logical_cpu_devices(2);
  std::vector<fl::Device> devices{fl::Device("cpu:1")};
  if (test::have_gpu()) devices.push_back(fl::Device("cuda:0"));
  const fl::Device cpu0("cpu:0");
  int rows_run = 0;
  for (const Row& row : table()) {
    const fl::Op* op = fl::find_op(row.name);
    if (op == nullptr || !takes_tensors(row)) continue;
    CAPTURE(row.name);
    bool ran = false;
    for (const fl::Device& device : devices) {
      if (!op->runs_on(device.kind())) continue;
      uint64_t seed = std::hash<std::string>{}(row.name) % 100000;
      for (fl::DType dt : row.dtypes) {
        for (const Case& c : row.cases) {
          ++seed;
          INFO("device ", device.str(), ", dtype ", fl::dtype_name(dt), ", case ", test::shape_text(c.shapes.at(0)),
               ", arg ", c.arg);
          const Inputs inputs = row.make(c, dt, seed * 1000);
          std::vector<Host> hosts;
          for (const fl::Tensor& t : inputs) hosts.push_back(test::host(t));
          const std::optional<Expected> applies = row.reference ? row.reference(hosts, c, dt) : std::nullopt;
          if (row.reference && !applies) continue;
          try {
            const fl::Tensor want = row.run(inputs, c, dt);
            Inputs moved;
            for (const fl::Tensor& t : inputs) moved.push_back(t.to(device));
            const fl::Tensor got = row.run(moved, c, dt);
            // to_device's row sends its result to cpu:0 whatever its input's device; the rest run where
            // their inputs are.
            CHECK(got.device() == (row.name == "to_device" ? cpu0 : device));
            const bool half = want.dtype() == fl::f16 || want.dtype() == fl::bf16;
            const bool same_kernel = device.kind() == fl::DeviceKind::cpu;
            if (same_kernel) {
              CHECK(identical(got.to(cpu0), want));
            } else {
              test::check_tensor(got.to(cpu0), test::values(want), want.shape(), want.dtype(),
                                 half ? std::nullopt : row.tolerance);
            }
          } catch (const std::exception& e) {
            FAIL_CHECK("threw " << test::error_kind(e) << ": " << e.what());
          }
          ran = true;
        }
      }
    }
    rows_run += ran ? 1 : 0;
  }
  CHECK(rows_run >= 36);
}

// Regression: scatter_add's output shape [rows, updates.shape[indices.rank():]...] is checked for
// an element count that overflows int64 (it once returned [2^50, 2^20] over an empty buffer).
TEST_CASE("scatter_add: an output whose element count overflows int64 throws ShapeError") {
  const fl::Tensor index = fl::tensor({int64_t{0}});
  test::check_op_throws<fl::ShapeError>(
      "scatter_add", [&] { (void)fl::scatter_add(index, fl::zeros(fl::Shape{1, int64_t{1} << 20}), int64_t{1} << 50); });
  test::check_op_throws<fl::ShapeError>(
      "scatter_add", [&] { (void)fl::scatter_add(index, fl::zeros(fl::Shape{1, 4}), std::numeric_limits<int64_t>::max()); });
}

// Regression: slice's OutOfRange message once computed start + length, which overflows int64
// (undefined behaviour) for a huge start or length.
TEST_CASE("slice: a huge start or length throws OutOfRange with a message that does not wrap around") {
  const fl::Tensor t = fl::zeros(fl::Shape{3, 4});
  const int64_t big = std::numeric_limits<int64_t>::max();
  for (const auto& [start, length] : std::vector<std::pair<int64_t, int64_t>>{{1, big}, {big, 1}}) {
    CAPTURE(start);
    CAPTURE(length);
    try {
      (void)fl::slice(t, 0, start, length);
      FAIL_CHECK("nothing thrown");
    } catch (const fl::OutOfRange& e) {
      CHECK(std::string(e.what()).find("-9223372036854775808") == std::string::npos);
    }
  }
}

TEST_CASE("a graph-only op called eagerly throws InvalidArgument naming the op and where it belongs") {
  int graph_only = 0;
  for (const fl::Op* op : fl::all_ops()) {
    if (!op->has_flag(fl::kGraphOnly)) continue;
    ++graph_only;
    const std::string name(op->name);
    CAPTURE(name);
    CHECK(op->has_flag(fl::kStateful));  // passes never fold, merge or prune them
    // Inputs that fit the arity and no attributes: dispatch must refuse before the op's shape rule
    // reads them.
    const std::vector<fl::Tensor> inputs(static_cast<size_t>(op->min_inputs), fl::ones({2}));
    test::check_throws<fl::InvalidArgument>([&] { fl::dispatch_all(*op, inputs, nullptr); },
                                            {name + ": exists only in traced graphs", "flowlet::trace"});
  }
  CHECK(graph_only == 7);  // variables (3), send/recv, queues (2)
}
