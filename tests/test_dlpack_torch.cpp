// DLPack exchange with libtorch (at::fromDLPack / at::toDLPack): both directions share memory (the
// same data pointer, writes visible on both sides) and each side's deleter frees its memory only
// after the other let go. Its own executable, built only where libtorch's headers and libraries are
// found (tests/meson.build), and kept small: ATen's headers make up most of its compile time.
#include <ATen/ATen.h>
#include <ATen/DLConvertor.h>
#include <doctest/doctest.h>

#include <vector>

#include "flowlet/dlpack.hpp"
#include "flowlet/flowlet.hpp"

namespace fl = flowlet;

TEST_CASE("a flowlet tensor handed to at::fromDLPack is the same memory, and outlives the flowlet handle") {
  const int64_t before = fl::memory_stats(fl::Device()).bytes_in_use;
  at::Tensor t;
  fl::Tensor x = fl::reshape(fl::arange(6, fl::i64).astype(fl::f32), {2, 3});
  {
    t = at::fromDLPack(fl::to_dlpack(fl::transpose(x)));  // a strided view: strides [1, 3]
    CHECK(t.data_ptr() == x.raw_data());
    CHECK(t.sizes().vec() == std::vector<int64_t>{3, 2});
    CHECK(t.strides().vec() == std::vector<int64_t>{1, 3});
    CHECK((t.scalar_type() == at::kFloat));
    CHECK(t[2][1].item<float>() == 5.0f);  // x[1][2]
  }
  t.mul_(10);  // torch writes; flowlet sees it
  CHECK(x.to_vector<float>() == std::vector<float>{0, 10, 20, 30, 40, 50});
  x.data<float>()[1] = -1.0f;  // flowlet writes x[0][1] = t[1][0]; torch sees it
  CHECK(t[1][0].item<float>() == -1.0f);
  x = fl::Tensor();
  CHECK(fl::memory_stats(fl::Device()).bytes_in_use - before == 24);  // torch still holds it
  CHECK(t.sum().item<float>() == doctest::Approx(139.0));
  t = at::Tensor();
  CHECK(fl::memory_stats(fl::Device()).bytes_in_use == before);  // the deleter freed it
}

TEST_CASE("a torch tensor handed to from_dlpack via at::toDLPack is the same memory, released after the last view") {
  at::Tensor t = at::arange(12, at::kDouble).reshape({3, 4});
  const auto alone = t.storage().use_count();  // counted the same way every time below
  fl::Tensor x = fl::from_dlpack(at::toDLPack(t.slice(1, 1, 3)));  // columns 1..2: strides [4, 1]
  CHECK(t.storage().use_count() == alone + 1);  // the DLPack context holds the slice, sharing t's storage
  CHECK(x.raw_data() == static_cast<double*>(t.data_ptr()) + 1);
  CHECK(x.strides() == fl::Strides{4, 1});
  CHECK(x.to_vector<double>() == std::vector<double>{1, 2, 5, 6, 9, 10});
  t.index_put_({1, 1}, 100.0);  // torch writes; flowlet sees it
  CHECK(x.to_vector<double>()[2] == 100.0);
  x.data<double>()[1] = -7.0;  // flowlet writes x[0][1] = t[0][2]
  CHECK(t[0][2].item<double>() == -7.0);
  fl::Tensor view = fl::slice(x, 0, 2, 1);
  x = fl::Tensor();
  CHECK(t.storage().use_count() == alone + 1);  // `view` keeps the DLPack tensor
  CHECK(view.to_vector<double>() == std::vector<double>{9, 10});
  view = fl::Tensor();
  CHECK(t.storage().use_count() == alone);  // the deleter ran

}

TEST_CASE("b8 reaches libtorch as uint8 (DLPack 0.6 has no bool code; libtorch 1.13 refuses to export bool)") {
  const fl::Tensor flags = fl::tensor({1.0f, 0.0f, 2.0f}) > 0.5f;
  const at::Tensor bytes = at::fromDLPack(fl::to_dlpack(flags));
  CHECK((bytes.scalar_type() == at::kByte));
  CHECK(bytes.data_ptr() == flags.raw_data());
  CHECK(bytes.sum().item<int64_t>() == 2);
  CHECK(bytes[1].item<int64_t>() == 0);
}
