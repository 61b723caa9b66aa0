// f32 row kernels for the reductions (src/ops/reduce.cpp): the sum and the max of a contiguous run.
//
// Sum: f32 vector lanes for pairs of elements, f64 for everything else.
// Why this shape: converting every element to f64 (the old loop) costs two conversions and two
// f64 adds per 8 floats, which keeps the loop from keeping up with memory when part of the input
// sits in L3. Here each lane first adds two elements in f32 (one rounding, relative error at most
// 2^-24 of that pair's sum), and only the pair sums are widened and accumulated in f64. For inputs
// of one sign the result's relative error is therefore at most 2^-24 (6.0e-8) plus the f64
// accumulation's (about n * 2^-53), against up to n * 2^-24 for a plain f32 loop.
//
// The lane structure (32 f32 lanes, 32 f64 accumulators, fixed combination order) does not depend
// on the instruction set or the thread count, so the same run of floats always gives the same bits.
#pragma once

#include <cstdint>

namespace flowlet::detail {

// Sum of x[0..n) as described above (n >= 0; 0 for an empty run).
double sum_f32_run(const float* x, int64_t n);

// Max of x[0..n): NaN if any element is NaN, -inf for an empty run. Branch-free vector lanes (the
// generic lane loop compiled to compare-and-branch per element: 3 ns per element on random data).
float max_f32_run(const float* x, int64_t n);

}  // namespace flowlet::detail
