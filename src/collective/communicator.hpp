// Communicator: the one seam every collective goes through, with a backend per transport (the way
// core/backend.hpp is the seam for CUDA).
//
// A communicator joins P participants: `local_size()` of them in this process (one per local
// device) times the job's processes, numbered process-major (participant = process * local_size +
// local). Backends: in-process (local devices exchanging through shared memory), MPI (CPU tensors
// across processes, on a duplicated communicator), NCCL (GPU tensors). A communicator with local
// participants in several processes combines them: the in-process exchange first, then one
// cross-process call per process.
//
// Matching: each participant's calls are numbered in the order it makes them; call k of every
// participant forms one collective. Callers keep that order (a traced graph orders its collective
// nodes on the communicator, as stateful nodes on a resource).
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "flowlet/collective.hpp"
#include "flowlet/core/device.hpp"
#include "flowlet/core/tensor.hpp"

namespace flowlet::detail {

enum class CollectiveKind : uint8_t { all_reduce, broadcast, all_gather, reduce_scatter, barrier };
const char* collective_name(CollectiveKind kind);  // "all_reduce", ... (the public function's name)
// all_reduce and reduce_scatter: the kinds that combine the participants' values with a ReduceOp.
inline bool reduces(CollectiveKind kind) {
  return kind == CollectiveKind::all_reduce || kind == CollectiveKind::reduce_scatter;
}

// One participant's part of one collective.
struct CollectiveCall {
  CollectiveKind kind = CollectiveKind::all_reduce;
  ReduceOp op = ReduceOp::sum;  // all_reduce, reduce_scatter
  int root = 0;                 // broadcast: the participant whose value everyone gets
  Tensor input;                 // on the participant's device, contiguous; empty handle for barrier
  // Exchange and compare a small header (kind, op, root, dtype, shape) before the data, so that
  // participants that disagree fail with an error naming the difference on every participant. Set
  // on a call site's first use (a traced node's first run; an eager signature's first call) and
  // whenever the caller wants it; the in-process exchange compares headers on every call anyway.
  bool check_header = true;
};

// Called exactly once, on any thread, with the participant's result (allocated by the
// communicator on the participant's device; empty for barrier) or the error the call failed with.
using CollectiveDone = std::function<void(Tensor result, std::exception_ptr error)>;

struct CommunicatorOptions {
  // A collective whose peers do not all arrive within this many seconds fails with DeadlineExceeded
  // on the participants that did arrive. <= 0: FLOWLET_COLLECTIVE_TIMEOUT, or 300 when unset.
  double timeout_seconds = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  int size() const { return local_size() * processes(); }  // participants over all processes
  virtual int local_size() const = 0;                      // participants in this process
  virtual int processes() const = 0;                       // processes taking part
  int rank_of(int local) const { return process_rank() * local_size() + local; }
  virtual int process_rank() const = 0;                    // this process's index among them
  virtual Device device(int local) const = 0;              // local participant `local`'s device

  // Starts local participant `local`'s next collective and returns at once; never waits for peers
  // on the calling thread (a graph's collective node holds no executor thread while it waits).
  // Argument errors of the call itself (a tensor on the wrong device) are thrown here, before
  // anything is sent; errors that involve peers arrive through `done`.
  virtual void start(int local, CollectiveCall call, CollectiveDone done) = 0;

  // Fails every call of this process's participants that still waits for peers, and every later
  // call, with `error`: for a caller that knows a participant will never come (a replica whose
  // step failed), so its peers fail now instead of at the timeout. Calls already handed to the
  // cross-process transport complete as they would.
  virtual void abort(std::exception_ptr error) = 0;

  // start() and wait for the result (eager calls). Rethrows the call's error.
  Tensor run(int local, CollectiveCall call);

  // "communicator of 4 participants (2 processes x [cpu:0, cpu:1])": for error messages.
  virtual std::string describe() const = 0;
};

// The communicator over the job's processes, one participant each on the process's default device
// (what a collective outside MirroredStrategy::run uses). Made on first use.
std::shared_ptr<Communicator> world_communicator();

// A communicator whose participants are `local_devices` of every process (all CPU devices, or all
// GPUs). Collective over processes: every process calls it, in the same order, with the same
// number of devices; the devices must be distinct. InvalidArgument / DeviceError otherwise.
std::shared_ptr<Communicator> make_communicator(const std::vector<Device>& local_devices,
                                                CommunicatorOptions options = {});

}  // namespace flowlet::detail
