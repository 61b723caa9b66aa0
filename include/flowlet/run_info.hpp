// What the executor reports about the last run of a traced function's graph (CUDA Graph replay,
// transfers between devices); TracedFunction returns these, the executor fills them.
#pragma once

#include <cstdint>
#include <string>

namespace flowlet {

// Whether the last call's graph ran as a CUDA Graph, and if not, why.
struct CudaGraphInfo {
  bool captured = false;  // the graph is recorded and the last call replayed it
  int64_t replays = 0;    // calls that replayed it so far
  int recordings = 0;     // times it was recorded (again after a variable changed its buffer)
  std::string why_not;    // "" when captured (or to be recorded at the next call)
};

// What the last call moved between devices: its graph is cut into one partition per device, and
// every edge between two partitions is a Send/Recv pair (zero-copy between logical CPU devices,
// which share memory; `bytes` counts the tensors' sizes all the same).
struct TransferStats {
  int64_t transfers = 0;  // Send/Recv pairs that ran, control-only pairs included
  int64_t bytes = 0;      // bytes of the tensors they carried
};

}  // namespace flowlet
