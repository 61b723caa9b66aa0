// Writes the seed corpora of the fuzz targets from real files: checkpoints saved by flowlet, the
// first examples of Debian's Fashion-MNIST test split, and parameter-server messages as flowlet
// encodes them. Run from the source root after building:
//   build/fuzz/tests/fuzz/make_fuzz_seeds tests/fuzz/corpus [/usr/share/datasets/fashion-mnist]
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <flowlet/flowlet.hpp>

#include "ps/wire/messages.hpp"

namespace fl = flowlet;
using Bytes = std::vector<uint8_t>;

namespace {

Bytes read_gzip(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) throw std::runtime_error("cannot open " + path);
  Bytes bytes;
  uint8_t buffer[1 << 16];
  for (int got; (got = gzread(file, buffer, sizeof buffer)) > 0;) bytes.insert(bytes.end(), buffer, buffer + got);
  gzclose(file);
  return bytes;
}

Bytes gzip(const Bytes& bytes) {
  uLongf size = compressBound(bytes.size()) + 32;
  Bytes out(size);
  z_stream stream{};
  deflateInit2(&stream, 9, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);  // +16: gzip wrapper
  stream.next_in = const_cast<uint8_t*>(bytes.data());
  stream.avail_in = static_cast<uInt>(bytes.size());
  stream.next_out = out.data();
  stream.avail_out = static_cast<uInt>(size);
  deflate(&stream, Z_FINISH);
  out.resize(stream.total_out);
  deflateEnd(&stream);
  return out;
}

void write(const std::filesystem::path& path, const Bytes& bytes) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                              static_cast<std::streamsize>(bytes.size()));
}

// An IDX file cut to its first `n` examples: the real header with the count replaced.
Bytes first_examples(const Bytes& idx, uint32_t n) {
  const size_t rank = idx[3];
  size_t per_example = 1;
  for (size_t k = 1; k < rank; ++k)
    per_example *= (size_t{idx[4 + 4 * k]} << 24) | (size_t{idx[5 + 4 * k]} << 16) | (size_t{idx[6 + 4 * k]} << 8) |
                   idx[7 + 4 * k];
  Bytes out(idx.begin(), idx.begin() + static_cast<long>(4 + 4 * rank + n * per_example));
  for (int b = 0; b < 4; ++b) out[4 + b] = static_cast<uint8_t>(n >> (24 - 8 * b));
  return out;
}

// The idx_reader input layout: 2-byte big-endian images length, images, labels.
Bytes pair_input(const Bytes& images, const Bytes& labels) {
  Bytes out = {static_cast<uint8_t>(images.size() >> 8), static_cast<uint8_t>(images.size())};
  out.insert(out.end(), images.begin(), images.end());
  out.insert(out.end(), labels.begin(), labels.end());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR [FASHION_MNIST_DIR]\n", argv[0]);
    return 2;
  }
  const std::filesystem::path corpus = argv[1];
  const std::string fashion = argc > 2 ? argv[2] : "/usr/share/datasets/fashion-mnist";

  // Checkpoints: the variables of fuzz_checkpoint_restore.cpp, and a single one.
  const auto checkpoints = corpus / "checkpoint_restore";
  std::filesystem::create_directories(checkpoints);
  std::vector<fl::Variable> vars = {
      fl::Variable(fl::tensor(std::vector<float>{1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, 6.0f}, {2, 3}), "dense/kernel"),
      fl::Variable(fl::tensor({1.0 / 3.0, -1e300}), "bias"),
      fl::Variable(fl::scalar<int64_t>(-12345), "global_step"),
      fl::Variable(fl::tensor(std::vector<bool>{true, false, false, true}, {2, 2}), "mask"),
      fl::Variable(fl::zeros({0, 4}, fl::f32), "empty"),
  };
  fl::save_checkpoint((checkpoints / "all_variables.safetensors").string(), vars, 1000);
  fl::save_checkpoint((checkpoints / "one_variable.safetensors").string(), {vars[0]}, 7);

  // IDX: the first 2 test images and labels, plain and gzip, and one image with its label.
  const auto idx = corpus / "idx_reader";
  std::filesystem::create_directories(idx);
  const Bytes images = read_gzip(fashion + "/t10k-images-idx3-ubyte.gz");
  const Bytes labels = read_gzip(fashion + "/t10k-labels-idx1-ubyte.gz");
  write(idx / "two_plain", pair_input(first_examples(images, 2), first_examples(labels, 2)));
  write(idx / "two_gzip", pair_input(gzip(first_examples(images, 2)), gzip(first_examples(labels, 2))));
  write(idx / "one_mixed", pair_input(gzip(first_examples(images, 1)), first_examples(labels, 1)));
  write(idx / "none_plain", pair_input(first_examples(images, 0), first_examples(labels, 0)));

  // Parameter-server messages: one of each kind, tensors of several dtypes and ranks.
  namespace ps = fl::detail::ps;
  const auto messages = corpus / "ps_message";
  std::filesystem::create_directories(messages);
  ps::Push push{1, 7, 6, {}};
  push.entries.push_back({0, fl::Tensor(), fl::tensor(std::vector<float>{0.5f, -1, 2, 4}, {2, 2})});
  push.entries.push_back({2, fl::tensor(std::vector<int64_t>{3, 0}, {2}), fl::full({2, 3}, 0.25, fl::bf16)});
  const std::vector<std::pair<std::string, ps::Message>> seeds = {
      {"pull_request", ps::PullRequest{1, 0, 4, 2, 3}},
      {"sparse_pull_request", ps::SparsePullRequest{2, 1, 5, 3, 0, fl::tensor(std::vector<int64_t>{9, 1, 4}, {3})}},
      {"pull_reply_f64", ps::PullReply{3, 8, fl::tensor(std::vector<double>{1, -2, 3.5}, {3, 1})}},
      {"pull_reply_b8_scalar", ps::PullReply{4, 0, fl::scalar(true)}},
      {"pull_reply_empty_f16", ps::PullReply{5, 1, fl::zeros({0, 4}, fl::f16)}},
      {"push", push},
      {"goodbye", ps::Goodbye{3, 100}},
      {"error_reply", ps::ErrorReply{6, ps::ErrorCode::invalid_argument, "push: var 9 is not held here"}},
  };
  for (const auto& [name, message] : seeds) {
    const ps::Bytes bytes = ps::encode(message);
    std::ofstream(messages / name, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  return 0;
}
