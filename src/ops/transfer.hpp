// send and recv: the two halves of a cut edge between graph partitions on different devices
// (inserted by the partition pass, run only inside graph steps). Send hands its input to the step's
// rendezvous; Recv waits for it without holding a thread and yields it on the destination device.
// A control edge that crosses devices is a pair too, moving no tensor.
#pragma once

#include <cstdint>
#include <string>

#include "flowlet/core/device.hpp"
#include "flowlet/op.hpp"

namespace flowlet::detail {

struct TransferAttrs {
  std::string key;      // unique in the graph: "edge matmul_3:0 cpu:0->cpu:1", "control assign_2 cpu:1->cpu:0"
  int32_t slot = -1;    // the pair's rendezvous slot (0 .. number of pairs - 1)
  Device source;
  Device destination;
  bool control = false;  // orders nodes across devices; moves no tensor
  std::string describe() const;
};

extern Op send_op;  // (value) or () for control -> nothing; runs on `source`
extern Op recv_op;  // () -> value (nothing for control); runs on `destination`

// The tensor a Recv on `destination` yields for `value`. CPU devices share memory, so this is a
// zero-copy view of the sender's buffer labelled with the destination device (its bytes stay
// counted on the sender's device); between device kinds it is a copy.
Tensor deliver_to(const Tensor& value, Device destination);

}  // namespace flowlet::detail
