// DLPack exchange (flowlet/dlpack.hpp): round trips share memory (same pointer, writes visible),
// every dtype's code and bits, strided views and byte offsets, the deleter contract (exactly once,
// only after the last tensor; also when from_dlpack throws), and the errors. The exchange with
// libtorch is tests/test_dlpack_torch.cpp (built only where libtorch is installed).
#include <dlpack/dlpack.h>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "flowlet/dlpack.hpp"
#include "flowlet/flowlet.hpp"
#include "support/reference.hpp"

using test::check_throws;

namespace {

// A DLManagedTensor over host memory we own, whose deleter counts its calls: the producer side of
// the ownership tests, built by hand so that every DLTensor field can be set.
struct Producer {
  std::vector<unsigned char> bytes;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  int deleted = 0;
  DLManagedTensor managed{};

  Producer(size_t byte_count, std::vector<int64_t> shape_, std::vector<int64_t> strides_, DLDataType dtype)
      : bytes(byte_count), shape(std::move(shape_)), strides(std::move(strides_)) {
    managed.dl_tensor.data = bytes.data();
    managed.dl_tensor.device = {kDLCPU, 0};
    managed.dl_tensor.ndim = static_cast<int32_t>(shape.size());
    managed.dl_tensor.dtype = dtype;
    managed.dl_tensor.shape = shape.data();
    managed.dl_tensor.strides = strides.empty() ? nullptr : strides.data();
    managed.dl_tensor.byte_offset = 0;
    managed.manager_ctx = this;
    managed.deleter = [](DLManagedTensor* self) { ++static_cast<Producer*>(self->manager_ctx)->deleted; };
  }
  template <class T>
  T* as() { return reinterpret_cast<T*>(bytes.data()); }
};

constexpr DLDataType kF32{kDLFloat, 32, 1};

int64_t cpu_bytes_in_use() { return fl::memory_stats(fl::Device()).bytes_in_use; }

}  // namespace

TEST_CASE("to_dlpack maps every dtype to its DLPack code and bits, and from_dlpack maps it back") {
  struct Row {
    fl::DType dtype;
    uint8_t code;
    uint8_t bits;
    fl::DType back;  // b8 comes back as u8: DLPack 0.6 has no bool code
  };
#if DLPACK_VERSION >= 80
  constexpr Row b8_row{fl::b8, kDLBool, 8, fl::b8};
#else
  constexpr Row b8_row{fl::b8, kDLUInt, 8, fl::u8};
#endif
  const std::vector<Row> rows = {
      {fl::f32, kDLFloat, 32, fl::f32}, {fl::f64, kDLFloat, 64, fl::f64},  {fl::f16, kDLFloat, 16, fl::f16},
      {fl::bf16, kDLBfloat, 16, fl::bf16}, {fl::i32, kDLInt, 32, fl::i32}, {fl::i64, kDLInt, 64, fl::i64},
      {fl::u8, kDLUInt, 8, fl::u8},        b8_row,
  };
  for (const Row& row : rows) {
    CAPTURE(fl::dtype_name(row.dtype));
    const fl::Tensor x = fl::reshape(fl::arange(6, fl::i64).astype(row.dtype), {2, 3});
    DLManagedTensor* m = fl::to_dlpack(x);
    const DLTensor& dl = m->dl_tensor;
    CHECK(dl.dtype.code == row.code);
    CHECK(dl.dtype.bits == row.bits);
    CHECK(dl.dtype.lanes == 1);
    CHECK(dl.device.device_type == kDLCPU);
    CHECK(dl.device.device_id == 0);
    REQUIRE(dl.ndim == 2);
    CHECK(dl.shape[0] == 2);
    CHECK(dl.shape[1] == 3);
    CHECK(dl.strides[0] == 3);
    CHECK(dl.strides[1] == 1);
    CHECK(dl.byte_offset == 0);
    CHECK(dl.data == x.raw_data());

    const fl::Tensor y = fl::from_dlpack(m);
    CHECK(y.dtype() == row.back);
    CHECK(y.raw_data() == x.raw_data());  // no copy
    CHECK(y.shape() == fl::Shape{2, 3});
    CHECK(std::memcmp(y.raw_data(), x.raw_data(), 6 * fl::dtype_size(row.dtype)) == 0);
  }
}

TEST_CASE("a round trip shares memory: writes through either side are visible in the other") {
  fl::Tensor x = fl::zeros({4}, fl::f32);
  DLManagedTensor* m = fl::to_dlpack(x);
  static_cast<float*>(m->dl_tensor.data)[2] = 7.0f;  // the consumer writes
  CHECK(x.to_vector<float>() == std::vector<float>{0, 0, 7, 0});
  fl::Tensor y = fl::from_dlpack(m);
  x.data<float>()[0] = -1.0f;  // flowlet writes; the re-imported tensor sees it
  CHECK(y.to_vector<float>() == std::vector<float>{-1, 0, 7, 0});
}

TEST_CASE("to_dlpack keeps strided views as they are: the first element's address and the strides") {
  const fl::Tensor base = fl::reshape(fl::arange(24, fl::i64).astype(fl::f64), {4, 6});
  const fl::Tensor transposed = fl::transpose(base);    // strides [1, 6]
  const fl::Tensor sliced = fl::slice(base, 1, 2, 3);   // columns 2..4: offset 2, strides [6, 1]
  for (const fl::Tensor& view : {transposed, sliced}) {
    DLManagedTensor* m = fl::to_dlpack(view);
    const DLTensor& dl = m->dl_tensor;
    CHECK(dl.data == view.raw_data());
    CHECK(dl.byte_offset == 0);  // libtorch 1.13 ignores byte_offset: the offset is in data
    REQUIRE(dl.ndim == 2);
    for (int i = 0; i < 2; ++i) {
      CHECK(dl.shape[i] == view.shape()[i]);
      CHECK(dl.strides[i] == view.strides()[i]);
    }
    // Read the elements back through DLPack's own addressing, as a consumer would.
    std::vector<double> through_dlpack;
    for (int64_t r = 0; r < dl.shape[0]; ++r) {
      for (int64_t c = 0; c < dl.shape[1]; ++c) {
        through_dlpack.push_back(static_cast<const double*>(dl.data)[r * dl.strides[0] + c * dl.strides[1]]);
      }
    }
    CHECK(through_dlpack == view.to_vector<double>());
    const fl::Tensor back = fl::from_dlpack(m);
    CHECK(back.raw_data() == view.raw_data());
    CHECK(back.strides() == view.strides());
    CHECK(back.to_vector<double>() == view.to_vector<double>());
  }
}

TEST_CASE("from_dlpack honours byte_offset, explicit strides (zero too) and null strides") {
  SUBCASE("byte_offset and column-major strides") {
    // 2x3 column-major f32, starting 8 bytes (two floats) into the buffer.
    Producer p(8 * sizeof(float), {2, 3}, {1, 2}, kF32);
    std::iota(p.as<float>(), p.as<float>() + 8, 0.0f);  // 0 1 2 3 4 5 6 7
    p.managed.dl_tensor.byte_offset = 2 * sizeof(float);
    const fl::Tensor t = fl::from_dlpack(&p.managed);
    CHECK(t.raw_data() == p.as<float>() + 2);
    // element (r, c) is at 2 + r + 2c: rows [2 4 6], [3 5 7]
    CHECK(t.to_vector<float>() == std::vector<float>{2, 4, 6, 3, 5, 7});
    CHECK((t + 1.0f).to_vector<float>() == std::vector<float>{3, 5, 7, 4, 6, 8});  // ops read it
  }
  SUBCASE("a zero stride broadcasts one row") {
    Producer p(3 * sizeof(float), {4, 3}, {0, 1}, kF32);
    std::iota(p.as<float>(), p.as<float>() + 3, 1.0f);
    const fl::Tensor t = fl::from_dlpack(&p.managed);
    CHECK(fl::sum(t).item<float>() == doctest::Approx(24.0));
    CHECK(t.to_vector<float>() == std::vector<float>{1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3});
  }
  SUBCASE("null strides mean row-major") {
    Producer p(6 * sizeof(float), {3, 2}, {}, kF32);
    std::iota(p.as<float>(), p.as<float>() + 6, 0.0f);
    const fl::Tensor t = fl::from_dlpack(&p.managed);
    CHECK(t.strides() == fl::Strides{2, 1});
    CHECK(t.to_vector<float>() == std::vector<float>{0, 1, 2, 3, 4, 5});
  }
  SUBCASE("a scalar and an empty tensor") {
    Producer scalar(sizeof(float), {}, {}, kF32);
    *scalar.as<float>() = 2.5f;
    CHECK(fl::from_dlpack(&scalar.managed).item<float>() == 2.5f);
    Producer empty(0, {0, 5}, {5, 1}, kF32);
    empty.managed.dl_tensor.data = nullptr;
    const fl::Tensor e = fl::from_dlpack(&empty.managed);
    CHECK(e.shape() == fl::Shape{0, 5});
    CHECK(e.numel() == 0);
  }
}

TEST_CASE("from_dlpack calls the producer's deleter exactly once, after the last tensor sharing it") {
  Producer p(6 * sizeof(float), {2, 3}, {}, kF32);
  {
    fl::Tensor t = fl::from_dlpack(&p.managed);
    fl::Tensor view = fl::slice(t, 1, 1, 2);  // shares the storage
    fl::Tensor same = t;
    t = fl::Tensor();
    same = fl::Tensor();
    CHECK(p.deleted == 0);  // `view` still reads the memory
    CHECK(view.shape() == fl::Shape{2, 2});
    view = fl::Tensor();
    CHECK(p.deleted == 1);
  }
  CHECK(p.deleted == 1);
  // A result computed from it does not hold the memory.
  Producer q(4 * sizeof(float), {4}, {}, kF32);
  fl::Tensor doubled;
  {
    const fl::Tensor t = fl::from_dlpack(&q.managed);
    doubled = t * 2.0f;
  }
  CHECK(q.deleted == 1);
  CHECK(doubled.numel() == 4);
}

TEST_CASE("to_dlpack keeps the storage alive until the consumer's deleter call, and frees it then") {
  const int64_t before = cpu_bytes_in_use();
  DLManagedTensor* m = nullptr;
  {
    fl::Tensor x = fl::full({1024}, 3.0, fl::f32);
    m = fl::to_dlpack(x);
  }  // the only flowlet handle is gone
  CHECK(cpu_bytes_in_use() - before == 4096);
  CHECK(static_cast<const float*>(m->dl_tensor.data)[1023] == 3.0f);
  m->deleter(m);
  CHECK(cpu_bytes_in_use() == before);
}

TEST_CASE("from_dlpack rejects what flowlet cannot hold, naming it, and still calls the deleter once") {
  struct Case {
    const char* name;
    void (*spoil)(DLTensor&);
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {"complex", [](DLTensor& t) { t.dtype = {kDLComplex, 64, 1}; }, {"from_dlpack", "code 5", "kDLComplex", "64 bits", "supported"}},
      {"int16", [](DLTensor& t) { t.dtype = {kDLInt, 16, 1}; }, {"code 0", "kDLInt", "16 bits", "kDLInt 32/64"}},
      {"lanes", [](DLTensor& t) { t.dtype = {kDLFloat, 32, 4}; }, {"kDLFloat", "4 lanes", "1 lane"}},
      {"opencl", [](DLTensor& t) { t.device = {kDLOpenCL, 0}; }, {"device type 4", "kDLOpenCL", "supported: kDLCPU, kDLCUDA"}},
      {"rocm", [](DLTensor& t) { t.device = {kDLROCM, 1}; }, {"device type 10", "kDLROCM", "id 1"}},
      {"negative stride", [](DLTensor& t) { t.strides[1] = -1; }, {"negative strides", "[2, 3]", "3, -1"}},
      {"negative dim", [](DLTensor& t) { t.shape[0] = -2; }, {"from_dlpack", "[-2, 3]"}},
      {"null data", [](DLTensor& t) { t.data = nullptr; }, {"null data"}},
      {"misaligned", [](DLTensor& t) { t.byte_offset = 1; }, {"byte_offset 1", "not aligned", "f32"}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    Producer p(64, {2, 3}, {3, 1}, kF32);
    c.spoil(p.managed.dl_tensor);
    const bool shape_error = std::string(c.name) == "negative dim";
    if (shape_error) {
      check_throws<fl::ShapeError>([&] { fl::from_dlpack(&p.managed); }, c.parts);
    } else {
      check_throws<fl::InvalidArgument>([&] { fl::from_dlpack(&p.managed); }, c.parts);
    }
    CHECK(p.deleted == 1);
  }
  check_throws<fl::InvalidArgument>([] { fl::from_dlpack(nullptr); }, {"from_dlpack", "null"});
}

TEST_CASE("from_dlpack of CUDA memory needs the device; to_dlpack refuses undefined and symbolic tensors") {
  if (fl::device_count(fl::DeviceKind::cuda) == 0) {
    Producer p(64, {2, 3}, {}, kF32);
    p.managed.dl_tensor.device = {kDLCUDA, 0};
    check_throws<fl::DeviceError>([&] { fl::from_dlpack(&p.managed); }, {"from_dlpack", "cuda:0"});
    CHECK(p.deleted == 1);
  }
  check_throws<fl::InvalidArgument>([] { fl::to_dlpack(fl::Tensor()); }, {"to_dlpack", "undefined"});
  auto f = fl::trace([](fl::Tensor x) {
    fl::to_dlpack(x);
    return x;
  });
  check_throws<fl::InvalidArgument>([&] { f(fl::ones({2})); }, {"to_dlpack", "symbolic", "[2]", "f32"});
}

TEST_CASE("kDLCUDAHost memory is host memory: it becomes a cpu tensor") {
  Producer p(2 * sizeof(float), {2}, {}, kF32);
  p.as<float>()[1] = 5.0f;
  p.managed.dl_tensor.device = {kDLCUDAHost, 0};
  const fl::Tensor t = fl::from_dlpack(&p.managed);
  CHECK(t.device() == fl::Device("cpu:0"));
  CHECK(t.to_vector<float>()[1] == 5.0f);
}

TEST_CASE("a tensor on a logical CPU device exports as kDLCPU 0 and comes back on cpu:0, same memory") {
  fl::set_logical_cpu_devices(2);  // nothing else in this program uses cpu:1
  const fl::Tensor x = fl::ones({3}, fl::f32, fl::Device("cpu:1"));
  DLManagedTensor* m = fl::to_dlpack(x);
  CHECK(m->dl_tensor.device.device_type == kDLCPU);
  CHECK(m->dl_tensor.device.device_id == 0);
  const fl::Tensor y = fl::from_dlpack(m);
  CHECK(y.device() == fl::Device("cpu:0"));
  CHECK(y.raw_data() == x.raw_data());
  CHECK(y.to_vector<float>() == std::vector<float>{1, 1, 1});
}
