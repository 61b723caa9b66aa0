// The unknown-dimension probe: whether two traces of one function at different sizes recorded the
// same graph, so that one graph serves every size.
#pragma once

#include <optional>
#include <string>

#include "flowlet/graph.hpp"

namespace flowlet::detail {

// Where two traces of one function differ, ignoring shapes: null when they record the same ops on
// the same inputs with the same attributes and constants.
std::optional<std::string> first_structural_difference(const Graph& a, const Graph& b);

}  // namespace flowlet::detail
