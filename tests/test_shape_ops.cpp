// Shape ops: reshape (views, -1), transpose, permute, concat, gather and contiguous, with every
// dtype, non-contiguous and empty inputs, and the declared errors.
#include <cstdint>
#include <string>
#include <vector>

#include "support/reference.hpp"

using test::check_op_throws;
using test::check_tensor;
using test::check_throws;
using test::Host;

namespace {
fl::Tensor iota(const fl::Shape& shape, fl::DType dt = fl::f32) {
  std::vector<double> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i);
  return test::make(v, shape, dt);
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// reshape

TEST_CASE("reshape of a contiguous tensor is a view that shares storage") {
  fl::Tensor a = iota(fl::Shape{2, 3});
  const fl::Tensor b = fl::reshape(a, fl::Shape{3, 2});
  check_tensor(b, {0, 1, 2, 3, 4, 5}, fl::Shape{3, 2}, fl::f32);
  CHECK(a.storage().get() == b.storage().get());
  a.data<float>()[4] = 40.0f;  // visible through the view
  CHECK(b.to_vector<float>()[4] == 40.0f);
  const fl::Tensor c = fl::reshape(b, fl::Shape{6});
  CHECK(c.storage().get() == a.storage().get());
  CHECK(c.is_contiguous());
}

TEST_CASE("reshape infers one -1 dimension") {
  const fl::Tensor a = iota(fl::Shape{2, 3, 4});
  check_tensor(fl::reshape(a, fl::Shape{-1}), test::values(a), fl::Shape{24}, fl::f32);
  check_tensor(fl::reshape(a, fl::Shape{4, -1}), test::values(a), fl::Shape{4, 6}, fl::f32);
  check_tensor(fl::reshape(a, fl::Shape{-1, 2, 3}), test::values(a), fl::Shape{4, 2, 3}, fl::f32);
  check_tensor(fl::reshape(a, fl::Shape{2, -1, 2}), test::values(a), fl::Shape{2, 6, 2}, fl::f32);
  // Rank 0 and back.
  check_tensor(fl::reshape(fl::scalar(5.0f), fl::Shape{1, 1}), {5}, fl::Shape{1, 1}, fl::f32);
  check_tensor(fl::reshape(fl::tensor({5.0f}), fl::Shape{}), {5}, fl::Shape{}, fl::f32);
  check_tensor(fl::reshape(fl::tensor({5.0f}), fl::Shape{-1}), {5}, fl::Shape{1}, fl::f32);
  // Empty tensors.
  check_tensor(fl::reshape(fl::zeros(fl::Shape{0, 3}), fl::Shape{3, 0}), {}, fl::Shape{3, 0}, fl::f32);
  check_tensor(fl::reshape(fl::zeros(fl::Shape{0, 3}), fl::Shape{-1, 3}), {}, fl::Shape{0, 3}, fl::f32);
  check_tensor(fl::reshape(fl::zeros(fl::Shape{2, 0}), fl::Shape{0}), {}, fl::Shape{0}, fl::f32);
}

TEST_CASE("reshape of a non-contiguous tensor copies its logical order, in every dtype") {
  int compared = 0;
  for (fl::DType dt : test::kAllDTypes) {
    CAPTURE(dt);
    const fl::Tensor a = test::random_tensor(fl::Shape{3, 4}, 11, dt);
    const fl::Tensor t = fl::transpose(a);  // [4, 3]
    const std::vector<double> logical = test::permute_ref(test::host(a), {1, 0}).values;
    check_tensor(fl::reshape(t, fl::Shape{12}), logical, fl::Shape{12}, dt);
    check_tensor(fl::reshape(t, fl::Shape{2, -1}), logical, fl::Shape{2, 6}, dt);
    const fl::Tensor s = test::strided_view(a);
    check_tensor(fl::reshape(s, fl::Shape{6, 2}), test::values(a), fl::Shape{6, 2}, dt);
    ++compared;
  }
  CHECK(compared == 8);
}

TEST_CASE("reshape rejects bad target shapes with ShapeError") {
  const fl::Tensor a = iota(fl::Shape{2, 3});
  check_op_throws<fl::ShapeError>("reshape", [&] { (void)fl::reshape(a, fl::Shape{4}); }, {"[2, 3]", "[4]"});
  check_op_throws<fl::ShapeError>("reshape", [&] { (void)fl::reshape(a, fl::Shape{-1, -1}); }, {"[-1, -1]"});
  check_op_throws<fl::ShapeError>("reshape", [&] { (void)fl::reshape(a, fl::Shape{-2, -3}); }, {"[-2, -3]"});
  check_op_throws<fl::ShapeError>("reshape", [&] { (void)fl::reshape(a, fl::Shape{4, -1}); }, {"[4, -1]"});
  check_op_throws<fl::ShapeError>("reshape", [&] { (void)fl::reshape(a, fl::Shape{}); });
  check_op_throws<fl::ShapeError>("reshape", [&] { (void)fl::reshape(a, fl::Shape{7, 0}); });
}

// ---------------------------------------------------------------------------------------------
// transpose and permute

TEST_CASE("transpose swaps the two dimensions as a view") {
  const fl::Tensor a = fl::tensor(std::vector<int32_t>{1, 2, 3, 4, 5, 6}, fl::Shape{2, 3});
  const fl::Tensor t = fl::transpose(a);
  check_tensor(t, {1, 4, 2, 5, 3, 6}, fl::Shape{3, 2}, fl::i32);
  CHECK(t.storage().get() == a.storage().get());
  CHECK_FALSE(t.is_contiguous());
  check_tensor(fl::transpose(t), {1, 2, 3, 4, 5, 6}, fl::Shape{2, 3}, fl::i32);
  check_tensor(fl::transpose(fl::zeros(fl::Shape{0, 4})), {}, fl::Shape{4, 0}, fl::f32);
  // contiguous() of a view is a row-major copy; of a contiguous tensor it is the tensor itself.
  const fl::Tensor c = t.contiguous();
  CHECK(c.is_contiguous());
  check_tensor(c, {1, 4, 2, 5, 3, 6}, fl::Shape{3, 2}, fl::i32);
  CHECK(c.storage().get() != a.storage().get());
  CHECK(a.contiguous().storage().get() == a.storage().get());
}

TEST_CASE("transpose needs rank 2 and throws ShapeError otherwise") {
  check_throws<fl::ShapeError>([] { (void)fl::transpose(fl::zeros(fl::Shape{2, 3, 4})); }, {"transpose", "[2, 3, 4]"});
  check_throws<fl::ShapeError>([] { (void)fl::transpose(fl::zeros(fl::Shape{3})); }, {"transpose", "[3]"});
  check_throws<fl::ShapeError>([] { (void)fl::transpose(fl::scalar(1.0f)); }, {"transpose"});
}

TEST_CASE("permute reorders dimensions as a view, in every dtype") {
  int compared = 0;
  uint64_t seed = 40;
  const std::vector<std::vector<int64_t>> perms = {{0, 1, 2}, {2, 0, 1}, {1, 2, 0}, {2, 1, 0}, {0, 2, 1}};
  for (fl::DType dt : test::kAllDTypes) {
    for (const auto& perm : perms) {
      CAPTURE(dt);
      CAPTURE(perm[0]);
      CAPTURE(perm[1]);
      const fl::Tensor x = test::random_tensor(fl::Shape{2, 3, 4}, seed++, dt);
      const Host want = test::permute_ref(test::host(x), perm);
      const fl::Tensor p = fl::permute(x, perm);
      check_tensor(p, want.values, want.shape, dt);
      CHECK(p.storage().get() == x.storage().get());
      // Permuting a view (and a strided view) composes.
      check_tensor(fl::permute(test::permuted_view(x), perm), want.values, want.shape, dt);
      check_tensor(fl::permute(test::strided_view(x), perm), want.values, want.shape, dt);
      ++compared;
    }
  }
  CHECK(compared == 40);
  check_tensor(fl::permute(fl::scalar(3), {}), {3}, fl::Shape{}, fl::i32);
  check_tensor(fl::permute(fl::zeros(fl::Shape{2, 0, 3}), {2, 0, 1}), {}, fl::Shape{3, 2, 0}, fl::f32);
  // Inverse permutations undo each other.
  const fl::Tensor x = iota(fl::Shape{2, 3, 4, 5});
  check_tensor(fl::permute(fl::permute(x, {3, 1, 0, 2}), {2, 1, 3, 0}), test::values(x), fl::Shape{2, 3, 4, 5}, fl::f32);
}

TEST_CASE("permute rejects anything but a permutation of the axes with InvalidArgument") {
  const fl::Tensor x = iota(fl::Shape{2, 3, 4});
  check_op_throws<fl::InvalidArgument>("permute", [&] { (void)fl::permute(x, {0, 0, 1}); });
  check_op_throws<fl::InvalidArgument>("permute", [&] { (void)fl::permute(x, {0, 1}); });
  check_op_throws<fl::InvalidArgument>("permute", [&] { (void)fl::permute(x, {0, 1, 2, 3}); });
  check_op_throws<fl::InvalidArgument>("permute", [&] { (void)fl::permute(x, {0, 1, 3}); }, {"3"});
  check_op_throws<fl::InvalidArgument>("permute", [&] { (void)fl::permute(x, {0, 1, -7}); }, {"-7"});
}

// ---------------------------------------------------------------------------------------------
// concat

TEST_CASE("concat joins along an axis, negative axes included") {
  const fl::Tensor a = fl::tensor(std::vector<int32_t>{1, 2, 3, 4}, fl::Shape{2, 2});
  const fl::Tensor b = fl::tensor(std::vector<int32_t>{5, 6}, fl::Shape{1, 2});
  const fl::Tensor c = fl::tensor(std::vector<int32_t>{7, 8}, fl::Shape{2, 1});
  check_tensor(fl::concat({a, b}, 0), {1, 2, 3, 4, 5, 6}, fl::Shape{3, 2}, fl::i32);
  check_tensor(fl::concat({a, c}, 1), {1, 2, 7, 3, 4, 8}, fl::Shape{2, 3}, fl::i32);
  check_tensor(fl::concat({a, c}, -1), {1, 2, 7, 3, 4, 8}, fl::Shape{2, 3}, fl::i32);
  check_tensor(fl::concat({b, a, b}, -2), {5, 6, 1, 2, 3, 4, 5, 6}, fl::Shape{4, 2}, fl::i32);
  check_tensor(fl::concat({a}, 0), {1, 2, 3, 4}, fl::Shape{2, 2}, fl::i32);
  check_tensor(fl::concat({fl::tensor({1.0f}), fl::tensor({2.0f, 3.0f})}, 0), {1, 2, 3}, fl::Shape{3}, fl::f32);
  // Zero-size pieces contribute nothing; all-empty gives empty.
  check_tensor(fl::concat({a, fl::zeros(fl::Shape{0, 2}, fl::i32), b}, 0), {1, 2, 3, 4, 5, 6}, fl::Shape{3, 2}, fl::i32);
  check_tensor(fl::concat({fl::zeros(fl::Shape{2, 0}), fl::zeros(fl::Shape{2, 0})}, 1), {}, fl::Shape{2, 0}, fl::f32);
  check_tensor(fl::concat({fl::zeros(fl::Shape{0, 3}), fl::zeros(fl::Shape{0, 3})}, 1), {}, fl::Shape{0, 6}, fl::f32);
}

TEST_CASE("concat matches the reference in every dtype with non-contiguous pieces") {
  int compared = 0;
  uint64_t seed = 600;
  for (fl::DType dt : test::kAllDTypes) {
    for (int64_t axis : {0, 1, 2, -1}) {
      CAPTURE(dt);
      CAPTURE(axis);
      const int64_t ax = axis < 0 ? axis + 3 : axis;
      fl::Shape s1{2, 3, 4}, s2{2, 3, 4}, s3{2, 3, 4};
      s1[static_cast<size_t>(ax)] = 1;
      s3[static_cast<size_t>(ax)] = 5;
      const fl::Tensor x = test::random_tensor(s1, seed++, dt);
      const fl::Tensor y = test::random_tensor(s2, seed++, dt);
      const fl::Tensor z = test::random_tensor(s3, seed++, dt);
      const Host want = test::concat_ref({test::host(x), test::host(y), test::host(z)}, axis);
      check_tensor(fl::concat({x, y, z}, axis), want.values, want.shape, dt);
      check_tensor(fl::concat({test::permuted_view(x), test::strided_view(y), test::permuted_view(z)}, axis), want.values,
                   want.shape, dt);
      ++compared;
    }
  }
  CHECK(compared == 32);
}

TEST_CASE("concat rejects empty lists, mixed dtypes, mismatched shapes and bad axes") {
  const fl::Tensor a = fl::zeros(fl::Shape{2, 3});
  check_op_throws<fl::InvalidArgument>("concat", [] { (void)fl::concat({}, 0); });
  check_op_throws<fl::DTypeError>("concat", [&] { (void)fl::concat({a, fl::zeros(fl::Shape{2, 3}, fl::i32)}, 0); },
                                  {"f32", "i32"});
  check_op_throws<fl::ShapeError>("concat", [&] { (void)fl::concat({a, fl::zeros(fl::Shape{3, 2})}, 0); },
                                  {"[2, 3]", "[3, 2]"});
  check_op_throws<fl::ShapeError>("concat", [&] { (void)fl::concat({a, fl::zeros(fl::Shape{2, 3, 1})}, 0); },
                                  {"[2, 3]", "[2, 3, 1]"});
  check_op_throws<fl::ShapeError>("concat", [&] { (void)fl::concat({a, fl::zeros(fl::Shape{6})}, 0); });
  check_op_throws<fl::InvalidArgument>("concat", [&] { (void)fl::concat({a, a}, 2); }, {"2"});
  check_op_throws<fl::InvalidArgument>("concat", [&] { (void)fl::concat({a, a}, -3); }, {"-3"});
  // Rank-0 pieces have no axis to join along (which error kind is not specified).
  check_op_throws<fl::Error>("concat", [] { (void)fl::concat({fl::scalar(1.0f), fl::scalar(2.0f)}, 0); });
}

// ---------------------------------------------------------------------------------------------
// gather

TEST_CASE("gather picks rows along axis 0, repeated indices included") {
  const fl::Tensor p = fl::tensor(std::vector<float>{1, 2, 3, 4, 5, 6}, fl::Shape{3, 2});
  check_tensor(fl::gather(p, fl::tensor({int64_t{2}, int64_t{0}, int64_t{2}})), {5, 6, 1, 2, 5, 6}, fl::Shape{3, 2}, fl::f32);
  check_tensor(fl::gather(p, fl::tensor({1, 1, 1, 1})), {3, 4, 3, 4, 3, 4, 3, 4}, fl::Shape{4, 2}, fl::f32);  // i32
  // Index shape comes first: [2, 2] indices into [3, 2] params -> [2, 2, 2].
  check_tensor(fl::gather(p, fl::tensor(std::vector<int64_t>{0, 1, 2, 0}, fl::Shape{2, 2})), {1, 2, 3, 4, 5, 6, 1, 2},
               fl::Shape{2, 2, 2}, fl::f32);
  // A rank-0 index picks one row.
  check_tensor(fl::gather(p, fl::scalar(int64_t{1})), {3, 4}, fl::Shape{2}, fl::f32);
  // Rank-1 params: elements.
  check_tensor(fl::gather(fl::tensor({10, 20, 30}), fl::tensor({2, 0})), {30, 10}, fl::Shape{2}, fl::i32);
  // No indices: an empty result with the row shape.
  check_tensor(fl::gather(p, fl::zeros(fl::Shape{0}, fl::i64)), {}, fl::Shape{0, 2}, fl::f32);
  // Rows of zero width.
  check_tensor(fl::gather(fl::zeros(fl::Shape{3, 0}), fl::tensor({2, 1})), {}, fl::Shape{2, 0}, fl::f32);
}

TEST_CASE("gather matches the reference for every params dtype and index dtype, contiguous or not") {
  int compared = 0;
  uint64_t seed = 700;
  for (fl::DType dt : test::kAllDTypes) {
    for (fl::DType index_dt : {fl::i32, fl::i64}) {
      CAPTURE(dt);
      CAPTURE(index_dt);
      const fl::Tensor params = test::random_tensor(fl::Shape{5, 3, 2}, seed++, dt);
      std::vector<double> idx;
      test::Rng rng(seed++);
      for (int i = 0; i < 12; ++i) idx.push_back(static_cast<double>(rng.integer(0, 4)));
      const fl::Tensor indices = test::make(idx, fl::Shape{3, 4}, index_dt);
      const Host want = test::gather_ref(test::host(params), test::host(indices));
      REQUIRE(want.shape == fl::Shape{3, 4, 3, 2});
      check_tensor(fl::gather(params, indices), want.values, want.shape, dt);
      check_tensor(fl::gather(test::permuted_view(params), test::permuted_view(indices)), want.values, want.shape, dt);
      check_tensor(fl::gather(test::strided_view(params), test::strided_view(indices)), want.values, want.shape, dt);
      ++compared;
    }
  }
  CHECK(compared == 16);
}

TEST_CASE("gather rejects bad indices: OutOfRange naming the index, DTypeError for non-integers") {
  const fl::Tensor p = fl::zeros(fl::Shape{3, 2});
  check_op_throws<fl::OutOfRange>("gather", [&] { (void)fl::gather(p, fl::tensor({int64_t{0}, int64_t{7}})); }, {"7"});
  check_op_throws<fl::OutOfRange>("gather", [&] { (void)fl::gather(p, fl::tensor({3})); }, {"3"});
  check_op_throws<fl::OutOfRange>("gather", [&] { (void)fl::gather(p, fl::tensor({0, -1})); }, {"-1"});
  check_op_throws<fl::OutOfRange>("gather", [&] { (void)fl::gather(p, fl::tensor({int64_t{123456789012}})); },
                                  {"123456789012"});
  check_op_throws<fl::OutOfRange>("gather", [] { (void)fl::gather(fl::zeros(fl::Shape{0, 2}), fl::tensor({0})); }, {"0"});
  // A bad index inside a non-contiguous index tensor is found too.
  check_op_throws<fl::OutOfRange>("gather", [&] {
    (void)fl::gather(p, test::strided_view(fl::tensor(std::vector<int64_t>{0, 1, 2, 9}, fl::Shape{2, 2})));
  }, {"9"});
  for (fl::DType dt : {fl::f32, fl::f64, fl::u8, fl::b8}) {
    CAPTURE(dt);
    check_op_throws<fl::DTypeError>("gather", [&] { (void)fl::gather(p, fl::zeros(fl::Shape{2}, dt)); },
                                    {std::string(fl::dtype_name(dt))});
  }
  check_throws<fl::Error>([] { (void)fl::gather(fl::scalar(1.0f), fl::tensor({0})); }, {"gather"});
}
