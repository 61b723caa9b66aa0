// The messages between parameter-server workers and servers, and their byte encoding.
//
// Every message crosses a transport as one byte string: the in-process transport moves it as is,
// the MPI transport sends it as one MPI message. decode() treats its input as hostile: every
// length, count, dtype, rank and dimension is checked against the bytes that are there, so a
// truncated or malformed message throws DataLoss naming what is wrong and where, and never reads or
// writes out of bounds (tests/test_ps_wire.cpp fuzzes it).
//
// Layout (little-endian, no padding): u32 magic "FLPS", u8 format version, u8 kind, then the
// kind's fields in the order of the structs below. A Tensor is u8 dtype, u8 rank, rank x i64 dims,
// then numel x dtype_size bytes (contiguous, row-major; a CPU tensor on decode). A string is u32
// length then bytes. A vector is u32 count then its elements.
//
// Added by the wire part (compatible): an undefined Tensor (a default-constructed handle, e.g. the
// `rows` of a dense PushEntry) is the dtype byte kNoTensor and rank 0, and decodes to an undefined
// Tensor; a rank above kMaxWireRank is malformed (the checkpoint reader's limit too). The kinds are
// numbered 1.. in the order of the Message variant's alternatives; the format version is 1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "flowlet/core/tensor.hpp"

namespace flowlet::detail::ps {

using Bytes = std::vector<std::byte>;

inline constexpr uint8_t kNoTensor = 0xff;  // the dtype byte of an undefined Tensor
inline constexpr int kMaxWireRank = 64;     // the most dimensions a tensor on the wire may have
// encode() reserves this much capacity beyond the message, so that a transport can append its
// frame (the MPI transport's 8-byte endpoint trailer) without reallocating and copying the message.
// (64 rather than 8: the MPI transport receives into the buffers of its completed sends, and the
// spare lets a 4 MB reply's buffer take a 4 MB push, whose header is a few bytes longer.)
inline constexpr size_t kFrameSpare = 64;

// Worker -> server: the server's rows of variable var_id, once the server's version is at least
// min_version (sync) and the worker may read (bounded staleness: `clock` is how many steps the
// worker has pushed to this server).
struct PullRequest {
  uint64_t request_id = 0;
  int32_t worker = 0;
  int64_t clock = 0;
  int32_t var_id = 0;
  int64_t min_version = 0;
};

// Worker -> server: only rows `rows` (i64 [n], indices local to the server's piece, each in
// [0, piece rows)) of variable var_id; same waiting rules as PullRequest.
struct SparsePullRequest {
  uint64_t request_id = 0;
  int32_t worker = 0;
  int64_t clock = 0;
  int32_t var_id = 0;
  int64_t min_version = 0;
  Tensor rows;
};

// Server -> worker: the answer to a pull (dense: the piece's rows; sparse: [n, row shape...]),
// read at `version`.
struct PullReply {
  uint64_t request_id = 0;
  int64_t version = 0;
  Tensor value;
};

// One variable's gradient in a push: dense (rows empty; `grad` has the piece's shape) or sparse
// (rows i64 [n], local to the piece, unique; grad [n, row shape...]).
struct PushEntry {
  int32_t var_id = 0;
  Tensor rows;
  Tensor grad;
};

// Worker -> server: one step's gradients for the server's variables (possibly none: the push still
// counts as the worker's step), computed from values read at read_version.
struct Push {
  int32_t worker = 0;
  int64_t clock = 0;  // the worker's step count with this push (1 for its first)
  int64_t read_version = 0;
  std::vector<PushEntry> entries;
};

// Worker -> server: the worker has finished its run (it sends nothing more).
struct Goodbye {
  int32_t worker = 0;
  int64_t clock = 0;
};

// Server -> worker: a pull failed (request_id), or the worker's push did (request_id 0).
enum class ErrorCode : uint8_t { invalid_argument = 1, deadline_exceeded = 2, internal = 3 };
struct ErrorReply {
  uint64_t request_id = 0;
  ErrorCode code = ErrorCode::internal;
  std::string message;
};

using Message = std::variant<PullRequest, SparsePullRequest, PullReply, Push, Goodbye, ErrorReply>;

// "pull_request", "push", ...: for errors and logs.
const char* message_name(const Message& message);

// The message as bytes. CPU tensors (contiguous or not); InvalidArgument for a tensor on another
// device or a count that does not fit the format.
Bytes encode(const Message& message);

// The message `bytes` hold, or DataLoss naming the first problem (bad magic or version, unknown
// kind or dtype, a rank above the maximum, a negative dimension, a size that overflows, fewer or
// more bytes than the fields need). Tensors are new CPU tensors (cpu:0) owning their bytes.
Message decode(std::span<const std::byte> bytes);
// The same checks and result, taking the message's buffer over (added by the wire part, compatible):
// tensors of 4 KiB and more view their elements in `bytes`' allocation instead of copying them
// (shifted back in place by at most 7 bytes when the layout leaves them off their element
// alignment), so a received 4 MB tensor costs no second buffer. The tensors share ownership of the
// buffer, which lives as long as any of them.
Message decode(Bytes&& bytes);

}  // namespace flowlet::detail::ps
