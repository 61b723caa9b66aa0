// Test support for the graph-pass tests: a pass's environment switch (FLOWLET_CONV_FUSION,
// FLOWLET_DENSE_FUSION) set for a scope, and the number of live nodes of an op in a graph.
#pragma once

#include <string_view>

#include <flowlet/graph.hpp>

#include "support/scoped_env.hpp"

namespace test {

// Sets `variable` to "1" or "0" for a scope (graphs traced inside see it), then restores it.
class PassSwitch : public ScopedEnv {
 public:
  PassSwitch(const char* variable, bool on) : ScopedEnv(variable, on ? "1" : "0") {}
};

// Live op nodes of the op named `name`.
inline int count_ops(const flowlet::Graph& graph, std::string_view name) {
  int n = 0;
  for (const flowlet::Node& node : graph.nodes()) {
    if (!node.removed && node.kind == flowlet::NodeKind::op && node.op->name == name) ++n;
  }
  return n;
}

}  // namespace test
