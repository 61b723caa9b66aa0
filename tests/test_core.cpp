// Core types: DType, f16_t/bf16_t, Shape, Device, Tensor handles, item/to_vector, and fmt output.
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "support/reference.hpp"

using test::check_throws;

// ---------------------------------------------------------------------------------------------
// DType

TEST_CASE("every dtype has its documented name and size") {
  struct Row {
    fl::DType dtype;
    const char* name;
    size_t size;
    bool floating;
    bool integral;
  };
  const std::vector<Row> rows = {
      {fl::f32, "f32", 4, true, false},  {fl::f64, "f64", 8, true, false}, {fl::i32, "i32", 4, false, true},
      {fl::i64, "i64", 8, false, true},  {fl::u8, "u8", 1, false, true},   {fl::b8, "b8", 1, false, false},
      {fl::f16, "f16", 2, true, false},  {fl::bf16, "bf16", 2, true, false},
  };
  REQUIRE(rows.size() == static_cast<size_t>(fl::kNumDTypes));
  for (const Row& row : rows) {
    CAPTURE(row.name);
    CHECK(fl::dtype_name(row.dtype) == row.name);
    CHECK(fl::dtype_size(row.dtype) == row.size);
    CHECK(fl::is_floating(row.dtype) == row.floating);
    CHECK(fl::is_integral(row.dtype) == row.integral);
    CHECK(fmt::format("{}", row.dtype) == row.name);
  }
}

TEST_CASE("C++ element types map to their dtypes") {
  CHECK(fl::dtype_of<float> == fl::f32);
  CHECK(fl::dtype_of<double> == fl::f64);
  CHECK(fl::dtype_of<int32_t> == fl::i32);
  CHECK(fl::dtype_of<int64_t> == fl::i64);
  CHECK(fl::dtype_of<uint8_t> == fl::u8);
  CHECK(fl::dtype_of<bool> == fl::b8);
  CHECK(fl::dtype_of<fl::f16_t> == fl::f16);
  CHECK(fl::dtype_of<fl::bf16_t> == fl::bf16);
  CHECK(fl::dtype_of<const float> == fl::f32);
}

// ---------------------------------------------------------------------------------------------
// f16_t and bf16_t

namespace {
float from_bits(uint32_t bits) { return std::bit_cast<float>(bits); }
uint32_t bits_of(float value) { return std::bit_cast<uint32_t>(value); }
}  // namespace

TEST_CASE("f16_t converts exact values to their IEEE binary16 bits") {
  struct Row {
    float value;
    uint16_t bits;
  };
  const std::vector<Row> rows = {
      {0.0f, 0x0000},         {-0.0f, 0x8000},        {1.0f, 0x3c00},          {-2.0f, 0xc000},
      {0.5f, 0x3800},         {65504.0f, 0x7bff},     {-65504.0f, 0xfbff},     {0x1.0p-14f, 0x0400},
      {0x1.0p-24f, 0x0001},   {0x1.ff8p-15f, 0x03ff}, {1.0f + 0x1.0p-10f, 0x3c01}, {3.140625f, 0x4248},
  };
  for (const Row& row : rows) {
    CAPTURE(row.value);
    const fl::f16_t h(row.value);
    CHECK(h.bits == row.bits);
    CHECK(bits_of(static_cast<float>(h)) == bits_of(row.value));  // exact way back, sign of zero too
  }
}

TEST_CASE("f16_t rounds to nearest, ties to even, including subnormals and overflow") {
  // Halfway between 1 (even mantissa) and 1 + 2^-10: down to 1.
  CHECK(fl::f16_t(1.0f + 0x1.0p-11f).bits == 0x3c00);
  // Halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even): up.
  CHECK(fl::f16_t(1.0f + 3 * 0x1.0p-11f).bits == 0x3c02);
  // Just above halfway rounds up.
  CHECK(fl::f16_t(1.0f + 0x1.0p-11f + 0x1.0p-20f).bits == 0x3c01);
  // Subnormals: steps of 2^-24.
  CHECK(fl::f16_t(0x1.0p-25f).bits == 0x0000);          // half a step, tie to even 0
  CHECK(fl::f16_t(0x1.8p-25f).bits == 0x0001);          // 0.75 step rounds up
  CHECK(fl::f16_t(0x1.8p-24f).bits == 0x0002);          // 1.5 steps: tie to even 2
  CHECK(fl::f16_t(0x1.4p-23f).bits == 0x0002);          // 2.5 steps: tie to even 2
  CHECK(fl::f16_t(-0x1.0p-24f).bits == 0x8001);
  CHECK(fl::f16_t(0x1.0p-30f).bits == 0x0000);          // far below: zero
  // Largest subnormal rounds up into the smallest normal.
  CHECK(fl::f16_t(0x1.ffcp-15f).bits == 0x0400);
  // Overflow: 65519 still rounds to 65504, 65520 (halfway to 2^16) rounds to infinity.
  CHECK(fl::f16_t(65519.0f).bits == 0x7bff);
  CHECK(fl::f16_t(65520.0f).bits == 0x7c00);
  CHECK(fl::f16_t(1e10f).bits == 0x7c00);
  CHECK(fl::f16_t(-1e10f).bits == 0xfc00);
}

TEST_CASE("f16_t keeps infinities and NaN") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(fl::f16_t(inf).bits == 0x7c00);
  CHECK(fl::f16_t(-inf).bits == 0xfc00);
  CHECK(static_cast<float>(fl::f16_t(inf)) == inf);
  CHECK(static_cast<float>(fl::f16_t(-inf)) == -inf);
  const fl::f16_t nan(std::numeric_limits<float>::quiet_NaN());
  CHECK((nan.bits & 0x7c00) == 0x7c00);
  CHECK((nan.bits & 0x03ff) != 0);
  CHECK(std::isnan(static_cast<float>(nan)));
  CHECK_FALSE(nan == nan);  // compares as float
}

TEST_CASE("every finite and infinite f16 bit pattern survives a round trip through float") {
  int checked = 0;
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto h = static_cast<uint16_t>(bits);
    const float f = fl::f16_t::to_float(h);
    if ((h & 0x7c00) == 0x7c00 && (h & 0x03ff) != 0) {
      CHECK(std::isnan(f));
      continue;
    }
    if (fl::f16_t::from_float(f) != h) {
      FAIL_CHECK("f16 bits " << bits << " came back as " << fl::f16_t::from_float(f));
      break;
    }
    ++checked;
  }
  CHECK(checked == 65536 - 2 * 1023);
}

TEST_CASE("f16 values agree with the binary16 formula") {
  // value = (-1)^s * 2^(e-15) * (1 + m/1024) for normals, 2^-14 * m/1024 for subnormals.
  for (uint32_t bits = 0; bits < 0x7c00; bits += 7) {
    const double e = static_cast<double>((bits >> 10) & 0x1f);
    const double m = static_cast<double>(bits & 0x3ff);
    const double expected = e == 0 ? std::ldexp(m / 1024.0, -14) : std::ldexp(1.0 + m / 1024.0, static_cast<int>(e) - 15);
    REQUIRE(static_cast<double>(fl::f16_t::to_float(static_cast<uint16_t>(bits))) == expected);
  }
}

TEST_CASE("bf16_t is the upper half of a float, rounded to nearest even") {
  CHECK(fl::bf16_t(1.0f).bits == 0x3f80);
  CHECK(fl::bf16_t(-2.0f).bits == 0xc000);
  CHECK(fl::bf16_t(0.0f).bits == 0x0000);
  CHECK(fl::bf16_t(-0.0f).bits == 0x8000);
  CHECK(static_cast<float>(fl::bf16_t(3.0f)) == 3.0f);
  // Ties: lower half exactly 0x8000 rounds to the even upper half.
  CHECK(fl::bf16_t(from_bits(0x3f808000u)).bits == 0x3f80);  // even stays
  CHECK(fl::bf16_t(from_bits(0x3f818000u)).bits == 0x3f82);  // odd rounds up
  CHECK(fl::bf16_t(from_bits(0x3f808001u)).bits == 0x3f81);  // above half rounds up
  CHECK(fl::bf16_t(from_bits(0x3f807fffu)).bits == 0x3f80);  // below half rounds down
  // Subnormal floats keep their upper bits.
  CHECK(fl::bf16_t(from_bits(0x00010000u)).bits == 0x0001);
  // The largest float rounds to infinity.
  CHECK(fl::bf16_t(std::numeric_limits<float>::max()).bits == 0x7f80);
}

TEST_CASE("bf16_t keeps infinities and NaN") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(fl::bf16_t(inf).bits == 0x7f80);
  CHECK(fl::bf16_t(-inf).bits == 0xff80);
  CHECK(std::isnan(static_cast<float>(fl::bf16_t(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload lives only in the low half must not become infinity.
  CHECK(std::isnan(static_cast<float>(fl::bf16_t(from_bits(0x7f800001u)))));
}

TEST_CASE("every bf16 bit pattern survives a round trip through float") {
  int checked = 0;
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto b = static_cast<uint16_t>(bits);
    const float f = from_bits(bits << 16);
    if (std::isnan(f)) {
      CHECK(std::isnan(static_cast<float>(fl::bf16_t(f))));
      continue;
    }
    if (fl::bf16_t(f).bits != b) {
      FAIL_CHECK("bf16 bits " << bits << " came back as " << fl::bf16_t(f).bits);
      break;
    }
    ++checked;
  }
  CHECK(checked == 65536 - 2 * 127);
}

// ---------------------------------------------------------------------------------------------
// Shape

TEST_CASE("Shape compares, counts elements and prints itself") {
  const fl::Shape s{2, 3};
  CHECK(s.size() == 2);
  CHECK(s.rank() == 2);
  CHECK(s[0] == 2);
  CHECK(s[1] == 3);
  CHECK(s.numel() == 6);
  CHECK(s == fl::Shape{2, 3});
  CHECK_FALSE(s == fl::Shape{3, 2});
  CHECK_FALSE(s == fl::Shape{2, 3, 1});
  CHECK(s.str() == "[2, 3]");
  CHECK(fl::Shape{}.str() == "[]");
  CHECK(fl::Shape{}.numel() == 1);
  CHECK(fl::Shape{}.size() == 0);
  CHECK(fl::Shape{7}.str() == "[7]");
  CHECK(fl::Shape{4, 0, 3}.numel() == 0);
  CHECK(fl::Shape(std::vector<int64_t>{5, 1, 2}) == fl::Shape{5, 1, 2});
  CHECK(fl::Shape{5, 1, 2}.to_vector() == std::vector<int64_t>{5, 1, 2});
  CHECK(fmt::format("{}", fl::Shape{2, 3}) == "[2, 3]");
  CHECK(fmt::format("{}", fl::Shape{}) == "[]");
}

TEST_CASE("Shape of rank above six moves to the heap and stays correct") {
  fl::Shape s{1, 2, 3, 4, 5, 6};
  fl::Shape copy_before = s;
  s.push_back(7);
  s.push_back(8);
  CHECK(s.size() == 8);
  CHECK(s[6] == 7);
  CHECK(s[7] == 8);
  CHECK(s.numel() == 40320);
  CHECK(s.str() == "[1, 2, 3, 4, 5, 6, 7, 8]");
  CHECK(copy_before.size() == 6);
  const fl::Shape copy = s;  // copies the heap storage
  s[7] = 9;
  CHECK(copy[7] == 8);
  CHECK_FALSE(copy == s);
  fl::Shape assigned{1};
  assigned = copy;
  CHECK(assigned == copy);
  const fl::Shape from_list{1, 1, 2, 1, 1, 2, 1, 1, 2};
  CHECK(from_list.numel() == 8);
  CHECK(from_list.size() == 9);
}

TEST_CASE("tensors of rank eight work end to end") {
  const fl::Shape shape{1, 2, 1, 2, 1, 2, 1, 2};
  fl::Tensor t = test::make(test::random_values(16, 3, fl::f32), shape, fl::f32);
  CHECK(t.rank() == 8);
  CHECK(t.shape() == shape);
  const std::vector<double> v = test::values(t);
  double expected = 0;
  for (double x : v) expected += x;
  test::check_tensor(fl::sum(t), {expected}, fl::Shape{}, fl::f32);
  test::check_tensor(t + t, test::unary_ref(test::host(t), [](double x) { return 2 * x; }).values, shape, fl::f32);
}

// ---------------------------------------------------------------------------------------------
// Device

TEST_CASE("Device parses cpu and cuda specs") {
  const fl::Device cpu("cpu");
  CHECK(cpu.kind() == fl::DeviceKind::cpu);
  CHECK(cpu.index() == 0);
  CHECK(cpu.str() == "cpu:0");
  CHECK(cpu == fl::Device("cpu:0"));
  CHECK(cpu == fl::Device());
  const fl::Device cpu1("cpu:1");
  CHECK(cpu1.kind() == fl::DeviceKind::cpu);
  CHECK(cpu1.index() == 1);
  CHECK(cpu1.str() == "cpu:1");
  CHECK_FALSE(cpu1 == cpu);
  const fl::Device cuda("cuda:0");
  CHECK(cuda.kind() == fl::DeviceKind::cuda);
  CHECK(cuda.index() == 0);
  CHECK(cuda.str() == "cuda:0");
  CHECK_FALSE(cuda == cpu);
  CHECK(fl::Device("cuda:3").index() == 3);
  CHECK(fl::Device(fl::DeviceKind::cuda, 2).str() == "cuda:2");
  CHECK(fmt::format("{}", fl::Device("cpu")) == "cpu:0");
  CHECK(fmt::format("{}", fl::Device("cuda:0")) == "cuda:0");
  CHECK(fl::device_kind_name(fl::DeviceKind::cpu) == "cpu");
  CHECK(fl::device_kind_name(fl::DeviceKind::cuda) == "cuda");
}

TEST_CASE("Device rejects malformed specs with DeviceError naming the spec") {
  for (const char* spec : {"gpu", "cpu:x", "cpu:-1", "cuda:", "tpu:0", "cpu:1x"}) {
    CAPTURE(spec);
    check_throws<fl::DeviceError>([&] { fl::Device d(spec); }, {spec});
  }
  check_throws<fl::DeviceError>([] { fl::Device d(""); });
}

TEST_CASE("Device errors quote a long or binary spec cut to its first 64 bytes with its length") {
  const std::string huge = "gpu" + std::string(1 << 20, 'x');
  std::string message;
  try {
    fl::Device d(huge);
  } catch (const fl::DeviceError& e) {
    message = e.what();
  }
  CHECK(message.size() < 300);
  CHECK(message.find("'gpu" + std::string(61, 'x') + "... (1048579 bytes)'") != std::string::npos);
  check_throws<fl::DeviceError>([] { fl::Device d(std::string("cpu:1\0\n", 7)); }, {"'cpu:1\\x00\\x0a'"});
}

TEST_CASE("only cpu:0 exists by default") {
  CHECK(fl::device_count(fl::DeviceKind::cpu) == 1);
  CHECK_NOTHROW(fl::check_device_exists("zeros", fl::Device("cpu")));
  check_throws<fl::DeviceError>([] { fl::check_device_exists("zeros", fl::Device("cpu:1")); }, {"zeros", "cpu:1"});
  check_throws<fl::DeviceError>([] { fl::check_device_exists("zeros", fl::Device("cuda:0")); }, {"zeros", "cuda:0"});
}

// ---------------------------------------------------------------------------------------------
// Tensor handles

TEST_CASE("a tensor knows its shape, dtype, device and layout") {
  const fl::Tensor t = fl::tensor(std::vector<float>{1, 2, 3, 4, 5, 6}, fl::Shape{2, 3});
  CHECK(t.defined());
  CHECK(t.shape() == fl::Shape{2, 3});
  CHECK(t.dtype() == fl::f32);
  CHECK(t.device() == fl::Device("cpu:0"));
  CHECK(t.rank() == 2);
  CHECK(t.numel() == 6);
  CHECK(t.is_contiguous());
  CHECK(t.offset() == 0);
  CHECK(t.strides() == fl::Strides{3, 1});
  CHECK(t.storage()->bytes() >= 6 * sizeof(float));
  CHECK(t.to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6});
}

TEST_CASE("copies of a tensor handle share storage") {
  fl::Tensor a = fl::tensor({1.0f, 2.0f, 3.0f});
  const fl::Tensor b = a;  // NOLINT: the copy is the point
  CHECK(a.storage().get() == b.storage().get());
  CHECK(a.impl_ptr() == b.impl_ptr());
  a.data<float>()[1] = 42.0f;  // a write through one handle is seen through the other
  CHECK(b.to_vector<float>() == std::vector<float>{1, 42, 3});
  const fl::Tensor c = fl::tensor({1.0f, 2.0f, 3.0f});
  CHECK(a.storage().get() != c.storage().get());
  // Storage outlives the handle it came from.
  fl::Tensor d;
  {
    fl::Tensor e = fl::tensor({7, 8});
    d = e;
  }
  CHECK(d.to_vector<int32_t>() == std::vector<int32_t>{7, 8});
}

TEST_CASE("an empty Tensor handle is rejected by every accessor and op") {
  const fl::Tensor empty;
  CHECK_FALSE(empty.defined());
  const fl::Tensor x = fl::tensor({1.0f, 2.0f});
  const std::vector<std::pair<const char*, std::function<void()>>> uses = {
      {"shape", [&] { (void)empty.shape(); }},
      {"dtype", [&] { (void)empty.dtype(); }},
      {"numel", [&] { (void)empty.numel(); }},
      {"device", [&] { (void)empty.device(); }},
      {"to_vector", [&] { (void)empty.to_vector<float>(); }},
      {"item", [&] { (void)empty.item<float>(); }},
      {"astype", [&] { (void)empty.astype(fl::f64); }},
      {"to", [&] { (void)empty.to(fl::Device("cpu")); }},
      {"contiguous", [&] { (void)empty.contiguous(); }},
      {"add", [&] { (void)fl::add(empty, x); }},
      {"add right", [&] { (void)fl::add(x, empty); }},
      {"exp", [&] { (void)fl::exp(empty); }},
      {"sum", [&] { (void)fl::sum(empty); }},
      {"matmul", [&] { (void)fl::matmul(empty, empty); }},
      {"reshape", [&] { (void)fl::reshape(empty, fl::Shape{2}); }},
      {"concat", [&] { (void)fl::concat({x, empty}, 0); }},
  };
  for (const auto& [name, use] : uses) {
    CAPTURE(name);
    check_throws<fl::InvalidArgument>(use, {"empty Tensor handle"});
  }
}

// ---------------------------------------------------------------------------------------------
// item and to_vector

namespace {
template <class T>
T sample_value() {
  if constexpr (std::is_same_v<T, bool>) {
    return true;
  } else if constexpr (std::is_same_v<T, fl::f16_t> || std::is_same_v<T, fl::bf16_t>) {
    return T(-2.5f);
  } else if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(-2.75);
  } else {
    return static_cast<T>(76);  // fits every integer type
  }
}
}  // namespace

TEST_CASE_TEMPLATE("item and to_vector return the stored values", T, float, double, int32_t, int64_t, uint8_t,
                   bool, fl::f16_t, fl::bf16_t) {
  const T value = sample_value<T>();
  const fl::Tensor s = fl::scalar(value);
  CHECK(s.rank() == 0);
  CHECK(s.numel() == 1);
  CHECK(s.shape() == fl::Shape{});
  CHECK(s.dtype() == fl::dtype_of<T>);
  CHECK(s.item<T>() == value);
  const std::vector<T> one_value = s.to_vector<T>();
  REQUIRE(one_value.size() == 1);
  CHECK(one_value[0] == value);
  // One element at any rank has an item.
  const fl::Tensor one = fl::tensor(std::vector<T>{value}, fl::Shape{1, 1, 1});
  CHECK(one.item<T>() == value);
  // Row-major order of a rank-2 tensor.
  const std::vector<T> many{value, T{}, value, T{}, T{}, value};
  const fl::Tensor m = fl::tensor(many, fl::Shape{2, 3});
  CHECK(m.shape() == fl::Shape{2, 3});
  CHECK(m.dtype() == fl::dtype_of<T>);
  const std::vector<T> back = m.to_vector<T>();
  REQUIRE(back.size() == many.size());
  for (size_t i = 0; i < many.size(); ++i) CHECK(back[i] == many[i]);
}

TEST_CASE("item, to_vector and data reject a mismatched element type with DTypeError") {
  const fl::Tensor f = fl::tensor({1.0f, 2.0f});
  check_throws<fl::DTypeError>([&] { (void)fl::scalar(1.0f).item<double>(); }, {"item", "f32"});
  check_throws<fl::DTypeError>([&] { (void)f.to_vector<int32_t>(); }, {"to_vector", "f32"});
  check_throws<fl::DTypeError>([&] { (void)f.to_vector<double>(); }, {"to_vector", "f32"});
  check_throws<fl::DTypeError>([&] { (void)f.data<double>(); }, {"f32"});
  check_throws<fl::DTypeError>([&] { (void)fl::scalar(int64_t{3}).item<int32_t>(); }, {"item", "i64"});
  check_throws<fl::DTypeError>([&] { (void)fl::tensor({true, false}).to_vector<uint8_t>(); }, {"b8"});
  check_throws<fl::DTypeError>([&] { (void)fl::tensor({1.0, 2.0}).to_vector<float>(); }, {"f64"});
}

TEST_CASE("item needs exactly one element and says so with InvalidArgument") {
  check_throws<fl::InvalidArgument>([] { (void)fl::tensor({1.0f, 2.0f}).item<float>(); }, {"item"});
  check_throws<fl::InvalidArgument>([] { (void)fl::zeros(fl::Shape{0}).item<float>(); }, {"item"});
  check_throws<fl::InvalidArgument>([] { (void)fl::zeros(fl::Shape{2, 2}, fl::i64).item<int64_t>(); }, {"item"});
  CHECK(fl::zeros(fl::Shape{0}).to_vector<float>().empty());
}

TEST_CASE("comparison results read back as bool") {
  const fl::Tensor c = fl::tensor({1.0f, 5.0f, 3.0f}) > 2.0f;
  CHECK(c.dtype() == fl::b8);
  CHECK(c.to_vector<bool>() == std::vector<bool>{false, true, true});
  CHECK((fl::scalar(4) == 4).item<bool>());
}

// ---------------------------------------------------------------------------------------------
// astype and to

TEST_CASE("astype converts values and leaves the source alone") {
  const fl::Tensor t = fl::tensor({1.5f, -2.25f, 0.0f, 7.0f});
  const fl::Tensor d = t.astype(fl::f64);
  CHECK(d.dtype() == fl::f64);
  CHECK(d.to_vector<double>() == std::vector<double>{1.5, -2.25, 0.0, 7.0});
  CHECK(t.dtype() == fl::f32);
  CHECK(d.astype(fl::f32).to_vector<float>() == t.to_vector<float>());
  CHECK(t.astype(fl::i32).to_vector<int32_t>() == std::vector<int32_t>{1, -2, 0, 7});
  const fl::Tensor h = fl::tensor({0.1f, 1000.3f}).astype(fl::f16);
  CHECK(h.dtype() == fl::f16);
  const std::vector<fl::f16_t> hv = h.to_vector<fl::f16_t>();
  CHECK(hv[0].bits == fl::f16_t(0.1f).bits);
  CHECK(hv[1].bits == fl::f16_t(1000.3f).bits);
  const fl::Tensor b = fl::tensor({0.1f, 1000.3f}).astype(fl::bf16);
  CHECK(b.to_vector<fl::bf16_t>()[1].bits == fl::bf16_t(1000.3f).bits);
}

TEST_CASE("to moves between existing devices and rejects missing ones with DeviceError") {
  const fl::Tensor t = fl::tensor({1.0f, 2.0f});
  const fl::Tensor same = t.to(fl::Device("cpu"));
  CHECK(same.device() == fl::Device("cpu:0"));
  CHECK(same.to_vector<float>() == std::vector<float>{1, 2});
  check_throws<fl::DeviceError>([&] { (void)t.to(fl::Device("cpu:1")); }, {"cpu:1"});
  check_throws<fl::DeviceError>([&] { (void)t.to(fl::Device("cuda:0")); }, {"cuda:0"});
}

// ---------------------------------------------------------------------------------------------
// fmt

TEST_CASE("fmt prints small tensors with their values, shape and dtype") {
  CHECK(fmt::format("{}", fl::tensor(std::vector<int32_t>{1, 2, 3, 4}, fl::Shape{2, 2})) ==
        "tensor([[1, 2],\n        [3, 4]], shape=[2, 2], dtype=i32)");
  CHECK(fmt::format("{}", fl::tensor({1.0f, 2.5f})) == "tensor([1, 2.5], shape=[2], dtype=f32)");
  CHECK(fmt::format("{}", fl::tensor({0.1f, -1.5f})) == "tensor([0.1, -1.5], shape=[2], dtype=f32)");
  CHECK(fmt::format("{}", fl::tensor({0.1, 3.0})) == "tensor([0.1, 3], shape=[2], dtype=f64)");
  CHECK(fl::to_string(fl::tensor({7, 8})) == fmt::format("{}", fl::tensor({7, 8})));
  const std::string s = fmt::format("{}", fl::scalar(int64_t{3}));
  CHECK(s.find('3') != std::string::npos);
  CHECK(s.find("shape=[]") != std::string::npos);
  CHECK(s.find("dtype=i64") != std::string::npos);
  const std::string e = fmt::format("{}", fl::zeros(fl::Shape{0, 3}));
  CHECK(e.find("shape=[0, 3]") != std::string::npos);
  CHECK(e.find("dtype=f32") != std::string::npos);
  // A non-contiguous view prints its logical (row-major) order.
  const fl::Tensor t = fl::transpose(fl::tensor(std::vector<int32_t>{1, 2, 3, 4, 5, 6}, fl::Shape{2, 3}));
  CHECK(fmt::format("{}", t) == "tensor([[1, 4],\n        [2, 5],\n        [3, 6]], shape=[3, 2], dtype=i32)");
}

TEST_CASE("fmt abbreviates tensors of more than 1000 elements with an ellipsis") {
  const std::string s = fmt::format("{}", fl::arange(2000, fl::f32));
  CAPTURE(s);
  CHECK(s.find("...") != std::string::npos);
  CHECK(s.find("shape=[2000]") != std::string::npos);
  CHECK(s.find("dtype=f32") != std::string::npos);
  CHECK(s.find("0, 1, 2") != std::string::npos);
  CHECK(s.find("1997, 1998, 1999") != std::string::npos);
  CHECK(s.find("1000") == std::string::npos);
  CHECK(s.size() < 200);
  const std::string m = fmt::format("{}", fl::zeros(fl::Shape{50, 50}, fl::i32));
  CHECK(m.find("...") != std::string::npos);
  CHECK(m.find("shape=[50, 50]") != std::string::npos);
  CHECK(m.find("dtype=i32") != std::string::npos);
  CHECK(m.size() < 400);
  // Exactly 1000 elements are printed in full.
  const std::string full = fmt::format("{}", fl::arange(1000, fl::i32));
  CHECK(full.find("...") == std::string::npos);
  CHECK(full.find("500, 501") != std::string::npos);
}
