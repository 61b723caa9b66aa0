// The contract between DistributedCheckpointManager (src/checkpoint/distributed/) and what a
// checkpoint holds: a Source snapshots what this process writes and restores what it needs.
//
// Two sources exist: the variables every process holds whole (add(variables), in
// src/checkpoint/distributed/) and a parameter-server strategy's servers (add(strategy), in
// src/ps/checkpoint/). The manager owns files, manifests, threads and the agreement between
// processes; a source only deals in logical tensors and row ranges of them.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "flowlet/core/tensor.hpp"
#include "flowlet/distributed_checkpoint.hpp"

namespace flowlet::detail::ckpt {

// Rows [row_begin, row_end) of one logical tensor (a variable, an optimizer slot), as one process
// writes them. A rank-0 tensor has the one row [0, 1).
struct Piece {
  std::string tensor;  // the logical tensor's name: unique among everything a checkpoint holds
  DType dtype = f32;
  Shape shape;         // the logical tensor's full shape
  int64_t row_begin = 0, row_end = 1;
  // A host copy, contiguous, that nothing else writes to (the training thread goes on while the
  // background thread writes it): shape with dimension 0 = row_end - row_begin (rank 0: scalar).
  Tensor value;
};

// One shard file this process writes. The manager names the file `<name>.<unique id>.safetensors`.
struct ShardContent {
  std::string name;  // unique in the checkpoint; [a-z0-9_-]+: "variables-p0", "server-1"
  std::vector<Piece> pieces;
};

// Where one logical tensor's rows are in a checkpoint (read from its manifest).
struct PieceRecord {
  std::string shard;  // ShardContent::name
  int64_t row_begin = 0, row_end = 1;
  std::string entry;  // the safetensors entry in the shard file that holds these rows (added by core)
};
struct TensorRecord {
  std::string name;
  DType dtype = f32;
  Shape shape;
  std::vector<PieceRecord> pieces;  // sorted by row_begin; they tile [0, rows) exactly
};

// A checkpoint being restored: its manifest (already validated) and the tensors in it. read()
// returns rows of a logical tensor assembled from its pieces; it validates every shard file it
// touches in full first (size, CRC-32, safetensors structure, step), once per file. Errors are
// InvalidArgument naming the file (the manager adds which process found them).
class Reader {
 public:
  virtual ~Reader() = default;
  virtual int64_t step() const = 0;
  virtual const std::string& path() const = 0;  // the checkpoint's directory
  virtual int saved_processes() const = 0;
  // What sources recorded at save (Source::snapshot's `attributes`), e.g. "ps.servers" -> "2".
  virtual const std::map<std::string, std::string>& attributes() const = 0;
  virtual const std::vector<TensorRecord>& tensors() const = 0;
  virtual const TensorRecord* find(const std::string& tensor) const = 0;
  // Rows [row_begin, row_end) of `tensor` as a new host tensor (rank 0: [0, 1) gives the scalar).
  // InvalidArgument for a tensor not in the checkpoint or rows out of range.
  virtual Tensor read(const std::string& tensor, int64_t row_begin, int64_t row_end) = 0;
  Tensor read(const std::string& tensor) {
    const TensorRecord* record = find(tensor);
    return read(tensor, 0, record == nullptr || record->shape.rank() == 0 ? 1 : record->shape[0]);
  }
};

// What this process is in the job, for sources.
struct ProcessView {
  int process = 0;    // 0 .. processes - 1
  int processes = 1;
};

class Source {
 public:
  virtual ~Source() = default;
  // The logical tensors this source saves (every process gives the same list): the manager checks
  // that names are unique across sources when the source is added.
  virtual std::vector<std::string> tensor_names() const = 0;
  // At save(), on the training thread of every process: appends this process's shard files (each
  // piece a private copy; none is fine) and sets `attributes` (the same on every process: the
  // cluster shape as this source sees it; process 0's are written to the manifest).
  virtual void snapshot(const ProcessView& view, std::vector<ShardContent>& shards,
                        std::map<std::string, std::string>& attributes) = 0;
  // Restore, phase 1, on every process: refuse a checkpoint that does not fit (the message says
  // why), and read what this process will assign. Changes nothing visible.
  virtual void load(const ProcessView& view, Reader& reader) = 0;
  // Restore, phase 2, once every process's load() succeeded: assign what load() read. Should not
  // fail; an exception here still reaches the caller.
  virtual void commit() = 0;
};

// Lets src/ps/checkpoint/ (add(ParameterServerStrategy&)) register its source.
struct ManagerAccess {
  static void add_source(DistributedCheckpointManager& manager, std::shared_ptr<Source> source);
};

}  // namespace flowlet::detail::ckpt
