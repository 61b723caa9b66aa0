// CUDA Graph capture of traced steps. Launching a kernel costs the host a few microseconds, so a
// traced step of many small ops on a GPU is bound by launches, not by the GPU. A graph whose every
// node runs on one GPU, with static shapes and no effects on the host, is recorded once into a
// CUDA Graph and then replayed with one launch per call (TraceOptions::cuda_graphs, on by default).
//
// The contract that makes a replay equal to running the plan:
//   - Addresses are fixed. Arguments are copied into buffers the graph owns before each replay;
//     outputs are copied out of the graph's buffers after it (a caller's tensor is never rewritten
//     by a later replay); every intermediate comes from a memory pool the recording keeps.
//   - Variables are updated in place, into the buffer the recording saw (the in-place update
//     paths of apply_variable_update and assign_matmul). Before each replay every variable the
//     graph touches must still have that buffer, and nobody else may hold a variable it writes;
//     otherwise the variable gets a private copy, as an eager update would give it, and the step
//     is recorded again (a few times at most: then the function stops capturing and says why).
//   - Nothing runs on the host during a replay, so kernels that check data on the host (an index
//     out of range, a label, an integer division by zero) defer their check while recording: the
//     check runs after the replay's phase that contains it. Checks must come before the step's
//     first variable update, so the graph is recorded in two phases when it has checks: the first
//     ends before that update, and the second is launched only when every check passed. A bad
//     label therefore throws the eager error, and no variable has changed ("loses nothing").
//   - The first call runs the plan normally (it warms up cuBLAS and lazy kernel loading); the
//     second records and replays; later calls replay. A failed recording (some kernel turned out
//     to need the host) makes the function run its plan from then on, with the reason kept.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "flowlet/run_info.hpp"
#include "runtime/step_context.hpp"

namespace flowlet {
class Graph;
struct Node;
}  // namespace flowlet

namespace flowlet::detail {

class Plan;
struct VariableState;

// What a kernel that checks data on the host does while its step is recorded into a CUDA Graph
// (StepContext::recording): it queues the check here instead of waiting for the device; the
// checks run after a replay of the phase.
struct CaptureRecorder final : StepRecording {
  // Throws DeviceError (the recording fails) when checks are no longer allowed.
  void defer_check(std::function<void()> check) override;

  struct DeferredCheck {
    std::function<void()> check;  // throws the kernel's error when its flag was raised
    const Node* node = nullptr;
  };
  std::vector<DeferredCheck> checks;
  const Node* node = nullptr;  // the node whose kernel is being recorded
  bool checks_allowed = true;  // false after the step's first variable update
};

// Non-null while the calling thread records a CUDA Graph (the executor names the node being
// recorded in it; kernels see the recording through their StepContext instead).
extern constinit thread_local CaptureRecorder* capture_recorder;

class GraphCapture {
 public:
  // Why `plan` cannot run as a CUDA Graph ("" when it can). `allowed` is TraceOptions::cuda_graphs
  // and no step statistics; FLOWLET_CUDA_GRAPHS=0 in the environment turns capture off too.
  static std::string why_not(const Graph& graph, const Plan& plan, bool dynamic_shapes, bool allowed);

  // `plan` (over `graph`) passed why_not; both outlive this object.
  GraphCapture(const Graph& graph, const Plan& plan);
  ~GraphCapture();

  std::vector<Tensor> run(std::span<const Tensor> arguments);
  CudaGraphInfo info() const;

 private:
  struct Recorded;
  struct VariableUse {
    VariableState* state = nullptr;
    bool writes = false;
    const void* buffer = nullptr;  // the value's address when the graph was recorded
  };

  bool record(std::span<const Tensor> arguments);  // false when it failed (why_not_ says why)
  bool buffers_unchanged();  // also gives written variables that others share a private copy
  std::vector<Tensor> replay(std::span<const Tensor> arguments);
  void give_up(std::string why);

  const Graph& graph_;
  const Plan& plan_;
  int device_ = 0;
  int32_t first_write_ = 0;  // the first item updating a variable (items before it may check data)
  std::vector<VariableUse> variables_;

  mutable std::mutex mutex_;  // one call at a time replays (the graph's buffers are shared)
  std::atomic<bool> given_up_{false};
  int64_t calls_ = 0;
  int recordings_ = 0;
  int64_t replays_ = 0;
  std::string why_not_;
  std::unique_ptr<Recorded> recorded_;
};

}  // namespace flowlet::detail
