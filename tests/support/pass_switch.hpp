// Test support for the graph-pass tests: a pass's environment switch (FLOWLET_CONV_FUSION,
// FLOWLET_DENSE_FUSION) set for a scope, and the number of live nodes of an op in a graph.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include <flowlet/graph.hpp>

namespace test {

// Sets `variable` to "1" or "0" for a scope (graphs traced inside see it), then restores it.
class PassSwitch {
 public:
  PassSwitch(const char* variable, bool on) : variable_(variable) {
    if (const char* old = std::getenv(variable)) old_ = old;
    setenv(variable, on ? "1" : "0", 1);
  }
  ~PassSwitch() {
    if (old_) {
      setenv(variable_, old_->c_str(), 1);
    } else {
      unsetenv(variable_);
    }
  }
  PassSwitch(const PassSwitch&) = delete;
  PassSwitch& operator=(const PassSwitch&) = delete;

 private:
  const char* variable_;
  std::optional<std::string> old_;
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
