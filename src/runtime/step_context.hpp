// What one graph step gives the kernels it runs (OpCall::step): the rendezvous its partitions
// exchange tensors through, the cancellation that a failing node triggers, and, while the step is
// recorded into a CUDA Graph, the recording. Eager calls have none.
#pragma once

#include <functional>

namespace flowlet::detail {

class Rendezvous;
class Cancellation;

// A step being recorded into a CUDA Graph (exec/graph_capture.hpp): its launches are recorded, not
// run, so a kernel that checks data on the host cannot wait for the device. It hands the check
// here instead; the check runs after the replay of the recorded phase.
class StepRecording {
 public:
  // Queues `check` (it throws the kernel's error when its flag was raised). Throws DeviceError
  // (the recording fails and the function runs uncaptured) when checks are no longer allowed.
  virtual void defer_check(std::function<void()> check) = 0;

 protected:
  ~StepRecording() = default;
};

struct StepContext {
  Rendezvous* rendezvous = nullptr;      // null when the graph has one partition
  Cancellation* cancellation = nullptr;  // never null inside a step
  StepRecording* recording = nullptr;    // non-null while the step is recorded into a CUDA Graph
};

// The recording a kernel runs in, from its OpCall::step, or null (an eager call, or a step that is
// not recorded).
inline StepRecording* recording_of(const StepContext* step) { return step ? step->recording : nullptr; }

}  // namespace flowlet::detail
