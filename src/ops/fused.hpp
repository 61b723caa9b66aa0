// The fused elementwise op: a small program of elementwise steps that runs tile by tile, each step
// through its own op's CPU kernel, so intermediates stay in cache. Built by fuse_elementwise
// (src/trace/passes/fusion.cpp); internal, not in the public op table.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "flowlet/op.hpp"

namespace flowlet::detail {

// One operand of a step: external input `index` of the fused node, or the result of step `index`
// (an earlier step).
struct FusedOperand {
  enum class Kind : uint8_t { input, step };
  Kind kind = Kind::input;
  int32_t index = 0;
  friend bool operator==(const FusedOperand&, const FusedOperand&) = default;
};

// One elementwise op of the program; `dtype` is its output's dtype.
struct FusedStep {
  const Op* op = nullptr;
  std::shared_ptr<const void> attributes;  // the op's attribute struct, or null
  std::vector<FusedOperand> operands;
  DType dtype = DType::f32;
};

// The attributes of fused_elementwise. The last step's result is the output. Every external input
// has the output's shape or is a rank-0 scalar; `input_dtypes` are their dtypes as traced.
//
// Example (y = tanh(x * c + b), c rank-0):
//   steps = {{mul, {in0, in1}}, {add, {step0, in2}}, {tanh, {step1}}}, input_dtypes = {f32, f32, f32}
struct FusedProgram {
  std::vector<FusedStep> steps;
  std::vector<DType> input_dtypes;
};

// "mul(in0, in1) -> add(s0, in2) -> cast[dtype=f64](s1)": the steps in order with their attributes,
// for DOT labels and CSE keys (the op's describe_attributes). Two programs over the same inputs
// compute the same thing exactly when their descriptions are equal (step dtypes follow from the
// inputs' dtypes and the attributes).
std::string describe(const FusedProgram& program);

// The op. Its attributes are a FusedProgram; it has no gradient (fusion runs after gradients are
// recorded). Inputs: the program's external inputs, in order. The fusion pass inserts it; it has
// no public function.
extern Op fused_elementwise_op;

// Elements per tile: the unit one thread runs all steps over before moving on (64 KiB of f32 per
// live intermediate; a chain keeps two, so tiles stay in L2). 4K-32K measured alike on an 8-op
// chain. Below kParallelGrain, so a step's kernel never splits its tile across threads.
inline constexpr int64_t kFusedTile = 16384;

}  // namespace flowlet::detail
