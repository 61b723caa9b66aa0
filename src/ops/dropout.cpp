// Placeholder (dropout): filled by its part of issue 15.
#include "ops/registry.hpp"

namespace flowlet::detail {

void add_dropout_ops(std::vector<Op*>& ops) { (void)ops; }

}  // namespace flowlet::detail
