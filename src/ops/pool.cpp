// Placeholder (max_pool2d, avg_pool2d and their backward ops): filled by its part of issue 15.
#include "ops/registry.hpp"

namespace flowlet::detail {

void add_pool_ops(std::vector<Op*>& ops) { (void)ops; }

}  // namespace flowlet::detail
