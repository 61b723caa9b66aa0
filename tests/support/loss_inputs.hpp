// Test support for the cross-entropy fusion tests (test_fusion_loss, test_fusion_loss_sharing):
// logits and labels from seeds, a bit-for-bit comparison of two tensors (NaN matching NaN), and a
// traced function's op counts with its values checked against eager.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>
#include <vector>

#include <doctest/doctest.h>
#include <flowlet/flowlet.hpp>

#include "support/pass_switch.hpp"
#include "support/reference.hpp"

namespace test {

// Uniform in [-3, 3): logits whose softmax is neither flat nor one-hot.
inline flowlet::Tensor loss_logits(const flowlet::Shape& shape, uint64_t seed, flowlet::DType dtype) {
  return flowlet::uniform(shape, -3.0, 3.0, seed, dtype);
}

// Labels (i * 7 + seed) mod classes: every class, no pattern aligned with the rows.
inline flowlet::Tensor loss_labels(int64_t n, int64_t classes, flowlet::DType dtype, uint64_t seed) {
  std::vector<double> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>((i * 7 + seed) % static_cast<uint64_t>(classes));
  return make(v, flowlet::Shape{n}, dtype);
}

// Equal bit for bit (NaN where the other has NaN), shape and dtype included.
inline void check_same_bits(const flowlet::Tensor& got, const flowlet::Tensor& want) {
  REQUIRE(got.shape() == want.shape());
  REQUIRE(got.dtype() == want.dtype());
  const std::vector<double> a = values(got), b = values(want);
  size_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ += !(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i])));
  CHECK(differ == 0);
}

// Traces f (returning std::vector<Tensor>) at args, checks the graph's invariants and that the
// traced call equals f run eagerly bit for bit, and returns the live node counts of `ops`.
template <class F, class... Args>
std::vector<int> traced_op_counts(F f, std::vector<std::string_view> ops, const Args&... args) {
  auto traced = flowlet::trace(f);
  const flowlet::Graph& graph = traced.graph(args...);
  graph.check_invariants();
  const std::vector<flowlet::Tensor> got = traced(args...), want = f(args...);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) check_same_bits(got[i], want[i]);
  std::vector<int> counts;
  for (std::string_view op : ops) counts.push_back(count_ops(graph, op));
  return counts;
}

}  // namespace test
