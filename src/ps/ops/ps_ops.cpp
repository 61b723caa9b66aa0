// Placeholder of the parameter-server seam (issue 13): filled in by its part.
#include <vector>

#include "ops/registry.hpp"

namespace flowlet::detail {
void add_ps_ops(std::vector<Op*>& /*ops*/) {}
}  // namespace flowlet::detail
