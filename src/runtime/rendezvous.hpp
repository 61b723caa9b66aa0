// Rendezvous: where the partitions of one graph step hand tensors to each other. Every cut edge of
// the partitioned graph is one Send/Recv pair sharing a slot number (assigned by the partition
// pass; its readable key, "edge matmul_3:0 cpu:0->cpu:1", is in the nodes' attributes). A Send
// never waits; a Recv that comes first parks a callback instead of a thread. One per step.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <vector>

#include "flowlet/core/tensor.hpp"

namespace flowlet::detail {

class Rendezvous {
 public:
  // Called with the tensor (or with the error that aborted the step: the tensor is then empty).
  using Receiver = void (*)(void* context, Tensor value, std::exception_ptr error);

  explicit Rendezvous(int32_t slots);

  // Hands `value` to the slot's Recv (calling its parked receiver on this thread) or keeps it until
  // the Recv asks. `bytes` is what the transfer moved (0 for a control edge). Once per slot per step.
  void send(int32_t slot, Tensor value, int64_t bytes);
  // Calls `receiver` with the slot's tensor: now, on this thread, if it was sent already; else from
  // the send() that delivers it, or from abort().
  void receive(int32_t slot, Receiver receiver, void* context);
  // Fails every parked and future receive with `error` (the step was cancelled).
  void abort(std::exception_ptr error);

  int64_t bytes_moved() const { return bytes_.load(std::memory_order_relaxed); }
  int64_t transfers() const { return transfers_.load(std::memory_order_relaxed); }

 private:
  struct Slot {
    bool sent = false;
    Tensor value;
    Receiver receiver = nullptr;
    void* context = nullptr;
  };
  std::mutex mutex_;
  std::vector<Slot> slots_;
  std::exception_ptr aborted_;
  std::atomic<int64_t> bytes_{0};
  std::atomic<int64_t> transfers_{0};
};

}  // namespace flowlet::detail
