// matmul: hand-worked products, a naive triple loop in double as reference, batched and broadcast
// rank-3 operands, transposed and strided views, zero-size dimensions, and the declared errors.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "kernels/gemm_outer.hpp"
#include "kernels/gemm_packed.hpp"
#include "kernels/gemm_small.hpp"
#include "kernels/gemm_small_bt.hpp"
#include "kernels/gemm_split.hpp"
#include "kernels/gemm_thin.hpp"
#include "ops/gemm.hpp"
#include "runtime/thread_pool.hpp"
#include "support/reference.hpp"

using test::check_op_throws;
using test::check_tensor;
using test::check_throws;
using test::Host;

namespace {

// A product's m x k x n, and random operands a [m, k] and b [k, n] of it (seeds taken in order).
struct ProductDims {
  int64_t m, k, n;
};
std::pair<fl::Tensor, fl::Tensor> random_operands(const ProductDims& d, uint64_t& seed, fl::DType dt) {
  fl::Tensor a = fl::randn(fl::Shape{d.m, d.k}, seed++, dt);
  fl::Tensor b = fl::randn(fl::Shape{d.k, d.n}, seed++, dt);
  return {std::move(a), std::move(b)};
}

// Checks a product against the double reference. Each element may be off by a few f32 (or f64)
// roundings of the terms it sums, so the bound scales with sum_k |a_ik * b_kj|.
bool check_product(const fl::Tensor& got, const fl::Tensor& a, const fl::Tensor& b,
                   std::source_location loc = std::source_location::current()) {
  const Host ha = test::host(a);
  const Host hb = test::host(b);
  const Host want = test::matmul_ref(ha, hb);
  const Host magnitude = test::matmul_ref(test::unary_ref(ha, [](double x) { return std::abs(x); }),
                                          test::unary_ref(hb, [](double x) { return std::abs(x); }));
  const fl::DType dt = a.dtype();
  if (!test::check_tensor(got, want.values, want.shape, dt, test::Tolerance{1e30, 1e30}, loc)) return false;
  const std::vector<double> v = test::values(got);
  const double eps = dt == fl::f64 ? 1e-13 : 4e-6;
  std::vector<double> slack(v.size());
  for (size_t i = 0; i < v.size(); ++i) slack[i] = std::abs(v[i] - want.values[i]) - eps * (magnitude.values[i] + 1.0);
  size_t bad = 0;
  for (double s : slack) bad += s > 0 ? 1 : 0;
  if (bad > 0) {
    size_t first = 0;
    while (slack[first] <= 0) ++first;
    ADD_FAIL_CHECK_AT(loc.file_name(), static_cast<int>(loc.line()),
                      fmt::format("{} of {} products off; first [{}] got {} want {}", bad, v.size(), first, v[first],
                                  want.values[first]));
    return false;
  }
  return true;
}

// matmul of a [m, k] and b [k, n] as given, with either or both stored transposed and viewed back
// (BLAS and our kernels see transpose flags), and as strided views (packed first): the number of
// the five products within check_product's bound.
int check_product_views(const fl::Tensor& a, const fl::Tensor& b,
                        std::source_location loc = std::source_location::current()) {
  const fl::DType dt = a.dtype();
  const int64_t m = a.shape()[0], k = a.shape()[1], n = b.shape()[1];
  const fl::Tensor a_t = fl::transpose(test::make(test::values(fl::transpose(a)), fl::Shape{k, m}, dt));
  const fl::Tensor b_t = fl::transpose(test::make(test::values(fl::transpose(b)), fl::Shape{n, k}, dt));
  int ok = 0;
  ok += check_product(fl::matmul(a, b), a, b, loc) ? 1 : 0;
  ok += check_product(fl::matmul(a_t, b), a, b, loc) ? 1 : 0;
  ok += check_product(fl::matmul(a, b_t), a, b, loc) ? 1 : 0;
  ok += check_product(fl::matmul(a_t, b_t), a, b, loc) ? 1 : 0;
  ok += check_product(fl::matmul(test::strided_view(a), test::strided_view(b)), a, b, loc) ? 1 : 0;
  return ok;
}

}  // namespace

TEST_CASE("matmul of hand-worked matrices") {
  const fl::Tensor a = fl::tensor(std::vector<float>{1, 2, 3, 4, 5, 6}, fl::Shape{2, 3});
  const fl::Tensor b = fl::tensor(std::vector<float>{7, 8, 9, 10, 11, 12}, fl::Shape{3, 2});
  check_tensor(fl::matmul(a, b), {58, 64, 139, 154}, fl::Shape{2, 2}, fl::f32);
  check_tensor(fl::matmul(b, a), {39, 54, 69, 49, 68, 87, 59, 82, 105}, fl::Shape{3, 3}, fl::f32);
  check_tensor(fl::matmul(a.astype(fl::f64), b.astype(fl::f64)), {58, 64, 139, 154}, fl::Shape{2, 2}, fl::f64);
  // Outer and inner products as matrices.
  const fl::Tensor col = fl::tensor(std::vector<double>{1, 2, 3}, fl::Shape{3, 1});
  const fl::Tensor row = fl::tensor(std::vector<double>{4, 5, 6}, fl::Shape{1, 3});
  check_tensor(fl::matmul(row, col), {32}, fl::Shape{1, 1}, fl::f64);
  check_tensor(fl::matmul(col, row), {4, 5, 6, 8, 10, 12, 12, 15, 18}, fl::Shape{3, 3}, fl::f64);
  // Identity leaves a matrix unchanged, exactly.
  const fl::Tensor eye = fl::tensor(std::vector<float>{1, 0, 0, 0, 1, 0, 0, 0, 1}, fl::Shape{3, 3});
  const fl::Tensor x = fl::randn(fl::Shape{3, 4}, 5);
  check_tensor(fl::matmul(eye, x), test::values(x), fl::Shape{3, 4}, fl::f32, test::Tolerance{0, 0});
}

TEST_CASE("matmul matches a naive triple loop in double") {
  using Dims = ProductDims;
  int compared = 0;
  uint64_t seed = 10;
  for (fl::DType dt : test::kFloatDTypes) {
    for (const Dims& d : {Dims{1, 1, 1}, Dims{3, 4, 5}, Dims{17, 33, 9}, Dims{64, 64, 64}, Dims{1, 100, 1},
                          Dims{100, 1, 100}, Dims{129, 70, 31}, Dims{2, 300, 3}}) {
      CAPTURE(dt);
      CAPTURE(d.m);
      CAPTURE(d.k);
      CAPTURE(d.n);
      const auto [a, b] = random_operands(d, seed, dt);
      check_product(fl::matmul(a, b), a, b);
      ++compared;
    }
  }
  CHECK(compared == 16);
}

TEST_CASE("matmul of a 256-cube stays within f32 rounding of the double result") {
  const fl::Tensor a = fl::randn(fl::Shape{256, 256}, 1);
  const fl::Tensor b = fl::randn(fl::Shape{256, 256}, 2);
  check_product(fl::matmul(a, b), a, b);
}

TEST_CASE("rank-3 matmul multiplies each batch and broadcasts a rank-2 operand") {
  // Hand-worked: batch 0 is the identity, batch 1 doubles.
  const fl::Tensor a = fl::tensor(std::vector<float>{1, 0, 0, 1, 2, 0, 0, 2}, fl::Shape{2, 2, 2});
  const fl::Tensor b = fl::tensor(std::vector<float>{1, 2, 3, 4}, fl::Shape{2, 2});
  check_tensor(fl::matmul(a, b), {1, 2, 3, 4, 2, 4, 6, 8}, fl::Shape{2, 2, 2}, fl::f32);
  check_tensor(fl::matmul(b, a), {1, 2, 3, 4, 2, 4, 6, 8}, fl::Shape{2, 2, 2}, fl::f32);
  int compared = 0;
  uint64_t seed = 100;
  for (fl::DType dt : test::kFloatDTypes) {
    CAPTURE(dt);
    const fl::Tensor x = fl::randn(fl::Shape{4, 3, 5}, seed++, dt);
    const fl::Tensor y = fl::randn(fl::Shape{4, 5, 2}, seed++, dt);
    const fl::Tensor w = fl::randn(fl::Shape{5, 2}, seed++, dt);
    const fl::Tensor v = fl::randn(fl::Shape{3, 5}, seed++, dt);
    compared += check_product(fl::matmul(x, y), x, y) ? 1 : 0;
    compared += check_product(fl::matmul(x, w), x, w) ? 1 : 0;  // [4,3,5] x [5,2]
    compared += check_product(fl::matmul(v, y), v, y) ? 1 : 0;  // [3,5] x [4,5,2]
    const fl::Tensor one = fl::randn(fl::Shape{1, 7, 3}, seed++, dt);
    const fl::Tensor other = fl::randn(fl::Shape{1, 3, 2}, seed++, dt);
    compared += check_product(fl::matmul(one, other), one, other) ? 1 : 0;
  }
  CHECK(compared == 8);
}

TEST_CASE("matmul accepts transposed, permuted and strided views") {
  int compared = 0;
  uint64_t seed = 200;
  for (fl::DType dt : test::kFloatDTypes) {
    CAPTURE(dt);
    const fl::Tensor a = fl::randn(fl::Shape{6, 4}, seed++, dt);  // used as a^T: [4, 6]
    const fl::Tensor b = fl::randn(fl::Shape{5, 6}, seed++, dt);  // used as b^T: [6, 5]
    const fl::Tensor at = fl::transpose(a);
    const fl::Tensor bt = fl::transpose(b);
    const fl::Tensor at_copy = test::make(test::values(at), fl::Shape{4, 6}, dt);
    const fl::Tensor bt_copy = test::make(test::values(bt), fl::Shape{6, 5}, dt);
    compared += check_product(fl::matmul(at, bt), at_copy, bt_copy) ? 1 : 0;
    compared += check_product(fl::matmul(at, bt_copy), at_copy, bt_copy) ? 1 : 0;
    compared += check_product(fl::matmul(at_copy, bt), at_copy, bt_copy) ? 1 : 0;
    compared += check_product(fl::matmul(test::strided_view(at_copy), test::strided_view(bt_copy)), at_copy, bt_copy) ? 1 : 0;
    // a a^T through a view of the same storage.
    compared += check_product(fl::matmul(a, fl::transpose(a)), a, test::make(test::values(at), fl::Shape{4, 6}, dt)) ? 1 : 0;
    // Batched operands with their last two dimensions swapped by permute.
    const fl::Tensor x = fl::randn(fl::Shape{3, 5, 4}, seed++, dt);  // viewed as [3, 4, 5]
    const fl::Tensor y = fl::randn(fl::Shape{3, 5, 2}, seed++, dt);
    const fl::Tensor xp = fl::permute(x, {0, 2, 1});
    const fl::Tensor xp_copy = test::make(test::values(xp), fl::Shape{3, 4, 5}, dt);
    compared += check_product(fl::matmul(xp, y), xp_copy, y) ? 1 : 0;
    compared += check_product(fl::matmul(test::permuted_view(xp_copy), test::strided_view(y)), xp_copy, y) ? 1 : 0;
    // The batch dimension moved to the middle and back.
    const fl::Tensor z = fl::randn(fl::Shape{4, 3, 5}, seed++, dt);
    const fl::Tensor zp = fl::permute(z, {1, 0, 2});  // [3, 4, 5]
    compared += check_product(fl::matmul(zp, y), test::make(test::values(zp), fl::Shape{3, 4, 5}, dt), y) ? 1 : 0;
  }
  CHECK(compared == 16);
}

TEST_CASE("matmul with a zero-size dimension") {
  for (fl::DType dt : test::kFloatDTypes) {
    CAPTURE(dt);
    // k = 0: a sum over nothing, zeros.
    check_tensor(fl::matmul(fl::zeros(fl::Shape{3, 0}, dt), fl::zeros(fl::Shape{0, 4}, dt)), std::vector<double>(12, 0.0),
                 fl::Shape{3, 4}, dt);
    check_tensor(fl::matmul(fl::ones(fl::Shape{2, 2, 0}, dt), fl::ones(fl::Shape{2, 0, 3}, dt)),
                 std::vector<double>(12, 0.0), fl::Shape{2, 2, 3}, dt);
    // m or n or the batch = 0: empty results.
    check_tensor(fl::matmul(fl::ones(fl::Shape{0, 3}, dt), fl::ones(fl::Shape{3, 4}, dt)), {}, fl::Shape{0, 4}, dt);
    check_tensor(fl::matmul(fl::ones(fl::Shape{2, 3}, dt), fl::ones(fl::Shape{3, 0}, dt)), {}, fl::Shape{2, 0}, dt);
    check_tensor(fl::matmul(fl::ones(fl::Shape{0, 2, 3}, dt), fl::ones(fl::Shape{0, 3, 4}, dt)), {}, fl::Shape{0, 2, 4}, dt);
    check_tensor(fl::matmul(fl::ones(fl::Shape{0, 2, 3}, dt), fl::ones(fl::Shape{3, 4}, dt)), {}, fl::Shape{0, 2, 4}, dt);
  }
}

TEST_CASE("matmul rejects mismatched shapes with ShapeError naming both") {
  const fl::Tensor a = fl::zeros(fl::Shape{2, 3});
  const fl::Tensor b = fl::zeros(fl::Shape{4, 5});
  check_throws<fl::ShapeError>([&] { (void)fl::matmul(a, b); },
                               {"matmul: inner dimensions differ; got a [2, 3] and b [4, 5]"});
  check_op_throws<fl::ShapeError>("matmul", [] { (void)fl::matmul(fl::zeros(fl::Shape{2, 3, 4}), fl::zeros(fl::Shape{2, 5, 6})); },
                                  {"[2, 3, 4]", "[2, 5, 6]"});
  // Batch sizes differ.
  check_op_throws<fl::ShapeError>("matmul", [] { (void)fl::matmul(fl::zeros(fl::Shape{2, 3, 4}), fl::zeros(fl::Shape{3, 4, 5})); },
                                  {"[2, 3, 4]", "[3, 4, 5]"});
  // Ranks other than 2 and 3.
  check_op_throws<fl::ShapeError>("matmul", [] { (void)fl::matmul(fl::zeros(fl::Shape{3}), fl::zeros(fl::Shape{3})); }, {"[3]"});
  check_op_throws<fl::ShapeError>("matmul", [] { (void)fl::matmul(fl::zeros(fl::Shape{2, 3}), fl::zeros(fl::Shape{3})); }, {"[3]"});
  check_op_throws<fl::ShapeError>("matmul", [] { (void)fl::matmul(fl::scalar(1.0f), fl::scalar(1.0f)); });
  check_op_throws<fl::ShapeError>("matmul", [] { (void)fl::matmul(fl::zeros(fl::Shape{1, 2, 3, 4}), fl::zeros(fl::Shape{1, 2, 4, 3})); },
                                  {"[1, 2, 3, 4]"});
}

TEST_CASE("matmul rejects integer and mixed dtypes with DTypeError") {
  for (fl::DType dt : {fl::i32, fl::i64, fl::u8, fl::b8}) {
    CAPTURE(dt);
    const std::string name(fl::dtype_name(dt));
    check_op_throws<fl::DTypeError>("matmul", [&] { (void)fl::matmul(fl::ones(fl::Shape{2, 2}, dt), fl::ones(fl::Shape{2, 2}, dt)); },
                                    {name});
  }
  check_op_throws<fl::DTypeError>("matmul", [] { (void)fl::matmul(fl::ones(fl::Shape{2, 2}), fl::ones(fl::Shape{2, 2}, fl::f64)); },
                                  {"f32", "f64"});
  // Halves are never promoted: the caller chooses the dtype with astype.
  check_op_throws<fl::DTypeError>("matmul", [] { (void)fl::matmul(fl::ones(fl::Shape{2, 2}, fl::f16), fl::ones(fl::Shape{2, 2})); },
                                  {"f16", "f32"});
  check_op_throws<fl::DTypeError>("matmul", [] { (void)fl::matmul(fl::ones(fl::Shape{2, 2}, fl::bf16), fl::ones(fl::Shape{2, 2}, fl::f16)); },
                                  {"bf16", "f16"});
}

namespace {

// One unit in the last place at 1.0: 2^-10 for f16 (11 significant bits), 2^-7 for bf16 (8).
double half_ulp_at_one(fl::DType dt) { return dt == fl::f16 ? 0x1p-10 : 0x1p-7; }

}  // namespace

TEST_CASE("f16 and bf16 matmul is the f32 product of the same values, rounded once") {
  // Accumulation is in f32 (as cuBLAS's CUBLAS_COMPUTE_32F): the result is the f32 product of the
  // upcast operands rounded to the half dtype, never a sum of rounded half-precision terms. One
  // ulp of slack allows a different f32 summation order landing on the other side of a rounding.
  int compared = 0;
  uint64_t seed = 900;
  for (fl::DType dt : test::kHalfDTypes) {
    CAPTURE(dt);
    const test::Tolerance one_ulp{half_ulp_at_one(dt), 1e-6};
    auto check = [&](const fl::Tensor& a, const fl::Tensor& b, std::source_location loc = std::source_location::current()) {
      const fl::Tensor got = fl::matmul(a, b);
      const fl::Tensor want = fl::matmul(a.astype(fl::f32), b.astype(fl::f32)).astype(dt);
      compared += test::check_tensor(got, test::values(want), want.shape(), dt, one_ulp, loc) ? 1 : 0;
    };
    auto random = [&](fl::Shape shape) { return test::random_tensor(shape, seed++, dt); };
    check(random({5, 70}), random({70, 17}));                    // plain GEMM
    check(random({1, 40}), random({40, 9}));                     // a row: the GEMV path
    check(random({3, 5, 64}), random({3, 64, 6}));               // batched
    check(random({3, 5, 8}), random({8, 4}));                    // a shared rank-2 operand
    check(fl::transpose(random({70, 5})), random({70, 17}));     // a transposed view
    check(random({200, 190}), random({190, 210}));               // split over the pool
    check(random({4, 0}), random({0, 3}));                       // k = 0: zeros
  }
  CHECK(compared == 14);
}

TEST_CASE("f16 and bf16 matmul gradients match the f32 gradients rounded") {
  // x [3, 4, 5] @ w [5, 2]: w is shared across the batch, so its gradient sums the batch (a half sum:
  // f64 accumulation, rounded once). The loss is an f32 sum of the upcast product.
  uint64_t seed = 950;
  for (fl::DType dt : test::kHalfDTypes) {
    CAPTURE(dt);
    const fl::Tensor x = test::random_tensor(fl::Shape{3, 4, 5}, seed++, dt);
    const fl::Tensor w = test::random_tensor(fl::Shape{5, 2}, seed++, dt);
    const fl::Tensor weights = test::random_tensor(fl::Shape{3, 4, 2}, seed++, fl::f32);
    auto grads = [&](const fl::Tensor& a, const fl::Tensor& b) {
      fl::GradientTape tape;
      tape.watch(a);
      tape.watch(b);
      return tape.gradient(fl::sum(fl::matmul(a, b).astype(fl::f32) * weights), {a, b});
    };
    const std::vector<fl::Tensor> got = grads(x, w);
    const std::vector<fl::Tensor> want = grads(x.astype(fl::f32), w.astype(fl::f32));
    REQUIRE(got.size() == 2);
    // Each of the batch's three products rounds once before the sum: a few ulps of the terms.
    const double eps = half_ulp_at_one(dt);
    for (size_t i = 0; i < 2; ++i) {
      CAPTURE(i);
      test::check_tensor(got[i], test::values(want[i]), want[i].shape(), dt, test::Tolerance{2 * eps, 16 * eps});
    }
  }
}

TEST_CASE("row, column and rank-1 products (BLAS-2 paths) accept transposed and strided views") {
  int compared = 0;
  uint64_t seed = 400;
  for (fl::DType dt : test::kFloatDTypes) {
    CAPTURE(dt);
    using Dims = ProductDims;
    for (const Dims& d : {Dims{1, 37, 23}, Dims{29, 41, 1}, Dims{31, 1, 19}, Dims{1, 1, 7}, Dims{1, 5, 1}}) {
      CAPTURE(d.m);
      CAPTURE(d.k);
      CAPTURE(d.n);
      const auto [a, b] = random_operands(d, seed, dt);
      // The same values stored transposed, then viewed back: BLAS sees a transpose flag.
      compared += check_product_views(a, b);
    }
  }
  CHECK(compared == 50);
}

// Thin products: a dimension of 10 as the MLP's output layer has (n = 10 forward and in h^T @ dy,
// k = 10 in dy @ W2^T), or a batch of 8 (m = 8). f32 pieces of these shapes go to oneDNN's sgemm where the build has it
// (kernels/gemm_thin.hpp), OpenBLAS otherwise; both must match the double reference through
// transposed and strided views, inside a batch, and in the blocks of a product split over threads.
TEST_CASE("thin products (a 10-wide dimension) match the double reference through views, batches and splits") {
  int compared = 0;
  uint64_t seed = 500;
  using Dims = ProductDims;
  // The last two are big enough to be split over the pool (by rows; by columns).
  const Dims all[] = {{2, 256, 10}, {37, 10, 23}, {256, 64, 10}, {64, 10, 256}, {17, 3, 16}, {8, 784, 256},
                      {1024, 10, 256}, {3001, 700, 10}, {10, 700, 3001}};
  for (fl::DType dt : {fl::f32, fl::f64}) {
    CAPTURE(dt);
    for (const Dims& d : all) {
      CAPTURE(d.m);
      CAPTURE(d.k);
      CAPTURE(d.n);
      const auto [a, b] = random_operands(d, seed, dt);
      compared += check_product_views(a, b);
    }
    // A batch of thin products against a shared rank-2 operand, each matrix checked on its own.
    const fl::Tensor batch = fl::randn(fl::Shape{3, 40, 256}, seed++, dt);
    const fl::Tensor w = fl::randn(fl::Shape{256, 10}, seed++, dt);
    const fl::Tensor product = fl::matmul(batch, w);
    for (int64_t i = 0; i < 3; ++i) {
      const fl::Tensor ai = fl::reshape(fl::slice(batch, 0, i, 1).contiguous(), fl::Shape{40, 256});
      const fl::Tensor ci = fl::reshape(fl::slice(product, 0, i, 1).contiguous(), fl::Shape{40, 10});
      compared += check_product(ci, ai, w) ? 1 : 0;
    }
  }
  CHECK(compared == 2 * (9 * 5 + 3));
}

// gemm_into, as the traced step's fused update (assign_matmul) calls it: beta 0 writes C without
// reading it (NaN there must not leak in), beta 1 adds the product to C; thin and square shapes.
TEST_CASE("gemm_into overwrites (beta 0, never reading C) or accumulates (beta 1) on every path") {
  uint64_t seed = 600;
  using Dims = ProductDims;
  for (fl::DType dt : {fl::f32, fl::f64}) {
    CAPTURE(dt);
    // 8x256x10, 1x256x10 and 256x8x10 (with a_t) take kernels/gemm_small.hpp.
    for (const Dims& d : {Dims{256, 64, 10}, Dims{64, 10, 256}, Dims{33, 47, 29}, Dims{300, 200, 250}, Dims{8, 256, 10},
                          Dims{1, 256, 10}, Dims{256, 8, 10}}) {
      CAPTURE(d.m);
      CAPTURE(d.k);
      CAPTURE(d.n);
      const auto [a, b] = random_operands(d, seed, dt);
      const fl::Tensor a_t = fl::transpose(test::make(test::values(fl::transpose(a)), fl::Shape{d.k, d.m}, dt));
      fl::Tensor c = test::make(std::vector<double>(static_cast<size_t>(d.m * d.n), std::nan("")), fl::Shape{d.m, d.n}, dt);
      fl::detail::gemm_into(a_t, b, c, 2.0, 0.0);
      const Host twice = test::unary_ref(test::matmul_ref(test::host(a), test::host(b)), [](double x) { return 2 * x; });
      CHECK(check_tensor(c, twice.values, twice.shape, dt, test::Tolerance{1e-4, 1e-4}));
      // c = 2 a b now; adding a b once more gives 3 a b.
      fl::detail::gemm_into(a, b, c, 1.0, 1.0);
      const Host thrice = test::unary_ref(test::matmul_ref(test::host(a), test::host(b)), [](double x) { return 3 * x; });
      CHECK(check_tensor(c, thrice.values, thrice.shape, dt, test::Tolerance{1e-4, 1e-4}));
    }
  }
}

// Rank-1 products (k = 1, kernels/gemm_outer.hpp): batch-1 weight gradients x^T @ dh and h^T @ dy.
// Through matmul (a column of a wider matrix as the left operand, so a steps over rows; big enough
// to split over the pool) and through gemm_into (beta 0 over NaN, beta 1 accumulating), each
// element against alpha * a_i * b_j in double.
TEST_CASE("rank-1 products (k = 1) match the double reference through views, splits and gemm_into") {
  int compared = 0;
  uint64_t seed = 700;
  struct Dims {
    int64_t m, n;
  };
  for (fl::DType dt : {fl::f32, fl::f64}) {
    CAPTURE(dt);
    for (const Dims& d : {Dims{784, 256}, Dims{256, 10}, Dims{3, 1000}, Dims{1000, 3}, Dims{2, 2}}) {
      CAPTURE(d.m);
      CAPTURE(d.n);
      const fl::Tensor a = fl::randn(fl::Shape{d.m, 1}, seed++, dt);
      const fl::Tensor b = fl::randn(fl::Shape{1, d.n}, seed++, dt);
      compared += check_product(fl::matmul(a, b), a, b) ? 1 : 0;
      // x^T for a row x, as the weight gradient has it.
      const fl::Tensor a_t = fl::transpose(fl::reshape(a, fl::Shape{1, d.m}));
      compared += check_product(fl::matmul(a_t, b), a, b) ? 1 : 0;
      // Column 1 of a [m, 3] matrix: a steps by 3 elements.
      const fl::Tensor wide = fl::concat({fl::randn(fl::Shape{d.m, 1}, seed++, dt), a, fl::randn(fl::Shape{d.m, 1}, seed++, dt)}, 1);
      const fl::Tensor column = fl::slice(wide, 1, 1, 1);
      compared += check_product(fl::matmul(column, b), a, b) ? 1 : 0;
      compared += check_product(fl::matmul(test::strided_view(a), test::strided_view(b)), a, b) ? 1 : 0;
      const Host ab = test::matmul_ref(test::host(a), test::host(b));
      fl::Tensor c = test::make(std::vector<double>(static_cast<size_t>(d.m * d.n), std::nan("")), fl::Shape{d.m, d.n}, dt);
      fl::detail::gemm_into(a, b, c, -2.0, 0.0);
      const Host minus_twice = test::unary_ref(ab, [](double x) { return -2 * x; });
      compared += check_tensor(c, minus_twice.values, minus_twice.shape, dt, test::Tolerance{1e-6, 1e-6}) ? 1 : 0;
      fl::detail::gemm_into(a_t, b, c, 3.0, 1.0);  // -2 ab + 3 ab
      compared += check_tensor(c, ab.values, ab.shape, dt, test::Tolerance{1e-5, 1e-5}) ? 1 : 0;
    }
  }
  CHECK(compared == 2 * 5 * 6);
}

// The kernel itself, with a strided b (matmul's operands never give it one: BLAS packing takes
// those first) short enough for its stack buffer and longer than it.
TEST_CASE("outer_product gathers a strided b and accumulates or overwrites") {
  for (int64_t n : {7, 513, 1500}) {
    CAPTURE(n);
    const int64_t m = 9;
    std::vector<double> a(static_cast<size_t>(2 * m)), b(static_cast<size_t>(3 * n)), c(static_cast<size_t>(m * n), std::nan(""));
    for (size_t i = 0; i < a.size(); ++i) a[i] = 0.25 * static_cast<double>(i) - 1;
    for (size_t j = 0; j < b.size(); ++j) b[j] = 0.5 - 0.125 * static_cast<double>(j % 17);
    std::vector<float> af(a.begin(), a.end()), bf(b.begin(), b.end()), cf(c.size(), std::nanf(""));
    fl::detail::outer_product(m, n, 0.5, a.data(), 2, b.data(), 3, false, c.data());
    fl::detail::outer_product(m, n, 0.5f, af.data(), 2, bf.data(), 3, false, cf.data());
    int bad = 0;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        const double want = 0.5 * a[static_cast<size_t>(2 * i)] * b[static_cast<size_t>(3 * j)];
        bad += c[static_cast<size_t>(i * n + j)] != want;  // exact: quarter and eighth steps
        bad += cf[static_cast<size_t>(i * n + j)] != static_cast<float>(want);
      }
    }
    fl::detail::outer_product(m, n, 1.0, a.data(), 2, b.data(), 3, true, c.data());
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        bad += c[static_cast<size_t>(i * n + j)] != 1.5 * a[static_cast<size_t>(2 * i)] * b[static_cast<size_t>(3 * j)];
      }
    }
    CHECK(bad == 0);
  }
}

// Tiny products (kernels/gemm_small.hpp: our AVX2/FMA tiles, 6 rows x 16 f32 or 8 f64 columns, on
// the calling thread): every row tail (1-5 rows after the 6-row tiles), column tails inside the
// first and second vector of a block, several blocks, k below and above the four interleaved
// partial sums, each operand transposed (a transposed B is gathered on the stack), strided views,
// batches, and a row times a narrow matrix (batch 1's h @ W2, which otherwise goes to GEMV).
TEST_CASE("small products match the double reference over tails, transposes, views and batches") {
  int compared = 0, small = 0;
  uint64_t seed = 800;
  for (fl::DType dt : {fl::f32, fl::f64}) {
    CAPTURE(dt);
    for (int64_t m : {1, 2, 5, 6, 7, 8, 13}) {
      for (int64_t n : {2, 3, 8, 9, 10, 16, 17, 33}) {
        for (int64_t k : {2, 3, 10, 31, 256}) {
          CAPTURE(m);
          CAPTURE(n);
          CAPTURE(k);
          small += fl::detail::small_gemm_pays(m, n, k, false, false) ? 1 : 0;
          const fl::Tensor a = fl::randn(fl::Shape{m, k}, seed++, dt);
          const fl::Tensor b = fl::randn(fl::Shape{k, n}, seed++, dt);
          compared += check_product_views(a, b);
        }
      }
    }
    // A batch of 3 small products against a shared transposed operand (dy @ W2^T at batch 8).
    const fl::Tensor batch = fl::randn(fl::Shape{3, 8, 10}, seed++, dt);
    const fl::Tensor w = fl::randn(fl::Shape{37, 10}, seed++, dt);
    const fl::Tensor product = fl::matmul(batch, fl::transpose(w));
    for (int64_t i = 0; i < 3; ++i) {
      const fl::Tensor ai = fl::reshape(fl::slice(batch, 0, i, 1).contiguous(), fl::Shape{8, 10});
      const fl::Tensor ci = fl::reshape(fl::slice(product, 0, i, 1).contiguous(), fl::Shape{8, 37});
      compared += check_product(ci, ai, fl::transpose(w)) ? 1 : 0;
    }
  }
  CHECK(compared == 2 * (7 * 8 * 5 * 5 + 3));
  // Where the CPU has AVX2 and FMA, nearly every shape above takes the kernel (all but the largest).
  if (fl::detail::small_gemm_supported()) CHECK(small >= 2 * 7 * 8 * 4);
}

namespace {

// A kernel called directly (small_gemm's signature), C a block inside a larger buffer (ldc > n)
// and A, B with leading dimensions past their rows: the block is written exactly (quarter-step
// values make every sum exact), beta 0 never reads C (NaN stays out), accumulate adds alpha times
// the product, and nothing outside the block changes. Returns the number of wrong elements.
template <class T, class Kernel>
int block_errors(Kernel kernel, bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k) {
  const int64_t lda = (transpose_a ? m : k) + 3, ldb = (transpose_b ? k : n) + 2, ldc = n + 5;
  const int64_t a_rows = transpose_a ? k : m, b_rows = transpose_b ? n : k;
  std::vector<T> a(static_cast<size_t>(a_rows * lda)), b(static_cast<size_t>(b_rows * ldb));
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<T>(0.25 * static_cast<double>(i % 13) - 1.5);
  for (size_t j = 0; j < b.size(); ++j) b[j] = static_cast<T>(0.5 - 0.25 * static_cast<double>(j % 7));
  auto at = [&](int64_t i, int64_t p) { return static_cast<double>(transpose_a ? a[p * lda + i] : a[i * lda + p]); };
  auto bt = [&](int64_t p, int64_t j) { return static_cast<double>(transpose_b ? b[j * ldb + p] : b[p * ldb + j]); };
  const T sentinel = static_cast<T>(-7.75);
  std::vector<T> c(static_cast<size_t>((m + 1) * ldc), std::numeric_limits<T>::quiet_NaN());
  for (int64_t j = 0; j < ldc; ++j) c[m * ldc + j] = sentinel;  // the row below the block
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = n; j < ldc; ++j) c[i * ldc + j] = sentinel;  // right of the block
  }
  kernel(transpose_a, transpose_b, m, n, k, T(2), a.data(), lda, b.data(), ldb, false, c.data(), ldc);
  int bad = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double want = 0;
      for (int64_t p = 0; p < k; ++p) want += at(i, p) * bt(p, j);
      bad += static_cast<double>(c[i * ldc + j]) != 2 * want;
    }
  }
  kernel(transpose_a, transpose_b, m, n, k, T(-0.5), a.data(), lda, b.data(), ldb, true, c.data(), ldc);
  for (int64_t i = 0; i <= m; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      if (i == m || j >= n) {
        bad += c[i * ldc + j] != sentinel;
        continue;
      }
      double want = 0;
      for (int64_t p = 0; p < k; ++p) want += at(i, p) * bt(p, j);
      bad += static_cast<double>(c[i * ldc + j]) != 1.5 * want;
    }
  }
  return bad;
}

}  // namespace

// small_gemm through block_errors (column tails are stored in 4-, 2- and 1-lane pieces).
TEST_CASE("small_gemm writes exactly its block of C, overwriting or accumulating") {
  if (!fl::detail::small_gemm_supported()) return;
  auto kernel = [](auto... args) { fl::detail::small_gemm(args...); };
  auto run = [&]<class T>(T, bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k) {
    CAPTURE(sizeof(T));
    CAPTURE(transpose_a);
    CAPTURE(transpose_b);
    CAPTURE(m);
    CAPTURE(n);
    CAPTURE(k);
    CHECK(block_errors<T>(kernel, transpose_a, transpose_b, m, n, k) == 0);
  };
  for (bool transpose_a : {false, true}) {
    for (bool transpose_b : {false, true}) {
      for (int64_t m : {1, 4, 6, 11}) {
        for (int64_t n : {2, 5, 8, 12, 16, 21}) {
          for (int64_t k : {2, 7, 40}) {
            run(float{}, transpose_a, transpose_b, m, n, k);
            run(double{}, transpose_a, transpose_b, m, n, k);
          }
        }
      }
    }
    // A transposed B past the stack buffer (70 x 64 > kSmallGemmPackElements): gathered on the heap.
    run(float{}, transpose_a, true, 7, 70, 64);
    run(double{}, transpose_a, true, 7, 70, 64);
  }
}

// The piece edges of a split product (kernels/gemm_split.hpp): hand cases, then every extent up
// to 1100 at 1-4 threads for the properties the driver relies on.
TEST_CASE("guided and even GEMM pieces cover the extent in aligned, non-empty, ordered pieces") {
  using fl::detail::GemmPieces;
  auto edges = [](const GemmPieces& p) { return std::vector<int64_t>(p.edges.begin(), p.edges.begin() + p.count + 1); };
  // 1024 rows, 2 threads: a quarter of what is left each time, rounded up to 16, at least 64,
  // the last 112 rows in one piece (64 would leave 48).
  CHECK(edges(fl::detail::guided_gemm_pieces(1024, 2, 16, 64)) ==
        std::vector<int64_t>{0, 256, 448, 592, 704, 784, 848, 912, 1024});
  CHECK(edges(fl::detail::guided_gemm_pieces(256, 2, 16, 64)) == std::vector<int64_t>{0, 64, 128, 192, 256});
  // Below 2 * parts * min_piece: even halves, as before guided pieces.
  CHECK(edges(fl::detail::guided_gemm_pieces(255, 2, 16, 64)) == std::vector<int64_t>{0, 112, 255});
  CHECK(edges(fl::detail::guided_gemm_pieces(128, 2, 16, 64)) == std::vector<int64_t>{0, 64, 128});
  CHECK(edges(fl::detail::even_gemm_pieces(40, 3, 16)) == std::vector<int64_t>{0, 16, 40});  // 40 / 16 = 2 pieces
  CHECK(edges(fl::detail::even_gemm_pieces(7, 2, 16)) == std::vector<int64_t>{0, 7});
  CHECK(fl::detail::guided_gemm_pieces(0, 2, 16, 64).count == 0);
  int bad = 0, checked = 0;
  for (int64_t parts = 1; parts <= 4; ++parts) {
    for (int64_t extent = 1; extent <= 1100; ++extent) {
      for (const GemmPieces& p : {fl::detail::guided_gemm_pieces(extent, parts, 16, 64), fl::detail::even_gemm_pieces(extent, parts, 16)}) {
        ++checked;
        bool ok = p.count >= 1 && p.count <= fl::detail::kMaxGemmPieces && p.edges[0] == 0 && p.edges[p.count] == extent;
        for (int64_t j = 0; j < p.count; ++j) ok = ok && p.edges[j + 1] > p.edges[j];
        for (int64_t j = 1; j < p.count; ++j) ok = ok && p.edges[j] % 16 == 0;
        // As many pieces as threads wherever the extent has that many aligned blocks.
        ok = ok && p.count >= std::min(parts, std::max<int64_t>(extent / 16, 1));
        if (!ok) {
          ++bad;
          CAPTURE(parts);
          CAPTURE(extent);
          FAIL_CHECK("bad pieces");
        }
      }
    }
  }
  CHECK(bad == 0);
  CHECK(checked == 4 * 1100 * 2);
  // Guided pieces are never shorter than min_piece, and shrink (but for the last, which takes a
  // rest shorter than min_piece).
  for (int64_t extent : {256, 300, 1000, 1024, 4096, 100000}) {
    const GemmPieces p = fl::detail::guided_gemm_pieces(extent, 2, 16, 64);
    CAPTURE(extent);
    for (int64_t j = 0; j < p.count; ++j) CHECK(p.edges[j + 1] - p.edges[j] >= 64);
    for (int64_t j = 1; j + 1 < p.count; ++j) CHECK(p.edges[j + 1] - p.edges[j] <= p.edges[j] - p.edges[j - 1]);
  }
  CHECK(fl::detail::guided_gemm_pieces(1 << 30, 2, 16, 64).count == fl::detail::kMaxGemmPieces);
  // A min_piece off the grid (small_gemm's 6-row tiles, 13 rows) is rounded up to it (18), so
  // that every inner edge stays on the grid.
  CHECK(edges(fl::detail::guided_gemm_pieces(64, 2, 6, 13)) == std::vector<int64_t>{0, 30, 64});
  CHECK(edges(fl::detail::guided_gemm_pieces(128, 2, 6, 13)) == std::vector<int64_t>{0, 36, 60, 78, 96, 128});
  int off_grid = 0;
  for (int64_t parts = 2; parts <= 3; ++parts) {
    for (int64_t extent = 1; extent <= 1100; ++extent) {
      const GemmPieces p = fl::detail::guided_gemm_pieces(extent, parts, 6, 13);
      for (int64_t j = 1; j < p.count; ++j) off_grid += p.edges[j] % 6 != 0 || p.edges[j] <= p.edges[j - 1];
      off_grid += p.edges[p.count] != extent;
    }
  }
  CHECK(off_grid == 0);
}

// Products big enough for guided pieces at 2-3 threads (rows, and columns when wider than tall),
// with extents off the 16-row grid, views and transposes: within the double reference's bound,
// the same bits on a second call, and gemm_into's beta 1 adding to C.
TEST_CASE("products split into guided pieces match the double reference and repeat bit for bit") {
  uint64_t seed = 900;
  int compared = 0;
  using Dims = ProductDims;
  const Dims all[] = {{1000, 97, 130}, {300, 160, 257}, {130, 97, 1001}};
  for (fl::DType dt : {fl::f32, fl::f64}) {
    CAPTURE(dt);
    for (const Dims& d : all) {
      CAPTURE(d.m);
      CAPTURE(d.n);
      const auto [a, b] = random_operands(d, seed, dt);
      compared += check_product_views(a, b);
      CHECK(test::values(fl::matmul(a, b)) == test::values(fl::matmul(a, b)));
      // beta 1: C = 0.5 (every element) + a b
      fl::Tensor c = fl::full(fl::Shape{d.m, d.n}, 0.5, dt);
      fl::detail::gemm_into(a, b, c, 1.0, 1.0);
      const std::vector<double> want = test::values(fl::matmul(a, b));
      const std::vector<double> got = test::values(c);
      int off = 0;
      for (size_t i = 0; i < got.size(); ++i) off += std::abs(got[i] - (want[i] + 0.5)) > 1e-4 * (std::abs(want[i]) + 1) ? 1 : 0;
      CHECK(off == 0);
    }
  }
  CHECK(compared == 2 * 3 * 5);
}

// Narrow products at 200-1024 rows (h @ W2 and h^T @ dy, n = 10-16), one piece each at every thread
// count: within the double reference's bound through views, and where small_gemm runs them (f64,
// transposed A) the same bits as one direct small_gemm call, gemm_into's beta 1 included. f32 with
// A as stored goes to oneDNN where the build has it (thin_sgemm_beats_small): there the reference
// bound and repeatable bits.
TEST_CASE("narrow products go to oneDNN (f32, A as stored) or equal one small_gemm call bit for bit") {
  uint64_t seed = 950;
  int compared = 0, same = 0, cases = 0;
  struct Dims {
    int64_t m, k, n;
    bool transpose_a;
  };
  const Dims all[] = {{256, 256, 10, false}, {211, 256, 10, false}, {1024, 256, 10, false}, {331, 200, 13, false},
                      {256, 208, 10, true}, {256, 300, 10, true}, {97, 512, 16, true}};
  for (fl::DType dt : {fl::f32, fl::f64}) {
    CAPTURE(dt);
    for (const Dims& d : all) {
      CAPTURE(d.m);
      CAPTURE(d.k);
      CAPTURE(d.transpose_a);
      const fl::Tensor a_stored = fl::randn(d.transpose_a ? fl::Shape{d.k, d.m} : fl::Shape{d.m, d.k}, seed++, dt);
      const fl::Tensor a = d.transpose_a ? fl::transpose(a_stored) : a_stored;
      const fl::Tensor b = fl::randn(fl::Shape{d.k, d.n}, seed++, dt);
      compared += check_product_views(a.contiguous(), b);
      compared += check_product(fl::matmul(a, b), a, b) ? 1 : 0;
      if (!fl::detail::small_gemm_pays(d.m, d.n, d.k, d.transpose_a, false)) continue;
      ++cases;
      if (dt == fl::f32 && fl::detail::thin_sgemm_beats_small(d.m, d.n, d.k, d.transpose_a, false)) {
        // oneDNN takes it instead (at least kThinOverSmallWork): the same bits again.
        const bool bits = test::values(fl::matmul(a, b)) == test::values(fl::matmul(a, b));
        CHECK(bits);
        same += bits ? 1 : 0;
        continue;
      }
      // One unsplit call, straight into a buffer; then matmul and gemm_into (beta 1 on C = 0.5).
      const std::vector<double> sa = test::values(a_stored), sb = test::values(b);
      std::vector<double> one(static_cast<size_t>(d.m * d.n)), accumulated(one.size());
      auto call = [&]<class T>(T) {
        std::vector<T> ta(sa.begin(), sa.end()), tb(sb.begin(), sb.end()), tc(one.size(), T(0.5));
        const int64_t lda = d.transpose_a ? d.m : d.k;
        fl::detail::small_gemm(d.transpose_a, false, d.m, d.n, d.k, T(1), ta.data(), lda, tb.data(), d.n, false,
                               tc.data(), d.n);
        one.assign(tc.begin(), tc.end());
        std::fill(tc.begin(), tc.end(), T(0.5));
        fl::detail::small_gemm(d.transpose_a, false, d.m, d.n, d.k, T(1), ta.data(), lda, tb.data(), d.n, true,
                               tc.data(), d.n);
        accumulated.assign(tc.begin(), tc.end());
      };
      if (dt == fl::f32) call(0.0f);
      else call(0.0);
      fl::Tensor c = fl::full(fl::Shape{d.m, d.n}, 0.5, dt);
      fl::detail::gemm_into(a, b, c, 1.0, 1.0);
      const bool bits = test::values(fl::matmul(a, b)) == one && test::values(c) == accumulated;
      CHECK(bits);
      same += bits ? 1 : 0;
    }
  }
  CHECK(compared == 2 * 7 * 6);
  if (fl::detail::small_gemm_supported()) {
    CHECK(cases == 2 * 7);
    CHECK(same == cases);
  }
}

// small_sgemm_bt (dy @ W2^T at batch 2-8) through block_errors: every row count and depth it takes,
// column counts with no tail and with tails of 1-7 (8-column blocks, then 4-column pieces), A as
// stored and transposed.
TEST_CASE("small_sgemm_bt writes exactly its block of C, overwriting or accumulating") {
  if (!fl::detail::small_gemm_supported()) return;
  auto kernel = [](bool transpose_a, bool, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                   const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
    fl::detail::small_sgemm_bt(transpose_a, m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
  };
  int runs = 0;
  for (bool transpose_a : {false, true}) {
    for (int64_t m = 2; m <= fl::detail::kSmallBtMaxRows; ++m) {
      for (int64_t n : {16, 17, 19, 20, 23, 24, 29, 256}) {
        for (int64_t k = 2; k <= fl::detail::kSmallBtMaxDepth; ++k) {
          CAPTURE(transpose_a);
          CAPTURE(m);
          CAPTURE(n);
          CAPTURE(k);
          CHECK(fl::detail::small_sgemm_bt_pays(m, n, k, true));
          CHECK(block_errors<float>(kernel, transpose_a, true, m, n, k) == 0);
          ++runs;
        }
      }
    }
  }
  CHECK(runs == 2 * 7 * 8 * 11);
  CHECK(fl::detail::small_sgemm_bt_pays(8, 1024, 10, true));
  CHECK(block_errors<float>(kernel, false, true, 8, 1000, 12) == 0);
  // Outside its shapes: a single row (GEMV's), 9 rows, k 13, B as stored, fewer than 16 columns,
  // more than 256 columns with fewer than 8 rows, more than 1024.
  CHECK_FALSE(fl::detail::small_sgemm_bt_pays(4, 784, 10, true));
  CHECK_FALSE(fl::detail::small_sgemm_bt_pays(8, 1025, 10, true));
  CHECK_FALSE(fl::detail::small_sgemm_bt_pays(1, 256, 10, true));
  CHECK_FALSE(fl::detail::small_sgemm_bt_pays(9, 256, 10, true));
  CHECK_FALSE(fl::detail::small_sgemm_bt_pays(8, 256, 13, true));
  CHECK_FALSE(fl::detail::small_sgemm_bt_pays(8, 256, 10, false));
  CHECK_FALSE(fl::detail::small_sgemm_bt_pays(8, 15, 10, true));
}

namespace {

// packed_sgemm (kernels/gemm_packed.hpp) in small_gemm's signature at a given thread count.
auto packed_at(int threads) {
  return [threads](bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                   int64_t lda, const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
    fl::detail::packed_sgemm(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, accumulate ? 1.0f : 0.0f, c, ldc,
                             threads);
  };
}

}  // namespace

// The packed driver through block_errors (exact sums: any wrong packing, edge or k block shows):
// every extent around the micro-tile (6 x 16), the tile (kPackedMcMax rows) and the k block
// (kPackedKc) edges, all four transposes, at 1 and 3 threads.
TEST_CASE("packed_sgemm writes exactly its block of C around every block edge, overwriting or accumulating") {
  if (!fl::detail::packed_sgemm_supported()) return;
  const int64_t kc = fl::detail::kPackedKc, mc = fl::detail::kPackedMcMax;
  const std::vector<int64_t> edges = {1, 5, 6, 7, 15, 16, 17, mc - 1, mc, mc + 1, kc - 1, kc, kc + 1, 2 * kc + 1};
  int cases = 0;
  for (bool transpose_a : {false, true}) {
    for (bool transpose_b : {false, true}) {
      CAPTURE(transpose_a);
      CAPTURE(transpose_b);
      for (int threads : {1, 3}) {
        CAPTURE(threads);
        const auto kernel = packed_at(threads);
        for (int64_t x : edges) {
          CAPTURE(x);
          CHECK(block_errors<float>(kernel, transpose_a, transpose_b, x, 17, 19) == 0);   // m
          CHECK(block_errors<float>(kernel, transpose_a, transpose_b, 7, x, 19) == 0);    // n
          CHECK(block_errors<float>(kernel, transpose_a, transpose_b, 13, 21, x) == 0);   // k
          CHECK(block_errors<float>(kernel, transpose_a, transpose_b, x, x, 5) == 0);     // m and n
          cases += 4;
        }
        // Several tiles in both directions and three k blocks, every edge partial.
        CHECK(block_errors<float>(kernel, transpose_a, transpose_b, mc + 7, fl::detail::kPackedNcMax + 5, 2 * kc + 3) == 0);
        ++cases;
      }
    }
  }
  CHECK(cases == 4 * 2 * (4 * 14 + 1));
}

// Random operands at the training shapes and off-grid ones (and one whose shared packing is not kept
// between calls): within f32 rounding of the double reference, the same bits at 1, 2 and 3 threads
// and on a repeated call, C read through ldc > n.
TEST_CASE("packed_sgemm matches the double reference and repeats bit for bit at 1, 2 and 3 threads") {
  if (!fl::detail::packed_sgemm_supported()) return;
  struct Case {
    int64_t m, k, n;
    bool transpose_a, transpose_b;
  };
  const Case cases[] = {{128, 784, 256, false, false}, {784, 128, 256, true, false}, {301, 257, 530, false, true},
                        {97, 515, 1001, true, true},   {1000, 33, 70, false, false},
                        // A packed is 29200 x 144 floats, past what a thread keeps (kKeptSharedFloats).
                        {144, 29200, 5, false, false}};
  uint64_t seed = 900;
  for (const Case& s : cases) {
    CAPTURE(s.m);
    CAPTURE(s.k);
    CAPTURE(s.n);
    const int64_t lda = (s.transpose_a ? s.m : s.k) + 1, ldb = (s.transpose_b ? s.k : s.n) + 3, ldc = s.n + 2;
    const std::vector<double> av = test::values(fl::randn(fl::Shape{(s.transpose_a ? s.k : s.m) * lda}, seed++, fl::f32));
    const std::vector<double> bv = test::values(fl::randn(fl::Shape{(s.transpose_b ? s.n : s.k) * ldb}, seed++, fl::f32));
    const std::vector<float> a(av.begin(), av.end()), b(bv.begin(), bv.end());
    auto at = [&](int64_t i, int64_t p) { return static_cast<double>(s.transpose_a ? a[p * lda + i] : a[i * lda + p]); };
    auto bt = [&](int64_t p, int64_t j) { return static_cast<double>(s.transpose_b ? b[j * ldb + p] : b[p * ldb + j]); };
    std::vector<float> first;
    for (int threads : {1, 2, 3, 2}) {
      CAPTURE(threads);
      std::vector<float> c(static_cast<size_t>(s.m * ldc), std::numeric_limits<float>::quiet_NaN());
      fl::detail::packed_sgemm(s.transpose_a, s.transpose_b, s.m, s.n, s.k, 1.5f, a.data(), lda, b.data(), ldb, 0.0f,
                               c.data(), ldc, threads);
      if (first.empty()) {
        int bad = 0;
        for (int64_t i = 0; i < s.m; ++i) {
          for (int64_t j = 0; j < s.n; ++j) {
            double want = 0, magnitude = 0;
            for (int64_t p = 0; p < s.k; ++p) {
              want += at(i, p) * bt(p, j);
              magnitude += std::abs(at(i, p) * bt(p, j));
            }
            bad += !(std::abs(c[i * ldc + j] - 1.5 * want) <= 4e-6 * 1.5 * (magnitude + 1.0));
          }
        }
        CHECK(bad == 0);
        first = c;
      } else {
        int differing = 0;
        for (int64_t i = 0; i < s.m; ++i) {
          for (int64_t j = 0; j < s.n; ++j) differing += c[i * ldc + j] != first[i * ldc + j];
        }
        CHECK(differing == 0);
      }
    }
  }
}

// Which split products take the packed driver (the rule in gemm_packed.hpp), and that matmul and
// gemm_into there give exactly one direct packed_sgemm call's bits (the driver's bits do not depend
// on the thread count), within f32 rounding of the double reference through every view.
TEST_CASE("f32 products the packed driver pays for go to it and equal one direct call bit for bit") {
  using fl::detail::packed_sgemm_pays;
  const bool supported = fl::detail::packed_sgemm_supported();
  CHECK(packed_sgemm_pays(784, 256, 128, true, false, 2) == supported);   // x^T @ dh, batch 128
  CHECK(packed_sgemm_pays(512, 512, 512, false, false, 2) == supported);  // square 512
  CHECK_FALSE(packed_sgemm_pays(784, 256, 128, true, false, 1));          // one thread: BLAS
  CHECK_FALSE(packed_sgemm_pays(1024, 256, 784, false, false, 2));        // x @ W1
  CHECK_FALSE(packed_sgemm_pays(784, 256, 1024, true, false, 2));         // x^T @ dh, batch 1024
  CHECK_FALSE(packed_sgemm_pays(128, 256, 256, false, false, 2));         // few rows
  CHECK_FALSE(packed_sgemm_pays(1024, 10, 256, false, false, 2));         // narrow
  uint64_t seed = 950;
  for (const ProductDims d : {ProductDims{784, 128, 256}, ProductDims{600, 97, 150}, ProductDims{515, 512, 70}}) {
    CAPTURE(d.m);
    CAPTURE(d.k);
    CAPTURE(d.n);
    auto [a, b] = random_operands(d, seed, fl::f32);
    CHECK(check_product_views(a, b) == 5);
    if (!supported || fl::detail::intra_op_threads() < 2) continue;
    // A transposed (stored [k, m]) as x^T @ dh is; matmul, then gemm_into accumulating onto 0.5.
    const fl::Tensor a_stored = fl::transpose(a).contiguous();
    const fl::Tensor a_t = fl::transpose(a_stored);
    std::vector<float> want(static_cast<size_t>(d.m * d.n));
    fl::detail::packed_sgemm(true, false, d.m, d.n, d.k, 1.0f, a_stored.data<float>(), d.m, b.data<float>(), d.n, 0.0f,
                             want.data(), d.n, 1);
    const fl::Tensor got = fl::matmul(a_t, b);
    CHECK(test::values(got) == std::vector<double>(want.begin(), want.end()));
    fl::Tensor c = fl::full(fl::Shape{d.m, d.n}, 0.5, fl::f32);
    fl::detail::gemm_into(a_t, b, c, 1.0, 1.0);
    std::vector<float> accumulated(static_cast<size_t>(d.m * d.n), 0.5f);
    fl::detail::packed_sgemm(true, false, d.m, d.n, d.k, 1.0f, a_stored.data<float>(), d.m, b.data<float>(), d.n, 1.0f,
                             accumulated.data(), d.n, 1);
    CHECK(test::values(c) == std::vector<double>(accumulated.begin(), accumulated.end()));
  }
}
