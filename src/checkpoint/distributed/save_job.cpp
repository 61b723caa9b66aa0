// The background part of a save: shard files, the gather to process 0, the manifest (save_job.hpp).
#include "checkpoint/distributed/save_job.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>
#include <system_error>
#include <thread>

#include "checkpoint/distributed/agreement.hpp"
#include "checkpoint/distributed/layout.hpp"
#include "checkpoint/distributed/manifest.hpp"
#include "checkpoint/safetensors_file.hpp"
#include "core/check.hpp"

namespace flowlet::detail::ckpt {

namespace {

void test_delay() {
  if (const int ms = test_write_delay_ms(); ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

// 16 hex digits that no other save (of any process, any run) picks for the same shard.
std::string unique_id() {
  static thread_local std::mt19937_64 generator(
      std::random_device{}() ^ (static_cast<uint64_t>(::getpid()) << 32) ^
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  return fmt::format("{:016x}", generator());
}

// The safetensors entry for a piece: the tensor's name when it holds every row.
std::string entry_name(const Piece& piece) {
  const int64_t rows = piece.shape.rank() == 0 ? 1 : piece.shape[0];
  if (piece.row_begin == 0 && piece.row_end == rows) return piece.tensor;
  return fmt::format("{}#rows{}-{}", piece.tensor, piece.row_begin, piece.row_end);
}

// A source's piece must be what it says it is before it reaches a file.
void check_piece(const SaveJob& job, const ShardContent& shard, const Piece& piece) {
  const int64_t rows = piece.shape.rank() == 0 ? 1 : piece.shape[0];
  std::vector<int64_t> dims = piece.shape.to_vector();
  if (!dims.empty()) dims[0] = piece.row_end - piece.row_begin;
  const bool ok = piece.value.defined() && piece.value.device() == Device() && piece.value.is_contiguous() &&
                  piece.value.dtype() == piece.dtype && piece.row_begin >= 0 && piece.row_begin <= piece.row_end &&
                  piece.row_end <= rows && piece.value.shape() == Shape(dims);
  if (!ok) {
    detail::fail<InvalidArgument>(
        "{}: shard '{}' holds a bad piece of '{}': rows [{}, {}) of a {} {} tensor, but its value is {}", job.op,
        shard.name, piece.tensor, piece.row_begin, piece.row_end, piece.dtype, piece.shape,
        piece.value.defined()
            ? fmt::format("{} {} on {}", piece.value.dtype(), piece.value.shape(), piece.value.device())
            : std::string("empty"));
  }
}

// Step 1 for this process: its shard files and their records (as a partial manifest).
Manifest write_shards(const SaveJob& job, const std::string& step_dir, int64_t& bytes) {
  std::error_code error;
  std::filesystem::create_directories(step_dir, error);
  if (error) detail::fail<InvalidArgument>("{}: cannot create directory '{}': {}", job.op, step_dir, error.message());
  Manifest partial;
  partial.step = job.step;
  partial.processes = job.view.processes;
  for (const ShardContent& shard : job.shards) {
    std::vector<checkpoint::NamedTensor> tensors;
    std::set<std::string> entries;
    for (const Piece& piece : shard.pieces) {
      check_piece(job, shard, piece);
      std::string entry = entry_name(piece);
      if (!entries.insert(entry).second)
        detail::fail<InvalidArgument>("{}: shard '{}' holds rows of '{}' twice", job.op, shard.name, piece.tensor);
      TensorRecord record;
      record.name = piece.tensor;
      record.dtype = piece.dtype;
      record.shape = piece.shape;
      record.pieces.push_back({shard.name, piece.row_begin, piece.row_end, entry});
      partial.tensors.push_back(std::move(record));
      tensors.push_back({std::move(entry), piece.value});
    }
    ShardRecord record;
    record.name = shard.name;
    record.file = fmt::format("{}.{}.safetensors", shard.name, unique_id());
    record.process = job.view.process;
    const checkpoint::WrittenFile written = checkpoint::write_safetensors_file(
        step_dir + "/" + record.file, tensors, job.step,
        {{"shard", shard.name}, {"process", std::to_string(job.view.process)}}, job.op, test_delay);
    record.bytes = written.bytes;
    record.crc32 = written.crc32;
    bytes += written.bytes;
    partial.shards.push_back(std::move(record));
  }
  return partial;
}

// Step 3 on process 0: every process's records joined into one manifest.
Manifest join_records(const SaveJob& job, const std::vector<std::string>& records, const std::string& step_dir) {
  Manifest manifest;
  manifest.step = job.step;
  manifest.processes = job.view.processes;
  manifest.cluster = job.view.processes == 1 ? "1 process" : fmt::format("{} processes", job.view.processes);
  manifest.attributes = job.attributes;
  manifest.metadata = job.metadata;
  std::map<std::string, size_t> tensor_index;
  for (size_t p = 0; p < records.size(); ++p) {
    const std::string& text = records[p];
    if (text.empty() || text[0] != 'R') {
      throw_encoded(text.empty() ? std::string("Ino record") : text.substr(1),
                    job.view.processes > 1 ? fmt::format("process {}: ", p) : std::string());
    }
    Manifest partial = parse_manifest(std::string_view(text).substr(1), fmt::format("records of process {}", p), job.op,
                                      /*validate=*/false);
    for (ShardRecord& shard : partial.shards) manifest.shards.push_back(std::move(shard));
    for (TensorRecord& tensor : partial.tensors) {
      const auto [it, inserted] = tensor_index.emplace(tensor.name, manifest.tensors.size());
      if (inserted) {
        manifest.tensors.push_back(std::move(tensor));
        continue;
      }
      TensorRecord& joined = manifest.tensors[it->second];
      if (joined.dtype != tensor.dtype || !(joined.shape == tensor.shape)) {
        detail::fail<InvalidArgument>("{}: processes disagree on tensor '{}': {} {} and {} {}", job.op, tensor.name,
                                      joined.dtype, joined.shape, tensor.dtype, tensor.shape);
      }
      for (PieceRecord& piece : tensor.pieces) joined.pieces.push_back(std::move(piece));
    }
  }
  for (TensorRecord& tensor : manifest.tensors) {
    std::sort(tensor.pieces.begin(), tensor.pieces.end(),
              [](const PieceRecord& a, const PieceRecord& b) { return a.row_begin < b.row_begin; });
  }
  // A source that left rows out or wrote them twice is caught here, before the checkpoint exists.
  validate_manifest(manifest, step_dir + "/" + std::string(kManifestFile), job.op);
  return manifest;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

int test_write_delay_ms() {
  static const int delay = [] {
    const char* text = std::getenv("FLOWLET_CHECKPOINT_TEST_WRITE_DELAY_MS");
    return text == nullptr ? 0 : std::max(0, std::atoi(text));
  }();
  return delay;
}

CheckpointSaveStats run_save_job(SaveJob& job) {
  const std::string step_dir = step_directory(job.directory, job.prefix, job.step);
  CheckpointSaveStats stats;
  stats.step = job.step;
  stats.copy_seconds = job.copy_seconds;

  // 1-2: write, then tell process 0 what was written (or why not).
  std::string mine;
  try {
    const Manifest partial = write_shards(job, step_dir, stats.bytes);
    mine = 'R';
    mine += manifest_to_json(partial);
  } catch (...) {
    mine = 'E';  // appended, not `"E" + ...`: GCC 12 warns (-Wrestrict) about the operator+ form
    mine += encode_error(std::current_exception());
  }
  job.shards.clear();  // the copies are written: free them before the manifest work
  const std::vector<std::string> records = all_gather_strings(job.comm, mine);

  // 3: process 0 commits.
  std::string outcome;
  if (job.view.process == 0) {
    try {
      const Manifest manifest = join_records(job, records, step_dir);
      test_delay();
      const std::string text = manifest_to_json(manifest);
      checkpoint::write_file_atomically(step_dir + "/" + std::string(kManifestFile), {{text.data(), text.size()}},
                                        job.op);
      std::vector<std::string> keep;
      for (const ShardRecord& shard : manifest.shards) {
        keep.push_back(shard.file);
        stats.total_bytes += shard.bytes;
      }
      clean_after_commit(job.directory, job.prefix, job.step, step_dir, job.max_to_keep, keep, job.op);
    } catch (...) {
      outcome = encode_error(std::current_exception());
    }
  } else {
    stats.total_bytes = stats.bytes;
  }

  // 4: everyone learns process 0's outcome.
  const std::vector<std::string> outcomes = all_gather_strings(job.comm, outcome);
  if (!outcomes[0].empty()) throw_encoded(outcomes[0], "");
  stats.write_seconds = seconds_since(job.copied);
  return stats;
}

}  // namespace flowlet::detail::ckpt
