// Op: the one definition of an operation (name, arity, flags, shape/dtype rule, kernels per device kind).
//
// Every caller (the eager dispatcher, the tracer, gradient tapes, placement and the executor) reads
// the same Op value, and every op call goes through dispatch(). Attributes are a plain struct per
// op, passed type-erased.
#pragma once

#include <array>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "flowlet/core/device.hpp"
#include "flowlet/core/tensor.hpp"

namespace flowlet {

struct Op;

namespace detail {
struct StepContext;  // what a graph step gives its kernels (the rendezvous, cancellation): src/runtime/step_context.hpp
}  // namespace detail

// Shape and dtype of one output, as the op's rule infers it.
struct TensorMeta {
  Shape shape;
  DType dtype = DType::f32;
};

inline constexpr int kMaxOutputs = 4;

// What an op's rule infers: its outputs and the device it runs on (the inputs' device unless the
// op creates tensors from attributes, like zeros).
struct OutputSpec {
  std::array<TensorMeta, kMaxOutputs> outputs;
  int count = 1;
  Device device;
};

// One invocation: the op, its inputs and its attribute struct, and, inside a graph step, the
// step's context (null for eager calls).
struct OpCall {
  const Op& op;
  std::span<const Tensor> inputs;
  const void* attributes = nullptr;
  detail::StepContext* step = nullptr;

  template <class Attributes>
  const Attributes& attrs() const {
    return *static_cast<const Attributes*>(attributes);
  }
};

// Checks the inputs and attributes (throwing the Error subclass that names the op and the problem)
// and fills the output shapes and dtypes.
using InferFn = void (*)(const OpCall& call, OutputSpec& spec);
// Computes the outputs. They arrive allocated (contiguous, row-major) unless the op is a view.
using KernelFn = void (*)(const OpCall& call, std::span<Tensor> outputs);

// How an asynchronous kernel says it finished: call it exactly once, from any thread, with null or
// the error it failed with. The outputs must be written before.
struct AsyncDone {
  void (*fn)(void* context, std::exception_ptr error) = nullptr;
  void* context = nullptr;
  void operator()(std::exception_ptr error = nullptr) const { fn(context, std::move(error)); }
};
// A kernel that may have to wait for something outside the graph step (a Recv for its tensor, a
// dequeue on an empty queue). It returns at once and calls `done` when the outputs are ready, so a
// waiting node holds no thread. Outputs arrive empty; the kernel sets them. Graph steps only.
using AsyncKernelFn = void (*)(const OpCall& call, std::span<Tensor> outputs, AsyncDone done);

// What a gradient rule sees: the op's inputs and outputs as recorded, and its attributes.
struct GradCall {
  const Op& op;
  std::span<const Tensor> inputs;
  std::span<const Tensor> outputs;
  const void* attributes = nullptr;
  uint64_t wanted = ~uint64_t{0};  // bit i: the caller needs input i's gradient (rules may skip others)

  template <class Attributes>
  const Attributes& attrs() const {
    return *static_cast<const Attributes*>(attributes);
  }
  bool wants(size_t input) const { return input >= 64 || ((wanted >> input) & 1u) != 0; }
};

// Fills input_grads[i] with d(loss)/d(input i) from output_grads (one per output, never empty).
// Written with flowlet's public ops, so it runs eagerly, records on outer tapes (higher-order
// gradients) and into traced graphs. Leaving input_grads[i] empty means "no gradient".
using GradFn = void (*)(const GradCall& call, std::span<const Tensor> output_grads, std::span<Tensor> input_grads);

// Copies an op's attribute struct so a tape (or a graph) can keep it past the call.
using CopyAttributesFn = std::shared_ptr<const void> (*)(const void* attributes);

template <class Attributes>
std::shared_ptr<const void> copy_attributes(const void* attributes) {
  return std::make_shared<const Attributes>(*static_cast<const Attributes*>(attributes));
}

// Describes an op's attribute struct as text, every field, e.g. "axes=[1], keepdims=true": two
// attribute structs of one op are equal exactly when their descriptions are (doubles print with
// fmt's shortest round-trip form). Graph dumps show it; CSE compares nodes by it.
using DescribeAttributesFn = std::string (*)(const void* attributes);

// Calls the struct's `std::string describe() const`, or a free `describe(const Attributes&)` found
// by argument-dependent lookup (for enums and other non-struct attributes).
template <class Attributes>
std::string describe_attributes(const void* attributes) {
  const auto& value = *static_cast<const Attributes*>(attributes);
  if constexpr (requires { value.describe(); }) {
    return value.describe();
  } else {
    return describe(value);
  }
}

// What a stateful op is ordered on in a traced graph: its nodes keep their program order per
// resource (a variable, a queue), reads after the last write and a write after every earlier use.
struct ResourceAccess {
  const void* resource = nullptr;  // null: the host, which every print and callback shares
  bool writes = true;
};
using ResourceFn = ResourceAccess (*)(const void* attributes);

// The start of a traced node's name ("read_w", "dequeue_batches"); the tracer appends the node id.
using NodeNameFn = std::string (*)(const void* attributes);

enum OpFlags : uint32_t {
  kNoFlags = 0,
  kView = 1u << 0,         // outputs alias the input's storage; the kernel builds them itself
  kStateful = 1u << 1,     // has effects beyond its outputs: never folded, deduplicated or pruned
  kElementwise = 1u << 2,  // output element i depends only on input elements i (after broadcast)
  kPlacesOutput = 1u << 3, // its attributes say where the output lives (to_device): device scopes leave it be
  // Exists only in graphs: recorded while tracing (by a library call such as Variable::value() or
  // inserted by a pass), run by the executor; an eager call is an error.
  kGraphOnly = 1u << 4,
  // The CPU kernel only moves handles and metadata (a view, a variable's tensor, a Send), so it
  // serves every device kind: each backend gets it when it registers its kernels.
  kAnyDevice = 1u << 5,
  // Runs where its resource lives: a device scope's placement request does not apply to its node.
  kRunsAtResource = 1u << 6,
  kContraction = 1u << 7,  // costs outputs x the inner dimension of input 0 (matmul): the executor's threading rule
};

struct Op {
  std::string_view name;  // same as the public function
  int min_inputs = 0;
  int max_inputs = 0;     // -1: any number
  uint32_t flags = kNoFlags;
  InferFn infer = nullptr;
  std::array<KernelFn, kNumDeviceKinds> kernels{};  // a device supports the op iff its kernel is set
  GradFn grad = nullptr;                     // nullptr: not differentiable (comparisons, indices)
  CopyAttributesFn copy_attributes = nullptr;  // set when the op has an attribute struct
  DescribeAttributesFn describe_attributes = nullptr;  // set together with copy_attributes
  // Graph-only ops that wait (Recv, dequeue) run through these instead of `kernels`.
  std::array<AsyncKernelFn, kNumDeviceKinds> async_kernels{};
  ResourceFn resource = nullptr;  // stateful ops: what the tracer orders the node on (null: the host)
  NodeNameFn node_name = nullptr; // null: nodes are named after the op

  bool has_flag(OpFlags flag) const { return (flags & flag) != 0; }
  bool runs_on(DeviceKind kind) const {
    return kernels[static_cast<size_t>(kind)] != nullptr || async_kernels[static_cast<size_t>(kind)] != nullptr;
  }
};

// Every op of the library, by name, graph-only ones included. Built on first use: each device
// backend adds its kernels then (one call per backend, src/registry.cpp).
const std::vector<Op*>& all_ops();
Op* find_op(std::string_view name);  // nullptr when unknown

}  // namespace flowlet
