// fused_elementwise: runs a FusedProgram tile by tile, each step through its own op's CPU kernel.
//
// Why a primitive: a chain of elementwise ops run one by one reads and writes the whole tensor per
// op; here one thread runs every step over a tile of kFusedTile elements before moving on, so the
// intermediates stay in L1/L2 and memory sees only the external inputs read once and the output
// written once. No op gets a second implementation: the steps call the same kernels eager calls do.
#include "ops/fused.hpp"

#include <algorithm>

#include "core/check.hpp"
#include "ops/registry.hpp"
#include "runtime/thread_pool.hpp"

namespace flowlet::detail {
namespace {

// A step's kernel over a tile must never split it across threads: the tile is the unit of
// parallelism here, and the kernels' own parallel_for stays serial below kParallelGrain.
static_assert(kFusedTile < kParallelGrain, "a tile must stay below the kernels' parallel grain");

constexpr auto kCpu = static_cast<size_t>(DeviceKind::cpu);

// Structural checks on the program (the pass builds valid ones; a hand-built one may not be).
void check_program(const FusedProgram& program, size_t inputs) {
  if (program.steps.empty()) fail<InvalidArgument>("fused_elementwise: the program has no steps");
  if (program.input_dtypes.size() != inputs) {
    fail<InvalidArgument>("fused_elementwise: expects {} inputs (as fused); got {}", program.input_dtypes.size(),
                          inputs);
  }
  for (size_t i = 0; i < program.steps.size(); ++i) {
    const FusedStep& step = program.steps[i];
    if (step.op == nullptr || !step.op->kernels[kCpu]) {
      fail<InvalidArgument>("fused_elementwise: step {} has no op with a CPU kernel", i);
    }
    for (const FusedOperand& operand : step.operands) {
      const bool valid = operand.kind == FusedOperand::Kind::input
                             ? operand.index >= 0 && static_cast<size_t>(operand.index) < inputs
                             : operand.index >= 0 && static_cast<size_t>(operand.index) < i;
      if (!valid) {
        fail<InvalidArgument>("fused_elementwise: step {} ({}) reads {} {}, which does not exist before it", i,
                              step.op->name, operand.kind == FusedOperand::Kind::input ? "input" : "step",
                              operand.index);
      }
    }
  }
}

void fused_infer(const OpCall& call, OutputSpec& spec) {
  const auto& program = call.attrs<FusedProgram>();
  check_program(program, call.inputs.size());
  // Every input has the output's shape or is rank-0, so the output shape is that of any non-scalar.
  const Shape* shape = nullptr;
  for (size_t k = 0; k < call.inputs.size(); ++k) {
    const Tensor& t = call.inputs[k];
    if (t.dtype() != program.input_dtypes[k]) {
      fail<DTypeError>("fused_elementwise: input {} has dtype {}, but the program was fused for {}", k, t.dtype(),
                       program.input_dtypes[k]);
    }
    if (t.rank() == 0) continue;
    if (shape == nullptr) {
      shape = &t.shape();
    } else if (t.shape() != *shape) {
      fail<InvalidArgument>(
          "fused_elementwise: inputs must have one shape or be rank-0 scalars; got input {} with shape {} and "
          "an earlier input with shape {}",
          k, t.shape(), *shape);
    }
  }
  spec.outputs[0] = {shape != nullptr ? *shape : Shape{}, program.steps.back().dtype};
}

// Scratch slots for the intermediate results: step i (not the last) writes slot[i], which is never
// a slot one of its own operands lives in (kernels are not asked to run in place), and a slot is
// reused once the step stored there has had its last use. A chain needs two slots.
struct SlotPlan {
  std::vector<int32_t> slot;  // per step; -1 for the last (it writes the output)
  int32_t count = 0;
};

SlotPlan plan_slots(const FusedProgram& program) {
  const size_t steps = program.steps.size();
  std::vector<size_t> last_use(steps, 0);
  for (size_t i = 0; i < steps; ++i) {
    last_use[i] = i;  // a result nobody reads is dead right after its step
    for (const FusedOperand& operand : program.steps[i].operands) {
      if (operand.kind == FusedOperand::Kind::step) last_use[static_cast<size_t>(operand.index)] = i;
    }
  }
  SlotPlan plan;
  plan.slot.assign(steps, -1);
  std::vector<int32_t> free_slots;
  for (size_t i = 0; i + 1 < steps; ++i) {
    if (free_slots.empty()) {
      plan.slot[i] = plan.count++;
    } else {
      plan.slot[i] = free_slots.back();
      free_slots.pop_back();
    }
    // Release what dies at step i (its operands' slots, and its own when unused) only now, after
    // step i's own slot was chosen, so a step never writes over its inputs.
    for (size_t j = 0; j <= i; ++j) {
      if (last_use[j] == i && plan.slot[j] >= 0) free_slots.push_back(plan.slot[j]);
    }
  }
  return plan;
}

void fused_kernel(const OpCall& call, std::span<Tensor> outputs) {
  const auto& program = call.attrs<FusedProgram>();
  const Tensor& out = outputs[0];
  const int64_t n = out.numel();
  if (n == 0) return;
  const size_t steps = program.steps.size();

  // Full-size inputs are walked as flat ranges, so they must be contiguous; one-element inputs are
  // passed whole as rank-0 tensors, which every elementwise kernel broadcasts.
  std::vector<Tensor> inputs(call.inputs.size());
  std::vector<char> full(call.inputs.size(), 0);
  for (size_t k = 0; k < call.inputs.size(); ++k) {
    const Tensor& t = call.inputs[k];
    if (t.numel() == 1) {
      inputs[k] = Tensor::view(t.storage(), Shape{}, Strides{}, t.offset(), t.dtype());
    } else {
      inputs[k] = t.contiguous();
      full[k] = 1;
    }
  }

  const SlotPlan plan = plan_slots(program);
  size_t widest = 1;
  for (const FusedStep& step : program.steps) widest = std::max(widest, dtype_size(step.dtype));
  const int64_t tile = std::min(n, kFusedTile);
  const int64_t tiles = (n + tile - 1) / tile;
  auto run_tiles = [&](int64_t first_tile, int64_t end_tile) {
    // This chunk's scratch: one buffer per slot, reused for every tile of the chunk.
    std::vector<Tensor> slots(static_cast<size_t>(plan.count));
    for (Tensor& s : slots) s = Tensor::empty(Shape{tile * static_cast<int64_t>(widest)}, u8, out.device());
    std::vector<Tensor> tile_inputs(inputs.size());
    std::vector<Tensor> results(steps);
    std::vector<Tensor> operands;
    for (int64_t t = first_tile; t < end_tile; ++t) {
      const int64_t begin = t * tile;
      const int64_t length = std::min(tile, n - begin);
      const Shape shape{length};
      const Strides unit{1};
      for (size_t k = 0; k < inputs.size(); ++k) {
        const Tensor& in = inputs[k];
        tile_inputs[k] = full[k] ? Tensor::view(in.storage(), shape, unit, in.offset() + begin, in.dtype()) : in;
      }
      for (size_t i = 0; i < steps; ++i) {
        const FusedStep& step = program.steps[i];
        operands.clear();
        for (const FusedOperand& operand : step.operands) {
          const auto index = static_cast<size_t>(operand.index);
          operands.push_back(operand.kind == FusedOperand::Kind::input ? tile_inputs[index] : results[index]);
        }
        Tensor& result = results[i];
        result = i + 1 == steps
                     ? Tensor::view(out.storage(), shape, unit, out.offset() + begin, out.dtype())
                     : Tensor::view(slots[static_cast<size_t>(plan.slot[i])].storage(), shape, unit, 0, step.dtype);
        const OpCall step_call{*step.op, operands, step.attributes.get()};
        step.op->kernels[kCpu](step_call, std::span<Tensor>(&result, 1));
      }
    }
  };
  // A few chunks per thread rather than one: threads that join late or are busy elsewhere (the
  // executor runs nodes concurrently) leave their share to the others. Work below about
  // kParallelGrain elements of one op stays on the calling thread, as in the eager kernels.
  const int64_t work = n * static_cast<int64_t>(steps);
  const int64_t chunks = work < 2 * kParallelGrain ? 1 : std::min<int64_t>(tiles, 4 * intra_op_threads());
  if (chunks <= 1) {
    run_tiles(0, tiles);
    return;
  }
  auto run_chunk = [&](int64_t chunk) { run_tiles(tiles * chunk / chunks, tiles * (chunk + 1) / chunks); };
  run_chunks(chunks, FunctionRef<void(int64_t)>(run_chunk));
}

}  // namespace

std::string describe(const FusedProgram& program) {
  std::string text;
  for (size_t i = 0; i < program.steps.size(); ++i) {
    const FusedStep& step = program.steps[i];
    if (i > 0) text += " -> ";
    text += step.op != nullptr ? step.op->name : "?";
    if (step.attributes) {  // the pass fuses attributed ops only when they can describe them
      const bool describable = step.op != nullptr && step.op->describe_attributes != nullptr;
      text += fmt::format("[{}]", describable ? step.op->describe_attributes(step.attributes.get())
                                              : fmt::format("attributes at {}", step.attributes.get()));
    }
    text += '(';
    for (size_t k = 0; k < step.operands.size(); ++k) {
      const FusedOperand& operand = step.operands[k];
      if (k > 0) text += ", ";
      text += fmt::format("{}{}", operand.kind == FusedOperand::Kind::input ? "in" : "s", operand.index);
    }
    text += ')';
  }
  return text;
}

Op fused_elementwise_op{"fused_elementwise", 1, -1, kElementwise, &fused_infer, {&fused_kernel, nullptr},
                        nullptr, &copy_attributes<FusedProgram>, &describe_attributes<FusedProgram>};

void add_fused_ops(std::vector<Op*>& ops) { ops.push_back(&fused_elementwise_op); }

}  // namespace flowlet::detail
