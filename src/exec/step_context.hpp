// What one graph step gives the kernels it runs (OpCall::step): the rendezvous its partitions
// exchange tensors through, and the cancellation that a failing node triggers. Eager calls have none.
#pragma once

namespace flowlet::detail {

class Rendezvous;
class Cancellation;

struct StepContext {
  Rendezvous* rendezvous = nullptr;      // null when the graph has one partition
  Cancellation* cancellation = nullptr;  // never null inside a step
};

}  // namespace flowlet::detail
