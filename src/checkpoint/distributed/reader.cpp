// CheckpointReader: a checkpoint's manifest and its validated shard files (reader.hpp).
#include "checkpoint/distributed/reader.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "checkpoint/safetensors_file.hpp"
#include "core/check.hpp"

namespace flowlet::detail::ckpt {

namespace {

// The whole manifest text; InvalidArgument naming the file when it cannot be read.
std::string read_manifest_text(const std::string& file, std::string_view op) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) detail::fail<InvalidArgument>("{}: cannot open manifest '{}': {}", op, file, std::strerror(errno));
  struct stat info {};
  std::string text;
  int error = 0;
  if (::fstat(fd, &info) != 0) {
    error = errno;
  } else if (!S_ISREG(info.st_mode) || static_cast<uint64_t>(info.st_size) > kMaxManifestBytes) {
    ::close(fd);
    detail::fail<InvalidArgument>("{}: manifest '{}' is not a regular file of at most {} bytes; got {} bytes", op, file,
                                  kMaxManifestBytes, static_cast<int64_t>(info.st_size));
  } else {
    text.resize(static_cast<size_t>(info.st_size));
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::pread(fd, text.data() + done, text.size() - done, static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        error = n < 0 ? errno : EIO;
        break;
      }
      done += static_cast<size_t>(n);
    }
  }
  ::close(fd);
  if (error != 0) detail::fail<InvalidArgument>("{}: cannot read manifest '{}': {}", op, file, std::strerror(error));
  return text;
}

}  // namespace

CheckpointReader::CheckpointReader(std::string path, int64_t expected_step, std::string op)
    : path_(std::move(path)), op_(std::move(op)) {
  while (path_.size() > 1 && path_.back() == '/') path_.pop_back();
  manifest_path_ = path_ + "/" + std::string(kManifestFile);
  manifest_ = parse_manifest(read_manifest_text(manifest_path_, op_), manifest_path_, op_);
  if (expected_step >= 0 && manifest_.step != expected_step) {
    detail::fail<InvalidArgument>(
        "{}: manifest '{}' is not valid: step: {} differs from the step {} its directory's name says (a manifest "
        "of another checkpoint?)",
        op_, manifest_path_, manifest_.step, expected_step);
  }
  for (size_t i = 0; i < manifest_.tensors.size(); ++i) tensor_index_.emplace(manifest_.tensors[i].name, i);
  for (size_t i = 0; i < manifest_.shards.size(); ++i) shard_index_.emplace(manifest_.shards[i].name, i);
}

const TensorRecord* CheckpointReader::find(const std::string& tensor) const {
  const auto it = tensor_index_.find(tensor);
  return it == tensor_index_.end() ? nullptr : &manifest_.tensors[it->second];
}

void CheckpointReader::validate_shard(size_t index) {
  if (loaded_.count(index) != 0) return;
  const ShardRecord& record = manifest_.shards.at(index);
  const std::string file_path = path_ + "/" + record.file;
  const checkpoint::SafetensorsFile file(file_path, op_);
  const auto bad = [&](const std::string& why) {
    detail::fail<InvalidArgument>("{}: shard '{}' does not match manifest '{}': {}", op_, file_path, manifest_path_,
                                  why);
  };
  if (static_cast<int64_t>(file.size()) != record.bytes)
    bad(fmt::format("it has {} bytes but the manifest records {} (truncated, or from another checkpoint?)", file.size(),
                    record.bytes));
  if (file.header().step != manifest_.step)
    bad(fmt::format("it holds step {} but the manifest is of step {} (from another checkpoint?)", file.header().step,
                    manifest_.step));
  uint32_t file_crc = 0;
  std::vector<Tensor> tensors = file.read_all(file_crc);
  if (file_crc != record.crc32)
    bad(fmt::format("its crc32 is {} but the manifest records {} (from another checkpoint?)",
                    checkpoint::hex32(file_crc), checkpoint::hex32(record.crc32)));
  auto loaded = std::make_unique<LoadedShard>();
  for (size_t k = 0; k < tensors.size(); ++k)
    loaded->entries.emplace(file.header().entries[k].name, std::move(tensors[k]));
  // Every piece the manifest places in this shard must be there, with its dtype and shape.
  for (const TensorRecord& t : manifest_.tensors) {
    for (const PieceRecord& p : t.pieces) {
      if (p.shard != record.name) continue;
      const auto it = loaded->entries.find(p.entry);
      if (it == loaded->entries.end()) bad(fmt::format("it has no entry \"{}\" (rows of '{}')", p.entry, t.name));
      std::vector<int64_t> dims = t.shape.to_vector();
      if (!dims.empty()) dims[0] = p.row_end - p.row_begin;
      if (it->second.dtype() != t.dtype || !(it->second.shape() == Shape(dims))) {
        bad(fmt::format("entry \"{}\" is {} {} but the manifest expects {} {}", p.entry, it->second.dtype(),
                        it->second.shape(), t.dtype, Shape(dims)));
      }
    }
  }
  loaded_.emplace(index, std::move(loaded));
}

CheckpointReader::LoadedShard& CheckpointReader::shard(const std::string& name) {
  const size_t index = shard_index_.at(name);  // the manifest was validated: every piece's shard exists
  validate_shard(index);
  return *loaded_.at(index);
}

Tensor CheckpointReader::read(const std::string& tensor, int64_t row_begin, int64_t row_end) {
  const TensorRecord* record = find(tensor);
  if (record == nullptr)
    detail::fail<InvalidArgument>("{}: tensor '{}' is not in checkpoint '{}'", op_, tensor, manifest_path_);
  const int64_t rows = record->shape.rank() == 0 ? 1 : record->shape[0];
  if (row_begin < 0 || row_end < row_begin || row_end > rows) {
    detail::fail<InvalidArgument>("{}: rows [{}, {}) of tensor '{}' are outside its {} rows (checkpoint '{}')", op_,
                                  row_begin, row_end, tensor, rows, manifest_path_);
  }
  std::vector<int64_t> dims = record->shape.to_vector();
  if (!dims.empty()) dims[0] = row_end - row_begin;
  Tensor out = Tensor::empty(Shape(dims), record->dtype);
  const int64_t row_bytes = piece_bytes(record->shape, record->dtype, 0, 1);
  for (const PieceRecord& p : record->pieces) {
    const int64_t begin = std::max(p.row_begin, row_begin), end = std::min(p.row_end, row_end);
    if (begin >= end) continue;
    const Tensor& source = shard(p.shard).entries.at(p.entry);
    std::memcpy(static_cast<char*>(out.raw_data()) + (begin - row_begin) * row_bytes,
                static_cast<const char*>(source.raw_data()) + (begin - p.row_begin) * row_bytes,
                static_cast<size_t>((end - begin) * row_bytes));
  }
  return out;
}

}  // namespace flowlet::detail::ckpt
