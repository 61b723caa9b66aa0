// Checkpoints: round trips, errors that change nothing, truncation, bit flips, SIGKILL mid-save, hostile paths
// (FIFOs, NUL bytes), headers with many keys, and the manager's rules.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <flowlet/checkpoint.hpp>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <set>
#include <thread>

#include "support/checkpoint_files.hpp"
#include "support/fifo_watchdog.hpp"
#include "support/reference.hpp"

namespace {

using test::contents;
using test::read_file;
using test::TempDir;
using test::with_bit_flipped;
using test::write_file;

fl::Tensor half_tensor(std::initializer_list<float> values, fl::DType dtype, const fl::Shape& shape) {
  return fl::cast(fl::tensor(std::vector<float>(values), shape), dtype);
}

// One variable of every dtype, rank 0, a zero-size dimension, and names that need JSON escaping.
std::vector<fl::Variable> assorted_variables() {
  return {
      fl::Variable(fl::tensor(std::vector<float>{1.5f, -2.0f, 3.25f, -0.0f, 1e-30f, 6.0f}, {2, 3}), "dense/kernel"),
      fl::Variable(fl::tensor({1.0 / 3.0, -1e300, 2.5, 4.0}), "dense/bias_f64"),
      fl::Variable(fl::scalar<int64_t>(-1234567890123), "global_step"),
      fl::Variable(fl::tensor(std::vector<int32_t>{-7, 0, 2147483647}, {3}), "i32 \"quoted\" \\ name"),
      fl::Variable(fl::tensor(std::vector<uint8_t>{0, 1, 128, 255, 42}, {5}), "bytes\ttab"),
      fl::Variable(fl::tensor(std::vector<bool>{true, false, false, true}, {2, 2}), "mask"),
      fl::Variable(half_tensor({1.0f, -2.5f, 65504.0f}, fl::f16, {3, 1}), "half"),
      fl::Variable(half_tensor({3.0f, -0.15625f, 1e20f, 7.0f}, fl::bf16, {1, 2, 2}), "brain_\xc3\xa9"),
      fl::Variable(fl::zeros({0, 4}, fl::f32), "empty"),
  };
}

// Variables with the same names, dtypes and shapes as `vars` but other values (ones), to restore into.
std::vector<fl::Variable> blank_like(const std::vector<fl::Variable>& vars) {
  std::vector<fl::Variable> blank;
  for (const auto& v : vars) blank.emplace_back(fl::ones(v.shape(), v.dtype()), v.name());
  return blank;
}

// Table-driven CRC-32 (the zlib polynomial), for hand-made files.
uint32_t crc32(std::string_view bytes, uint32_t crc = 0) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (const char ch : bytes) crc = table[(crc ^ static_cast<uint8_t>(ch)) & 0xffu] ^ (crc >> 8);
  return ~crc;
}

// A checkpoint file with valid checksums around arbitrary entries: `entries` is the JSON after the metadata
// (e.g. `,"w":{...}`). Lets a test reach the checks behind the checksums.
std::string make_file(const std::string& entries, std::string_view data, int64_t step = 7) {
  std::string header = fmt::format(
      R"({{"__metadata__":{{"step":"{}","format":"flowlet","crc32":"{:08x}","header_crc32":"00000000"}}{}}})", step,
      crc32(data), entries);
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string prefix(8, '\0');
  const uint64_t length = header.size();
  std::memcpy(prefix.data(), &length, 8);
  const uint32_t header_crc = crc32(header, crc32(prefix));
  const size_t at = header.find("00000000");
  header.replace(at, 8, fmt::format("{:08x}", header_crc));
  return prefix + header + std::string(data);
}

}  // namespace

TEST_CASE(
    "a checkpoint round-trips every dtype, rank 0, zero-size dimensions and escaped names, and returns the step") {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  auto saved = assorted_variables();
  fl::save_checkpoint(path, saved, 42);
  const auto restored = blank_like(saved);
  CHECK(contents(restored) != contents(saved));
  CHECK(fl::restore_checkpoint(path, restored) == 42);
  CHECK(contents(restored) == contents(saved));

  // The layout: 8-byte length, JSON header starting with the metadata, data 8-byte aligned.
  const std::string bytes = read_file(path);
  uint64_t header_bytes;
  std::memcpy(&header_bytes, bytes.data(), 8);
  CHECK((8 + header_bytes) % 8 == 0);
  const std::string header = bytes.substr(8, header_bytes);
  CHECK(header.rfind(R"({"__metadata__":{"step":"42","format":"flowlet","crc32":")", 0) == 0);
  CHECK(header.find(R"("dense/kernel":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]})") != std::string::npos);
  CHECK(header.find(R"("i32 \"quoted\" \\ name":{"dtype":"I32")") != std::string::npos);
  CHECK(header.find(R"("global_step":{"dtype":"I64","shape":[])") != std::string::npos);
  CHECK(header.find(R"("dtype":"BOOL")") != std::string::npos);
  CHECK(header.find(R"("dtype":"BF16")") != std::string::npos);
  CHECK(header.find(R"("empty":{"dtype":"F32","shape":[0,4])") != std::string::npos);

  // A subset restores on its own; no temporary files are left behind.
  fl::Variable step_only(fl::scalar<int64_t>(0), "global_step");
  CHECK(fl::restore_checkpoint(path, {step_only}) == 42);
  CHECK(step_only.value().item<int64_t>() == -1234567890123);
  CHECK(std::distance(std::filesystem::directory_iterator(dir.path), std::filesystem::directory_iterator()) == 1);

  // Saving again replaces the file; negative steps are fine.
  saved[0].assign(fl::zeros({2, 3}));
  fl::save_checkpoint(path, saved, -5);
  CHECK(fl::restore_checkpoint(path, restored) == -5);
  CHECK(contents(restored) == contents(saved));
}

TEST_CASE("saving rejects empty, duplicate and reserved names and writes nothing") {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  const fl::Variable a(fl::zeros({2}), "a"), a_again(fl::ones({3}), "a"), unnamed(fl::zeros({1}));
  test::check_op_throws<fl::InvalidArgument>("save_checkpoint",
                                             [&] {
                                               fl::save_checkpoint(path, {a, a_again}, 1);
                                             },
                                             {"duplicate variable name 'a'", "positions 0 and 1"});
  test::check_op_throws<fl::InvalidArgument>("save_checkpoint",
                                             [&] {
                                               fl::save_checkpoint(path, {a, unnamed}, 1);
                                             },
                                             {"variable 1 has an empty name"});
  test::check_op_throws<fl::InvalidArgument>(
      "save_checkpoint", [&] { fl::save_checkpoint(path, {fl::Variable(fl::zeros({1}), "__metadata__")}, 1); },
      {"__metadata__"});
  test::check_op_throws<fl::InvalidArgument>("save_checkpoint",
                                             [&] {
                                               fl::save_checkpoint(path, {a, fl::Variable()}, 1);
                                             },
                                             {"empty Variable handle"});
  test::check_op_throws<fl::InvalidArgument>(
      "save_checkpoint", [&] { fl::save_checkpoint(path, {fl::Variable(fl::zeros({1}), "bad\xff")}, 1); }, {"UTF-8"});
  test::check_op_throws<fl::InvalidArgument>(
      "save_checkpoint", [&] { fl::save_checkpoint(dir.file("missing/dir/x.safetensors"), {a}, 1); },
      {"cannot create", "missing/dir/x.safetensors"});
  CHECK(std::filesystem::is_empty(dir.path));
}

TEST_CASE("restoring into a variable with another shape, dtype or name throws, names it and changes nothing") {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  fl::save_checkpoint(path,
                      {fl::Variable(fl::zeros({2, 3}), "w"), fl::Variable(fl::zeros({3}, fl::i64), "b"),
                       fl::Variable(fl::zeros({4}), "c")},
                      9);
  // The bad variable comes last, so assigning as it went would have changed the others.
  std::vector<fl::Variable> targets = {fl::Variable(fl::ones({2, 3}), "w"), fl::Variable(fl::ones({3}, fl::i64), "b")};
  const auto with = [&](fl::Variable extra) {
    auto all = targets;
    all.push_back(std::move(extra));
    return all;
  };
  const auto before = contents(targets);

  test::check_op_throws<fl::ShapeError>("restore_checkpoint",
                                        [&] {
                                          fl::restore_checkpoint(path, with(fl::Variable(fl::ones({2, 2}), "c")));
                                        },
                                        {"'c'", path, "[4]", "[2, 2]"});
  test::check_op_throws<fl::DTypeError>(
      "restore_checkpoint", [&] { fl::restore_checkpoint(path, with(fl::Variable(fl::ones({4}, fl::f64), "c"))); },
      {"'c'", path, "f32", "f64"});
  test::check_op_throws<fl::InvalidArgument>(
      "restore_checkpoint", [&] { fl::restore_checkpoint(path, with(fl::Variable(fl::ones({4}), "d"))); },
      {"variable 'd' is not in checkpoint", path, "w, b, c"});
  test::check_op_throws<fl::InvalidArgument>("restore_checkpoint",
                                             [&] {
                                               fl::restore_checkpoint(path, with(fl::Variable(fl::ones({2, 3}), "w")));
                                             },
                                             {"duplicate variable name 'w'"});
  test::check_op_throws<fl::InvalidArgument>("restore_checkpoint",
                                             [&] { fl::restore_checkpoint(dir.file("absent.safetensors"), targets); },
                                             {"cannot open", "absent.safetensors", "No such file"});
  test::check_op_throws<fl::InvalidArgument>("restore_checkpoint", [&] { fl::restore_checkpoint(dir.path, targets); },
                                             {dir.path});
  CHECK(contents(targets) == before);
}

TEST_CASE("hand-made files with bad offsets, shapes, dtypes or data are rejected with a precise message") {
  TempDir dir;
  const std::string path = dir.file("crafted.safetensors");
  fl::Variable w(fl::ones({2}), "w");
  const std::string eight(8, '\0');
  const auto rejects = [&](const std::string& file, const std::vector<std::string>& parts) {
    write_file(path, file);
    std::vector<std::string> all = parts;
    all.push_back(path);
    test::check_op_throws<fl::InvalidArgument>(
        "restore_checkpoint", [&] { fl::restore_checkpoint(path, {w}); }, all);
    CHECK(w.value().to_vector<float>() == std::vector<float>{1, 1});
  };
  // The helper itself makes valid files.
  write_file(path, make_file(R"(,"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", eight, 3));
  CHECK(fl::restore_checkpoint(path, {w}) == 3);
  CHECK(w.value().to_vector<float>() == std::vector<float>{0, 0});
  w.assign(fl::ones({2}));

  rejects(
      make_file(
          R"(,"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"v":{"dtype":"F32","shape":[1],"data_offsets":[4,8]})",
          eight),
      {"overlap or gap"});
  rejects(make_file(R"(,"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", eight + "xx"), {"trailing bytes"});
  rejects(make_file(R"(,"w":{"dtype":"F32","shape":[2],"data_offsets":[0,16]})", eight), {"run past"});
  rejects(make_file(R"(,"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]})", eight), {"needs 12"});
  rejects(make_file(R"(,"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]})", eight), {"negative dimension"});
  rejects(make_file(R"(,"w":{"dtype":"F8_E4M3","shape":[8],"data_offsets":[0,8]})", eight),
          {"unknown dtype \"F8_E4M3\""});
  rejects(make_file(R"(,"w":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]})", eight), {"only integers"});
  rejects(make_file(R"(,"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1})", eight), {"unknown key"});
  rejects(make_file(R"(,"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"w":{})", eight), {"duplicate key \"w\""});
  rejects(make_file(R"(,"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]})", eight), {"2^63"});
  fl::Variable mask(fl::zeros({8}, fl::b8), "mask");
  write_file(path,
             make_file(R"(,"mask":{"dtype":"BOOL","shape":[8],"data_offsets":[0,8]})", std::string(7, '\1') + '\2'));
  test::check_op_throws<fl::InvalidArgument>("restore_checkpoint", [&] { fl::restore_checkpoint(path, {mask}); },
                                             {"'mask'", "BOOL byte", "got 2 at element 7", path});
  CHECK(mask.value().to_vector<bool>() == std::vector<bool>(8, false));
  std::string bad_data = make_file(R"(,"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", eight);
  bad_data.back() = '\1';
  rejects(bad_data, {"data checksum does not match"});
  std::string bad_step = make_file(R"(,"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", eight, 42);
  bad_step.replace(bad_step.find("\"42\""), 4, "\"43\"");
  rejects(bad_step, {"header checksum does not match"});
  // A safetensors file without flowlet's metadata (as Python writes by default).
  std::string plain = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::string prefix(8, '\0');
  const uint64_t length = plain.size();
  std::memcpy(prefix.data(), &length, 8);
  rejects(prefix + plain + eight, {"no __metadata__"});
  rejects(std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}", {"header length", "truncated"});
}

TEST_CASE("every truncation of a checkpoint throws and changes nothing") {
  TempDir dir;
  const std::string path = dir.file("full.safetensors");
  const std::string cut = dir.file("cut.safetensors");
  fl::save_checkpoint(path,
                      {fl::Variable(fl::tensor({1.0f, 2.0f, 3.0f}), "w"), fl::Variable(fl::scalar<int64_t>(5), "n"),
                       fl::Variable(fl::tensor({true, false}), "m")},
                      11);
  const std::string bytes = read_file(path);
  std::vector<fl::Variable> targets = {fl::Variable(fl::zeros({3}), "w"), fl::Variable(fl::scalar<int64_t>(0), "n"),
                                       fl::Variable(fl::tensor({false, true}), "m")};
  const auto before = contents(targets);
  int wrong = 0;
  for (size_t length = 0; length < bytes.size(); ++length) {
    write_file(cut, std::string_view(bytes).substr(0, length));
    bool threw = false;
    try {
      fl::restore_checkpoint(cut, targets);
    } catch (const fl::Error&) {
      threw = true;
    }
    if (!threw || contents(targets) != before) {
      if (wrong++ == 0) FAIL_CHECK("truncation to " << length << " of " << bytes.size() << " bytes was accepted");
    }
  }
  CHECK(wrong == 0);
  write_file(cut, bytes);
  CHECK(fl::restore_checkpoint(cut, targets) == 11);
  CHECK(targets[0].value().to_vector<float>() == std::vector<float>{1, 2, 3});
}

TEST_CASE("flipping any single bit of a checkpoint is detected, never restored as wrong values") {
  TempDir dir;
  const std::string path = dir.file("full.safetensors");
  const std::string flipped = dir.file("flipped.safetensors");
  const std::vector<fl::Variable> saved = {fl::Variable(fl::tensor({1.0f, -2.0f, 3.5f}), "weights"),
                                           fl::Variable(fl::scalar<int64_t>(77), "n"),
                                           fl::Variable(half_tensor({0.5f, 8.0f}, fl::bf16, {2}), "h"),
                                           fl::Variable(fl::tensor({true, false, true}), "mask")};
  fl::save_checkpoint(path, saved, 1234);
  const std::string bytes = read_file(path);
  std::vector<fl::Variable> targets = blank_like(saved);
  const auto sentinel = contents(targets);
  const auto expected = contents(saved);
  int silently_wrong = 0, accepted = 0;
  for (size_t bit = 0; bit < bytes.size() * 8; ++bit) {
    write_file(flipped, with_bit_flipped(bytes, bit / 8, static_cast<int>(bit % 8)));
    try {
      const int64_t step = fl::restore_checkpoint(flipped, targets);
      ++accepted;  // acceptable only if the result is exactly the saved state
      if (step != 1234 || contents(targets) != expected) {
        if (silently_wrong++ == 0) FAIL_CHECK("flipping bit " << bit << " restored wrong values or step " << step);
      }
      for (size_t i = 0; i < targets.size(); ++i) targets[i].assign(blank_like(saved)[i].value());
    } catch (const fl::Error&) {
      if (contents(targets) != sentinel && silently_wrong++ == 0)
        FAIL_CHECK("flipping bit " << bit << " changed variables");
    }
  }
  CHECK(silently_wrong == 0);
  // Both checksums cover everything (header, padding and data), so in fact every flip is rejected.
  CHECK(accepted == 0);
}

TEST_CASE("a save killed with SIGKILL at a random moment always leaves a complete earlier or later checkpoint") {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  constexpr int kStates = 3;
  constexpr int64_t kBig = 1 << 20;  // 4 MiB of f32 per save
  std::vector<std::vector<fl::Variable>> states;
  std::vector<std::vector<std::string>> expected;
  for (int s = 0; s < kStates; ++s) {
    states.push_back(
        {fl::Variable(fl::full({kBig}, s + 1.0), "big"), fl::Variable(fl::full({16}, s * 100.0, fl::i64), "small")});
    expected.push_back(contents(states.back()));
  }
  const auto started = std::chrono::steady_clock::now();
  fl::save_checkpoint(path, states[0], 0);
  const auto save_us =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - started).count();

  std::vector<fl::Variable> targets = {fl::Variable(fl::zeros({kBig}), "big"),
                                       fl::Variable(fl::zeros({16}, fl::i64), "small")};
  std::mt19937_64 rng(20261129);
  // Kill anywhere from before the first write to a few saves in.
  // Each round lets the child finish 0-2 saves (it reports each one on a pipe), then kills it at a random
  // moment within the next save or two.
  std::uniform_int_distribution<int> completed_saves(0, 2);
  std::uniform_int_distribution<int64_t> delay_us(0, std::max<int64_t>(2 * save_us, 2000));
  constexpr int kRounds = 32;
  constexpr int64_t kRoundStride = 1'000'000;
  std::set<int64_t> steps_seen;
  int killed_mid_write = 0;  // rounds that left a temporary file: the kill landed between open and rename
  for (int round = 1; round <= kRounds; ++round) {
    const int wait_for = completed_saves(rng);
    const std::chrono::microseconds delay(delay_us(rng));
    test::kill_saving_child(
        [&](const std::function<void()>& report) {
          for (int64_t i = 1;; ++i) {
            fl::save_checkpoint(path, states[i % kStates], round * kRoundStride + i);
            report();
          }
        },
        wait_for, delay);

    const int64_t step = fl::restore_checkpoint(path, targets);
    const int64_t state = step % kRoundStride % kStates;
    CHECK(step / kRoundStride <= round);  // never a step that no save reached
    if (wait_for > 0) CHECK((step / kRoundStride == round && step % kRoundStride >= wait_for));  // reported saves stick
    CHECK(contents(targets) == expected[state]);
    steps_seen.insert(step);
    // Temporary files of killed saves stay behind (harmless); clear them so the disk does not fill.
    for (const auto& entry : std::filesystem::directory_iterator(dir.path)) {
      if (entry.path().filename().string().find(".tmp.") != std::string::npos) {
        std::filesystem::remove(entry.path());
        ++killed_mid_write;
      }
    }
  }
  MESSAGE("one save took " << save_us << " us; " << steps_seen.size() << " distinct steps over " << kRounds
                           << " kills, " << killed_mid_write << " of them while a temporary file was being written");
  CHECK(killed_mid_write > 0);
  CHECK(steps_seen.size() > kRounds / 2);
}

TEST_CASE("CheckpointManager keeps the newest max_to_keep checkpoints and restores the latest") {
  TempDir dir;
  const std::string directory = dir.file("run/checkpoints");  // created on the first save
  fl::CheckpointManager manager(directory, 3);
  fl::Variable w(fl::zeros({2}), "w");
  CHECK(manager.checkpoints().empty());
  CHECK_FALSE(manager.latest().has_value());
  CHECK(manager.restore_latest({w}) == -1);
  CHECK(w.value().to_vector<float>() == std::vector<float>{0, 0});

  for (int64_t step : {1, 2, 3, 10, 42}) {
    w.assign(fl::full({2}, static_cast<double>(step)));
    CHECK(manager.save({w}, step) == directory + fmt::format("/ckpt-{:06d}.safetensors", step));
  }
  CHECK(manager.checkpoints() == std::vector<std::string>{directory + "/ckpt-000003.safetensors",
                                                          directory + "/ckpt-000010.safetensors",
                                                          directory + "/ckpt-000042.safetensors"});
  CHECK(manager.latest() == directory + "/ckpt-000042.safetensors");
  CHECK(!std::filesystem::exists(directory + "/ckpt-000001.safetensors"));

  fl::Variable restored(fl::zeros({2}), "w");
  CHECK(manager.restore_latest({restored}) == 42);
  CHECK(restored.value().to_vector<float>() == std::vector<float>{42, 42});

  // A new manager over the same directory sees them; other prefixes and stray files are ignored.
  write_file(directory + "/ckpt-000099.safetensors.tmp.123.0", "partial");
  write_file(directory + "/notes.txt", "x");
  fl::CheckpointManager other_prefix(directory, 2, "best");
  CHECK(other_prefix.checkpoints().empty());
  fl::CheckpointManager again(directory, 2);
  CHECK(again.checkpoints().size() == 3);
  again.save({w}, 1'000'000);  // more than 6 digits
  CHECK(again.checkpoints() ==
        std::vector<std::string>{directory + "/ckpt-000042.safetensors", directory + "/ckpt-1000000.safetensors"});
  CHECK(again.restore_latest({restored}) == 1'000'000);

  test::check_throws<fl::InvalidArgument>([&] { fl::CheckpointManager(directory, 0); }, {"max_to_keep", "got 0"});
  test::check_throws<fl::InvalidArgument>([&] { fl::CheckpointManager(directory, 1, "a/b"); }, {"prefix"});
  test::check_throws<fl::InvalidArgument>([&] { manager.save({w}, -1); }, {"step", "got -1"});
}

TEST_CASE("restoring from a FIFO is refused at once instead of waiting for a writer") {
  TempDir dir;
  const std::string fifo = dir.file("model.safetensors");
  test::make_fifo(fifo);
  fl::Variable w(fl::ones({2}), "w");
  CHECK(test::returns_without_blocking_on(fifo, [&] {
    test::check_op_throws<fl::InvalidArgument>("restore_checkpoint", [&] { fl::restore_checkpoint(fifo, {w}); },
                                               {fifo, "not a regular file", "got a FIFO"});
  }));
  CHECK(w.value().to_vector<float>() == std::vector<float>{1, 1});

  // The manager's latest file is that FIFO: restore_latest throws instead of hanging or skipping it.
  const std::string run = dir.file("run");
  std::filesystem::create_directory(run);
  fl::CheckpointManager manager(run, 3);
  manager.save({w}, 4);
  const std::string named_like_a_checkpoint = run + "/ckpt-000005.safetensors";
  test::make_fifo(named_like_a_checkpoint);
  CHECK(manager.latest() == named_like_a_checkpoint);
  CHECK(test::returns_without_blocking_on(named_like_a_checkpoint, [&] {
    test::check_op_throws<fl::InvalidArgument>("restore_checkpoint", [&] { manager.restore_latest({w}); },
                                               {named_like_a_checkpoint, "got a FIFO"});
  }));
}

TEST_CASE("a path with a NUL byte is rejected everywhere instead of naming a shorter file") {
  TempDir dir;
  fl::Variable w(fl::full({2}, 3.0), "w");
  const std::string real = dir.file("a");
  fl::save_checkpoint(real, {w}, 1);
  const std::string with_nul = real + std::string("\0.bak", 5);  // the C calls would see only `real`

  fl::Variable target(fl::ones({2}), "w");
  test::check_op_throws<fl::InvalidArgument>("restore_checkpoint", [&] { fl::restore_checkpoint(with_nul, {target}); },
                                             {"path contains a NUL byte at offset " + std::to_string(real.size()),
                                              "\\x00.bak"});
  CHECK(target.value().to_vector<float>() == std::vector<float>{1, 1});

  w.assign(fl::full({2}, 9.0));
  test::check_op_throws<fl::InvalidArgument>("save_checkpoint", [&] { fl::save_checkpoint(with_nul, {w}, 2); },
                                             {"NUL byte"});
  CHECK(fl::restore_checkpoint(real, {target}) == 1);  // `real` was not overwritten
  CHECK(target.value().to_vector<float>() == std::vector<float>{3, 3});

  test::check_throws<fl::InvalidArgument>([&] { fl::CheckpointManager(dir.path + std::string("\0/x", 3)); },
                                          {"CheckpointManager", "directory contains a NUL byte"});
  test::check_throws<fl::InvalidArgument>([&] { fl::CheckpointManager(dir.path, 3, std::string("ck\0pt", 5)); },
                                          {"CheckpointManager", "prefix", "ck\\x00pt"});
}

// `count` zero-size entries named k0, k1, ... (they tile an empty data section), plus "w" of 2 floats.
std::string many_entries_file(int count, bool duplicate_last) {
  std::string entries = R"(,"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  for (int i = 0; i < count; ++i) {
    const int name = duplicate_last && i == count - 1 ? 0 : i;
    entries += fmt::format(R"(,"k{}":{{"dtype":"F32","shape":[0],"data_offsets":[8,8]}})", name);
  }
  return make_file(entries, std::string(8, '\0'));
}

// Seconds restore_checkpoint takes for a header of `count` keys (the fastest of three tries, so a
// moment of load on the machine does not count).
double restore_seconds(const std::string& path, int count) {
  write_file(path, many_entries_file(count, false));
  double best = 1e9;
  for (int attempt = 0; attempt < 3; ++attempt) {
    fl::Variable w(fl::ones({2}), "w");
    const auto start = std::chrono::steady_clock::now();
    CHECK(fl::restore_checkpoint(path, {w}) == 7);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    CHECK(w.value().to_vector<float>() == std::vector<float>{0, 0});
  }
  return best;
}

TEST_CASE("a header with 40,000 keys restores in time linear in its keys, and a duplicate among them is still found") {
  TempDir dir;
  const std::string path = dir.file("many.safetensors");
  const double small_s = restore_seconds(path, 4'000);
  const double restore_s = restore_seconds(path, 40'000);
  fl::Variable last(fl::zeros({0}), "k39999");
  CHECK(fl::restore_checkpoint(path, {last}) == 7);

  fl::Variable w(fl::ones({2}), "w");
  write_file(path, many_entries_file(40'000, true));
  const auto start = std::chrono::steady_clock::now();
  test::check_op_throws<fl::InvalidArgument>("restore_checkpoint", [&] { fl::restore_checkpoint(path, {w}); },
                                             {path, "duplicate key \"k0\""});
  const double reject_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(w.value().to_vector<float>() == std::vector<float>{1, 1});
  MESSAGE("4,000 keys restored in " << small_s << " s; 40,000 keys restored in " << restore_s
                                    << " s, a duplicate rejected in " << reject_s << " s");
  // Ten times the keys: about ten times the time when parsing is linear, a hundred times when each
  // key is checked against all before it (a scan per key took 21 s here for 40,000; linear parsing
  // takes about 0.2 s in a release build and about 1 s under ThreadSanitizer). The ratio does not
  // depend on the build or the machine's speed; the millisecond added to the small case keeps a
  // very fast one from making it noise. The bound is 60, not 30: the small header stays in cache
  // and the large one does not, which made linear parsing measure 41x under load (CI's 2 cores
  // running the MPI tests beside it).
  CHECK(restore_s < 60 * (small_s + 0.001));
  CHECK(restore_s < 10.0);
  CHECK(reject_s < 10.0);
}

TEST_CASE("CheckpointManager throws on a directory it cannot list instead of reporting no checkpoint") {
  TempDir dir;
  fl::Variable w(fl::ones({2}), "w");
  // Not a directory (root reads any directory, so permissions cannot stand in for this everywhere).
  write_file(dir.file("plain"), "x");
  fl::CheckpointManager over_a_file(dir.file("plain"), 3);
  test::check_throws<fl::InvalidArgument>([&] { over_a_file.restore_latest({w}); },
                                          {"CheckpointManager: cannot list directory '" + dir.file("plain") + "'",
                                           "Not a directory"});
  test::check_throws<fl::InvalidArgument>([&] { (void)over_a_file.latest(); }, {"cannot list directory"});
  test::check_throws<fl::InvalidArgument>([&] { (void)over_a_file.checkpoints(); }, {"cannot list directory"});
  CHECK(w.value().to_vector<float>() == std::vector<float>{1, 1});

  if (::geteuid() != 0) {
    const std::string locked = dir.file("locked");
    std::filesystem::create_directory(locked);
    std::filesystem::permissions(locked, std::filesystem::perms::none);
    test::check_throws<fl::InvalidArgument>([&] { fl::CheckpointManager(locked).restore_latest({w}); },
                                            {"cannot list directory", "Permission denied"});
    std::filesystem::permissions(locked, std::filesystem::perms::owner_all);
  }
  // A directory that does not exist yet is the one case of "no checkpoint".
  CHECK(fl::CheckpointManager(dir.file("not-yet")).restore_latest({w}) == -1);
}

TEST_CASE("CheckpointManager sees, restores and prunes steps of 19 digits") {
  TempDir dir;
  fl::CheckpointManager manager(dir.path, 2);
  fl::Variable w(fl::ones({2}), "w");
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();  // 9223372036854775807, 19 digits
  for (const int64_t step : {int64_t{999'999'999'999'999'999}, int64_t{1'000'000'000'000'000'000}, kMax - 1, kMax}) {
    w.assign(fl::full({2}, static_cast<double>(step % 1000)));
    CHECK(manager.save({w}, step) == dir.file(fmt::format("ckpt-{}.safetensors", step)));
    CHECK(manager.latest() == dir.file(fmt::format("ckpt-{}.safetensors", step)));
  }
  CHECK(manager.checkpoints() == std::vector<std::string>{dir.file("ckpt-9223372036854775806.safetensors"),
                                                          dir.file("ckpt-9223372036854775807.safetensors")});
  fl::Variable restored(fl::zeros({2}), "w");
  CHECK(manager.restore_latest({restored}) == kMax);
  CHECK(restored.value().to_vector<float>() == std::vector<float>{807, 807});
  // Names past int64 are not this manager's (it cannot have written them); leading zeros are.
  write_file(dir.file("ckpt-9223372036854775808.safetensors"), "x");
  write_file(dir.file("ckpt-99999999999999999999.safetensors"), "x");
  CHECK(manager.latest() == dir.file("ckpt-9223372036854775807.safetensors"));
}

TEST_CASE("CheckpointManager keeps the checkpoint just saved below older higher steps and makes it the latest") {
  TempDir dir;
  fl::CheckpointManager manager(dir.path, 3);
  fl::Variable w(fl::ones({2}), "w");
  for (const int64_t step : {10, 20, 30}) {
    w.assign(fl::full({2}, static_cast<double>(step)));
    manager.save({w}, step);
  }
  // Restarted from step 10 and trained again: the save at 15 must be what the next restart finds.
  w.assign(fl::full({2}, 15.0));
  const std::string path = manager.save({w}, 15);
  CHECK(path == dir.file("ckpt-000015.safetensors"));
  CHECK(std::filesystem::is_regular_file(path));
  CHECK(manager.latest() == path);
  CHECK(manager.checkpoints() ==
        std::vector<std::string>{dir.file("ckpt-000010.safetensors"), dir.file("ckpt-000015.safetensors")});
  fl::Variable restored(fl::zeros({2}), "w");
  CHECK(manager.restore_latest({restored}) == 15);
  CHECK(restored.value().to_vector<float>() == std::vector<float>{15, 15});
  // The rolled-back steps stay on disk, out of the manager's sight, restorable by path.
  CHECK(fl::restore_checkpoint(dir.file("ckpt-000030.safetensors.superseded"), {restored}) == 30);
  CHECK(std::filesystem::exists(dir.file("ckpt-000020.safetensors.superseded")));

  // Pruning goes on within the new lineage, oldest first; the newest save always stays.
  for (const int64_t step : {16, 17}) manager.save({w}, step);
  CHECK(manager.checkpoints() == std::vector<std::string>{dir.file("ckpt-000015.safetensors"),
                                                          dir.file("ckpt-000016.safetensors"),
                                                          dir.file("ckpt-000017.safetensors")});
  fl::CheckpointManager keep_one(dir.path, 1);
  CHECK(keep_one.save({w}, 3) == dir.file("ckpt-000003.safetensors"));
  CHECK(keep_one.checkpoints() == std::vector<std::string>{dir.file("ckpt-000003.safetensors")});

  // The same step spelled without leading zeros would also hide the new file.
  fl::save_checkpoint(dir.file("ckpt-4.safetensors"), {w}, 4);
  CHECK(keep_one.save({w}, 4) == dir.file("ckpt-000004.safetensors"));
  CHECK(keep_one.checkpoints() == std::vector<std::string>{dir.file("ckpt-000004.safetensors")});
  CHECK(std::filesystem::exists(dir.file("ckpt-4.safetensors.superseded")));
}
